"""`gpuledger topics apply` against the real broker: create, converge, idempotence, drift, errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from typer.testing import CliRunner

from base.errors import ServiceError
from schemas.topics import ALERTS, DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, all_topics
from stack.broker import free_ports
from streams.cli import register

pytestmark = pytest.mark.integration


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    app = typer.Typer()
    register(app, typer.Typer())
    monkeypatch.setenv("GPULEDGER_CONFIG", str(tmp_path / "absent.toml"))

    def run(*args: str, bootstrap: str, prefix: str) -> Any:
        env = {"GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix}
        return CliRunner().invoke(app, ["topics", "apply", "--state-dir", str(tmp_path), *args], env=env)

    return run


@pytest.fixture
def prefix(kafka_config: dict[str, str], unique_topic: Callable[[str], str]) -> Iterator[str]:
    value = unique_topic("apply") + "."
    yield value
    admin = AdminClient(kafka_config)
    mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(value)]
    if mine:
        admin.delete_topics(mine)


def _report(result: Any) -> dict[str, dict[str, Any]]:
    return {row["topic"]: row for row in json.loads(result.stdout)}


def _broker_state(admin: AdminClient, name: str) -> tuple[int, str, str]:
    partitions = len(admin.list_topics(name, timeout=10).topics[name].partitions)
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    entries = next(iter(configs.values())).result(timeout=10)
    return partitions, entries["cleanup.policy"].value, entries["retention.ms"].value


def test_apply_creates_converges_and_reports_drift(cli, prefix: str, kafka_config: dict[str, str]):
    bootstrap = kafka_config["bootstrap.servers"]
    admin = AdminClient(kafka_config)
    every = [prefix + t.name for t in all_topics()]
    assert len(every) == 34 and prefix + DEVICE_SAMPLES.name + ".dlq" in every  # 17 topics and their dead letters

    # One topic exists already, too small and with the wrong policy: apply grows and fixes it.
    jobs = prefix + JOB_EVENTS.name
    admin.create_topics([NewTopic(jobs, 1, 1, config={"cleanup.policy": "compact"})])[jobs].result(timeout=30)

    checked = cli("--check", "--json", bootstrap=bootstrap, prefix=prefix)
    assert checked.exit_code == 1, checked.output
    report = _report(checked)
    assert set(report) == set(every)
    assert report[jobs]["status"] == "differs"
    assert report[jobs]["changes"] == [
        "partitions 1 -> 4",
        "cleanup.policy compact -> delete",
        "retention.ms 604800000 -> 2592000000",
    ]
    assert {r["status"] for t, r in report.items() if t != jobs} == {"missing"}
    assert prefix + ALERTS.name not in admin.list_topics(timeout=10).topics  # --check changed nothing

    applied = cli("--json", bootstrap=bootstrap, prefix=prefix)
    assert applied.exit_code == 0, applied.output
    report = _report(applied)
    assert report[jobs]["status"] == "updated"
    assert {r["status"] for t, r in report.items() if t != jobs} == {"created"}
    for topic in all_topics():
        want = (topic.partitions, topic.cleanup_policy, str(topic.retention_ms))
        assert _broker_state(admin, prefix + topic.name) == want, topic.name
    assert _broker_state(admin, prefix + INVENTORY.name) == (4, "compact", "-1")

    again = cli("--json", bootstrap=bootstrap, prefix=prefix)
    assert again.exit_code == 0 and {r["status"] for r in _report(again).values()} == {"ok"}
    assert cli("--check", bootstrap=bootstrap, prefix=prefix).exit_code == 0

    # Someone changes retention by hand and adds partitions beyond the catalogue.
    alerts, samples = prefix + ALERTS.name, prefix + DEVICE_SAMPLES.name
    entry = ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, alerts, incremental_configs=[entry])
    next(iter(admin.incremental_alter_configs([resource]).values())).result(timeout=10)
    admin.create_partitions([NewPartitions(samples, 6)])[samples].result(timeout=10)

    drifted = cli("--check", "--json", bootstrap=bootstrap, prefix=prefix)
    assert drifted.exit_code == 1
    report = _report(drifted)
    assert report[alerts]["status"] == "differs" and report[alerts]["changes"] == [
        f"retention.ms 1000 -> {ALERTS.retention_ms}"
    ]
    assert report[samples]["status"] == "drift" and "cannot reduce" in report[samples]["drift"][0]

    fixed = cli(bootstrap=bootstrap, prefix=prefix)  # the rich table
    assert fixed.exit_code == 0, fixed.output
    assert "drift" in fixed.output and "updated" in fixed.output
    assert _broker_state(admin, alerts)[2] == str(ALERTS.retention_ms)
    assert _broker_state(admin, samples)[0] == 6  # reported, never "fixed" by deleting data


def test_unreachable_broker_is_one_line(cli):
    (port,) = free_ports(1)
    result = cli("--timeout", "2", bootstrap=f"127.0.0.1:{port}", prefix="x.")
    assert isinstance(result.exception, ServiceError)
    message = str(result.exception)
    assert "\n" not in message and f"127.0.0.1:{port}" in message and "unreachable" in message
