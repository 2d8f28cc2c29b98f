"""The one way to build a Kafka client: every consumer, producer and admin client comes from here,
configured from the settings (connection, security) plus what the caller overrides."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from base.errors import ServiceError
from base.settings import KafkaSettings


def is_fatal(err: KafkaError) -> bool:
    """A client error the client will not recover from (the instance must be rebuilt). confluent-kafka
    2.16 delivers the fatal-error event as code `_FATAL` with `fatal()` false, so both are checked."""
    return bool(err.fatal()) or err.code() == KafkaError._FATAL


# Throughput defaults a user can override with the standard keys in `kafka.config`.
PRODUCER_DEFAULTS = {
    "linger.ms": "20",
    "compression.type": "lz4",
    "enable.idempotence": "true",
    "acks": "all",
    # Kafka's default partitioner (the Java client's murmur2), not librdkafka's CRC32 one: a node's
    # samples and its allocations must share a partition whoever produced them (Java, Kafka Streams, us).
    "partitioner": "murmur2_random",
}

# What every consumer starts from: the caller commits, and a new group reads from the start.
CONSUMER_DEFAULTS: dict[str, Any] = {"enable.auto.commit": False, "auto.offset.reset": "earliest"}


def new_consumer(kafka: KafkaSettings, group: str, **overrides: Any) -> Consumer:
    """A consumer in `group`; `overrides` are librdkafka keys (dots as in the docs: pass a dict)."""
    return Consumer({**kafka.client_config(), **CONSUMER_DEFAULTS, "group.id": group, **overrides})


def producer_config(kafka: KafkaSettings, *, telemetry: bool = False, **overrides: Any) -> dict[str, Any]:
    """A producer's librdkafka configuration: the defaults, the settings' connection and `kafka.config`, then for a
    telemetry producer `kafka.telemetry` (its compression and linger), then the caller's `overrides`."""
    chosen = kafka.telemetry.producer_config() if telemetry else {}
    return {**PRODUCER_DEFAULTS, **kafka.client_config(), **chosen, **overrides}


def new_producer(kafka: KafkaSettings, **overrides: Any) -> Producer:
    return Producer(producer_config(kafka, **overrides))


def new_telemetry_producer(kafka: KafkaSettings, **overrides: Any) -> Producer:
    """A telemetry producer's (dcgm, nvsmi, the simulator, the replay): `kafka.telemetry`'s compression and linger."""
    return Producer(producer_config(kafka, telemetry=True, **overrides))


def new_admin(kafka: KafkaSettings | Mapping[str, Any], **overrides: Any) -> AdminClient:
    """An admin client from the settings, or from `kafka` as a whole librdkafka configuration where the
    client must not log in as the settings say (the broker launcher's superuser, a readiness probe of
    an address the settings do not name yet)."""
    base = kafka.client_config() if isinstance(kafka, KafkaSettings) else dict(kafka)
    return AdminClient({**base, **overrides})


def watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """Low and high offsets of `tp` from the broker, retrying while leadership settles."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            lo, hi = consumer.get_watermark_offsets(tp, timeout=10)
            return int(lo), int(hi)
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise ServiceError(f"cannot read offsets of {tp.topic}[{tp.partition}]: {exc}") from exc
            time.sleep(0.2)


def read_to_end(
    kafka: KafkaSettings,
    group: str,
    topic: str,
    partitions: Iterable[int] | None = None,
    *,
    timeout_s: float = 60.0,
    stopped: Callable[[], bool] = lambda: False,
) -> dict[tuple[int, bytes], bytes | None]:
    """A compacted topic's table as it stands now: the latest value per (partition, key) of `partitions`
    (all the topic's partitions when None; none when it does not exist) (None: a tombstone; a record
    without a key counts as key b""). Each partition is read from its low to its high watermark at the
    call; what is written later is not waited for. The reader only assigns partitions: it never joins
    or commits for `group`. After `timeout_s` it returns what it has read. ServiceError when the
    topic's partitions or watermarks stay unreadable (up to 30 s, or `timeout_s` if less) or `stopped()`
    turns true."""
    reader = new_consumer(kafka, group, **{"enable.partition.eof": True})
    wait_s = min(30.0, timeout_s)
    try:
        if partitions is None:
            try:
                listed = reader.list_topics(topic, timeout=wait_s).topics.get(topic)
            except KafkaException as exc:
                raise ServiceError(f"cannot list the partitions of {topic}: {exc}") from exc
            partitions = [] if listed is None or listed.error is not None else sorted(listed.partitions)
        ends: dict[int, int] = {}  # partition -> its high watermark, while not yet reached
        start: list[TopicPartition] = []
        for p in partitions:
            lo, hi = watermarks(reader, TopicPartition(topic, p), wait_s)
            if hi > lo:
                ends[p] = hi
                start.append(TopicPartition(topic, p, lo))
        latest: dict[tuple[int, bytes], bytes | None] = {}
        if not start:
            return latest
        reader.assign(start)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            if stopped():
                raise ServiceError(f"stopped while reading {topic}")
            for msg in reader.consume(500, 0.5):
                if msg.error():  # partition EOF included
                    continue
                p, off = int(msg.partition() or 0), int(msg.offset() or 0)
                latest[(p, msg.key() or b"")] = msg.value()
                if off + 1 >= ends.get(p, 0):
                    ends.pop(p, None)
        return latest
    finally:
        reader.close()
