"""Every door out of the embedded ClickHouse, tried as the analyst and as the writer.

The real server (chDB behind the HTTP interface, the session fixture) gets file, network and process
access and output files in every spelling we could think of: backquoted, quoted, escaped, commented,
nested in subqueries, CTEs, views, `IN`, `UNION`, `INSERT ... SELECT`, query parameters, multi-part
forms, compressed bodies, a second statement after `;`, identifiers that imitate parse-tree lines.
Each must come back as a ClickHouse error (`X-ClickHouse-Exception-Code`), with no secret in the
answer, no file written, and no connection made to a listener standing in for a remote host. Then the
ledger queries analysts need must still work. docs/security.md lists what is tried here.
"""

from __future__ import annotations

import base64
import gzip
import socket
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures_clickhouse import server_env, start_server, stop_server
from test_chargeback_ledger import ledger_settings, write_ledger  # noqa: F401 (fixture)

from base.settings import ClickHouseSettings
from sinks.db import connect

pytestmark = pytest.mark.integration

SECRET = "canary-" + uuid.uuid4().hex


@dataclass
class Door:
    secret_file: Path
    out_file: Path
    remote: str  # host:port of a listener that must never see a connection
    database: str


@pytest.fixture
def door(tmp_path: Path, clickhouse_database: str, clickhouse_server: Any) -> Iterator[Door]:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    host, port = listener.getsockname()
    writer = clickhouse_server.client(database=clickhouse_database)
    writer.command("CREATE TABLE t (s String) ENGINE = MergeTree ORDER BY s")
    writer.close()
    try:
        yield Door(secret, tmp_path / "out.txt", f"{host}:{port}", clickhouse_database)
        with pytest.raises(BlockingIOError):  # nobody connected to the "remote host"
            listener.accept()
    finally:
        listener.close()


# Statements: {secret} {out} {remote} are filled in. Each is refused for both users.
DOORS = [
    "SELECT 'x' INTO OUTFILE '{out}' TRUNCATE FORMAT TSVRaw",
    "SELECT 'x' INTO OUTFILE '{out}' AND STDOUT FORMAT TSVRaw",
    "SELECT 'x' INTO OUTFILE '{out}' COMPRESSION 'gzip' FORMAT TSVRaw",
    "EXPLAIN SELECT 1 INTO OUTFILE '{out}'",
    "SHOW TABLES INTO OUTFILE '{out}'",
    "DESCRIBE TABLE t INTO OUTFILE '{out}'",
    "SELECT `\\x66ile`('{secret}')",
    "SELECT file('{secret}')",
    'SELECT "file"(\'{secret}\')',
    "SELECT length(file('{secret}')) > 0",
    "SELECT * FROM file('{secret}', LineAsString)",
    "SELECT * FROM `file`('{secret}', LineAsString)",
    "SELECT * FROM file /* a comment */ ('{secret}', LineAsString)",
    "SELECT * FROM file -- a comment\n('{secret}', LineAsString)",
    "WITH leak AS (SELECT * FROM file('{secret}', LineAsString)) SELECT * FROM leak",
    "SELECT * FROM (SELECT * FROM (SELECT * FROM file('{secret}', LineAsString)))",
    "SELECT 1 WHERE 1 IN (SELECT 1 FROM file('{secret}', LineAsString))",
    "SELECT * FROM view(SELECT * FROM file('{secret}', LineAsString))",
    "SELECT 1 UNION ALL SELECT length(file('{secret}'))",
    "SELECT * FROM numbers(1) AS n JOIN file('{secret}', LineAsString) AS f ON 1 = 1",
    "SELECT * FROM url('http://{remote}/', LineAsString)",
    "SELECT * FROM URL('http://{remote}/', LineAsString)",
    "SELECT * FROM s3('http://{remote}/bucket/key', LineAsString)",
    "SELECT * FROM hdfs('hdfs://{remote}/x', LineAsString)",
    "SELECT * FROM remote('{remote}', system.one)",
    "SELECT * FROM remoteSecure('{remote}', system.one)",
    "SELECT * FROM mysql('{remote}', 'd', 't', 'u', 'p')",
    "SELECT * FROM postgresql('{remote}', 'd', 't', 'u', 'p')",
    "SELECT * FROM sqlite('{secret}', 't')",
    "SELECT * FROM executable('id', TSV, 'x String')",
    "SELECT * FROM input('x String')",
    "SELECT * FROM Python(SECRET)",
    "SELECT * FROM merge('system', '^users$')",
    "SELECT * FROM mergeTreeIndex('system', 'query_log')",
    "SELECT * FROM system.users",
    "SELECT * FROM `system`.`users`",
    "SELECT * FROM system.named_collections",
    "SELECT query FROM system.processes",
    "SELECT query FROM system.query_log",
    "SELECT * FROM system.server_settings",
    "SELECT 'x' IN system.query_log",
    "SELECT dictGet('d', 'a', toUInt64(1))",
    "SELECT joinGet('system.one', 'dummy', 0)",
    "SELECT catboostEvaluate('{secret}', 1)",
    "SELECT 1; SELECT file('{secret}')",
    "SELECT 1 AS `a\n      Function numbers`, file('{secret}')",
    "EXPLAIN SYNTAX SELECT file('{secret}')",
    "DESCRIBE TABLE file('{secret}', LineAsString)",
    "INSERT INTO FUNCTION file('{out}', TSV) SELECT 1",
    "INSERT INTO t FROM INFILE '{secret}' FORMAT LineAsString",
    "INSERT INTO t SELECT * FROM file('{secret}', LineAsString)",
    "CREATE TABLE leak (s String) ENGINE = File(LineAsString, '{secret}')",
    "CREATE TABLE leak AS file('{secret}', LineAsString)",
    "CREATE TABLE leak ENGINE = Memory AS SELECT * FROM file('{secret}', LineAsString)",
    "CREATE VIEW leak AS SELECT file('{secret}') AS s",
    "CREATE DICTIONARY leak (s String) PRIMARY KEY s SOURCE(FILE(path '{secret}' format 'LineAsString')) "
    "LAYOUT(FLAT()) LIFETIME(0)",
    "CREATE DATABASE leak ENGINE = Filesystem('/etc')",
    "ALTER TABLE t ADD COLUMN c String DEFAULT file('{secret}')",
    "BACKUP TABLE t TO File('{out}')",
    "SYSTEM RELOAD CONFIG",
    "KILL QUERY WHERE 1",
    "SET dialect = 'prql'",
    "SELECT * FROM t SETTINGS dialect = 'kusto'",
]


def _curl(server: Any, user: str, password: str, sql: str, **extra: Any) -> tuple[int, dict[str, str], bytes]:
    import http.client

    params = {"database": extra.pop("database")}
    params.update(extra.pop("params", {}))
    body: bytes = extra.pop("body", sql.encode())
    headers = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    headers.update(extra.pop("headers", {}))
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request("POST", "/?" + urllib.parse.urlencode(params), body=body, headers=headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _users(server: Any) -> list[tuple[str, str, str]]:
    return [("analyst", server.analyst_user, server.analyst_password), ("writer", server.user, server.password)]


def _refused(status: int, headers: dict[str, str], body: bytes, door: Door) -> None:
    assert "x-clickhouse-exception-code" in headers, (status, body[:300])
    assert int(headers["x-clickhouse-exception-code"]) > 0
    assert SECRET.encode() not in body
    assert not door.out_file.exists()


@pytest.mark.parametrize("template", DOORS)
def test_every_door_is_refused_for_both_users(clickhouse_server: Any, door: Door, template: str) -> None:
    sql = template.format(secret=door.secret_file, out=door.out_file, remote=door.remote)
    for _role, user, password in _users(clickhouse_server):
        status, headers, body = _curl(clickhouse_server, user, password, sql, database=door.database)
        _refused(status, headers, body, door)


def test_a_statement_after_values_rows_is_inert_data(clickhouse_server: Any, door: Door) -> None:
    """`VALUES` rows are spooled as data in the Values format, which stops at `;`: what follows is
    never parsed as a statement (the analyst is refused outright, as for any INSERT)."""
    sql = f"INSERT INTO t VALUES ('a'); SELECT file('{door.secret_file}')"
    _, headers, body = _curl(
        clickhouse_server, clickhouse_server.analyst_user, clickhouse_server.analyst_password, sql,
        database=door.database,
    )
    _refused(0, headers, body, door)
    status, _, body = _curl(clickhouse_server, clickhouse_server.user, clickhouse_server.password, sql,
                            database=door.database)
    assert status == 200 and SECRET.encode() not in body
    _, _, rows = _curl(clickhouse_server, clickhouse_server.user, clickhouse_server.password,
                       "SELECT s FROM t ORDER BY s", database=door.database)
    assert rows == b"a\n"


def test_doors_through_the_other_ways_in(clickhouse_server: Any, door: Door) -> None:
    """The same statement by GET `query=`, a query parameter that names a table, a multipart form, and
    a gzip body: every route the server reads a statement from reaches the same check."""
    leak = f"SELECT * FROM file('{door.secret_file}', LineAsString)"
    for _role, user, password in _users(clickhouse_server):
        routes = [
            {"params": {"query": leak}, "body": b""},
            {"body": b"SELECT * FROM {tbl:Identifier}", "params": {"param_tbl": "system.users"}},
            {"body": gzip.compress(leak.encode()), "headers": {"Content-Encoding": "gzip"}},
        ]
        boundary = "b" + uuid.uuid4().hex
        form = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="query"\r\n\r\n{leak}\r\n--{boundary}--\r\n'
        ).encode()
        routes.append({"body": form, "headers": {"Content-Type": f"multipart/form-data; boundary={boundary}"}})
        for route in routes:
            status, headers, body = _curl(clickhouse_server, user, password, "", database=door.database, **route)
            _refused(status, headers, body, door)


def test_analyst_may_not_lift_its_limits(clickhouse_server: Any, door: Door) -> None:
    user, password = clickhouse_server.analyst_user, clickhouse_server.analyst_password
    for sql, params in [
        ("SELECT 1 SETTINGS max_execution_time = 100000", {}),
        ("SET max_memory_usage = 0", {}),
        ("SELECT 1", {"max_result_rows": "0"}),
        ("SELECT 1", {"readonly": "0"}),
    ]:
        status, headers, body = _curl(clickhouse_server, user, password, sql, database=door.database, params=params)
        _refused(status, headers, body, door)
    # and the engine holds the limits the server set
    status, _, body = _curl(
        clickhouse_server, user, password, "SELECT getSetting('max_execution_time') > 0", database=door.database
    )
    assert (status, body) == (200, b"1\n")


def test_analyst_limits_from_settings_are_held_by_the_engine(tmp_path: Path) -> None:
    """`clickhouse.analyst_limits` reach the engine: a runaway query stops at its time limit, a huge
    result at its row limit, and the writer is not limited."""
    env = server_env(
        GPULEDGER_STATE_DIR=str(tmp_path / "state"),
        GPULEDGER_CLICKHOUSE__ANALYST_LIMITS__MAX_EXECUTION_TIME_S="2",
        GPULEDGER_CLICKHOUSE__ANALYST_LIMITS__MAX_RESULT_ROWS="1000",
    )
    server = start_server(tmp_path / "data", env=env)
    try:
        user, password = server.analyst_user, server.analyst_password
        started = time.monotonic()
        _, headers, body = _curl(server, user, password, "SELECT count() FROM system.numbers", database="default")
        assert headers.get("x-clickhouse-exception-code") == "159", body[:200]  # TIMEOUT_EXCEEDED
        assert time.monotonic() - started < 30
        _, headers, body = _curl(server, user, password, "SELECT number FROM numbers(5000)", database="default",
                                 params={"wait_end_of_query": "1"})
        assert headers.get("x-clickhouse-exception-code") == "396", body[:200]  # TOO_MANY_ROWS_OR_BYTES
        status, _, body = _curl(server, server.user, server.password, "SELECT count() FROM numbers(5000)",
                                database="default")
        assert (status, body) == (200, b"5000\n")
    finally:
        stop_server(server)


def test_the_ledger_queries_analysts_need_still_work(
    clickhouse_server: Any, ledger_settings: ClickHouseSettings  # noqa: F811
) -> None:
    """Every table and view of the migrated ledger, the catalogue, and clickhouse-connect's handshake."""
    write_ledger(ledger_settings)
    analyst = clickhouse_server.analyst_client(database=ledger_settings.database)
    writer = connect(ledger_settings)
    try:
        names = [r[0] for r in writer.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND NOT is_temporary "
            "AND engine NOT LIKE '%MaterializedView%' AND name NOT LIKE '.inner%'",
            parameters={"db": ledger_settings.database},
        ).result_rows]
        assert len(names) >= 10
        for name in names:
            # views with parameters are called with them by the reports (tests/integration/test_security_sql.py)
            if writer.command(
                "SELECT create_table_query LIKE '%{%:%}%' FROM system.tables WHERE database = {db:String} "
                "AND name = {n:String}", parameters={"db": ledger_settings.database, "n": name},
            ) == 1:
                continue
            analyst.query(f"SELECT * FROM `{name}` LIMIT 1")
        assert analyst.command("SELECT count() FROM v_chargeback_jobs") > 0
        for sql in ("SHOW TABLES", "SHOW DATABASES", "DESCRIBE TABLE device_minutes",
                    "SELECT name, type FROM system.columns WHERE table = 'device_minutes'",
                    "EXPLAIN SELECT count() FROM device_minutes", "EXISTS TABLE device_minutes",
                    "SELECT number FROM numbers(3)", "WITH x AS (SELECT 1 AS a) SELECT a FROM x"):
            analyst.query(sql)
    finally:
        analyst.close()
        writer.close()
