"""The install's ledger path as plain processes (issue 42 item 4): docker-compose.yml's services, and the
Kubernetes manifests' workloads (the last test here), each with its own command and environment (tests/manifests.py
reads both), against the fault suite's broker and ClickHouse and a local schema registry, give the simulator's own
per-job ledger (and compose's, the undisturbed run's).

What a site fills in is the only change to the environment: the addresses of Kafka, the registry and ClickHouse,
the two ClickHouse passwords (compose's `${CLICKHOUSE_PASSWORD:-...}`), replication 1 (one broker here, three in
compose) and the state folder (compose's volume). The run's own topic prefix, database and metrics port keep it
apart from the suite's other runs on the same broker and server. The simulator's service runs the suite's month
(`simulate run --fast ...`) instead of three hours of real-time backfill: its one changed command. The long-running
services get `--stats-file` (the harness stops a process only once its loop runs) and nothing else; the closing
step (`--exit-when-idle`) is the harness's, as in every fault test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fault_harness import (
    LEDGER_FIELDS,
    SIM,
    Baseline,
    PipelineRun,
    Stack,
    assert_same_ledger,
    check_consistent,
    finish_and_read,
    log,
    read_ledger,
    topic_counts,
    wait_until,
)
from fixtures_clickhouse import ANALYST_PASSWORD, WRITER_PASSWORD
from manifests import SERVICES, compose_env, install_processes

from base.processor_settings import ProcessorSettings
from base.settings import SinksSettings
from schemas.topics import all_topics
from stack.registry import LocalRegistry

pytestmark = pytest.mark.fault

ONESHOTS = ("topics", "schemas", "db-migrate", "ratecard")  # in compose's dependency order
PIPELINE = (*ONESHOTS, "sinks", "processors", "agents", "simulator")


class ComposeRun(PipelineRun):
    """A PipelineRun whose processes are compose's services (the harness's stop and closing steps kept)."""

    def __init__(self, stack: Stack, root: Path, registry_url: str) -> None:
        super().__init__(stack, "compose", root, sim=SIM)
        self.registry_url = registry_url
        self.processor_group = ProcessorSettings().group_id  # compose sets no group: the defaults
        self.sink_group = SinksSettings().group_id
        self.compose = compose_env(SERVICES["processors"])

    def env(self, **extra: str) -> dict[str, str]:
        site = {
            "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": self.stack.bootstrap,
            "GPULEDGER_KAFKA__REPLICATION_FACTOR": "1",
            "GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL": self.registry_url,
            "GPULEDGER_CLICKHOUSE__URL": self.stack.ch_url,
            "GPULEDGER_CLICKHOUSE__PASSWORD": WRITER_PASSWORD,
            "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": ANALYST_PASSWORD,
            "GPULEDGER_STATE_DIR": str(self.state),
        }
        assert site.keys() <= self.compose.keys(), "a site edits only what compose sets"
        apart = {
            "GPULEDGER_KAFKA__TOPIC_PREFIX": self.prefix,
            "GPULEDGER_CLICKHOUSE__DATABASE": self.database,
            "GPULEDGER_METRICS__BASE_PORT": "0",
        }
        plain = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
        config = str(Path(__file__).parent / "no-such-gpuledger.toml")  # no checkout's gpuledger.toml
        return {**plain, "GPULEDGER_CONFIG": config, **self.compose, **site, **apart, **extra}

    def command(self, service: str) -> list[str]:
        return [str(arg) for arg in SERVICES[service]["command"]]

    def setup(self) -> None:
        for service in ONESHOTS:
            self.cli(*self.command(service))

    def start_sink(self) -> None:
        self.sink = self.spawn("sink", *self.command("sinks"))

    def start_processors(self) -> None:
        stats = str(self.root / "processors-stats.json")
        self.processors = self.spawn("processors", *self.command("processors"), "--stats-file", stats)

    def start_agents(self) -> None:
        self.agents = self.spawn("agents", *self.command("agents"), "--stats-file", str(self.agents_stats))


def test_every_pipeline_service_shares_one_environment() -> None:
    """Compose gives every service of the ledger path the same environment: the one ComposeRun runs them with."""
    envs = {name: compose_env(SERVICES[name]) for name in PIPELINE}
    assert all(env == envs["processors"] for env in envs.values()), envs
    assert envs["processors"]["GPULEDGER_CLICKHOUSE__EMBEDDED"] == "false"


def test_compose_services_as_processes_give_the_undisturbed_ledger(
    stack: Stack, baseline: Baseline, local_registry: LocalRegistry, tmp_path: Any
) -> None:
    with ComposeRun(stack, tmp_path, local_registry.url) as run:
        run.start_pipeline()
        led = finish_and_read(run)
        assert run.dlq_counts() == {}, "records were dead-lettered"
        check_consistent(led)
        assert_same_ledger(led, baseline.ledger)
        assert led.jobs == baseline.expected  # the simulator's own ledger, to the second
        log = (run.logs / "processors.log").read_text(errors="replace")
        assert "--event-time" in SERVICES["processors"]["command"] and "processors run --event-time" in log


# ------------------------------------------------------------------------------------------------
# The Kubernetes install's ledger path (deploy/kubernetes: tests/manifests.install_processes)

SETUP_JOBS = ("gpuledger-topics", "gpuledger-schemas", "gpuledger-db-migrate", "gpuledger-ratecard")
LEDGER_PATH = ("gpuledger-sinks", "gpuledger-processors", "gpuledger-agents")
# A short month of the simulator's (both kinds of cluster: the Slurm-like one with its dead exporter, device that
# never reports and exporter upgrade; Kubernetes with Kueue gangs, notebooks and MIG), ending a minute before now.
INSTALL_SIM = {"nodes": 2, "kube_nodes": 3, "duration_s": 600, "seed": 5}


def _stop(popen: subprocess.Popen[bytes], log: Path) -> None:
    """SIGTERM, as the kubelet stops a pod: a stop, not a crash (exit 0)."""
    popen.terminate()
    try:
        rc = popen.wait(60)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
        raise AssertionError(f"{log.stem} did not stop within 60 s of SIGTERM: {log.read_text()[-2000:]}") from None
    assert rc == 0, f"{log.stem} exited {rc} on SIGTERM: {log.read_text(errors='replace')[-3000:]}"


def test_the_kubernetes_manifests_processes_give_the_simulators_ledger(
    stack: Stack, local_registry: LocalRegistry, tmp_path: Path
) -> None:
    """Each workload of deploy/kubernetes as a plain process (its container's args, environment, ConfigMap files and
    Secret keys: tests/manifests.kube_process) in the order an install runs them: the setup Jobs to completion
    (topics, schemas into the registry, tables, the rate card), then the Deployments of the ledger path (sinks,
    processors, agents), unchanged: real time, as a site runs them. Only what a site fills in changes in the
    ConfigMap's gpuledger.toml (the Kafka, registry and ClickHouse addresses, replication 1 on one broker) plus the
    run's topic prefix, database and metrics port (the suite's broker and server are shared).

    The input stands in for the producers (the install's need a node's exporter and a control plane): the
    simulator, run with the processors' own settings, publishes a short month ending a minute before now, all of it
    before the ledger path starts, so the processors take it as a backlog to catch up on and the wall clock closes
    its last minutes (no closing step of the harness's). The ledger then equals the simulator's own per-job ledger
    to the second, its three readings agree, and nothing is dead-lettered."""
    tag = uuid.uuid4().hex[:8]
    prefix, database = f"install-{tag}.", f"install_{tag}"
    site = {"kafka.bootstrap_servers": stack.bootstrap, "kafka.schema_registry_url": local_registry.url,
            "kafka.replication_factor": 1, "clickhouse.url": stack.ch_url, "kafka.topic_prefix": prefix,
            "clickhouse.database": database, "metrics.base_port": 0}  # fmt: skip
    secrets = {"gpuledger-clickhouse": {"password": WRITER_PASSWORD, "analyst-password": ANALYST_PASSWORD}}
    install = install_processes(tmp_path / "install", secrets=secrets, site=site)
    logs = tmp_path / "logs"
    logs.mkdir()
    t0 = time.monotonic()
    for name in SETUP_JOBS:
        rc = install[name].start(logs / f"{name}.log").wait(180)
        assert rc == 0, f"{name} exited {rc}: {(logs / f'{name}.log').read_text(errors='replace')[-3000:]}"
    setup_s = time.monotonic() - t0

    sim = INSTALL_SIM
    start_s = (int(time.time()) - sim["duration_s"] - 60) // 60 * 60
    ledger_file = tmp_path / "expected-ledger.json"
    args = ["simulate", "run", "--fast", "--start", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_s)),
            "--nodes", str(sim["nodes"]), "--kube-nodes", str(sim["kube_nodes"]), "--duration", str(sim["duration_s"]),
            "--seed", str(sim["seed"]), "--ledger", str(ledger_file)]  # fmt: skip
    rc = install["gpuledger-processors"].start(logs / "simulator.log", args).wait(300)
    assert rc == 0, f"simulator exited {rc}: {(logs / 'simulator.log').read_text(errors='replace')[-3000:]}"
    doc = json.loads(ledger_file.read_text())
    expected = {j: {f: int(v[f]) for f in LEDGER_FIELDS} for j, v in doc["jobs"].items()}

    t1 = time.monotonic()
    started = {name: install[name].start(logs / f"{name}.log") for name in LEDGER_PATH}
    try:

        def caught_up() -> bool:
            for name, popen in started.items():
                assert popen.poll() is None, f"{name} exited: {(logs / f'{name}.log').read_text()[-3000:]}"
            client = stack.client(database)
            try:
                return read_ledger(client).jobs == expected
            finally:
                client.close()

        wait_until(caught_up, 300, "the ledger to hold the simulator's per-job ledger", interval_s=2)
        ledger_s = time.monotonic() - t1
    finally:
        for name, popen in started.items():
            if popen.poll() is None:
                _stop(popen, logs / f"{name}.log")
    client = stack.client(database)
    try:
        led = read_ledger(client)
    finally:
        client.close()
    check_consistent(led)
    assert led.jobs == expected
    dlqs = [prefix + t.name for t in all_topics() if t.name.endswith(".dlq")]
    assert {k: v for k, v in topic_counts(stack.bootstrap, dlqs).items() if v} == {}, "records were dead-lettered"
    assert "--event-time" not in install["gpuledger-processors"].args  # the site's real-time processors
    log(f"install: setup {setup_s:.0f} s, ledger {ledger_s:.0f} s, {len(expected)} jobs, totals {led.totals()}")
