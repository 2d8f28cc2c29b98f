"""Scheduler producers against the real broker: poller, spool drain, corrections and the inventory-fed
device map, all through RecordPublisher, read back and decoded with the contract codec."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest
import typer
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from producers import scheduler_cli, scheduler_service
from producers.devicemap import InMemoryDeviceMap
from producers.jobevents import EventContext
from producers.slurm_poller import SlurmPoller
from producers.slurm_spool import drain
from schemas.codec import AvroCodec
from schemas.topics import CORRECTIONS, INVENTORY, JOB_EVENTS, node_key
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
HOOK = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "gpuledger_hook.py"


@pytest.fixture
def prefixed(settings):
    """Settings with a unique topic prefix, and the topics this test writes created on the broker."""
    settings.kafka.topic_prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient(settings.kafka.client_config())
    names = [settings.kafka.topic(t.name) for t in (JOB_EVENTS, CORRECTIONS, INVENTORY)]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    return settings


def _read(settings, topic, expected: int, timeout: float = 30.0) -> list[tuple[bytes, dict]]:
    codec = AvroCodec()
    consumer = Consumer({**settings.kafka.client_config(), "group.id": f"r-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": "false"})
    consumer.subscribe([settings.kafka.topic(topic.name)])
    out = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.key(), codec.decode(msg.value(), topic.subject).record))
    finally:
        consumer.close()
    return out


def _fake_slurm(tmp_path: Path, monkeypatch, outputs: dict[str, str]) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool, text in outputs.items():
        (tmp_path / f"{tool}.out").write_text(text)
        script = bindir / tool
        out = str(tmp_path / f"{tool}.out")
        script.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({out!r}).read())\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def test_poller_publishes_contract_records_to_the_broker(prefixed, tmp_path, monkeypatch):
    sacct = json.loads((FIX / "sacct-json/mila-iqia-SARC_slurm_23_11_5.json").read_text())
    sacct["jobs"] = []
    _fake_slurm(tmp_path, monkeypatch, {
        "squeue": (FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-multi-nodes.json").read_text(),
        "sacct": json.dumps(sacct),
    })
    # the node GPU map comes from the inventory topic, as in production
    pub = RecordPublisher(prefixed.kafka)
    for node in ("gpu1", "gpu2"):
        pub.publish(INVENTORY, node_key("hpc", node), {
            "cluster": "hpc", "node": node, "ts_ms": 1762529600000, "source": "slurm", "deleted": False,
            "devices": [{"uuid": f"GPU-{node}-{i}", "index": i, "model": "NVIDIA H100 80GB HBM3",
                         "generation": "hopper", "mig_profile": None, "mig_instance_id": None} for i in range(4)],
        })
    pub.flush()
    devmap = InMemoryDeviceMap()
    assert scheduler_service.load_inventory(prefixed, devmap) == 2
    poller = SlurmPoller(EventContext("hpc", devices=devmap), pub, clock=lambda: 1762529700000)
    events = poller.poll_once()
    pub.flush()
    got = _read(prefixed, JOB_EVENTS, len(events))
    assert [(k, r["event_type"]) for k, r in got] == [(b"hpc/11", "STARTED")]
    (_, rec), = got
    assert rec == events[0]
    assert [d["uuid"] for a in rec["allocations"] for d in a["devices"]] == [
        f"GPU-{n}-{i}" for n in ("gpu1", "gpu2") for i in range(4)]


def test_spool_drain_and_correction_reach_the_broker(prefixed, tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpuledger_hook", HOOK)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_USER": "alice", "SLURMD_NODENAME": "gpu1", "SLURM_JOB_GPUS": "1",
           "SLURM_JOB_START_TIME": "1762529652"}
    hook.spool(hook.build("start", env, 1762529653), str(tmp_path / "spool"))
    pub = RecordPublisher(prefixed.kafka)
    assert drain(tmp_path / "spool", EventContext("hpc"), pub, pub.flush) == (1, 0)
    (key, rec), = _read(prefixed, JOB_EVENTS, 1)
    assert key == b"hpc/77" and rec["allocations"][0]["devices"][0]["index"] == 1

    monkeypatch.setenv("GPULEDGER_KAFKA__BOOTSTRAP_SERVERS", prefixed.kafka.bootstrap_servers)
    monkeypatch.setenv("GPULEDGER_KAFKA__TOPIC_PREFIX", prefixed.kafka.topic_prefix)
    monkeypatch.setenv("GPULEDGER_STATE_DIR", str(prefixed.state_dir))
    monkeypatch.chdir(tmp_path)
    app, inspect_app = typer.Typer(), typer.Typer()
    scheduler_cli.register(app, inspect_app)
    res = CliRunner().invoke(app, ["attribution", "correct", "77", "--project", "atlas", "--reason",
                                   "charged to the wrong grant", "--by", "admin", "--cluster", "hpc"])
    assert res.exit_code == 0, res.output
    (key, corr), = _read(prefixed, CORRECTIONS, 1)
    assert key == b"hpc/77" and (corr["new_project"], corr["reason"], corr["corrected_by"]) == (
        "atlas", "charged to the wrong grant", "admin")
