"""The embedded ClickHouse as a process: one owner per path, restarts, shutdown, limits, the CLI."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError
from fixtures_clickhouse import REPO, SERVE, launch, server_env, start_server, stop_server

if TYPE_CHECKING:
    from fixtures_clickhouse import ClickHouseServer

pytest_plugins = ["fixtures_clickhouse"]
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_second_server_on_the_same_path_fails_at_once(tmp_path: Path) -> None:
    path = tmp_path / "data"
    first = start_server(path)
    try:
        started = time.monotonic()
        second = launch(path, "--port", "0", log_path=tmp_path / "second.log")
        code = second.wait(30)
        assert second.stdout is not None
        second.stdout.close()
        message = (tmp_path / "second.log").read_text()
        assert code == 2 and time.monotonic() - started < 20
        assert str(path) in message and f"process {first.pid}" in message and first.url in message
        assert "Traceback" not in message
        client = first.client()  # the owner is unaffected
        assert client.command("SELECT 1") == 1
        client.close()
    finally:
        assert stop_server(first) == 0


def test_data_persists_across_restarts_and_kill(tmp_path: Path) -> None:
    path = tmp_path / "data"
    server = start_server(path)
    client = server.client()
    client.command("CREATE TABLE kept (a UInt32) ENGINE = MergeTree ORDER BY a")
    client.insert("kept", [[i] for i in range(1000)], column_names=["a"])
    client.close()
    assert stop_server(server) == 0

    server = start_server(path)
    client = server.client()
    assert client.command("SELECT count() FROM kept") == 1000
    client.insert("kept", [[5000]], column_names=["a"])
    client.close()
    killed = server.pid
    stop_server(server, signal.SIGKILL)  # the lock goes with the process; committed data stays

    server = start_server(path)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    assert not list(shm.glob(f"gpuledger-clickhouse-spool-{killed}-*"))  # the dead server's spool is swept
    client = server.client()
    assert client.command("SELECT count() FROM kept") == 1001
    client.close()
    assert stop_server(server) == 0


def test_graceful_shutdown_finishes_inflight_inserts(tmp_path: Path) -> None:
    path = tmp_path / "data"
    server = start_server(path)
    client = server.client()
    client.command("CREATE TABLE big (a UInt64, b String) ENGINE = MergeTree ORDER BY a")
    rows = 600_000
    outcome: dict[str, Any] = {}

    def blocks() -> Any:
        # a slow producer: the server is signalled while this body is still arriving
        for start in range(0, rows, 100_000):
            time.sleep(0.2)
            yield [[i, "x"] for i in range(start, start + 100_000)]

    def one_request() -> None:
        def body() -> Any:
            for block in blocks():
                yield "".join(f"{a},{b}\n" for a, b in block).encode()

        try:
            summary = client.raw_insert("big", ["a", "b"], insert_block=body(), fmt="CSV")
            outcome["written"] = summary.written_rows
        except Exception as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=one_request)
    thread.start()
    time.sleep(0.5)
    server.process.send_signal(signal.SIGTERM)
    thread.join(60)
    assert server.process.wait(60) == 0
    assert "error" not in outcome, outcome.get("error")
    assert outcome["written"] == rows
    client.close()
    server = start_server(path)
    client = server.client()
    assert client.command("SELECT count() FROM big") == rows
    client.close()
    assert stop_server(server) == 0


def test_body_limit_and_secret_free_logs(tmp_path: Path) -> None:
    path = tmp_path / "data"
    server = start_server(path, "--max-body-mb", "1", "--verbose")
    try:
        client = server.client()
        client.command("CREATE TABLE lim (a String) ENGINE = MergeTree ORDER BY a")
        with pytest.raises(ClickHouseError):
            client.insert("lim", [["x" * 1000] for _ in range(3000)], column_names=["a"])
        assert client.command("SELECT count() FROM lim") == 0
        proc = subprocess.run(
            [
                "curl",
                "-sS",
                "-D",
                "-",
                "-o",
                "/dev/null",
                "-u",
                f"{server.user}:{server.password}",
                "--data-binary",
                "@-",
                f"{server.url}/?query=INSERT+INTO+lim+FORMAT+TSV",
            ],
            input=b"y\n" * 700_000,
            capture_output=True,
            timeout=60,
            check=True,
        )
        head = proc.stdout.decode()
        assert " 413 " in head and "X-ClickHouse-Exception-Code: 290" in head
        client.insert("lim", [["small"]], column_names=["a"])
        assert client.command("SELECT count() FROM lim") == 1
        with pytest.raises(DatabaseError):
            server.client(password="not-" + server.password)
        client.close()
        # credentials in the URL work, and stay out of the log even in a malformed request line
        url_auth = f"{server.url}/?user={server.user}&password={server.password}&query=SELECT+5"
        assert subprocess.run(["curl", "-sS", url_auth], capture_output=True, text=True, timeout=30).stdout == "5\n"
        with socket.create_connection((server.host, server.port), timeout=10) as raw:
            raw.sendall(f"GET /?password={server.analyst_password} HTTP/1.1 junk\r\n\r\n".encode())
            assert b"400" in raw.recv(4096)
    finally:
        assert stop_server(server) == 0
    log = server.log()
    assert "status=200" in log  # the verbose log did record requests
    for secret in (server.password, server.analyst_password):
        assert secret not in log


def test_listens_on_loopback_by_default_and_refuses_open_without_passwords(tmp_path: Path) -> None:
    env = server_env(GPULEDGER_STATE_DIR=str(tmp_path / "state"))
    proc = launch(tmp_path / "d1", "--port", "0", env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    open_env = {k: v for k, v in env.items() if "PASSWORD" not in k}
    result = subprocess.run(
        [*SERVE, "--path", str(tmp_path / "d2"), "--host", "0.0.0.0", "--port", "0"],
        cwd=REPO,
        env=open_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "empty password" in result.stderr and "Traceback" not in result.stderr


# -- `gpuledger sql` ---------------------------------------------------------------------------------


def _sql(server: ClickHouseServer, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = server_env(
        GPULEDGER_STATE_DIR=str(tmp_path / "state"),
        GPULEDGER_CLICKHOUSE__URL=server.url,
        GPULEDGER_CLICKHOUSE__DATABASE="cli_db",
        COLUMNS="200",
    )
    return subprocess.run(
        [sys.executable, "-m", "stack.clickhouse", "sql", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_sql_command(clickhouse_server: ClickHouseServer, tmp_path: Path) -> None:
    admin = clickhouse_server.client()
    admin.command("CREATE DATABASE IF NOT EXISTS cli_db")
    admin.command("CREATE TABLE IF NOT EXISTS cli_db.teams (team String, gpus UInt32) ENGINE = MergeTree ORDER BY team")
    admin.command("TRUNCATE TABLE cli_db.teams")
    admin.insert("cli_db.teams", [["vision", 8], ["speech", 4]], column_names=["team", "gpus"])
    admin.close()

    table = _sql(clickhouse_server, "SELECT team, gpus FROM teams ORDER BY team", tmp_path=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "team" in table.stdout and "vision" in table.stdout and "2 rows" in table.stdout
    csv = _sql(
        clickhouse_server,
        "SELECT team FROM teams WHERE gpus > {n:UInt32}",
        "--format",
        "csv",
        "--param",
        "n=5",
        tmp_path=tmp_path,
    )
    assert csv.returncode == 0 and csv.stdout == '"team"\n"vision"\n'
    js = _sql(
        clickhouse_server,
        "SELECT gpus FROM teams WHERE team = {t:String}",
        "--format",
        "json",
        "--param",
        "t=speech",
        tmp_path=tmp_path,
    )
    assert js.returncode == 0 and js.stdout.strip() == '{"gpus":4}'
    create = "CREATE TABLE IF NOT EXISTS scratch (a UInt8) ENGINE = Memory"
    refused = _sql(clickhouse_server, create, tmp_path=tmp_path)  # `sql` is the read-only analyst ...
    assert refused.returncode == 2 and refused.stderr.startswith("error:"), refused.stderr
    ddl = _sql(clickhouse_server, create, "--writer", tmp_path=tmp_path)  # ... unless --writer
    assert ddl.returncode == 0, ddl.stderr
    bad = _sql(clickhouse_server, "SELECT * FROM no_such_table", tmp_path=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "UNKNOWN_TABLE" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_sql_command_without_a_server(tmp_path: Path) -> None:
    env = server_env(GPULEDGER_STATE_DIR=str(tmp_path / "state"), GPULEDGER_CLICKHOUSE__URL="http://127.0.0.1:9")
    result = subprocess.run(
        [sys.executable, "-m", "stack.clickhouse", "sql", "SELECT 1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "cannot reach ClickHouse" in result.stderr and "Traceback" not in result.stderr


# -- the collected-handle trap, at the engine level ---------------------------------------------------


def test_stream_outlives_every_other_reference_to_its_handle(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import gc, sys
        from pathlib import Path
        from stack.clickhouse.engine import Engine
        engine = Engine(Path({str(tmp_path / "data")!r}))
        handle = engine.open_handle()
        stream = handle.stream("SELECT number FROM numbers(200000) SETTINGS max_block_size = 1000", "Native", {{}})
        chunks = iter(stream)
        next(chunks)
        del handle             # nothing but the stream refers to the handle now
        gc.collect()
        rest = sum(1 for _ in chunks)   # must finish, not block on a collected handle
        print("chunks", rest + 1)
        engine.close()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("chunks ")


def test_sessions_are_bounded(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--max-sessions", "2")
    try:
        clients = [server.client(session_id=f"bounded-{i}") for i in range(3)]
        clients[0].command("CREATE TEMPORARY TABLE mine (a UInt8)")
        clients[1].command("CREATE TEMPORARY TABLE mine (a UInt8)")
        clients[2].command("SELECT 1")  # a third session evicts the least recently used idle one
        assert clients[1].command("EXISTS TEMPORARY TABLE mine") == 1
        assert clients[0].command("EXISTS TEMPORARY TABLE mine") == 0
        # every session busy: a new one is refused with an error, never a retry status
        slow = [threading.Thread(target=c.command, args=("SELECT sleep(2)",)) for c in clients[:2]]
        for thread in slow:
            thread.start()
        time.sleep(0.5)
        result = subprocess.run(
            [
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-D",
                "-",
                "-u",
                f"{server.user}:{server.password}",
                "--data-binary",
                "SELECT 1",
                f"{server.url}/?session_id=bounded-new",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        for thread in slow:
            thread.join()
        assert "X-ClickHouse-Exception-Code: 202" in result.stdout
        assert result.stdout.strip().endswith("500")
        for client in clients:
            client.close()
    finally:
        assert stop_server(server) == 0


def test_path_held_by_another_chdb_process_is_named(tmp_path: Path) -> None:
    path = tmp_path / "data"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import chdb, sys, time; c = chdb.connect({str(path)!r}); c.query('SELECT 1'); "
            "print('open', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        result = subprocess.run(
            [*SERVE, "--path", str(path), "--port", "0"],
            cwd=REPO,
            env=server_env(GPULEDGER_STATE_DIR=str(tmp_path / "state")),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert str(path) in result.stderr and f"process {holder.pid}" in result.stderr
    finally:
        holder.kill()
        holder.wait(10)
        assert holder.stdout is not None
        holder.stdout.close()
