"""Pytest plugin: a real embedded ClickHouse server (chDB behind the HTTP interface) for tests.

Load it with `pytest_plugins = ["fixtures_clickhouse"]` (tests/conftest.py does).

Fixtures
  clickhouse_server    session-scoped `ClickHouseServer`: a `python -m stack.clickhouse clickhouse serve`
                       subprocess on a free loopback port with a temporary data path. Attributes:
                       url, host, port, user, password (writer), analyst_user, analyst_password
                       (read-only), path, pid; methods client(**kw) / analyst_client(**kw) return
                       clickhouse-connect clients (closed by the caller).
  clickhouse_database  a unique database for one test, dropped afterwards.
  clickhouse_client    factory: clickhouse_client(**kw) -> writer client bound to that database;
                       every client it made is closed after the test.
  ledger_client        a writer client (sinks.db.connect) on that database with every migration and view
                       applied; write_job_events(client, records) stores job events as the sink does.

Helpers for tests that need their own server (restarts, locks, shutdown):
  start_server(path, **options) -> ClickHouseServer;  stop_server(server, sig) -> exit code.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import clickhouse_connect
import pytest
from clickhouse_connect.driver.client import Client

REPO = Path(__file__).resolve().parents[1]
SERVE = (sys.executable, "-m", "stack.clickhouse", "clickhouse", "serve")  # the embedded server's command
WRITER_PASSWORD = "writer-" + uuid.uuid4().hex[:12]
ANALYST_PASSWORD = "analyst-" + uuid.uuid4().hex[:12]
_READY = re.compile(r"listening on (http://(\S+):(\d+))")


@dataclass
class ClickHouseServer:
    url: str
    host: str
    port: int
    path: Path
    process: subprocess.Popen[str] = field(repr=False)
    user: str = "gpuledger"
    password: str = field(default=WRITER_PASSWORD, repr=False)
    analyst_user: str = "analyst"
    analyst_password: str = field(default=ANALYST_PASSWORD, repr=False)
    log_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def client(self, **kwargs: Any) -> Client:
        kwargs.setdefault("username", self.user)
        kwargs.setdefault("password", self.password)
        return clickhouse_connect.get_client(host=self.host, port=self.port, **kwargs)

    def analyst_client(self, **kwargs: Any) -> Client:
        return self.client(username=self.analyst_user, password=self.analyst_password, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


def server_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(
        {
            "GPULEDGER_CONFIG": str(REPO / "tests" / "no-such-gpuledger.toml"),
            "GPULEDGER_CLICKHOUSE__PASSWORD": WRITER_PASSWORD,
            "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": ANALYST_PASSWORD,
        }
    )
    env.update(extra)
    return env


def launch(
    path: Path, *args: str, env: dict[str, str] | None = None, log_path: Path | None = None
) -> subprocess.Popen[str]:
    """Start `serve` without waiting for it; stdout is a pipe, stderr goes to log_path."""
    log_file = open(log_path or os.devnull, "a")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [*SERVE, "--path", str(path), *args],
            cwd=REPO,
            env=env or server_env(GPULEDGER_STATE_DIR=str(path.parent / "state")),
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
        )
    finally:
        log_file.close()


def start_server(
    path: Path, *args: str, port: int = 0, timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> ClickHouseServer:
    """A running server on `path` (extra CLI options in args); raises with its log if it fails."""
    log_path = path.parent / f"{path.name}-server.log"
    proc = launch(path, "--host", "127.0.0.1", "--port", str(port), *args, env=env, log_path=log_path)
    line: list[str] = []

    def read_line() -> None:
        assert proc.stdout is not None
        line.append(proc.stdout.readline())

    reader = threading.Thread(target=read_line, daemon=True)
    reader.start()
    reader.join(timeout_s)
    match = _READY.search(line[0]) if line else None
    if match is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(10)
        raise RuntimeError(f"embedded ClickHouse did not start: {log_path.read_text(errors='replace')}")
    return ClickHouseServer(
        url=match.group(1),
        host=match.group(2),
        port=int(match.group(3)),
        path=path,
        process=proc,
        log_path=log_path,
    )


def stop_server(server: ClickHouseServer, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
    if server.process.poll() is None:
        server.process.send_signal(sig)
    try:
        return server.process.wait(timeout_s)
    finally:
        if server.process.stdout is not None:
            server.process.stdout.close()


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    server = start_server(tmp_path_factory.mktemp("clickhouse") / "data")
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def clickhouse_database(clickhouse_server: ClickHouseServer) -> Iterator[str]:
    name = "test_" + uuid.uuid4().hex[:16]
    admin = clickhouse_server.client()
    admin.command(f"CREATE DATABASE {name}")
    try:
        yield name
    finally:
        admin.command(f"DROP DATABASE IF EXISTS {name} SYNC")
        admin.close()


@pytest.fixture
def clickhouse_client(clickhouse_server: ClickHouseServer, clickhouse_database: str) -> Iterator[Callable[..., Client]]:
    made: list[Client] = []

    def make(**kwargs: Any) -> Client:
        kwargs.setdefault("database", clickhouse_database)
        client = clickhouse_server.client(**kwargs)
        made.append(client)
        return client

    try:
        yield make
    finally:
        for client in made:
            client.close()


@pytest.fixture
def ledger_database(clickhouse_server: ClickHouseServer, clickhouse_database: str) -> Iterator[tuple[Any, Any]]:
    """The test's database migrated: a writer's client and the database's ClickHouseSettings (both logins)."""
    from base.settings import ClickHouseSettings
    from sinks.db import connect, migrate

    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    try:
        yield client, ch
    finally:
        client.close()


@pytest.fixture
def ledger_client(ledger_database: tuple[Any, Any]) -> Any:
    return ledger_database[0]


def write_job_events(client: Any, records: list[dict[str, Any]]) -> None:
    """Job events stored in `job_events` by the sinks' own writer (its rows of each record); none refused."""
    from schemas import topics
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending

    events, _ = SINKS[topics.JOB_EVENTS.name]
    pending = [Pending(events, row, Origin("e", 0, i)) for i, r in enumerate(records) for row in events.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
