"""A dispute's drill-down below the device-minute: one node's (or one device's) per-second samples over a span,
from wherever they are kept (`clickhouse.raw_samples_kept`, sinks/seconds_kept.py; issue 44 item 3).

- `every_second`, `sampled`: `raw_samples` in the warehouse (`sampled` holds one second in `raw_sample_every_s`);
- `minutes`: `telemetry.device-samples` in Kafka, while its retention holds them (2 days by default). The node's
  scrapes are all on one partition (its key, Kafka's default partitioner: `schemas.partition`); the read starts at
  the first offset whose timestamp (the producer's clock when it sent the scrape) is `EARLY_MS` before the span
  and stops at the first record stamped `late_ms` after it, or at the end of the partition. No consumer group
  is joined and nothing is committed.

Both give the same rows: the sink's own mapping (`sinks.rows.raw_sample_rows`) of each scrape, so a second read
from Kafka is exactly the row `raw_samples` would hold.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from base.settings import KafkaSettings
from schemas.records import NodeScrape
from schemas.topics import DEVICE_SAMPLES, node_key
from sinks.rows import RAW_SAMPLE_COLUMNS, raw_sample_rows
from sinks.seconds_kept import SecondsKept

SECOND_COLUMNS = tuple(c for c in RAW_SAMPLE_COLUMNS if c not in ("cluster", "source", "exporter_version"))
EARLY_MS = 60_000  # a scrape is sent after it was taken; this much clock skew before the span is allowed for
MAX_SPAN_MS = 3_600_000  # one read covers at most an hour
MAX_ROWS = 500_000


@dataclass(frozen=True, slots=True)
class Seconds:
    """The rows found, where they came from (`warehouse` or `kafka`) and what that place keeps."""

    rows: list[dict[str, Any]]
    source: str
    kept: SecondsKept
    scanned: int = 0  # Kafka: records read to find them

    def note(self) -> str:
        if self.source == "kafka":
            return (f"from Kafka ({DEVICE_SAMPLES.name}, {self.scanned:,} records read): the warehouse keeps "
                    f"{self.kept.describe()}; Kafka keeps every second for its retention only")  # fmt: skip
        return f"from the warehouse (raw_samples), which keeps {self.kept.describe()}"


def check_span(start_ms: int, end_ms: int) -> None:
    if not 0 < end_ms - start_ms <= MAX_SPAN_MS:
        raise ValueError(f"a span of seconds is 1 ms to an hour, got [{start_ms}, {end_ms})")


def from_warehouse(client: Any, cluster: str, node: str, start_ms: int, end_ms: int,
                   device: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """`raw_samples` rows of `node` (one device when given) in [start_ms, end_ms), by device and time."""
    check_span(start_ms, end_ms)
    result = client.query(
        f"SELECT {', '.join(SECOND_COLUMNS)} FROM raw_samples FINAL "
        "WHERE cluster = {cluster:String} AND node = {node:String} AND ts_ms >= {start:Int64} AND ts_ms < {end:Int64} "
        "AND ({device:String} = '' OR device_uuid = {device:String}) "
        "ORDER BY device_uuid, mig_instance_id, ts_ms LIMIT {limit:UInt32}",
        parameters={"cluster": cluster, "node": node, "start": start_ms, "end": end_ms, "device": device or "",
                    "limit": MAX_ROWS},
    )  # fmt: skip
    return [dict(zip(SECOND_COLUMNS, row, strict=True)) for row in result.result_rows]


def from_kafka(kafka: KafkaSettings, cluster: str, node: str, start_ms: int, end_ms: int, device: str | None = None,
               *, late_ms: int = 120_000, timeout_s: float = 60.0,
               decode: Callable[[bytes], dict[str, Any]] | None = None,
               ) -> tuple[list[dict[str, Any]], int]:  # fmt: skip
    """The same rows read from `telemetry.device-samples` (see the module's doc); and how many records were read."""
    import time

    from confluent_kafka import KafkaError, TopicPartition

    from base.kafka import new_consumer, watermarks
    from schemas.codec import AvroCodec
    from schemas.partition import partition_of

    check_span(start_ms, end_ms)
    if decode is None:
        codec = AvroCodec.from_settings(kafka)

        def decode(value: bytes) -> dict[str, Any]:
            return codec.decode(value, DEVICE_SAMPLES.subject).record

    topic = kafka.topic(DEVICE_SAMPLES.name)
    key = node_key(cluster, node)
    consumer = new_consumer(kafka, f"gpuledger-seconds-{uuid.uuid4().hex[:12]}")
    try:
        meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise LookupError(f"topic {topic} not found: {meta.error if meta else 'no metadata'}")
        tp = TopicPartition(topic, partition_of(key, len(meta.partitions)))
        _, high = watermarks(consumer, tp)
        (found,) = consumer.offsets_for_times([TopicPartition(tp.topic, tp.partition, max(0, start_ms - EARLY_MS))],
                                              timeout=30)  # fmt: skip
        first = found.offset if found.offset >= 0 else high  # -1: no record stamped at or after that time
        rows: list[dict[str, Any]] = []
        scanned = 0
        if first >= high:
            return rows, scanned  # none
        consumer.assign([TopicPartition(tp.topic, tp.partition, first)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=1.0):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise RuntimeError(f"reading {topic}[{tp.partition}] at {msg.offset()}: {err}")
                offset = int(msg.offset() or 0)
                if offset >= high or msg.timestamp()[1] > end_ms + late_ms:
                    return _ordered(rows), scanned
                scanned += 1
                value = msg.value()
                if msg.key() != key or value is None:
                    continue
                scrape = NodeScrape.from_avro(decode(value))
                if scrape.cluster != cluster or scrape.node != node or not start_ms <= scrape.ts_ms < end_ms:
                    continue
                for row in raw_sample_rows(scrape):
                    found_row = dict(zip(RAW_SAMPLE_COLUMNS, row, strict=True))
                    if device is None or found_row["device_uuid"] == device:
                        rows.append({c: found_row[c] for c in SECOND_COLUMNS})
                if offset + 1 >= high:
                    return _ordered(rows), scanned
        raise TimeoutError(f"reading {topic}[{tp.partition}] from offset {first} took over {timeout_s:g} s")
    finally:
        consumer.close()


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["device_uuid"], r["mig_instance_id"], r["ts_ms"]))


def device_seconds(kept: SecondsKept, warehouse: Callable[[], Any], kafka: KafkaSettings, cluster: str, node: str,
                   start_ms: int, end_ms: int, device: str | None = None, *, from_kafka_: bool = False,
                   ) -> Seconds:  # fmt: skip
    """The seconds of a span from where `kept` says they are: the warehouse (a client from `warehouse()`), or
    Kafka when the warehouse keeps minutes only or `from_kafka_` asks for every second (within its retention)."""
    if kept.writes and not from_kafka_:
        return Seconds(from_warehouse(warehouse(), cluster, node, start_ms, end_ms, device), "warehouse", kept)
    rows, scanned = from_kafka(kafka, cluster, node, start_ms, end_ms, device)
    return Seconds(rows, "kafka", kept, scanned)
