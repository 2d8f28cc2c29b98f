"""The local stack's components, in start order: the one list `gpuledger up/down/status` works from.

To add a component, append a `Component` to `COMPONENTS` (keep start order: what others need
comes first). A component is a long-running process (or, with `oneshot=True`, a step that runs to
completion, like applying topics). Most run a `gpuledger` sub-command: name it in `command` and
build the argv with `gpuledger_argv`; while that sub-command is not registered, status shows the
component as *unavailable* instead of starting it. Each process gets the environment of `up`
plus `GPULEDGER_STATE_DIR`, so it builds the same `Settings`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gpuledger import broker, security
from gpuledger.settings import Settings

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Health:
    """The answer of a readiness check: healthy or not, and one line saying why."""

    ok: bool
    detail: str


def _always(_: Settings) -> bool:
    return True


@dataclass(frozen=True)
class Component:
    """One process of the local stack.

    name: short, unique; names the pid file and the log file.
    argv: the command line from the settings. It may do foreground work first (the broker fetches
      its jars and formats storage), reporting through `progress`.
    ready: whether the running component serves; `None` means a live process is enough.
    enabled: whether this configuration wants the component at all.
    command: the `gpuledger` sub-command it runs (availability check), if any.
    oneshot: runs to completion during `up` (exit 0 is success) instead of staying up.
    status_ready: the readiness check `status` uses (it must change nothing); default `ready`.
    """

    name: str
    description: str
    argv: Callable[[Settings, Progress], list[str]]
    ready: Callable[[Settings], Health] | None = None
    enabled: Callable[[Settings], bool] = _always
    command: tuple[str, ...] | None = None
    oneshot: bool = False
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 20.0
    status_ready: Callable[[Settings], Health] | None = None


def gpuledger_argv(*args: str) -> list[str]:
    """Run a `gpuledger` sub-command with this interpreter (works without the console script)."""
    return [sys.executable, "-c", "from gpuledger.cli import main; main()", *args]


# ------------------------------------------------------------------------------------------------
# Readiness checks


def kafka_ready(settings: Settings) -> Health:
    if security.enabled(settings):
        return Health(*security.broker_ready(settings))
    ok = broker.metadata_ok(settings.kafka.client_config(), timeout=3.0)
    where = settings.kafka.bootstrap_servers
    return Health(ok, f"answers metadata at {where}" if ok else f"no metadata answer from {where}")


def kafka_ready_for_up(settings: Settings) -> Health:
    """`kafka_ready`, and with SASL_SSL on, (re)creates the pipeline's Kafka user through the admin login."""
    if security.enabled(settings):
        return Health(*security.broker_ready(settings, create_user=True))
    return kafka_ready(settings)


def clickhouse_ready(settings: Settings) -> Health:
    url = settings.clickhouse.url.rstrip("/") + "/ping"
    try:
        resp = httpx.get(url, timeout=2.0)
    except httpx.HTTPError as exc:
        return Health(False, f"{url}: {type(exc).__name__}")
    ok = resp.status_code == 200
    return Health(ok, f"{url}: HTTP {resp.status_code}")


# ------------------------------------------------------------------------------------------------
# Command lines


def _broker_argv(settings: Settings, progress: Progress) -> list[str]:
    cfg = broker.BrokerConfig.from_settings(settings)
    if security.enabled(settings):
        cfg = security.prepare_local_broker(settings, cfg, progress=progress)
    return broker.prepare(cfg, progress=progress)


def _clickhouse_argv(settings: Settings, _: Progress) -> list[str]:
    ch = settings.clickhouse
    return gpuledger_argv(
        "clickhouse", "serve", "--path", str(settings.clickhouse_path), "--host", ch.host, "--port", str(ch.port)
    )


def _simulated(settings: Settings) -> bool:
    # No real source configured: the cluster is the simulator's.
    return settings.cluster == "sim"


LOCAL_WEBHOOK_PORT = 8765
SIMULATOR_BACKFILL_S = 3 * 3600


def _local_chat(settings: Settings) -> bool:
    # No chat route configured: alerts go to a local webhook receiver so a demo shows them.
    chat = settings.sinks.chat
    return chat.default is None and not chat.users and not chat.teams


def _processors_argv(settings: Settings, _: Progress) -> list[str]:
    if _simulated(settings):
        # The simulator replays hours of history at start-up: event time alone closes its windows,
        # or the wall clock would call all that history late.
        return gpuledger_argv("processors", "run", "--event-time")
    return gpuledger_argv("processors", "run")


def _chat_argv(settings: Settings, _: Progress) -> list[str]:
    if _local_chat(settings):
        return gpuledger_argv("chat", "run", "--local-receiver", str(LOCAL_WEBHOOK_PORT))
    return gpuledger_argv("chat", "run")


COMPONENTS: list[Component] = [
    Component(
        name="broker",
        description="Apache Kafka, single KRaft node on loopback",
        argv=_broker_argv,
        ready=kafka_ready_for_up,
        status_ready=kafka_ready,
        enabled=lambda s: s.broker.enabled,
        ready_timeout_s=120.0,
        stop_timeout_s=30.0,
    ),
    Component(
        name="clickhouse",
        description="embedded ClickHouse (chDB behind the HTTP interface)",
        argv=_clickhouse_argv,
        ready=clickhouse_ready,
        enabled=lambda s: s.clickhouse.embedded,
        command=("clickhouse", "serve"),
    ),
    Component(
        name="topics",
        description="create/update the Kafka topics",
        argv=lambda s, _: gpuledger_argv("topics", "apply"),
        command=("topics", "apply"),
        oneshot=True,
    ),
    Component(
        name="processors",
        description="stream processors: allocations, attribution, windows, idle, coverage",
        argv=_processors_argv,
        command=("processors", "run"),
    ),
    Component(
        name="db-migrate",
        description="apply the ClickHouse migrations",
        argv=lambda s, _: gpuledger_argv("db", "migrate"),
        command=("db", "migrate"),
        oneshot=True,
    ),
    Component(
        name="ratecard",
        description="load the rate card into ClickHouse",
        argv=lambda s, _: gpuledger_argv("ratecard", "load"),
        command=("ratecard", "load"),
        oneshot=True,
    ),
    Component(
        name="sinks",
        description="ledger topics to ClickHouse (idempotent)",
        argv=lambda s, _: gpuledger_argv("sink", "run"),
        command=("sink", "run"),
    ),
    Component(
        name="chat-receiver",
        description="local webhook that stands in for chat (no route configured)",
        argv=lambda s, _: gpuledger_argv(
            "chat", "receiver", "--port", str(LOCAL_WEBHOOK_PORT), "--out", str(s.state_dir / "webhook.jsonl")
        ),
        enabled=_local_chat,
        command=("chat", "receiver"),
    ),
    Component(
        name="chat",
        description="alerts to chat, routed per user/team",
        argv=_chat_argv,
        command=("chat", "run"),
    ),
    Component(
        name="reclaim",
        description="reclaim executor (dry-run unless configured live)",
        argv=lambda s, _: gpuledger_argv("reclaim", "run"),
        command=("reclaim", "run"),
    ),
    Component(
        name="simulator",
        description="simulated cluster (no real source configured)",
        # Three hours of history first (reports and idle alerts to look at at once), then real time.
        argv=lambda s, _: gpuledger_argv("simulate", "run", "--backfill", str(SIMULATOR_BACKFILL_S)),
        enabled=_simulated,
        command=("simulate", "run"),
    ),
]


def by_name(components: list[Component] | None = None) -> dict[str, Component]:
    return {c.name: c for c in (COMPONENTS if components is None else components)}
