"""Kafka -> ClickHouse sink: the handler of `streams.consume.ConsumerLoop` that maps a batch of
decoded records to rows and inserts them.

The loop commits offsets only after the handler returned (the batch is in ClickHouse) and the dead
letters are delivered, so a crash at any point replays from the last commit, and the writer makes the
replay a no-op. When ClickHouse is unavailable the handler holds the loop (its partitions paused, still
polling so it stays in the group), retries the same batch with exponential backoff, and returns when
it lands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from base.errors import ContractError, ServiceError
from base.settings import ClickHouseSettings, KafkaSettings, SinksSettings
from schemas.codec import AvroCodec
from schemas.records import NodeScrape
from schemas.topics import DEVICE_SAMPLES, Topic
from sinks.bulk_samples import RawSampleBulk
from sinks.rows import DEFAULT_TOPICS, SINKS, TOPICS_BY_NAME, TableSpec
from sinks.seconds_kept import SecondsKept, scrape_ts_ms
from sinks.writer import ClickHouseUnavailable, LedgerWriter, Origin, Pending, Rejected, WriteResult
from streams.consume import ConsumerLoop, Received, Refused, SourceRecord
from streams.publish import RecordPublisher

log = logging.getLogger(__name__)


class RowRejected(ContractError):
    """ClickHouse refused a row of this record (constraint, type, range), or it could not be mapped."""


class _Stopping(ServiceError):
    """A stop came while a batch waited for ClickHouse: the batch is left uncommitted (replayed)."""


@dataclass(slots=True)
class SinkStats:
    batches: int = 0
    records: int = 0
    rows_inserted: int = 0
    duplicates_skipped: int = 0
    dead_lettered: int = 0
    retries: int = 0
    commits_failed: int = 0
    bulk_records: int = 0  # raw-sample records landed in bulk (sinks/bulk_samples.py), part of `records`
    bulk_refused: int = 0  # bulk inserts refused, their batch sent record by record
    samples_not_kept: int = 0  # node scrapes `clickhouse.raw_samples_kept` leaves out of raw_samples (consumed)


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
        kept: SecondsKept | None = None,
    ) -> None:
        names = topics or sinks.topics or list(DEFAULT_TOPICS)
        unknown = [n for n in names if n not in SINKS]
        if unknown:
            raise ServiceError(f"no sink for topic(s) {unknown}; known: {sorted(SINKS)}")
        # What raw_samples keeps (clickhouse.raw_samples_kept); `minutes`: the sink does not read the samples.
        self._kept = kept or SecondsKept.of(ClickHouseSettings())
        if not self._kept.writes and DEVICE_SAMPLES.name in names:
            names = [n for n in names if n != DEVICE_SAMPLES.name]
            if not names:
                raise ServiceError(f"raw samples are not kept (clickhouse.raw_samples_kept = minutes): no sink reads "
                                   f"{DEVICE_SAMPLES.name}")  # fmt: skip
            log.info("raw samples are not kept (clickhouse.raw_samples_kept = minutes): %s is not read",
                     DEVICE_SAMPLES.name)  # fmt: skip
        self._not_kept = 0
        self._not_kept_in_bulk = 0
        self._cfg = sinks
        self._writer = writer
        self._sleep = sleep
        # actual (prefixed) topic name -> (catalogue topic, table specs)
        self._routes: dict[str, tuple[Topic, tuple[TableSpec, ...]]] = {
            kafka.topic(n): (TOPICS_BY_NAME[n], SINKS[n]) for n in names
        }
        codec = codec or AvroCodec.from_settings(kafka)
        samples = kafka.topic(DEVICE_SAMPLES.name)
        self._samples = samples
        self._bulk = (
            RawSampleBulk(writer.client, codec, samples) if sinks.bulk_raw_samples and samples in self._routes else None
        )
        self.loop = ConsumerLoop(
            kafka,
            sinks.group_id,
            list(self._routes),
            publisher=RecordPublisher(kafka, codec),
            codec=codec,
            batch_max_records=sinks.batch_max_records,
            batch_max_wait_s=sinks.batch_max_wait_s,
            clock=clock_ms,
            config={"isolation.level": "read_committed"},
            bulk=self._land_in_bulk if self._bulk is not None or self._kept.mode == "sampled" else None,
        )
        self._rows_inserted = 0
        self._duplicates_skipped = 0
        self._retries = 0

    # The loop's client and dead-letter publisher, as a subclass may wrap them (metrics).
    @property
    def stats(self) -> SinkStats:
        s = self.loop.stats
        return SinkStats(
            batches=s.batches,
            records=s.records,
            rows_inserted=self._rows_inserted,
            duplicates_skipped=self._duplicates_skipped,
            dead_lettered=s.dead_lettered,
            retries=self._retries,
            commits_failed=s.commits_failed,
            bulk_records=s.bulk - self._not_kept_in_bulk,
            bulk_refused=self._bulk.stats.fell_back if self._bulk is not None else 0,
            samples_not_kept=self._not_kept,
        )

    def run(self, should_stop: Callable[[], bool], *, max_idle_s: float | None = None) -> SinkStats:
        """Consume until `should_stop()` or, when given, `max_idle_s` without a record. With a
        `base.shutdown.StopSignal`, a stop ends it within the signal's deadline whatever the broker
        or ClickHouse do: a batch not landed and committed by then is replayed at the next start."""
        self.loop.run(self.handle, should_stop, max_idle_s=max_idle_s)
        return self.stats

    def step(self) -> int:
        """Consume one batch and land it. Returns the number of records consumed."""
        return self.loop.step(self.handle)

    def close(self) -> None:
        self.loop.close()

    def handle(self, batch: list[Received]) -> list[Refused]:
        """Land a batch in ClickHouse (waiting for it to be there); the records that cannot be mapped
        to rows, or whose rows ClickHouse refuses, are returned to be dead-lettered."""
        pending, refused = self._rows(batch)
        result = self._write_with_retry(pending)
        refused.extend(self._refusal(r) for r in result.rejected)
        self._rows_inserted += sum(result.inserted.values())
        self._duplicates_skipped += result.skipped_duplicates
        return refused

    def _land_in_bulk(self, records: list[SourceRecord]) -> list[SourceRecord]:
        """Raw samples straight into ClickHouse (`sinks.bulk_samples`); returns what goes record by record. The
        scrapes `raw_samples_kept` leaves out are taken here too (consumed, committed, written nowhere)."""
        if self._kept.mode == "sampled":
            kept = [r for r in records if not self._left_out(r)]
            self._not_kept_in_bulk += len(records) - len(kept)
            records = kept
        if self._bulk is None:
            return records
        before = self._bulk.stats.rows
        left = self._bulk(records)
        self._bulk_landed(self._bulk.stats.rows - before)
        return left

    def _bulk_landed(self, rows: int) -> None:
        self._rows_inserted += rows

    def _left_out(self, r: SourceRecord) -> bool:
        """A device-samples record whose second raw_samples does not keep (read from its first bytes)."""
        if r.topic != self._samples or r.value is None:
            return False
        ts_ms = scrape_ts_ms(r.value)
        if ts_ms is None or self._kept.keeps(ts_ms):
            return False  # unreadable ones go on: the row path decodes and judges them
        self._not_kept += 1
        return True

    # -- pieces -----------------------------------------------------------------------------

    def _rows(self, batch: list[Received]) -> tuple[list[Pending], list[Refused]]:
        pending: list[Pending] = []
        refused: list[Refused] = []
        for received in batch:
            src = received.source
            _, specs = self._routes[src.topic]
            origin = Origin(src.topic, src.partition, src.offset, src.key, src.value, src.timestamp_ms)
            try:
                record = specs[0].record_type.from_avro(received.record)  # typed once, read by every table
                if isinstance(record, NodeScrape) and not self._kept.keeps(record.ts_ms):
                    self._not_kept += 1
                    continue
                rows = [(spec, row) for spec in specs for row in spec.to_rows(record)]
            except (KeyError, TypeError, ValueError) as exc:
                refused.append(self._refusal(Rejected(origin, "", type(exc).__name__, f"cannot map to rows: {exc!r}")))
                continue
            pending.extend(Pending(spec, row, origin) for spec, row in rows)
        return pending, refused

    @staticmethod
    def _refusal(item: Rejected) -> Refused:
        o = item.origin
        where = f"{item.table}: " if item.table else ""
        error = RowRejected(f"{where}{item.error_class}: {item.reason}")
        return Refused(SourceRecord(o.topic, o.partition, o.offset, o.key, o.value, o.timestamp_ms), error)

    def _write_with_retry(self, pending: list[Pending]) -> WriteResult:
        delay = self._cfg.retry_initial_s
        while True:
            try:
                result = self._writer.write(pending)
            except ClickHouseUnavailable as exc:
                if self.loop.stopping:
                    raise _Stopping(f"ClickHouse unavailable: {str(exc)[:300]}") from exc
                self._retries += 1
                log.warning("ClickHouse unavailable, retrying in %.1fs: %s", delay, str(exc)[:300])
                self.loop.hold(delay)
                delay = min(delay * 2, self._cfg.retry_max_s)
                continue
            self.loop.release()
            return result
