"""`producers.simulator.run` publishes the simulated cluster through RecordPublisher onto the real broker."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer

from base.settings import KafkaSettings
from producers.simulator import SimConfig, run, simulate
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration


def test_simulation_lands_on_the_broker_as_generated(kafka_bootstrap: str) -> None:
    cfg = SimConfig(seed=9, nodes=2, duration_s=240, upgrade_at_s=120)
    prefix = f"test.{uuid.uuid4().hex[:8]}."
    stats = run(cfg, RecordPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)))
    expected: dict[str, list[tuple[bytes, dict]]] = {}
    for topic, key, rec in simulate(cfg):
        expected.setdefault(topic.name, []).append((key, rec))
    assert stats.records == {name: len(v) for name, v in expected.items()}

    codec = AvroCodec()
    consumer = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}
    )
    topics = [prefix + t.name for t in (INVENTORY, JOB_EVENTS, DEVICE_SAMPLES)]
    consumer.subscribe(topics)
    total = sum(len(v) for v in expected.values())
    got: dict[str, list[tuple[bytes, dict]]] = {}
    deadline = time.monotonic() + 60
    n = 0
    try:
        while n < total and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                if msg.error() is None:
                    name = msg.topic()[len(prefix) :]
                    got.setdefault(name, []).append((msg.key(), codec.decode(msg.value()).record))
                    n += 1
    finally:
        consumer.close()
    for name, recs in expected.items():
        key_of = {(k, r["ts_ms"], r.get("event_type")) for k, r in recs}
        assert {(k, r["ts_ms"], r.get("event_type")) for k, r in got[name]} == key_of, name
    mappings = {r["mapping_version"] for _, r in got[DEVICE_SAMPLES.name]}
    assert mappings == {"dcgm-v2", "dcgm-v4"}


def test_cli_simulate_run_fast_writes_ledger(kafka_bootstrap: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    ledger = tmp_path / "ledger.json"
    env = {
        **os.environ,
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": f"test.{uuid.uuid4().hex[:8]}.",
        "GPULEDGER_CONFIG": str(tmp_path / "none.toml"),
    }
    exe = Path(sys.executable).with_name("gpuledger")
    res = subprocess.run(
        [
            str(exe),
            "simulate",
            "run",
            "--fast",
            "--nodes",
            "1",
            "--duration",
            "120",
            "--seed",
            "4",
            "--ledger",
            str(ledger),
            "--state-dir",
            str(tmp_path / "state"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "published" in res.stderr
    data = json.loads(ledger.read_text())
    assert data["classifier_version"] == "c1" and data["config"]["nodes"] == 1
    for job in data["jobs"].values():
        assert job["allocated_s"] == job["active_s"] + job["starved_s"] + job["idle_s"] + job["dark_s"]
