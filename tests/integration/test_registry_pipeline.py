"""The pipeline with the local stack's schema registry on, as `gpuledger up` runs it: every component
gets the registry's URL, so producers, processors and sinks write Confluent's wire format, and read
it (and the single-object records still on the topics) back."""

from __future__ import annotations

import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from test_chargeback_ledger import EXPECTED_TOTAL, worked_ledger
from test_processor_harness import create_topics, read_all, start_worker, wait, worker_env
from test_sink_kafka import make_settings, publish_ledger, run_sink, totals

from base.settings import KafkaSettings
from processors.pipeline import LEDGER_FIELDS, ledger_from_job_minutes
from producers.simulator import SimConfig, expected_ledger, simulate
from schemas import topics
from schemas.codec import CONFLUENT_MAGIC, SINGLE_OBJECT_MAGIC, AvroCodec, registry_client
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

CFG = SimConfig(seed=5, nodes=2, duration_s=1800)


def test_processors_write_and_read_confluent_framing_through_the_registry(
    kafka_bootstrap: str, registry_url: str, tmp_path: Path
) -> None:
    prefix = f"rp{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    records = list(simulate(CFG))
    # Half the input as a producer of the local stack writes it (Confluent), half as before it (single-object).
    registered = RecordPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix,
                                               schema_registry_url=registry_url))  # fmt: skip
    plain = RecordPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))
    # Two producers have two queues: a partition's log interleaves their batches, not their records. Both are
    # flushed at each new second of event time, so no record lands behind a later second's and is read as late.
    second = None
    for i, (topic, key, record) in enumerate(records):
        ts = record.get("ts_ms")
        if ts is not None and ts // 1000 != second:
            registered.flush()
            plain.flush()
            second = ts // 1000
        (registered if i % 2 else plain).publish(topic, key, record)
    registered.flush()
    plain.flush()

    env = worker_env(kafka_bootstrap, prefix, tmp_path, IDLE__IDLE_AFTER_MIN_INTERACTIVE="10")
    env["GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL"] = registry_url  # what `up` gives every component
    proc = start_worker(env, "--exit-when-idle", "3", log=tmp_path / "worker.log")
    assert wait(proc, 240) == 0, (tmp_path / "worker.log").read_text()[-3000:]

    raw = read_all(kafka_bootstrap, prefix + topics.JOB_MINUTES.name)
    assert raw and all(value[:1] == CONFLUENT_MAGIC for _, value in raw)
    codec = AvroCodec(registry_client(registry_url))
    minutes = [codec.decode(value, topics.JOB_MINUTES.subject).record for _, value in raw]
    expected = {j: {f: getattr(led, f) for f in LEDGER_FIELDS} for j, led in expected_ledger(CFG).items()}
    assert ledger_from_job_minutes(minutes) == expected
    # A Confluent consumer needs nothing of ours: the ids resolve in the registry.
    deserializer = AvroDeserializer(SchemaRegistryClient({"url": registry_url}))
    ctx = SerializationContext(prefix + topics.JOB_MINUTES.name, MessageField.VALUE)
    first: Any = deserializer(raw[0][1], ctx)
    assert first["job_id"] == minutes[0]["job_id"]
    dead = read_all(kafka_bootstrap, prefix + topics.DEVICE_SAMPLES.dlq, timeout_s=2)
    assert dead == [], "no record of either framing is dead-lettered"


def test_sinks_read_confluent_and_single_object_records_alike(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, registry_url: str
) -> None:
    settings = make_settings(kafka_bootstrap, clickhouse_server, clickhouse_database)
    settings.kafka.schema_registry_url = registry_url
    published = publish_ledger(settings)
    raw = read_all(kafka_bootstrap, settings.kafka.topic(topics.DEVICE_MINUTES.name))
    assert raw and all(value[:1] == CONFLUENT_MAGIC for _, value in raw)
    # The same ledger once more in single-object framing: the sink reads both, and deduplicates.
    plain = settings.model_copy(update={"kafka": settings.kafka.model_copy(update={"schema_registry_url": None})})
    republished = publish_ledger(plain)
    again = read_all(kafka_bootstrap, settings.kafka.topic(topics.DEVICE_MINUTES.name))
    assert sum(value[:2] == SINGLE_OBJECT_MAGIC for _, value in again) == len(worked_ledger())

    stats = run_sink(settings)
    assert stats.records == published + republished and stats.dead_lettered == 0
    expected_alloc = sum(r["allocated_s"] for r in worked_ledger())
    assert totals(settings) == (len(worked_ledger()), expected_alloc, Decimal(EXPECTED_TOTAL))
