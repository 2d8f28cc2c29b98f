"""The consumers of examples/consumers, run as a downstream team runs them, against the real broker
(and the real registry): they must read what the project writes, so docs/consumers.md cannot rot.
The Java consumer is the program of tests/interop, run by test_interop_java.py."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pytest
from test_processor_harness import REPO, create_topics, read_all

from base.settings import KafkaSettings
from producers.simulator import SimConfig, simulate
from schemas import load_schema
from schemas.codec import AvroCodec, _parse, crc64_fingerprint
from schemas.topics import INVENTORY, JOB_EVENTS
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples" / "consumers"
CFG = SimConfig(seed=5, nodes=2, duration_s=1800)


def _inputs() -> list[tuple[Any, bytes, dict[str, Any]]]:
    return [r for r in simulate(CFG) if r[0] in (JOB_EVENTS, INVENTORY)]


def _run(script: str, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args, "--from-beginning", "--until-end"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _export(tmp_path: Path) -> Path:
    dest = tmp_path / "schemas"
    proc = subprocess.run(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", "schemas", "export", str(dest)],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=False,
        env={"GPULEDGER_CONFIG": str(tmp_path / "none.toml"), "GPULEDGER_STATE_DIR": str(tmp_path / "state"),
             "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (dest / "history" / "sched.job-events" / "1.avsc").is_file()
    return dest


def test_fastavro_example_reads_single_object_records_and_older_versions(kafka_bootstrap: str, tmp_path: Path):
    prefix = f"ex{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    inputs = _inputs()
    publisher = RecordPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))
    for topic, key, record in inputs:
        publisher.publish(topic, key, record)
    # One job event as a version-1 writer wrote it: the example resolves it to the latest shape.
    v1 = _parse(load_schema(JOB_EVENTS.subject, 1))
    body = io.BytesIO()
    fastavro.schemaless_writer(body, v1, next(rec for t, _, rec in inputs if t == JOB_EVENTS))
    publisher.publish_raw(prefix + JOB_EVENTS.name, b"c/old", b"\xc3\x01" + crc64_fingerprint(v1) + body.getvalue())
    publisher.flush()

    topics = [prefix + JOB_EVENTS.name, prefix + INVENTORY.name]
    out = _run("fastavro_single_object.py", "--bootstrap", kafka_bootstrap, "--schemas", str(_export(tmp_path)),
               *[a for t in topics for a in ("--topic", t)])  # fmt: skip
    codec = AvroCodec()
    want = sorted(
        json.dumps(codec.decode(v).record, sort_keys=True) for t in topics for _, v in read_all(kafka_bootstrap, t)
    )
    assert len(out) == len(inputs) + 1
    assert sorted(json.dumps(r["value"], sort_keys=True) for r in out) == want
    old = next(r for r in out if r["key"] == "c/old")
    assert old["value"]["project_claimed"] is None  # a v3 field, filled from its default


def test_confluent_example_reads_registry_records(kafka_bootstrap: str, registry_url: str, tmp_path: Path):
    prefix = f"ey{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    inputs = _inputs()
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, schema_registry_url=registry_url)
    publisher = RecordPublisher(kafka)
    for topic, key, record in inputs:
        publisher.publish(topic, key, record)
    publisher.flush()
    topics = [prefix + JOB_EVENTS.name, prefix + INVENTORY.name]
    out = _run("confluent_registry.py", "--bootstrap", kafka_bootstrap, "--registry", registry_url,
               *[a for t in topics for a in ("--topic", t)])  # fmt: skip
    assert len(out) == len(inputs)
    assert sorted((r["key"], r["value"].get("event_id") or r["value"]["node"]) for r in out) == sorted(
        (k.decode(), rec.get("event_id") or rec["node"]) for _, k, rec in inputs
    )
