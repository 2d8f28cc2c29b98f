"""Our topics read and written by reference implementations, not by our own codec (issue 15).

Single-object encoding: Apache Avro Java (`BinaryMessageDecoder` + `SchemaStore.Cache` of every
`.avsc`, `BinaryMessageEncoder`), the program in tests/interop. Confluent's wire format: the same
program resolving schema ids in the real registry, and confluent-kafka's own `AvroSerializer` /
`AvroDeserializer`. Each direction runs the real processors on the real broker:

- our producers publish a simulated cluster, the processors run to the end, and the reference
  decoders read 100% of the six public topics;
- the reference encoders publish the same cluster, the processors take every record (no dead
  letter) and the ledger is the simulator's expected one.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fixtures_interop import InteropJava
from test_processor_harness import SIM_IDLE, create_topics, publish, read_all, start_worker, wait, worker_env

from base.settings import KafkaSettings
from processors.pipeline import LEDGER_FIELDS, ledger_from_job_minutes
from producers.simulator import SimConfig, expected_ledger, simulate
from schemas import SCHEMA_DIR, load_schema
from schemas.codec import AvroCodec, registry_client
from schemas.topics import (
    ALERTS,
    ALLOCATIONS,
    COVERAGE_MINUTES,
    DEVICE_MINUTES,
    DEVICE_SAMPLES,
    INVENTORY,
    JOB_DEVICE_MINUTES,
    JOB_EVENTS,
    JOB_MINUTES,
    Topic,
)
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

CFG = SimConfig(seed=5, nodes=2, duration_s=1800)
# The public topics a downstream consumer reads (docs/consumers.md).
PUBLIC = (DEVICE_MINUTES, JOB_MINUTES, COVERAGE_MINUTES, ALERTS, JOB_EVENTS, DEVICE_SAMPLES)
# What the readers nobody here wrote decode: the public topics, and the job stage's bundles, whose bodies the
# node stage writes by hand (`processors/job_rows.py`).
DECODED = (*PUBLIC, JOB_DEVICE_MINUTES)
# Every dead-letter topic the processors write.
DLQS = (DEVICE_SAMPLES.dlq, JOB_EVENTS.dlq, INVENTORY.dlq, ALLOCATIONS.dlq, DEVICE_MINUTES.dlq, JOB_DEVICE_MINUTES.dlq)


@pytest.fixture(scope="module")
def records() -> list[tuple[Topic, bytes, dict[str, Any]]]:
    return list(simulate(CFG))


def _run_processors(bootstrap: str, prefix: str, state: Path, registry_url: str | None = None) -> None:
    state.mkdir(parents=True, exist_ok=True)
    env = worker_env(bootstrap, prefix, state, **SIM_IDLE)
    if registry_url is not None:
        env["GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL"] = registry_url  # what `up` gives every component
    proc = start_worker(env, "--exit-when-idle", "3", log=state / "worker.log")
    assert wait(proc, 300) == 0, (state / "worker.log").read_text()[-3000:]


def _java_decode(java: InteropJava, bootstrap: str, prefix: str, registry_url: str | None = None) -> dict[str, Any]:
    args = ["decode", "--bootstrap", bootstrap, "--schemas", str(SCHEMA_DIR)]
    for topic in DECODED:
        args += ["--topic", f"{prefix}{topic.name}={topic.subject}"]
    if registry_url is not None:
        args += ["--registry", registry_url]
    out = java.run(*args)
    assert out["unfinished_partitions"] == [], out
    topics: dict[str, Any] = out["topics"]
    return {name.removeprefix(prefix): counts for name, counts in topics.items()}


def _assert_all_decoded(counts: dict[str, Any], framing: str) -> None:
    print(framing, {t: f"{c['decoded']}/{c['records']}" for t, c in counts.items()})  # the figures, with -s
    for topic in DECODED:
        c = counts[topic.name]
        assert c["records"] > 0, f"{topic.name}: nothing published"
        assert (c["decoded"], c["failed"], c[framing]) == (c["records"], 0, c["records"]), (topic.name, c)


def _expected() -> dict[str, dict[str, int]]:
    return {j: {f: getattr(led, f) for f in LEDGER_FIELDS} for j, led in expected_ledger(CFG).items()}


def _assert_processed(bootstrap: str, prefix: str, codec: AvroCodec) -> None:
    for dlq in DLQS:
        assert read_all(bootstrap, prefix + dlq, timeout_s=2) == [], f"{dlq}: records were dead-lettered"
    minutes = [codec.decode(v, JOB_MINUTES.subject).record for _, v in read_all(bootstrap, prefix + JOB_MINUTES.name)]
    assert ledger_from_job_minutes(minutes) == _expected()


# ------------------------------------------------------------------------------------------------
# Single-object encoding


def test_java_decodes_every_record_we_write(
    interop_java: InteropJava, kafka_bootstrap: str, records: list[Any], tmp_path: Path
) -> None:
    prefix = f"ij{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    publish(kafka_bootstrap, prefix, records)
    _run_processors(kafka_bootstrap, prefix, tmp_path / "state")
    _assert_all_decoded(_java_decode(interop_java, kafka_bootstrap, prefix), "singleObject")


def test_records_java_writes_are_processed_not_dead_lettered(
    interop_java: InteropJava, kafka_bootstrap: str, records: list[Any], tmp_path: Path
) -> None:
    prefix = f"jw{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    by_topic: dict[Topic, list[str]] = defaultdict(list)
    for topic, key, record in records:
        by_topic[topic].append(json.dumps({"key": key.decode(), "value": record}))
    assert set(by_topic) == {DEVICE_SAMPLES, JOB_EVENTS, INVENTORY}
    for topic, lines in by_topic.items():
        path = tmp_path / f"{topic.name}.jsonl"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out = interop_java.run(
            "produce", "--bootstrap", kafka_bootstrap, "--schemas", str(SCHEMA_DIR),
            "--topic", prefix + topic.name, "--subject", topic.subject, "--input", str(path),
        )  # fmt: skip
        assert out["produced"] == len(lines)
    raw = read_all(kafka_bootstrap, prefix + DEVICE_SAMPLES.name)
    assert raw[0][1][:10] == b"\xc3\x01" + AvroCodec().fingerprint(DEVICE_SAMPLES.subject)  # Java's header is ours
    _run_processors(kafka_bootstrap, prefix, tmp_path / "state")
    _assert_processed(kafka_bootstrap, prefix, AvroCodec())


# ------------------------------------------------------------------------------------------------
# Confluent's wire format through the real registry


def test_confluent_consumers_decode_every_record_we_write(
    interop_java: InteropJava, kafka_bootstrap: str, registry_url: str, records: list[Any], tmp_path: Path
) -> None:
    prefix = f"ic{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, schema_registry_url=registry_url)
    publisher = RecordPublisher(kafka)
    for topic, key, record in records:
        publisher.publish(topic, key, record)
    publisher.flush()
    _run_processors(kafka_bootstrap, prefix, tmp_path / "state", registry_url)

    _assert_all_decoded(_java_decode(interop_java, kafka_bootstrap, prefix, registry_url), "confluent")
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    for topic in DECODED:
        raw = read_all(kafka_bootstrap, prefix + topic.name)
        ctx = SerializationContext(prefix + topic.name, MessageField.VALUE)
        decoded = [deserializer(value, ctx) for _, value in raw]
        assert raw and all(isinstance(r, dict) for r in decoded), topic.name


def test_records_confluent_serializer_writes_are_processed(
    kafka_bootstrap: str, registry_url: str, records: list[Any], tmp_path: Path
) -> None:
    prefix = f"cw{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    client = SchemaRegistryClient({"url": registry_url})
    serializers = {
        topic: AvroSerializer(client, json.dumps(load_schema(topic.subject)), conf={"auto.register.schemas": True})
        for topic in (DEVICE_SAMPLES, JOB_EVENTS, INVENTORY)
    }  # TopicNameStrategy: subjects <topic>-value
    # A librdkafka producer must use Kafka's default partitioner (docs/consumers.md, "Producing to our inputs").
    conf = {"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random"}
    producer = Producer(conf)
    for topic, key, record in records:
        name = prefix + topic.name
        producer.produce(
            name, key=key, value=serializers[topic](record, SerializationContext(name, MessageField.VALUE))
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert f"{prefix}{DEVICE_SAMPLES.name}-value" in client.get_subjects()
    _run_processors(kafka_bootstrap, prefix, tmp_path / "state", registry_url)
    _assert_processed(kafka_bootstrap, prefix, AvroCodec(registry_client(registry_url)))
