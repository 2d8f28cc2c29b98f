"""docker-compose.yml's ledger path as plain processes (issue 42 item 4): each service's command and environment
as compose gives them (tests/manifests.py reads the file), against the fault suite's broker and ClickHouse and a
local schema registry, gives the same ledger as the undisturbed run and as the simulator's own.

What a site fills in is the only change to the environment: the addresses of Kafka, the registry and ClickHouse,
the two ClickHouse passwords (compose's `${CLICKHOUSE_PASSWORD:-...}`), replication 1 (one broker here, three in
compose) and the state folder (compose's volume). The run's own topic prefix, database and metrics port keep it
apart from the suite's other runs on the same broker and server. The simulator's service runs the suite's month
(`simulate run --fast ...`) instead of three hours of real-time backfill: its one changed command. The long-running
services get `--stats-file` (the harness stops a process only once its loop runs) and nothing else; the closing
step (`--exit-when-idle`) is the harness's, as in every fault test.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fault_harness import SIM, Baseline, PipelineRun, Stack, assert_same_ledger, check_consistent, finish_and_read
from fixtures_clickhouse import ANALYST_PASSWORD, WRITER_PASSWORD
from manifests import SERVICES, compose_env

from base.processor_settings import ProcessorSettings
from base.settings import SinksSettings
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
