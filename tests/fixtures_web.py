"""The team page's test ledger: a real pipeline run over the simulator, stored in the embedded ClickHouse.

`seed_simulated_ledger(client, cfg)` runs the simulator's records through the processors in memory (the
same stage objects the Kafka runtime drives) and writes what the sinks would (job events, device-minutes,
job-minutes, alerts, actions) with the sinks' own writer; `expected_ledger(cfg)` (written from the
simulator's ground truth, no processor code) is what the pages must agree with.

Fixtures (import them into a test module: `from fixtures_web import web_ledger, web_settings, web_app`):
  web_ledger    session-scoped: (ClickHouseSettings of a fresh migrated database with the rate card, SimConfig)
  small_ledger  function-scoped: ClickHouseSettings of a fresh database with the SMALL ledger (tests may change it)
  web_settings  Settings pointed at it, cluster "sim" (the simulator's registry and directory), demo off
  web_app       a Starlette TestClient of the app, as if from 127.0.0.1 (a trusted proxy address)
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from base.processor_settings import IdlePolicy, ProcessorSettings
from base.settings import BrokerSettings, ClickHouseSettings, Settings, WebSettings
from producers.simulator import SimConfig, simulate

REPO = Path(__file__).resolve().parents[1]
SIM = SimConfig(seed=5, nodes=3, duration_s=7200)  # 2 March 2026 11:30-13:30 UTC: lunch idles notebooks
PERIOD = "2026-03"
END_MS = SIM.start_ms + SIM.duration_s * 1000
SMALL = SimConfig(seed=11, nodes=1, duration_s=1800)  # a small ledger a test may change (its own database)
POLICY = IdlePolicy(idle_after_min_interactive=10, idle_after_min_batch=15, grace_min=5)


def seed_simulated_ledger(client: Any, cfg: SimConfig = SIM) -> dict[str, int]:
    from processors.pipeline import run_in_memory
    from schemas import topics
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending

    records = list(simulate(cfg))
    result = run_in_memory(records, ProcessorSettings(idle=POLICY))
    events = [r for topic, _, r in records if topic.name == topics.JOB_EVENTS.name]
    sources = {
        topics.JOB_EVENTS.name: events,
        topics.DEVICE_MINUTES.name: result.device_minutes,
        topics.JOB_MINUTES.name: result.job_minutes,
        topics.ALERTS.name: result.alerts,
        topics.RECLAIM_ACTIONS.name: result.actions,
    }
    pending = []
    for name, rows in sources.items():
        for spec in SINKS[name]:
            pending += [Pending(spec, row, Origin(name, 0, i)) for i, r in enumerate(rows) for row in spec.rows(r)]
    written = LedgerWriter(client).write(pending)
    assert not written.rejected, written.rejected[:3]
    return dict(written.inserted)


@contextlib.contextmanager
def priced_database(clickhouse_server: Any, prefix: str) -> Iterator[tuple[ClickHouseSettings, Any]]:
    """A fresh database migrated, with the first rate card in it, dropped afterwards; yields its settings and a
    writer's client (open while the block runs)."""
    from sinks.db import connect, migrate
    from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows

    database = prefix + uuid.uuid4().hex[:12]
    admin = clickhouse_server.client()
    admin.command(f"CREATE DATABASE {database}")
    ch = ClickHouseSettings(url=clickhouse_server.url, database=database, password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    client = connect(ch)
    try:
        migrate(client, ch)
        client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
        yield ch, client
    finally:
        client.close()
        admin.command(f"DROP DATABASE IF EXISTS {database} SYNC")
        admin.close()


@contextlib.contextmanager
def simulated_database(
    clickhouse_server: Any, prefix: str, cfg: SimConfig = SIM
) -> Iterator[tuple[ClickHouseSettings, Any]]:
    """`priced_database` with `cfg`'s simulated ledger in it; yields its settings and a writer's client."""
    with priced_database(clickhouse_server, prefix) as (ch, client):
        seed_simulated_ledger(client, cfg)
        yield ch, client


@pytest.fixture(scope="session")
def web_ledger(clickhouse_server: Any) -> Iterator[tuple[ClickHouseSettings, SimConfig]]:
    with simulated_database(clickhouse_server, "web_") as (ch, _):
        yield ch, SIM


@pytest.fixture
def small_ledger(clickhouse_server: Any) -> Iterator[ClickHouseSettings]:
    """A fresh database with the SMALL simulated ledger, dropped after the test."""
    with simulated_database(clickhouse_server, "webc_", SMALL) as (ch, _):
        yield ch


@pytest.fixture
def web_settings(web_ledger: tuple[ClickHouseSettings, SimConfig], tmp_path: Path) -> Settings:
    ch, _ = web_ledger
    return Settings(state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
                    web=WebSettings(demo=False))  # fmt: skip


def cli_env(ch: ClickHouseSettings) -> dict[str, str]:
    return {
        "GPULEDGER_CONFIG": str(REPO / "tests" / "no-such-gpuledger.toml"),
        "GPULEDGER_CLICKHOUSE__URL": ch.url,
        "GPULEDGER_CLICKHOUSE__DATABASE": ch.database,
        "GPULEDGER_CLICKHOUSE__PASSWORD": ch.password.get_secret_value(),
        "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": ch.analyst_password.get_secret_value(),
    }


def run_cli(ch: ClickHouseSettings, *args: str) -> str:
    from typer.testing import CliRunner

    from gpuledger.cli import _register_all, app

    if not any(g.name == "report" for g in app.registered_groups):
        _register_all()
    result = CliRunner().invoke(app, list(args), env=cli_env(ch), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


class Published:
    """Stands in for the Kafka publisher where a test only needs to see what would be published."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, bytes, dict[str, Any]]] = []

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.records.append((topic, key, record))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def make_client(settings: Settings, publisher: Any = None, now_ms: int = END_MS) -> Any:
    from starlette.testclient import TestClient

    from web.app import create_app
    from web.context import build_context

    ctx = build_context(settings, publisher=publisher)
    ctx.clock = lambda: now_ms / 1000
    return TestClient(create_app(ctx), client=("127.0.0.1", 40000), follow_redirects=False)


@pytest.fixture
def web_app(web_settings: Settings) -> Any:
    return make_client(web_settings, Published())
