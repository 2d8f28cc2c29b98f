"""The embedded ClickHouse, driven only through unmodified clickhouse-connect and curl.

One server subprocess for the module (the `clickhouse_server` fixture); each test gets its own
database. Tests that stop, restart or lock a server live in test_embedded_clickhouse_process.py.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import subprocess
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import lz4.frame
import pandas as pd
import pyarrow as pa
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, StreamFailureError

if TYPE_CHECKING:
    from fixtures_clickhouse import ClickHouseServer

pytest_plugins = ["fixtures_clickhouse"]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

NEVER_STATUSES = {429, 503, 504}


def curl(
    server: ClickHouseServer,
    *args: str,
    user: str | None = None,
    password: str | None = None,
    path: str = "/",
    data: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request with curl; returns (status, headers with lower-case names, body)."""
    auth = f"{user or server.user}:{server.password if password is None else password}"
    cmd = ["curl", "-sS", "-D", "-", "-u", auth, *args, f"{server.url}{path}"]
    if data is not None:
        cmd[1:1] = ["--data-binary", "@-"]
    proc = subprocess.run(cmd, input=data, capture_output=True, timeout=60, check=True)
    out = proc.stdout
    while out.startswith(b"HTTP/1.1 100"):
        out = out.partition(b"\r\n\r\n")[2]
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def q(database: str, sql: str) -> str:
    from urllib.parse import urlencode

    return "?" + urlencode({"database": database, "query": sql})


# -- handshake, ping, headers ----------------------------------------------------------------------


def test_handshake_and_ping(clickhouse_server: ClickHouseServer, clickhouse_client: Any) -> None:
    client = clickhouse_client()
    version = client.command("SELECT version()")
    assert client.server_version == version
    assert client.server_tz is not None
    status, _, body = curl(clickhouse_server, path="/ping")
    assert (status, body) == (200, b"Ok.\n")
    status, headers, body = curl(clickhouse_server, data=b"SELECT version(), timezone()")
    assert status == 200
    assert body.decode().split("\t")[0] == version
    assert headers["x-clickhouse-format"] == "TabSeparated"
    assert headers["x-clickhouse-timezone"]


def test_response_headers(clickhouse_server: ClickHouseServer, clickhouse_database: str) -> None:
    query_id = "qid-" + uuid.uuid4().hex
    status, headers, body = curl(
        clickhouse_server,
        path=q(clickhouse_database, "SELECT 1 AS x FORMAT JSONEachRow") + f"&query_id={query_id}&wait_end_of_query=1",
    )
    assert status == 200 and json.loads(body) == {"x": 1}
    assert headers["x-clickhouse-query-id"] == query_id
    assert headers["x-clickhouse-format"] == "JSONEachRow"
    assert headers["x-clickhouse-timezone"]
    summary = json.loads(headers["x-clickhouse-summary"])
    assert all(isinstance(v, str) for v in summary.values()) and "read_rows" in summary
    # a command: no format header
    status, headers, _ = curl(
        clickhouse_server, path=q(clickhouse_database, "CREATE TABLE h (a UInt8) ENGINE=Memory"), data=b""
    )
    assert status == 200 and "x-clickhouse-format" not in headers
    # an insert reports what it wrote
    status, headers, _ = curl(
        clickhouse_server, path=q(clickhouse_database, "INSERT INTO h FORMAT CSV"), data=b"1\n2\n3\n"
    )
    assert status == 200 and json.loads(headers["x-clickhouse-summary"])["written_rows"] == "3"


# -- commands and DDL --------------------------------------------------------------------------------


def test_commands_and_engines(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    client.command("CREATE TABLE raw (k UInt32, v Float64, ts DateTime) ENGINE = MergeTree ORDER BY k")
    client.command("CREATE TABLE latest (k UInt32, v Float64, ver UInt64) ENGINE = ReplacingMergeTree(ver) ORDER BY k")
    client.command(
        "CREATE TABLE agg (k UInt32, total AggregateFunction(sum, Float64)) ENGINE = AggregatingMergeTree ORDER BY k"
    )
    client.command("CREATE MATERIALIZED VIEW agg_mv TO agg AS SELECT k, sumState(v) AS total FROM raw GROUP BY k")
    client.insert(
        "raw",
        [[1, 1.5, dt.datetime(2024, 1, 1)], [1, 2.5, dt.datetime(2024, 1, 1)], [2, 4.0, dt.datetime(2024, 1, 1)]],
        column_names=["k", "v", "ts"],
    )
    client.insert("latest", [[1, 1.0, 1], [1, 9.0, 2]], column_names=["k", "v", "ver"])
    assert client.query("SELECT k, sumMerge(total) FROM agg GROUP BY k ORDER BY k").result_rows == [(1, 4.0), (2, 4.0)]
    assert client.query("SELECT v FROM latest FINAL").result_rows == [(9.0,)]
    assert client.command("SELECT 1") == 1
    assert client.command("SELECT 'a', 'b'") == ["a", "b"]
    assert client.command("SELECT 1 WHERE 0") == ""
    summary = client.command("ALTER TABLE raw DELETE WHERE k = 2 SETTINGS mutations_sync = 1")
    assert hasattr(summary, "summary")
    assert client.command("EXISTS TABLE raw") == 1


# -- inserts -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", ["lz4", "zstd", False])
def test_inserts_every_compression(clickhouse_client: Any, compress: Any) -> None:
    client = clickhouse_client(compress=compress)
    client.command(
        "CREATE TABLE t (id UInt64, name String, score Nullable(Float64), tags Array(String)) "
        "ENGINE = MergeTree ORDER BY id"
    )
    rows = [[i, f"n{i}", None if i % 3 == 0 else i / 2, [str(i)] * (i % 4)] for i in range(20_000)]
    summary = client.insert("t", rows, column_names=["id", "name", "score", "tags"])
    assert summary.written_rows == 20_000
    df = pd.DataFrame({"id": range(20_000, 20_100), "name": "df", "score": 1.0, "tags": [["a"]] * 100})
    assert client.insert_df("t", df).written_rows == 100
    table = pa.table(
        {
            "id": pa.array(range(30_000, 30_050), pa.uint64()),
            "name": ["arrow"] * 50,
            "score": [2.0] * 50,
            "tags": [["b", "c"]] * 50,
        }
    )
    client.insert_arrow("t", table)
    assert client.command("SELECT count() FROM t") == 20_150
    assert client.query("SELECT name, tags FROM t WHERE id = 7").result_rows == [("n7", ["7", "7", "7"])]
    assert client.command("SELECT count() FROM t WHERE score IS NULL") == len(range(0, 20_000, 3))


def test_insert_bodies_from_curl(clickhouse_server: ClickHouseServer, clickhouse_database: str) -> None:
    db = clickhouse_database
    create = "CREATE TABLE c (a UInt32, b String) ENGINE = MergeTree ORDER BY a"
    assert curl(clickhouse_server, path=q(db, create), data=b"")[0] == 200
    # chunked, lz4 frames, statement in the body
    body = lz4.frame.compress(b"INSERT INTO c FORMAT CSV\n1,one\n") + lz4.frame.compress(b"2,two\n")
    status, _, _ = curl(
        clickhouse_server,
        "-H",
        "Transfer-Encoding: chunked",
        "-H",
        "Content-Encoding: lz4",
        path=f"?database={db}",
        data=body,
    )
    assert status == 200
    # gzip, statement in the query parameter
    status, _, _ = curl(
        clickhouse_server,
        "-H",
        "Content-Encoding: gzip",
        path=q(db, "INSERT INTO c FORMAT TSV"),
        data=gzip.compress(b"3\tthree\n"),
    )
    assert status == 200
    # plain VALUES in the body
    assert curl(clickhouse_server, path=f"?database={db}", data=b"INSERT INTO c VALUES (4, 'four')")[0] == 200
    status, _, body = curl(clickhouse_server, path=q(db, "SELECT a, b FROM c ORDER BY a FORMAT CSV"))
    assert body.decode().splitlines() == ['1,"one"', '2,"two"', '3,"three"', '4,"four"']


def test_constraint_and_view_failures_are_reported(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    client.command("CREATE TABLE checked (a UInt32, CONSTRAINT small CHECK a < 100) ENGINE = MergeTree ORDER BY a")
    with pytest.raises(DatabaseError) as err:
        client.insert("checked", [[1], [500]], column_names=["a"])
    assert err.value.code == 469 and "small" in str(err.value)
    assert client.command("SELECT count() FROM checked") == 0

    client.command("CREATE TABLE src (a UInt32) ENGINE = MergeTree ORDER BY a")
    client.command("CREATE TABLE dst (a UInt32) ENGINE = MergeTree ORDER BY a")
    client.command(
        "CREATE MATERIALIZED VIEW mv TO dst AS SELECT throwIf(a = 7, 'seven is not allowed') + a AS a FROM src"
    )
    with pytest.raises(DatabaseError, match="seven is not allowed"):
        client.insert("src", [[6], [7]], column_names=["a"])
    assert client.command("SELECT count() FROM dst") == 0


# -- queries -------------------------------------------------------------------------------------------


def test_query_variants_and_streams(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    client.command("CREATE TABLE n (id UInt64, label LowCardinality(String), v Float32) ENGINE = MergeTree ORDER BY id")
    client.command("INSERT INTO n SELECT number, toString(number % 5), number / 2 FROM numbers(50000)")
    res = client.query("SELECT id, label FROM n ORDER BY id LIMIT 3")
    assert res.column_names == ("id", "label") and res.result_rows == [(0, "0"), (1, "1"), (2, "2")]
    df = client.query_df("SELECT label, count() AS c FROM n GROUP BY label ORDER BY label")
    assert list(df["c"]) == [10000] * 5
    table = client.query_arrow("SELECT id FROM n WHERE id < 10")
    assert table.num_rows == 10
    sql = "SELECT id, v FROM n SETTINGS max_block_size = 4096"
    with client.query_row_block_stream(sql) as stream:
        assert sum(len(block) for block in stream) == 50000
    with client.query_column_block_stream(sql) as stream:
        assert sum(len(block[0]) for block in stream) == 50000
    with client.query_df_stream(sql) as stream:
        assert sum(len(frame) for frame in stream) == 50000
    with client.query_arrow_stream(sql) as stream:
        assert sum(batch.num_rows for batch in stream) == 50000
    assert client.raw_query("SELECT 1 AS a FORMAT CSVWithNames") == b'"a"\n1\n'


def test_bound_parameters_including_multipart(
    clickhouse_client: Any, clickhouse_server: ClickHouseServer, clickhouse_database: str
) -> None:
    client = clickhouse_client()
    res = client.query("SELECT {a:UInt32} + 1 AS x, {s:String} AS s", parameters={"a": 41, "s": "it's"})
    assert res.result_rows == [(42, "it's")]
    big = "x" * 20_000  # over 4 KB of binds: the client sends a multipart form
    assert client.query("SELECT length({big:String})", parameters={"big": big}).result_rows == [(20_000,)]
    forced = clickhouse_client(form_encode_query_params=True)
    assert forced.query("SELECT {n:Int8} * 2", parameters={"n": 4}).result_rows == [(8,)]
    status, _, body = curl(
        clickhouse_server,
        "-F",
        "query=SELECT {v:String}",
        "-F",
        "param_v=form value",
        path=f"?database={clickhouse_database}",
    )
    assert (status, body) == (200, b"form value\n")
    with pytest.raises(DatabaseError) as err:
        client.query("SELECT {missing:UInt8}")
    assert err.value.code == 456


def test_per_query_settings_do_not_stick(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    default = client.command("SELECT getSetting('max_block_size')")
    assert client.command("SELECT getSetting('max_block_size')", settings={"max_block_size": 777}) == 777
    assert client.command("SELECT getSetting('max_block_size')") == default
    res = client.query("SELECT getSetting('max_threads') AS t", settings={"max_threads": 1})
    assert str(res.result_rows[0][0]) == "1"
    with pytest.raises(DatabaseError) as err:
        client.query("SELECT 1", settings={"no_such_setting_at_all": 1})
    assert err.value.code == 115
    assert client.command("SELECT 2") == 2


def test_database_parameter(
    clickhouse_server: ClickHouseServer, clickhouse_client: Any, clickhouse_database: str
) -> None:
    client = clickhouse_client()
    client.command("CREATE TABLE here (a UInt8) ENGINE = Memory")
    client.command("INSERT INTO here VALUES (5)")
    assert client.command("SELECT currentDatabase()") == clickhouse_database
    assert client.command("SELECT a FROM here") == 5
    other = clickhouse_server.client()  # no database: 'default'
    try:
        assert other.command("SELECT currentDatabase()") == "default"
        assert other.command(f"SELECT a FROM {clickhouse_database}.here") == 5
    finally:
        other.close()
    with pytest.raises(DatabaseError) as err:
        clickhouse_client(database="no_such_db_" + uuid.uuid4().hex[:6])
    assert err.value.code == 81


# -- sessions ------------------------------------------------------------------------------------------


def test_session_state(clickhouse_client: Any) -> None:
    first = clickhouse_client()
    second = clickhouse_client()
    first.command("SET max_threads = 3")
    first.command("CREATE TEMPORARY TABLE scratch (x UInt8)")
    first.command("INSERT INTO scratch VALUES (1), (2)")
    assert first.command("SELECT count() FROM scratch") == 2
    assert str(first.command("SELECT getSetting('max_threads')")) == "3"
    first.command("USE system")
    assert first.command("SELECT currentDatabase()") in ("system", first.database)
    with pytest.raises(DatabaseError):
        second.command("SELECT count() FROM scratch")
    assert str(second.command("SELECT getSetting('max_threads')")) != "3"
    # a session-less request does not leak SET into the next one
    sessionless = clickhouse_client(autogenerate_session_id=False)
    sessionless.command("SET max_threads = 5")
    assert str(sessionless.command("SELECT getSetting('max_threads')")) != "5"


def test_session_idle_expiry_and_check(clickhouse_server: ClickHouseServer, clickhouse_client: Any) -> None:
    session = "s-" + uuid.uuid4().hex
    client = clickhouse_client(session_id=session, settings={"session_timeout": 1})
    client.command("CREATE TEMPORARY TABLE short_lived (x UInt8)")
    assert client.command("EXISTS TEMPORARY TABLE short_lived") == 1
    time.sleep(3.0)
    # expired: the same id starts a fresh session, and nothing hangs on the closed handle
    assert client.command("EXISTS TEMPORARY TABLE short_lived") == 0
    with client.query_row_block_stream("SELECT number FROM numbers(10000) SETTINGS max_block_size=100") as stream:
        assert sum(len(b) for b in stream) == 10000
    status, headers, _body = curl(
        clickhouse_server, path=f"?session_id=none-{uuid.uuid4().hex}&session_check=1", data=b"SELECT 1"
    )
    assert status == 404 and headers["x-clickhouse-exception-code"] == "372"


def test_concurrent_use_of_one_session_is_refused(clickhouse_server: ClickHouseServer) -> None:
    session = "busy-" + uuid.uuid4().hex
    results: list[tuple[int, dict[str, str], bytes]] = []
    slow = threading.Thread(
        target=lambda: results.append(curl(clickhouse_server, path=f"?session_id={session}", data=b"SELECT sleep(1.5)"))
    )
    slow.start()
    time.sleep(0.5)
    status, headers, _ = curl(clickhouse_server, path=f"?session_id={session}", data=b"SELECT 1")
    slow.join()
    assert headers.get("x-clickhouse-exception-code") == "373" and status not in NEVER_STATUSES
    assert results[0][0] == 200


# -- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "code", "status"),
    [
        ("SELECT * FROM no_such_table", 60, 404),
        ("SELEC 1", 62, 400),
        ("SELECT throwIf(1, 'thrown')", 395, 500),
        ("SELECT sleep(3) SETTINGS max_execution_time = 0.5, timeout_overflow_mode = 'throw'", None, None),
    ],
)
def test_errors_carry_code_and_never_a_retry_status(
    clickhouse_server: ClickHouseServer, clickhouse_client: Any, sql: str, code: int | None, status: int | None
) -> None:
    got_status, headers, body = curl(clickhouse_server, data=sql.encode())
    assert got_status not in NEVER_STATUSES and got_status >= 400
    assert body.startswith(b"Code: ") and b"DB::Exception" in body
    assert headers["x-clickhouse-exception-code"] == body[6:].split(b".")[0].decode()
    if code is not None:
        assert headers["x-clickhouse-exception-code"] == str(code) and got_status == status
    with pytest.raises(DatabaseError) as err:
        clickhouse_client().query(sql)
    assert err.value.code == int(headers["x-clickhouse-exception-code"])


def test_mid_stream_error(clickhouse_server: ClickHouseServer, clickhouse_client: Any) -> None:
    sql = "SELECT number, throwIf(number = 30000, 'late failure') FROM numbers(100000) SETTINGS max_block_size = 1000"
    client = clickhouse_client()
    with pytest.raises(StreamFailureError, match="late failure"), client.query_row_block_stream(sql) as stream:
        for _ in stream:
            pass
    assert client.command("SELECT 3") == 3  # the session survives
    status, headers, body = curl(clickhouse_server, data=(sql + " FORMAT TSV").encode())
    tag = headers["x-clickhouse-exception-tag"]
    assert status == 200 and body.startswith(b"0\t0\n")
    assert f"__exception__\r\n{tag}\r\n".encode() in body and f" {tag}\r\n__exception__\r\n".encode() in body


# -- chDB traps ----------------------------------------------------------------------------------------


def test_empty_results_keep_their_columns(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    client.command(
        "CREATE TABLE e (id UInt32, name String, at DateTime('Europe/Paris')) ENGINE = MergeTree ORDER BY id"
    )
    res = client.query("SELECT * FROM e")
    assert res.column_names == ("id", "name", "at") and res.result_rows == []
    assert [t.name for t in res.column_types] == ["UInt32", "String", "DateTime('Europe/Paris')"]
    bound = client.query("SELECT id, name FROM e WHERE id > {m:UInt32}", parameters={"m": 3})
    assert bound.column_names == ("id", "name")
    with client.query_column_block_stream("SELECT id, name FROM e") as stream:
        blocks = list(stream)
        assert all(len(column) == 0 for block in blocks for column in block)
        assert stream.source.column_names == ("id", "name")
    assert client.query("SHOW TABLES LIKE 'nothing%'").column_names == ("name",)


def test_empty_result_with_low_cardinality_columns(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    client.command("CREATE TABLE lc_empty (k LowCardinality(String), n Nullable(Int32)) ENGINE = MergeTree ORDER BY k")
    res = client.query("SELECT k, n FROM lc_empty WHERE k = {k:String}", parameters={"k": "x' OR 1=1 --"})
    assert res.result_rows == []
    assert res.column_names == ("k", "n")
    assert [t.name for t in res.column_types] == ["LowCardinality(String)", "Nullable(Int32)"]


def test_datetime_zone_survives(clickhouse_client: Any) -> None:
    client = clickhouse_client()
    client.command(
        "CREATE TABLE z (name String, tags Array(String), lc LowCardinality(String), n Nullable(Int32), "
        "at DateTime('Asia/Tokyo'), plain DateTime, at64 DateTime64(3, 'America/New_York')) "
        "ENGINE = MergeTree ORDER BY name"
    )
    moment = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)
    client.insert(
        "z",
        [["a", ["x", "yy"], "k", None, moment, moment, moment], ["bb", [], "k", 3, moment, moment, moment]],
        column_names=["name", "tags", "lc", "n", "at", "plain", "at64"],
    )
    res = client.query("SELECT * FROM z ORDER BY name")
    types = {name: t.name for name, t in zip(res.column_names, res.column_types, strict=True)}
    assert types["at"] == "DateTime('Asia/Tokyo')" and types["plain"] == "DateTime"
    at = res.result_rows[0][4]
    assert at == moment and str(at.tzinfo) == "Asia/Tokyo"
    with client.query_row_block_stream("SELECT name, at FROM z ORDER BY name") as stream:
        rows = [row for block in stream for row in block]
    assert str(rows[1][1].tzinfo) == "Asia/Tokyo"
    df = client.query_df("SELECT at FROM z")
    assert str(df["at"].dt.tz) == "Asia/Tokyo"


def test_abandoned_stream_never_hangs_the_session(clickhouse_client: Any) -> None:
    client = clickhouse_client(session_id="abandon-" + uuid.uuid4().hex)
    for _ in range(3):
        with client.query_row_block_stream(
            "SELECT number FROM numbers(5000000) SETTINGS max_block_size = 1000"
        ) as stream:
            next(iter(stream))  # read one block, then walk away
        started = time.monotonic()
        with client.query_row_block_stream("SELECT number FROM numbers(100)") as stream:
            assert sum(len(b) for b in stream) == 100
        assert client.command("SELECT 4") == 4
        assert time.monotonic() - started < 10


# -- concurrency and users -----------------------------------------------------------------------------


def test_concurrent_clients_do_not_block_each_other(
    clickhouse_server: ClickHouseServer, clickhouse_client: Any
) -> None:
    writer = clickhouse_client()
    writer.command("CREATE TABLE busy (a UInt64) ENGINE = MergeTree ORDER BY a")
    analyst = clickhouse_server.analyst_client()
    slow_done: list[float] = []

    def slow() -> None:
        started = time.monotonic()
        analyst.command("SELECT sleep(2)")
        slow_done.append(time.monotonic() - started)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    for i in range(10):
        writer.insert("busy", [[i]], column_names=["a"])
        assert writer.command("SELECT 1") == 1
    elapsed = time.monotonic() - started
    thread.join()
    analyst.close()
    assert slow_done and slow_done[0] >= 1.9
    assert elapsed < 1.5, f"writer waited {elapsed:.2f}s behind the analyst's slow query"


LEDGER_DATABASE = "gpuledger"  # the server's default clickhouse.database: the one the analyst reads


def test_users_and_readonly(clickhouse_server: ClickHouseServer, clickhouse_client: Any) -> None:
    """The analyst reads the ledger database and nothing else; writes are refused on the engine's parse
    of the statement (497) before they reach the read-only handle (which would refuse them too)."""
    writer = clickhouse_client()
    ledger = LEDGER_DATABASE
    writer.command(f"CREATE DATABASE IF NOT EXISTS {ledger}")
    writer.command(f"CREATE OR REPLACE TABLE {ledger}.r (a UInt8) ENGINE = MergeTree ORDER BY a")
    writer.command(f"INSERT INTO {ledger}.r VALUES (1)")
    analyst = clickhouse_server.analyst_client(database=ledger)
    try:
        assert analyst.command("SELECT count() FROM r") == 1
        assert analyst.query("SELECT a FROM r").result_rows == [(1,)]
        for statement in (
            "INSERT INTO r VALUES (2)",
            "CREATE TABLE r2 (a UInt8) ENGINE = Memory",
            "DROP TABLE r",
            "SET readonly = 0",
        ):
            with pytest.raises(DatabaseError) as err:
                analyst.command(statement)
            assert err.value.code == 497, statement
        with pytest.raises(DatabaseError) as err:
            analyst.insert("r", [[3]], column_names=["a"])
        assert err.value.code == 497
        with pytest.raises(DatabaseError) as err:  # no reading the server's files
            analyst.query("SELECT * FROM file('/etc/hostname', 'LineAsString')")
        assert err.value.code == 497
    finally:
        analyst.close()
    status, headers, _ = curl(
        clickhouse_server,
        user=clickhouse_server.analyst_user,
        password=clickhouse_server.analyst_password,
        path=q(ledger, "DROP TABLE r"),
        data=b"",
    )
    assert status == 403 and headers["x-clickhouse-exception-code"] == "497"
    assert writer.command(f"SELECT count() FROM {ledger}.r") == 1
    # a per-request readonly setting from the writer applies to that request only (the engine refuses)
    with pytest.raises(DatabaseError) as err:
        writer.command(f"INSERT INTO {ledger}.r SELECT 9", settings={"readonly": 1})
    assert err.value.code == 164
    writer.command(f"INSERT INTO {ledger}.r VALUES (2)")
    assert writer.command(f"SELECT count() FROM {ledger}.r") == 2
    writer.command(f"DROP TABLE {ledger}.r SYNC")


def test_authentication(clickhouse_server: ClickHouseServer) -> None:
    status, headers, body = curl(clickhouse_server, password="wrong", data=b"SELECT 1")
    assert status == 401 and headers["x-clickhouse-exception-code"] == "516"
    assert clickhouse_server.password.encode() not in body
    proc = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", "SELECT 1", clickhouse_server.url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert proc.stdout == "401"  # no credentials at all
    proc = subprocess.run(
        [
            "curl",
            "-sS",
            "-H",
            f"X-ClickHouse-User: {clickhouse_server.analyst_user}",
            "-H",
            f"X-ClickHouse-Key: {clickhouse_server.analyst_password}",
            "--data-binary",
            "SELECT 7",
            clickhouse_server.url,
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert proc.stdout == "7\n"
    with pytest.raises(DatabaseError) as err:
        clickhouse_server.client(password="nope")
    assert err.value.code == 516


def test_client_that_hangs_up_mid_stream_frees_its_session(clickhouse_server: ClickHouseServer) -> None:
    import base64
    import socket

    session = "hangup-" + uuid.uuid4().hex
    auth = base64.b64encode(f"{clickhouse_server.user}:{clickhouse_server.password}".encode()).decode()
    sql = b"SELECT number, toString(number) FROM numbers(50000000) SETTINGS max_block_size = 10000 FORMAT TSV"
    request = (
        f"POST /?session_id={session} HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {auth}\r\n"
        f"Content-Length: {len(sql)}\r\n\r\n"
    ).encode() + sql
    with socket.create_connection((clickhouse_server.host, clickhouse_server.port), timeout=30) as raw:
        raw.sendall(request)
        received = 0
        while received < 256 * 1024:
            received += len(raw.recv(65536))
    started = time.monotonic()
    while True:  # the server notices the hang-up, cancels the stream and releases the session
        status, headers, body = curl(clickhouse_server, path=f"?session_id={session}", data=b"SELECT 42")
        if headers.get("x-clickhouse-exception-code") != "373":
            break
        assert time.monotonic() - started < 20, "the session stayed locked after the client left"
        time.sleep(0.1)
    assert (status, body) == (200, b"42\n")


@pytest.mark.parametrize(("fmt", "select_fmt"), [("Native", "Native"), ("CSV", "CSV")])
def test_a_body_that_fails_midway_stores_nothing(
    clickhouse_server: ClickHouseServer, clickhouse_database: str, fmt: str, select_fmt: str
) -> None:
    db = clickhouse_database
    assert (
        curl(clickhouse_server, path=q(db, "CREATE TABLE cut (a UInt64) ENGINE = MergeTree ORDER BY a"), data=b"")[0]
        == 200
    )
    _, _, data = curl(
        clickhouse_server,
        path=q(db, f"SELECT number AS a FROM numbers(100000) SETTINGS max_block_size = 10000 FORMAT {select_fmt}"),
    )
    body = lz4.frame.compress(f"INSERT INTO cut FORMAT {fmt}\n".encode() + data)[:-10]  # the frame is cut short
    status, headers, _ = curl(clickhouse_server, "-H", "Content-Encoding: lz4", path=f"?database={db}", data=body)
    assert status == 400 and headers["x-clickhouse-exception-code"] == "354"
    assert curl(clickhouse_server, path=q(db, "SELECT count() FROM cut"))[2] == b"0\n"
