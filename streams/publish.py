"""Publishing contract records: encode with the topic's schema, produce with the settings' client."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException

from base.errors import ContractError, NotDelivered, ServiceError
from base.kafka import is_fatal, new_producer, new_telemetry_producer
from base.settings import KafkaSettings
from schemas.codec import AvroCodec
from schemas.records import ContractRecord
from schemas.topics import Topic

# Errors no wait cures (a login or a certificate refused, no right to the topic): records waiting behind one
# are not "not delivered yet" but refused, so a caller that waits out a broker away stops.
REFUSALS = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


class _Outcome:
    """What the client's callbacks report. Apart from the publisher: a callback bound to the publisher would make
    publisher -> producer -> callback -> publisher, a cycle through the C client that the collector cannot see,
    so a dropped publisher's producer (and its threads) would live and retry for the rest of the process."""

    __slots__ = ("errors", "refused")

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.refused: str | None = None  # why the cluster will not take records however long one waits

    def on_error(self, err: KafkaError) -> None:
        if is_fatal(err) or err.code() in REFUSALS:
            self.refused = str(err)

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}: {err}")


class RecordPublisher:
    """Encodes records with their topic's schema and produces them. Used by every producer."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec | None = None, *, telemetry: bool = False,
                 **overrides: str) -> None:  # fmt: skip
        """`telemetry`: a telemetry producer's publisher (`kafka.telemetry`'s compression and linger)."""
        self._kafka = kafka
        # Confluent framing when a Schema Registry is configured, single-object encoding otherwise.
        self.codec = codec or AvroCodec.from_settings(kafka)
        self._outcome = _Outcome()
        build = new_telemetry_producer if telemetry else new_producer
        self._producer = build(kafka, error_cb=self._outcome.on_error, **overrides)

    def publish(self, topic: Topic, key: bytes, record: ContractRecord | dict[str, Any]) -> None:
        """Encode `record` with `topic`'s schema and produce it.

        `record` is a typed record (`schemas.records`), refused when it is another subject than the
        topic carries, or a dict in the Avro shape (`to_avro()`'s), which callers holding decoded
        dicts (republishing, dead letters, builders not yet typed) still pass."""
        if not isinstance(record, dict):
            if topic.subject != record.SUBJECT:
                raise ContractError(f"a {record.SUBJECT!r} record cannot go to {topic.name!r} ({topic.subject!r})")
            record = record.to_avro()
        value = self.codec.encode(topic.subject, record)
        self.publish_raw(self._kafka.topic(topic.name), key, value)

    @property
    def kafka(self) -> KafkaSettings:
        return self._kafka

    def publish_raw(
        self,
        topic_name: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    topic_name, value=value, key=key, headers=headers, on_delivery=self._outcome.on_delivery
                )
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let deliveries drain, then retry
        self._producer.poll(0)

    def poll(self, timeout_s: float) -> None:
        """Serve the client's delivery reports for up to `timeout_s` (a producer paced to the clock waits here)."""
        self._producer.poll(timeout_s)

    @property
    def queued(self) -> int:
        """Records produced and not yet acknowledged: in the client's queue or in flight to the cluster."""
        return len(self._producer)

    def flush(self, timeout_s: float = 30.0) -> None:
        try:
            remaining = self._producer.flush(timeout_s)
        except KafkaException as exc:
            raise ServiceError(f"Kafka flush failed: {exc}") from exc
        outcome = self._outcome
        if remaining and outcome.refused is not None:
            raise ServiceError(f"{remaining} records not delivered: {outcome.refused}")
        if remaining:
            raise NotDelivered(f"{remaining} records not delivered within {timeout_s:.0f}s")
        outcome.refused = None  # all delivered: a refusal seen before (a login not created yet) is over
        if outcome.errors:
            errors, outcome.errors = outcome.errors, []
            raise ServiceError(f"{len(errors)} records failed delivery, first: {errors[0]}")
