"""Shared fixtures. Keep this file tidy: one section per service, each fixture documented.

Kafka (session-scoped, started once):
  kafka_bootstrap   "host:port" of a real broker: `GPULEDGER_KAFKA_BOOTSTRAP` when set, else
                    testcontainers' Kafka when a Docker engine answers, else the project's own
                    launcher (stack.broker) on free loopback ports with a temporary data dir.
  kafka_config      librdkafka configuration dict for that broker (copy it before changing it).
  unique_topic      factory: unique_topic("samples") -> "test.samples.<hex>"; never shared.
  new_topic         factory: creates a unique topic on the broker (partitions, config) and
                    deletes it after the test; returns its name.
Settings:
  settings          a gpuledger `Settings` pointed at the test broker with a tmp state dir; its own
                    local broker is disabled (the test broker plays the external cluster).

Parallel workers (`make test` runs pytest-xdist, `-n` workers, `--dist loadgroup`): each worker starts its own
session services (broker, ClickHouse, registry) and draws ports from a range of its own (GPULEDGER_PORT_RANGE,
read by stack.broker.free_ports). Tests on a live engine go to one worker per engine, in their order
(xdist group "slurm": one live Slurm per machine; "kube": one control plane, its restart test last); a module
whose tests share a module-scoped fixture goes to one worker whole, so the fixture starts once.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from base.settings import BrokerSettings, KafkaSettings, Settings
from stack.broker import PORT_RANGE_ENV, free_ports

# embedded ClickHouse; the schema registry; the Java reference program of tests/interop; Kubernetes + Kueue;
# a live Slurm
pytest_plugins = ["fixtures_clickhouse", "fixtures_registry", "fixtures_interop", "fixtures_kube", "fixtures_slurm"]

# ------------------------------------------------------------------------------------------------
# Parallel workers

WORKER_PORTS = 1000  # ports in each worker's range
FIRST_WORKER_PORT = 15000  # worker k draws from 15000 + 1000 k: below the kernel's ephemeral range (32768 on)


def _worker_index() -> int | None:
    name = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw3" in worker 3 of an xdist run
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


# Brokers in tests live minutes: C1 only halves their start-up CPU on this 2-core machine (base.settings).
# Commands the tests start (`up`) read it from here; the fixtures' own brokers say so in their config.
os.environ.setdefault("GPULEDGER_BROKER__JIT", "quick")

_WORKER = _worker_index()
if _WORKER is not None and PORT_RANGE_ENV not in os.environ:
    _low = FIRST_WORKER_PORT + WORKER_PORTS * _WORKER
    if _low + WORKER_PORTS <= 32768:
        os.environ[PORT_RANGE_ENV] = f"{_low}-{_low + WORKER_PORTS - 1}"

ENGINE_GROUPS = {"slurm": {"live_slurm", "live_slurm_noacct"}, "kube": {"kube_binaries"}}  # group: its fixtures
# A test on both live engines (tests/integration/test_two_engines_live.py) belongs to the first group that matches,
# "slurm": one live Slurm per machine, so it never runs beside another Slurm test; its Kubernetes is a control
# plane of its own (its KWOK, Job controller and cluster-wide objects), never the kube group's session one, so it
# shares no engine with a test running beside it. fixtures_kube runs it last there, after the Slurm tests.


# Session fixtures that cost a worker a minute of CPU to build (the team page's simulated month, seeded into
# ClickHouse): the tests that read them go to one worker, so the month is seeded once, not once per worker.
SHARED_GROUPS = {"web": {"web_ledger"}}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The worker group a test belongs to: its live engine's, else its shared session fixture's, else its module's
    when it is a fault test or shares a module-scoped fixture, else none (any worker)."""
    names = set(getattr(item, "fixturenames", ()))
    for group, fixtures in (ENGINE_GROUPS | SHARED_GROUPS).items():
        if names & fixtures:
            return group
    if "fault" in item.path.parts:
        return item.nodeid.split("::", 1)[0]  # a fault module's runs share the session stack on one worker
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in ("module", "class", "package") for chain in defs for d in chain):
        return item.nodeid.split("::", 1)[0]
    return None


# The suite's parts and their budgets: the sum of their tests' durations (setup, call and teardown), in seconds,
# on the 2-core machine of docs/benchmarks.md. make test's parts add up to 4,800 s: 4 workers for 20 minutes; the
# fault suite runs alone (make fault) on 2 workers for 8 minutes. Printed after every run; over budget is said,
# never failed on.
PART_BUDGETS_S = {"unit": 360, "integration": 3060, "live Slurm": 540, "live Kubernetes": 540, "browser": 120,
                  "two engines": 180, "fault": 960, "fault at scale": 1800}  # fmt: skip


def suite_part(item: pytest.Item, group: str | None) -> str:
    parts = item.path.parts
    if "fault" in parts:
        return "fault at scale" if "scale" in parts else "fault"
    if group == "slurm" and "kube_binaries" in getattr(item, "fixturenames", ()):
        return "two engines"
    if group == "slurm":
        return "live Slurm"
    if group == "kube":
        return "live Kubernetes"
    if "unit" in parts:
        return "unit"
    return "browser" if item.path.name == "test_web_browser.py" else "integration"


@pytest.hookimpl(tryfirst=True)  # before `-m` selects, and before xdist turns the marks into "@group" node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    worker = hasattr(config, "workerinput")
    for item in items:
        group = xdist_group_of(item)
        if group in ENGINE_GROUPS:
            item.add_marker(pytest.mark.live_engine)  # `-m live_engine`: the repeat runner's live set
        if worker and group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        item.user_properties.append(("suite_part", suite_part(item, group)))  # reaches the controller's reports


_PART_TIMES: dict[str, list[float]] = {}  # part -> [tests, seconds, longest test's seconds]
_TEST_TIMES: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    part = dict(report.user_properties).get("suite_part")
    if not isinstance(part, str):
        return
    totals = _PART_TIMES.setdefault(part, [0, 0.0, 0.0])
    if report.when == "setup":
        totals[0] += 1
    totals[1] += report.duration
    _TEST_TIMES[report.nodeid] = _TEST_TIMES.get(report.nodeid, 0.0) + report.duration
    totals[2] = max(totals[2], _TEST_TIMES[report.nodeid])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _PART_TIMES:
        return
    terminalreporter.section("time per part of the suite (sum of each test's setup, call and teardown)")
    terminalreporter.write_line(f"{'part':<16} {'tests':>6} {'seconds':>9} {'budget':>7} {'longest test':>13}")
    for part, (tests, seconds, longest) in sorted(_PART_TIMES.items(), key=lambda kv: -kv[1][1]):
        budget = PART_BUDGETS_S.get(part)
        over = "  over budget" if budget is not None and seconds > budget else ""
        terminalreporter.write_line(f"{part:<16} {int(tests):>6} {seconds:>9.0f} {budget or '':>7} {longest:>12.0f}s"
                                    f"{over}")  # fmt: skip


@pytest.fixture(autouse=True)
def _own_defaults(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Integration and fault tests: what a command takes by default and a machine has once is the test's own, so two
    tests on two workers never share it and none writes into the user's data: the state dir (metrics port files,
    faust data, unsent policy records; default ~/.local/share/gpuledger) and the ports it binds (the web page's
    8080, the local chat receiver's 8765, the registry's 19081, the components' metrics from 9470). A test that sets
    its own keeps it."""
    if not {"integration", "fault"} & set(request.node.path.parts):
        return
    state = request.getfixturevalue("tmp_path_factory").mktemp("default-state")
    monkeypatch.setenv("GPULEDGER_STATE_DIR", str(state))
    web, chat, registry = free_ports(3)
    monkeypatch.setenv("GPULEDGER_WEB__PORT", str(web))
    monkeypatch.setenv("GPULEDGER_SINKS__CHAT__LOCAL_RECEIVER_PORT", str(chat))
    monkeypatch.setenv("GPULEDGER_REGISTRY__PORT", str(registry))
    monkeypatch.setenv("GPULEDGER_METRICS__BASE_PORT", "0")


# ------------------------------------------------------------------------------------------------
# Kafka


def _docker_engine_available() -> bool:
    """A Docker engine answers (a client binary alone is not enough)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("GPULEDGER_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    if _docker_engine_available():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from stack.broker import BrokerConfig, LocalBroker

    cfg = BrokerConfig.on_free_ports(tmp_path_factory.mktemp("kafka"), Settings().broker.kafka_version, jit="quick")
    with LocalBroker(cfg) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def _kafka_config_session(kafka_bootstrap: str) -> dict[str, str]:
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture
def kafka_config(_kafka_config_session: dict[str, str]) -> dict[str, str]:
    return dict(_kafka_config_session)


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    def make(name: str = "topic") -> str:
        return f"test.{name}.{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def new_topic(kafka_config: dict[str, str], unique_topic: Callable[[str], str]) -> Iterator[Callable[..., str]]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_config)
    created: list[str] = []

    def make(name: str = "topic", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        topic = unique_topic(name)
        fut = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic]
        fut.result(timeout=30)
        created.append(topic)
        # Creation returns before every partition has a leader: wait so the test starts on a usable topic.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(topic, timeout=10).topics.get(topic)
            ready = md is not None and md.error is None and len(md.partitions) == partitions
            if ready and all(p.leader >= 0 for p in md.partitions.values()):
                return topic
            time.sleep(0.1)
        raise TimeoutError(f"topic {topic} has no leader for every partition after 30 s")

    yield make
    if created:
        for fut in admin.delete_topics(created).values():
            with contextlib.suppress(Exception):  # best effort: topic names are unique anyway
                fut.result(timeout=30)


# ------------------------------------------------------------------------------------------------
# Settings


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    state = tmp_path / "state"
    state.mkdir()
    return Settings(
        state_dir=state,
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        broker=BrokerSettings(enabled=False),
    )
