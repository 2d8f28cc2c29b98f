"""Kafka -> ClickHouse sink: decode, map to rows, batch insert, dead-letter, then commit.

Offsets are committed only after the batch is in ClickHouse and its dead letters are delivered,
so a crash at any point replays from the last commit, and the writer makes the replay a no-op.
When ClickHouse is unavailable the sink pauses its partitions, keeps polling (so it stays in the
group), retries the same batch with exponential backoff, and resumes when it lands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from gpuledger.consumer import SourceRecord, dead_letter, decode_or_dead_letter
from gpuledger.errors import ContractError, ServiceError
from gpuledger.kafka import RecordPublisher
from gpuledger.settings import KafkaSettings, SinksSettings
from schemas.codec import AvroCodec
from schemas.topics import Topic
from sinks.rows import DEFAULT_TOPICS, SINKS, TOPICS_BY_NAME, TableSpec
from sinks.writer import ClickHouseUnavailable, LedgerWriter, Origin, Pending, Rejected

log = logging.getLogger(__name__)


class RowRejected(ContractError):
    """ClickHouse refused a row of this record (constraint, type, range), or it could not be mapped."""


@dataclass(slots=True)
class SinkStats:
    batches: int = 0
    records: int = 0
    rows_inserted: int = 0
    duplicates_skipped: int = 0
    dead_lettered: int = 0
    retries: int = 0
    commits_failed: int = 0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class LedgerSink:
    """One sink process: consumes the given topics (catalogue names) into ClickHouse."""

    def __init__(
        self,
        kafka: KafkaSettings,
        sinks: SinksSettings,
        writer: LedgerWriter,
        *,
        codec: AvroCodec | None = None,
        topics: list[str] | None = None,
        clock_ms: Callable[[], int] = now_ms,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        names = topics or sinks.topics or list(DEFAULT_TOPICS)
        unknown = [n for n in names if n not in SINKS]
        if unknown:
            raise ServiceError(f"no sink for topic(s) {unknown}; known: {sorted(SINKS)}")
        self._kafka = kafka
        self._cfg = sinks
        self._writer = writer
        self._codec = codec or AvroCodec.from_settings(kafka)
        self._clock_ms = clock_ms
        self._sleep = sleep
        # actual (prefixed) topic name -> (catalogue topic, table specs)
        self._routes: dict[str, tuple[Topic, tuple[TableSpec, ...]]] = {
            kafka.topic(n): (TOPICS_BY_NAME[n], SINKS[n]) for n in names
        }
        conf: dict[str, Any] = {
            **kafka.client_config(),
            "group.id": sinks.group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
        self._consumer = Consumer(conf)
        self._publisher = RecordPublisher(kafka, self._codec)
        self._paused = False
        self.stats = SinkStats()

    # -- main loop --------------------------------------------------------------------------

    def run(self, should_stop: Callable[[], bool], *, max_idle_s: float | None = None) -> SinkStats:
        """Consume until `should_stop()` or, when given, `max_idle_s` without a record."""
        self._consumer.subscribe(list(self._routes))
        idle_since = time.monotonic()
        try:
            while not should_stop():
                if self.step() or not self._consumer.assignment():  # joining the group is not idling
                    idle_since = time.monotonic()
                elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                    break
        finally:
            self.close()
        return self.stats

    def step(self) -> int:
        """Consume one batch and land it. Returns the number of records handled."""
        messages = self._consumer.consume(num_messages=self._cfg.batch_max_records, timeout=self._cfg.batch_max_wait_s)
        records = [m for m in messages if self._usable(m)]
        if not records:
            return 0
        pending, dead = self._decode(records)
        result = self._write_with_retry(pending)
        dead.extend(result.rejected)
        self._dead_letter(dead)
        self._publisher.flush()  # every dead letter delivered before the offsets move
        self._commit(records)
        self.stats.batches += 1
        self.stats.records += len(records)
        self.stats.rows_inserted += sum(result.inserted.values())
        self.stats.duplicates_skipped += result.skipped_duplicates
        return len(records)

    def close(self) -> None:
        try:
            self._publisher.flush(10)
        finally:
            self._consumer.close()

    # -- pieces -----------------------------------------------------------------------------

    def _usable(self, msg: Any) -> bool:
        err = msg.error()
        if err is None:
            return True
        if err.fatal():
            raise ServiceError(f"Kafka consumer failed: {err}")
        log.warning("consumer error (continuing): %s", err)
        return False

    def _decode(self, records: list[Any]) -> tuple[list[Pending], list[Rejected]]:
        pending: list[Pending] = []
        dead: list[Rejected] = []
        for msg in records:
            topic, specs = self._routes[msg.topic()]
            ts_type, ts = msg.timestamp()
            origin = Origin(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), ts if ts_type else None)
            record = decode_or_dead_letter(msg, self._codec, self._publisher, subject=topic.subject)
            if record is None:  # undecodable or invalid: already on <topic>.dlq with the reason
                self.stats.dead_lettered += 1
                continue
            try:
                rows = [(spec, row) for spec in specs for row in spec.rows(record)]
            except (KeyError, TypeError, ValueError) as exc:
                dead.append(Rejected(origin, "", type(exc).__name__, f"cannot map to rows: {exc!r}"))
                continue
            pending.extend(Pending(spec, row, origin) for spec, row in rows)
        return pending, dead

    def _write_with_retry(self, pending: list[Pending]) -> Any:
        delay = self._cfg.retry_initial_s
        while True:
            try:
                result = self._writer.write(pending)
            except ClickHouseUnavailable as exc:
                self.stats.retries += 1
                self._pause()
                log.warning("ClickHouse unavailable, retrying in %.1fs: %s", delay, str(exc)[:300])
                self._wait(delay)
                delay = min(delay * 2, self._cfg.retry_max_s)
                continue
            self._resume()
            return result

    def _pause(self) -> None:
        if not self._paused:
            self._consumer.pause(self._consumer.assignment())
            self._paused = True

    def _resume(self) -> None:
        if self._paused:
            self._consumer.resume(self._consumer.assignment())
            self._paused = False

    def _wait(self, seconds: float) -> None:
        """Sleep while staying in the group. A record from a partition assigned meanwhile (not
        paused) is put back with a seek, so nothing is skipped."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = self._consumer.poll(min(left, 0.5))
            if msg is not None and msg.error() is None:
                tp = TopicPartition(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
                self._consumer.seek(tp)
                self._consumer.pause([tp])

    def _dead_letter(self, dead: list[Rejected]) -> None:
        for item in dead:
            o = item.origin
            topic, _ = self._routes[o.topic]
            where = f"{item.table}: " if item.table else ""
            error = RowRejected(f"{where}{item.error_class}: {item.reason}")
            source = SourceRecord(o.topic, o.partition, o.offset, o.key, o.value, o.timestamp_ms)
            dead_letter(source, error, self._codec, self._publisher, subject=topic.subject, clock=self._clock_ms)
            self.stats.dead_lettered += 1
            log.warning("dead-lettered %s[%d]@%d: %s", o.topic, o.partition, o.offset, str(error)[:200])

    def _commit(self, records: list[Any]) -> None:
        last: dict[tuple[str, int], int] = {}
        for m in records:
            key = (m.topic(), m.partition())
            last[key] = max(last.get(key, -1), m.offset())
        offsets = [TopicPartition(t, p, o + 1) for (t, p), o in last.items()]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Partitions moved to another sink during the batch: it replays them, idempotently.
            self.stats.commits_failed += 1
            log.warning("offset commit failed (the next owner replays, idempotently): %s", exc)
