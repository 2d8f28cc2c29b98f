"""The prolog/epilog hooks of deploy/slurm run by the live slurmd (`Prolog=`/`Epilog=`, PrologFlags=Alloc):
each job's start and end are spooled on the node with the GPUs slurmd gave it (SLURM_JOB_GPUS), and
`gpuledger slurm spool-drain` publishes them to the real broker, then empties the spool."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger

from base.settings import Settings
from schemas.codec import AvroCodec
from schemas.topics import JOB_EVENTS
from stack.slurm.cluster import NODE, SlurmClient

pytestmark = pytest.mark.integration


def spooled(spool: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(spool.glob("*.json"))]


def wait_spooled(spool: Path, n: int, timeout: float = 30) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = spooled(spool)
        if len(found) >= n:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{n} spool files expected in {spool}, found {spooled(spool)}")


def read_events(settings: Settings, expected: int, timeout: float = 60) -> list[tuple[bytes, dict[str, Any]]]:
    codec = AvroCodec()
    consumer = Consumer({**settings.kafka.client_config(), "group.id": f"r-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": "false"})  # fmt: skip
    consumer.subscribe([settings.kafka.topic(JOB_EVENTS.name)])
    out: list[tuple[bytes, dict[str, Any]]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.key(), codec.decode(msg.value(), JOB_EVENTS.subject).record))
    finally:
        consumer.close()
    return out


def test_hooks_spool_on_the_node_and_the_drain_publishes(slurm: SlurmClient, settings: Settings) -> None:
    spool = slurm.cfg.spool
    for old in spool.glob("*.json"):  # earlier tests' jobs spooled too
        old.unlink()
    settings.kafka.topic_prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient(settings.kafka.client_config())
    for fut in admin.create_topics([NewTopic(settings.kafka.topic(JOB_EVENTS.name), 2, 1)]).values():
        fut.result(timeout=30)

    train = slurm.submit("--gres=gpu:h100:2", "--comment", "project=atlas")
    infer = slurm.submit("--gres=gpu:a100:1")
    slurm.wait_for_state(train, "RUNNING")
    slurm.wait_for_state(infer, "RUNNING")
    indices = {train: slurm.gres_indices(train)[NODE], infer: slurm.gres_indices(infer)[NODE]}
    starts = wait_spooled(spool, 2)
    assert {r["env"]["SLURM_JOB_ID"]: (r["kind"], r["host"]) for r in starts} == {
        train: ("start", NODE), infer: ("start", NODE)}  # fmt: skip
    assert {r["env"]["SLURM_JOB_ID"]: r["env"]["SLURM_JOB_GPUS"] for r in starts} == {
        job: ",".join(map(str, idx)) for job, idx in indices.items()}  # fmt: skip
    slurm.run("scancel", train, infer)
    slurm.wait_for_state(train, "CANCELLED")
    slurm.wait_for_state(infer, "CANCELLED")
    records = wait_spooled(spool, 4)
    assert sorted((r["env"]["SLURM_JOB_ID"], r["kind"]) for r in records) == sorted(
        (job, kind) for job in (train, infer) for kind in ("start", "end"))  # fmt: skip

    env = {
        **slurm.env, "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix, "GPULEDGER_CLUSTER": slurm.cfg.cluster_name,
        "GPULEDGER_SCHEDULER__DEVICE_MAP_FROM_INVENTORY": "false", "GPULEDGER_BROKER__ENABLED": "false",
    }  # fmt: skip
    proc = run_gpuledger(["slurm", "spool-drain", "--spool", str(spool), "--state-dir", str(settings.state_dir)], env)
    assert proc.returncode == 0, proc.stderr
    assert "sent 4, quarantined 0" in proc.stdout
    assert list(spool.glob("*.json")) == []  # deleted once the broker acknowledged them

    events = read_events(settings, 4)
    got = {(r["job_id"], r["event_type"]): (key, r) for key, r in events}
    assert sorted(got) == sorted((job, t) for job in (train, infer) for t in ("STARTED", "ENDED"))
    for job, idx in indices.items():
        key, started = got[(job, "STARTED")]
        assert key == f"{slurm.cfg.cluster_name}/{job}".encode() and started["cluster"] == slurm.cfg.cluster_name
        assert [(a["node"], tuple(d["index"] for d in a["devices"])) for a in started["allocations"]] == [(NODE, idx)]
        assert started["user"] == "root"
    assert got[(train, "STARTED")][1]["project"] == "atlas"
