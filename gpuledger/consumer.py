"""Reading contract topics: decode and validate every record, or send it to `<topic>.dlq`.

Any consumer (processors, sinks, tools) uses one of two entry points:

- `decode_or_dead_letter(msg, codec, publisher)` for a consumer loop it owns (faust agents build a
  `SourceRecord` from the event's message; `publisher` is a `RecordPublisher` or anything with its
  `publish_raw`): returns the decoded record dict, or None after producing the record to the
  dead-letter topic (`dead_letter_message` builds that message without producing it);
- `ContractConsumer`, a confluent-kafka consumer that does the above for a batch and commits
  offsets only after the dead letters are delivered.

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

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from gpuledger.errors import ContractError, ServiceError
from gpuledger.kafka import RecordPublisher
from gpuledger.settings import KafkaSettings
from schemas.codec import AvroCodec, Decoded
from schemas.models import validate as validate_record
from schemas.topics import topic_named

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


class ContractConsumer:
    """A confluent-kafka consumer of contract topics that yields only decoded, valid records.

    Bad records go to their topic's `.dlq`; `commit()` delivers the dead letters before it commits
    offsets, so a crash in between re-reads (and re-dead-letters) rather than drops.
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
        clock: Clock = wall_clock_ms,
        **overrides: str,
    ) -> None:
        from confluent_kafka import Consumer

        self._kafka = kafka
        self.codec = codec or AvroCodec.from_settings(kafka)
        self.publisher = publisher or RecordPublisher(kafka, self.codec)
        self._validate = validate
        self._clock = clock
        conf: dict[str, Any] = {
            **kafka.client_config(),
            "group.id": group_id,
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
            **overrides,
        }
        self._consumer = Consumer(conf)
        self._consumer.subscribe(list(topics))
        self.decoded = 0
        self.dead_lettered = 0

    def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[Received]:
        """Up to `max_records` good records; bad ones are dead-lettered on the way."""
        from confluent_kafka import KafkaException

        try:
            messages = self._consumer.consume(max_records, timeout=timeout_s)
        except KafkaException as exc:
            raise ServiceError(f"Kafka consume failed: {exc}") from exc
        out: list[Received] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():
                    raise ServiceError(f"Kafka consumer failed: {err.str()}")
                continue  # end of partition, transient client errors: librdkafka retries on its own
            source = SourceRecord.of(msg)
            decoded = _decode_or_dead_letter(
                source, self.codec, self.publisher, None, self._kafka.topic_prefix, self._validate, self._clock
            )
            if decoded is None:
                self.dead_lettered += 1
                continue
            self.decoded += 1
            out.append(Received(source, decoded.subject, decoded.record))
        return out

    def commit(self) -> None:
        """Deliver pending dead letters, then commit the consumed offsets."""
        from confluent_kafka import KafkaError, KafkaException

        self.publisher.flush()
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError._NO_OFFSET:
                return
            raise ServiceError(f"Kafka commit failed: {exc}") from exc

    def close(self) -> None:
        try:
            self.publisher.flush()
        finally:
            self._consumer.close()
