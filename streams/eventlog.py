"""Read a workflow topic whole: every record of every partition, from its low to its high watermark at the
call (what is written later is not waited for). For the low-rate governance topics (appeals, reservations),
whose readers fold the whole history into state each time (`schemas/governance_*.py`).

The reader only assigns partitions: it never joins or commits for a group. A record that does not decode or
validate is returned apart (with why), never folded; the sinks' consumer loop dead-letters it once.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from base.errors import ContractError, ServiceError
from base.kafka import new_consumer, watermarks
from base.settings import KafkaSettings
from schemas.codec import AvroCodec
from schemas.models import validate
from schemas.topics import Topic

log = logging.getLogger("gpuledger.eventlog")


@dataclass(frozen=True, slots=True)
class Unreadable:
    partition: int
    offset: int
    why: str


def read_events(
    kafka: KafkaSettings, topic: Topic, *, codec: AvroCodec | None = None, timeout_s: float = 30.0
) -> tuple[list[dict[str, Any]], list[Unreadable]]:
    """Every valid record of `topic` (in partition, offset order) and the ones that are not. ServiceError when
    the topic cannot be listed or read to its end within `timeout_s`."""
    codec = codec or AvroCodec.from_settings(kafka)
    name = kafka.topic(topic.name)
    reader = new_consumer(kafka, "gpuledger-eventlog", **{"enable.partition.eof": True})
    try:
        try:
            listed = reader.list_topics(name, timeout=min(30.0, timeout_s)).topics.get(name)
        except KafkaException as exc:
            raise ServiceError(f"cannot list the partitions of {name}: {exc}") from exc
        if listed is None or listed.error is not None:
            raise ServiceError(f"topic {name} does not exist (run `gpuledger topics apply`)")
        ends: dict[int, int] = {}
        start = []
        for p in sorted(listed.partitions):
            lo, hi = watermarks(reader, TopicPartition(name, p), min(30.0, timeout_s))
            if hi > lo:
                ends[p] = hi
                start.append(TopicPartition(name, p, lo))
        got: list[tuple[int, int, dict[str, Any]]] = []
        bad: list[Unreadable] = []
        if start:
            reader.assign(start)
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise ServiceError(f"{name} not read to its end within {timeout_s:.0f} s")
            for msg in reader.consume(500, 0.5):
                if msg.error():
                    continue
                p, off = int(msg.partition() or 0), int(msg.offset() or 0)
                try:
                    record = codec.decode(msg.value() or b"", topic.subject).record
                    validate(topic.subject, record)
                    got.append((p, off, record))
                except ContractError as exc:
                    bad.append(Unreadable(p, off, f"{type(exc).__name__}: {exc}"[:500]))
                if off + 1 >= ends.get(p, 0):
                    ends.pop(p, None)
        got.sort(key=lambda item: (item[0], item[1]))
        return [record for _, _, record in got], bad
    finally:
        reader.close()


def read_steps(kafka: KafkaSettings, topic: Topic) -> list[dict[str, Any]]:
    """A workflow topic's valid steps (appeals, reservations, escalations), each unreadable record logged."""
    events, unreadable = read_events(kafka, topic)
    for bad in unreadable:
        log.warning("%s partition %d offset %d not read: %s", topic.name, bad.partition, bad.offset, bad.why)
    return events
