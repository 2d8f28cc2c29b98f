"""Reading contract topics: decode and validate every record, or send it to `<topic>.dlq`.

Any consumer (processors, sinks, tools) uses one of two entry points:

- `decode_or_dead_letter(msg, codec, publisher)` for a consumer loop it owns (faust agents build a
  `SourceRecord` from the event's message; `publisher` is a `RecordPublisher` or anything with its
  `publish_raw`): returns the decoded record dict, or None after producing the record to the
  dead-letter topic (`dead_letter_message` builds that message without producing it);
- `ConsumerLoop`, the consumer loop of the ClickHouse sink (chat and reclaim run the same steps as a
  faust agent, `streams.agents.RecordAgent`): decode-or-dead-letter a batch, hand it to a handler,
  dead-letter what the handler `Refused`, deliver the dead letters, then commit.

A dead letter goes to `<source topic>.dlq` (the source topic name as the broker knows it, prefix
included) with the source key as its key. Its value is a `deadletter` record (schemas/deadletter.avsc)
encoded with the same codec as everything else: the original key and value bytes untouched, the
error, the source topic/partition/offset and the writer fingerprint, so a DLQ can be read,
inspected and replayed with the ordinary tools. The same facts are in the headers, so `kcat` or a
console consumer shows why without decoding:

    dlq.error.class         MalformedRecord | UnknownSchema | WrongSubject | InvalidRecord
    dlq.error.message       what was wrong
    dlq.source.topic        source topic
    dlq.source.partition    source partition (decimal)
    dlq.source.offset       source offset (decimal)
    dlq.schema.fingerprint  crc64:<hex> or registry-id:<n> from the framing; empty when none

What is a dead letter: bytes in neither framing, an unknown writer schema, a body that does not
decode, a record of another subject than the topic carries (per the topic catalogue), and a record
that breaks its model's rules (`schemas.models.validate`). What is not: a Schema Registry that
cannot be reached (`ServiceError` is raised; the records are fine, the worker retries or stops).
Nothing is dropped: the caller must not commit an offset before `publisher.flush()` returned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from base.errors import ContractError, ServiceError
from base.kafka import is_fatal, new_consumer
from base.settings import KafkaSettings
from base.shutdown import CLOSE_RESERVE_S, CLOSE_WAIT_S, budget, close_within
from schemas.codec import AvroCodec, Decoded
from schemas.models import validate as validate_record
from schemas.topics import topic_named
from streams.publish import RecordPublisher

log = logging.getLogger(__name__)

HEADER_ERROR_CLASS = "dlq.error.class"
HEADER_ERROR_MESSAGE = "dlq.error.message"
HEADER_SOURCE_TOPIC = "dlq.source.topic"
HEADER_SOURCE_PARTITION = "dlq.source.partition"
HEADER_SOURCE_OFFSET = "dlq.source.offset"
HEADER_SCHEMA_FINGERPRINT = "dlq.schema.fingerprint"
DLQ_SUFFIX = ".dlq"
DEADLETTER_SUBJECT = "deadletter"

Clock = Callable[[], int]


def wall_clock_ms() -> int:
    """Now, UTC epoch milliseconds (the time a record is dead-lettered; injected for tests)."""
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """A consumed record, whichever client consumed it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None

    @classmethod
    def of(cls, msg: Any) -> SourceRecord:
        """From a confluent-kafka `Message`, or an aiokafka `ConsumerRecord` / faust `ConsumerMessage`
        (attributes instead of methods; faust's timestamp is float seconds). A `SourceRecord` is returned as is."""
        if isinstance(msg, SourceRecord):
            return msg
        if not callable(msg.topic):
            ts = msg.timestamp
            ts_ms = None if ts is None else round(ts * 1000) if isinstance(ts, float) else int(ts)
            return cls(msg.topic, msg.partition, msg.offset, msg.key, msg.value, ts_ms)
        kind, ts = msg.timestamp()
        return cls(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), ts if kind else None)


@dataclass(frozen=True, slots=True)
class Received:
    """A record that decoded and validated."""

    source: SourceRecord
    subject: str
    record: dict[str, Any]


def expected_subject(topic_name: str, prefix: str = "") -> str | None:
    """The subject a broker-side topic carries per the catalogue; None for topics it does not list."""
    topic = topic_named(topic_name, prefix)
    return topic.subject if topic is not None else None


MAX_HEADER_MESSAGE = 1000
MAX_ENVELOPE_MESSAGE = 4000

Headers = list[tuple[str, str | bytes | None]]


class DeadLetterSink(Protocol):
    """Where dead letters are produced: a `RecordPublisher`, or a faust/aiokafka adapter with this method."""

    def publish_raw(
        self, topic_name: str, key: bytes | None, value: bytes | None, headers: Headers | None = None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class DeadLetterMessage:
    """The message to produce for one dead letter."""

    topic: str
    key: bytes | None
    value: bytes
    headers: Headers


def dead_letter_message(
    source: SourceRecord,
    error: ContractError,
    codec: AvroCodec,
    *,
    subject: str | None = None,
    now_ms: int,
) -> DeadLetterMessage:
    """The DeadLetter envelope and headers for `source` (pure: produce it however the caller produces)."""
    fingerprint = getattr(error, "fingerprint", None)
    if fingerprint is None and source.value is not None:
        fingerprint = AvroCodec.writer_fingerprint(source.value)
    message = str(error)
    envelope = {
        "source_topic": source.topic,
        "source_partition": source.partition,
        "source_offset": source.offset,
        "key": source.key,
        "value": source.value,
        "error_class": type(error).__name__,
        "error_message": message[:MAX_ENVELOPE_MESSAGE],
        "schema_fingerprint": fingerprint,
        "ts_ms": now_ms,
        "source_subject": subject,
        "source_timestamp_ms": source.timestamp_ms,
    }
    headers: Headers = [
        (HEADER_ERROR_CLASS, type(error).__name__.encode()),
        (HEADER_ERROR_MESSAGE, message[:MAX_HEADER_MESSAGE].encode()),
        (HEADER_SOURCE_TOPIC, source.topic.encode()),
        (HEADER_SOURCE_PARTITION, str(source.partition).encode()),
        (HEADER_SOURCE_OFFSET, str(source.offset).encode()),
        (HEADER_SCHEMA_FINGERPRINT, (fingerprint or "").encode()),
    ]
    value = codec.encode(DEADLETTER_SUBJECT, envelope)
    return DeadLetterMessage(source.topic + DLQ_SUFFIX, source.key, value, headers)


def dead_letter(
    source: SourceRecord,
    error: ContractError,
    codec: AvroCodec,
    sink: DeadLetterSink,
    *,
    subject: str | None = None,
    clock: Clock = wall_clock_ms,
) -> None:
    """Produce `source` to `<source.topic>.dlq` with the reason (envelope and headers)."""
    out = dead_letter_message(source, error, codec, subject=subject, now_ms=clock())
    sink.publish_raw(out.topic, out.key, out.value, out.headers)


def decode_or_dead_letter(
    msg: Any,
    codec: AvroCodec,
    publisher: DeadLetterSink,
    *,
    subject: str | None = None,
    topic_prefix: str | None = None,
    validate: bool = True,
    clock: Clock = wall_clock_ms,
) -> dict[str, Any] | None:
    """The decoded (and, with `validate`, model-checked) record of `msg`, or None once it is dead-lettered.

    `msg` is a confluent-kafka `Message` or a `SourceRecord`; `publisher` a `RecordPublisher` (or any
    `DeadLetterSink`). `subject` defaults to the subject the topic carries per the catalogue, with
    `topic_prefix` (default: the publisher's settings) stripped from the topic name; a record of
    another subject is a dead letter. Raises `ServiceError` only for infrastructure failures.
    """
    if topic_prefix is None:
        topic_prefix = str(getattr(getattr(publisher, "kafka", None), "topic_prefix", ""))
    decoded = _decode_or_dead_letter(SourceRecord.of(msg), codec, publisher, subject, topic_prefix, validate, clock)
    return decoded.record if decoded is not None else None


def _decode_or_dead_letter(
    source: SourceRecord,
    codec: AvroCodec,
    sink: DeadLetterSink,
    subject: str | None,
    topic_prefix: str,
    validate: bool,
    clock: Clock,
) -> Decoded | None:
    if subject is None:
        subject = expected_subject(source.topic, topic_prefix)
    try:
        decoded = codec.decode(source.value or b"", expected_subject=subject)
        if validate:
            validate_record(decoded.subject, decoded.record)
    except ContractError as exc:
        dead_letter(source, exc, codec, sink, subject=subject, clock=clock)
        return None
    return decoded


@dataclass(frozen=True, slots=True)
class Refused:
    """A decoded record its handler will not take (it cannot be mapped or stored): it is dead-lettered
    like a record that does not decode, before the batch's offsets are committed."""

    source: SourceRecord
    error: ContractError


# What a handler returns: the records of the batch it refused (None or empty: it took them all).
BatchHandler = Callable[[list[Received]], Iterable[Refused] | None]
# Lands the records it can take without their being decoded here (sinks/bulk_samples.py) and returns the others;
# it lands all it took or none, and the loop decodes and hands on what it returns.
BulkLander = Callable[[list[SourceRecord]], list[SourceRecord]]


@dataclass(slots=True)
class LoopStats:
    batches: int = 0
    records: int = 0  # consumed (errors from the client aside)
    decoded: int = 0  # handed to the handler
    bulk: int = 0  # landed by the bulk lander, not decoded here
    dead_lettered: int = 0  # undecodable, invalid or refused
    commits_failed: int = 0


IDLE_COMMIT_INTERVAL_S = 1.0  # how often an idle loop checks that the group holds what it handled
# A member killed or crashed hands its partitions to the next one within 10 s, not librdkafka's 45 s default:
# heartbeats come from librdkafka's own thread, so a long handler call does not lose the session.
LOOP_GROUP_CONFIG: dict[str, Any] = {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 1000}


class ConsumerLoop:
    """The consumer loop of every component but the processors: consume a batch of contract records,
    decode and validate each (the bad ones to `<topic>.dlq`), hand the good ones to a handler, dead-letter
    what the handler refuses, deliver every dead letter, then commit the batch's offsets.

    At least once: offsets move only after the handler returned and the dead letters are delivered, so
    a crash anywhere replays from the last commit (handlers are idempotent or tolerate a repeat).
    Commits are asynchronous (a synchronous one waits without bound on a coordinator that is frozen or
    still loading); an idle loop commits again what it handled wherever the group does not hold it, so a commit
    that failed, whose outcome never came, or that an older one overtook heals itself. With a
    `base.shutdown.StopSignal` as `should_stop`, every wait on the way out is bounded by its deadline.
    A fatal client error raises `ServiceError`; other client errors are logged and librdkafka retries.
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        group_id: str,
        topics: list[str],  # broker-side names: kafka.topic(catalogue_topic.name)
        *,
        publisher: RecordPublisher | None = None,
        codec: AvroCodec | None = None,
        validate: bool = True,
        batch_max_records: int = 500,
        batch_max_wait_s: float = 0.5,
        clock: Clock = wall_clock_ms,
        config: Mapping[str, Any] | None = None,  # librdkafka keys over the factory's consumer defaults
        bulk: BulkLander | None = None,
    ) -> None:
        self._kafka = kafka
        self.group_id = group_id
        self.codec = codec or AvroCodec.from_settings(kafka)
        self.publisher = publisher or RecordPublisher(kafka, self.codec)
        self._validate = validate
        self._bulk = bulk
        self._batch = (batch_max_records, batch_max_wait_s)
        self._clock = clock
        self.consumer: Any = new_consumer(
            kafka, group_id, on_commit=self._on_commit, **{**LOOP_GROUP_CONFIG, **(config or {})}
        )
        self.consumer.subscribe(list(topics))
        self.stats = LoopStats()
        self._should_stop: Callable[[], bool] = lambda: False  # run()'s: a StopSignal bounds the waits
        self._paused = False
        # What the group holds, as the broker confirmed it, per partition: an idle loop commits again
        # what it handled (`_landed`) wherever this differs.
        self._confirmed: dict[tuple[str, int], int] = {}
        self._landed: dict[tuple[str, int], int] = {}  # per partition, the offset after the last record handled
        self._last_idle_commit = 0.0

    # -- the loop -----------------------------------------------------------------------------

    def run(
        self, handle: BatchHandler, should_stop: Callable[[], bool], *, max_idle_s: float | None = None
    ) -> LoopStats:
        """Handle batches until `should_stop()` or, when given, `max_idle_s` without a record, then close.
        A `ServiceError` once stopping (a wait given up on) ends it quietly: the batch is not committed
        and is replayed at the next start."""
        self._should_stop = should_stop
        idle_since = time.monotonic()
        try:
            while not should_stop():
                if self.step(handle) or not self.consumer.assignment():  # joining the group is not idling
                    idle_since = time.monotonic()
                elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                    break
        except ServiceError as exc:
            if not should_stop():
                raise
            log.warning("stopping without finishing the batch (not committed, replayed at the next start): %s", exc)
        finally:
            self.close()
        return self.stats

    def step(self, handle: BatchHandler) -> int:
        """Consume one batch and see it through (or, with nothing to read, heal the commits). Returns the
        number of records consumed."""
        try:
            messages = self.consumer.consume(num_messages=self._batch[0], timeout=self._batch[1])
        except KafkaException as exc:
            raise ServiceError(f"Kafka consume failed: {exc}") from exc
        records = [m for m in messages if self._usable(m)]
        if not records:
            self._commit_again()
            return 0
        sources = [SourceRecord.of(m) for m in records]
        if self._bulk is not None:  # what it lands needs no decoding here
            left = self._bulk(sources)
            self.stats.bulk += len(sources) - len(left)
            sources = left
        good: list[Received] = []
        for source in sources:
            decoded = _decode_or_dead_letter(
                source, self.codec, self.publisher, None, self._kafka.topic_prefix, self._validate, self._clock
            )
            if decoded is None:  # already on <topic>.dlq with the reason
                self.stats.dead_lettered += 1
                log.warning("dead-lettered %s[%d]@%d: it does not decode or validate", *_where(source))
            else:
                good.append(Received(source, decoded.subject, decoded.record))
        self.stats.decoded += len(good)
        refused = list(handle(good) or ()) if good else []
        for item in refused:
            self._dead_letter(item)
        # Every dead letter delivered before the offsets move (raises, so no commit, if not in time).
        self.publisher.flush(budget(self._should_stop, 30.0, CLOSE_RESERVE_S))
        self._commit(records)
        self.stats.batches += 1
        self.stats.records += len(records)
        return len(records)

    def close(self) -> None:
        """Deliver pending dead letters, then leave the group (waiting for the last commit), each
        bounded: a close to a broker that is gone or frozen would otherwise wait without end."""
        try:
            self.publisher.flush(budget(self._should_stop, CLOSE_WAIT_S, CLOSE_RESERVE_S))
        except ServiceError as exc:
            log.warning("closing with dead letters undelivered (their batch is not committed): %s", exc)
        finally:
            what = f"closing the {self.group_id} consumer (and its last commit)"
            close_within(self.consumer.close, what, self._should_stop)

    # -- staying in the group while a handler waits ---------------------------------------------

    def hold(self, seconds: float) -> None:
        """Wait `seconds` without reading on (the assigned partitions paused) while staying in the
        group: for a handler that waits for its destination to come back. A record from a partition
        assigned meanwhile is put back with a seek, so nothing is skipped. `release()` resumes."""
        if not self._paused:
            self.consumer.pause(self.consumer.assignment())
            self._paused = True
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = self.consumer.poll(min(left, 0.5))
            if msg is not None and msg.error() is None:
                tp = TopicPartition(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
                self.consumer.seek(tp)
                self.consumer.pause([tp])

    def release(self) -> None:
        """Read on after `hold`."""
        if self._paused:
            self.consumer.resume(self.consumer.assignment())
            self._paused = False

    @property
    def stopping(self) -> bool:
        return self._should_stop()

    # -- pieces -------------------------------------------------------------------------------

    def _usable(self, msg: Any) -> bool:
        err = msg.error()
        if err is None:
            return True
        if is_fatal(err):
            raise ServiceError(f"Kafka consumer failed: {err}")
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error (continuing): %s", err)
        return False

    def _dead_letter(self, item: Refused) -> None:
        src = item.source
        subject = expected_subject(src.topic, self._kafka.topic_prefix)
        dead_letter(src, item.error, self.codec, self.publisher, subject=subject, clock=self._clock)
        self.stats.dead_lettered += 1
        log.warning("dead-lettered %s[%d]@%d: %s", *_where(src), str(item.error)[:200])

    def _commit(self, records: list[Any]) -> None:
        last: dict[tuple[str, int], int] = {}
        for m in records:
            key = (m.topic(), m.partition())
            last[key] = max(last.get(key, -1), m.offset())
        for key, offset in last.items():
            self._landed[key] = max(self._landed.get(key, -1), offset + 1)
        self._commit_async([TopicPartition(t, p, o + 1) for (t, p), o in last.items()])

    def _commit_again(self) -> None:
        """With nothing new to read, commit again, for every owned partition, the offset after the last
        record this loop handled, wherever the group does not hold it: a commit that failed (the
        coordinator was away), whose outcome never came, or that an older one overtook would otherwise
        show as lag for ever. Only what was handled is ever committed (not the client's position)."""
        now = time.monotonic()
        if now - self._last_idle_commit < IDLE_COMMIT_INTERVAL_S:
            return
        self._last_idle_commit = now
        owned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
        for key in [k for k in self._landed if k not in owned]:
            del self._landed[key]  # no longer ours: its new owner commits it
        held = self._confirmed
        behind = [(t, p, o) for (t, p), o in self._landed.items() if held.get((t, p)) != o]
        if behind:
            self._commit_async([TopicPartition(t, p, o) for t, p, o in behind])

    def _commit_async(self, offsets: list[TopicPartition]) -> None:
        # Asynchronous (the outcome comes to _on_commit).
        try:
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            self._on_commit(exc.args[0] if exc.args else exc, offsets)

    def _on_commit(self, err: Any, partitions: list[TopicPartition]) -> None:
        failed = []
        for tp in partitions:
            if err is None and tp.error is None:
                self._confirmed[(tp.topic, tp.partition)] = tp.offset
            else:
                failed.append(tp)
        if failed:
            # Committed again when idle if the partitions are still ours; else their new owner replays them.
            self.stats.commits_failed += 1
            log.warning(
                "offset commit failed (committed again when idle, or replayed by the next owner): %s",
                err if err is not None else failed[0].error,
            )


def _where(source: SourceRecord) -> tuple[str, int, int]:
    return source.topic, source.partition, source.offset
