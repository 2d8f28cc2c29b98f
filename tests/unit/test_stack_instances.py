"""processor.instances: `up` starts that many processes of `processors run` and `processors agents`, each with
the arguments of the first; compose scales the same services (`--scale`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from base import metrics
from base.processor_settings import ProcessorSettings
from base.settings import MetricsSettings, Settings
from schemas.topics import CATALOGUE
from stack.components import COMPONENTS

ROOT = Path(__file__).resolve().parents[2]
STAGE_TOPICS = ("telemetry.device-samples.v1", "sched.job-events.v1", "sched.allocations.v1", "inventory.devices.v1",
                "usage.device-minutes.v1", "processors.job-device-minutes.v1")  # fmt: skip


def _up(settings: Settings) -> dict[str, list[str]]:
    return {c.name: c.argv(settings, lambda _: None) for c in COMPONENTS if c.enabled(settings)}


@pytest.mark.parametrize("instances", [1, 2, 3, 4])
def test_up_starts_each_kind_of_processor_process_instances_times(tmp_path: Path, instances: int) -> None:
    settings = Settings(state_dir=tmp_path, cluster="sim", processor=ProcessorSettings(instances=instances))
    up = _up(settings)
    for kind in ("processors", "agents"):
        names = sorted(n for n in up if n == kind or n.startswith(kind + "-"))
        assert names == sorted([kind] + [f"{kind}-{k}" for k in range(2, instances + 1)])
        assert all(up[n] == up[kind] for n in names), "every process of a kind runs the same command"
    assert "--event-time" in up["processors-2" if instances > 1 else "processors"]


def test_instances_are_bounded_by_the_partitions_they_share(tmp_path: Path) -> None:
    """A process beyond the stage topics' partition count would hold nothing: refused at the settings."""
    partitions = {t.name: t.partitions for t in CATALOGUE if t.name in STAGE_TOPICS}
    assert len(partitions) == len(STAGE_TOPICS)
    most = min(partitions.values())
    ProcessorSettings(instances=most)
    with pytest.raises(ValidationError):
        ProcessorSettings(instances=most + 1)
    with pytest.raises(ValidationError):
        ProcessorSettings(instances=0)


def test_compose_can_scale_the_processor_services() -> None:
    """`docker compose up --scale processors=N --scale agents=N` is processor.instances = N: the services have no
    fixed container name and publish no host port, which a second replica could not take."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    for name in ("processors", "agents"):
        assert "container_name" not in services[name] and "ports" not in services[name], name


def test_each_processor_process_records_its_own_metrics_endpoint(tmp_path: Path) -> None:
    """Process k > 1 of a kind is told which it is (`up` sets GPULEDGER_METRICS__INSTANCE), records its metrics port
    under its own name on any free port, and `status` scrapes it: no process overwrites another's port file."""
    settings = Settings(state_dir=tmp_path, cluster="sim", processor=ProcessorSettings(instances=3))
    envs = {c.name: c.env(settings) for c in COMPONENTS if c.enabled(settings)}
    assert "GPULEDGER_METRICS__INSTANCE" not in envs["processors"]
    assert envs["processors-3"]["GPULEDGER_METRICS__INSTANCE"] == "3"
    assert envs["agents-2"]["GPULEDGER_METRICS__INSTANCE"] == "2"

    third = Settings(state_dir=tmp_path, cluster="sim", metrics=MetricsSettings(instance=3))
    assert metrics.configured_port(third, metrics.endpoint_name(third, "processors")) == 0, "not the first's port"
    server = metrics.start_metrics_server(third, "processors", registry=CollectorRegistry())
    assert server is not None
    try:
        assert metrics.read_port(settings, "processors-3") == server.port
        assert metrics.read_port(settings, "processors") is None
        assert [metrics.kind_of(n) for n in ("processors-3", "processors", "sim-k8s", "broker-2")] == [
            "processors", "processors", "sim-k8s", "broker"]
    finally:
        server.close()
