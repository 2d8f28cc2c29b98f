"""Thin adapters over confluent-kafka: publish contract records, with the settings' client config."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException, Producer

from gpuledger.errors import ServiceError
from gpuledger.settings import KafkaSettings
from schemas.codec import AvroCodec
from schemas.topics import Topic

# Throughput defaults a user can override with the standard keys in `kafka.config`.
PRODUCER_DEFAULTS = {
    "linger.ms": "20",
    "compression.type": "lz4",
    "enable.idempotence": "true",
    "acks": "all",
}


class RecordPublisher:
    """Encodes records with their topic's schema and produces them. Used by every producer."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec | None = None, **overrides: str) -> None:
        self._kafka = kafka
        # Confluent framing when a Schema Registry is configured, single-object encoding otherwise.
        self.codec = codec or AvroCodec.from_settings(kafka)
        conf: dict[str, Any] = {**PRODUCER_DEFAULTS, **kafka.client_config(), **overrides}
        self._producer = Producer(conf)
        self._errors: list[str] = []

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err}")

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
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
                    topic_name, value=value, key=key, headers=headers, on_delivery=self._on_delivery
                )
                break
            except BufferError:
                self._producer.poll(0.05)  # local queue full: let deliveries drain, then retry
        self._producer.poll(0)

    def flush(self, timeout_s: float = 30.0) -> None:
        try:
            remaining = self._producer.flush(timeout_s)
        except KafkaException as exc:
            raise ServiceError(f"Kafka flush failed: {exc}") from exc
        if remaining:
            raise ServiceError(f"{remaining} records not delivered within {timeout_s:.0f}s")
        if self._errors:
            errors, self._errors = self._errors, []
            raise ServiceError(f"{len(errors)} records failed delivery, first: {errors[0]}")
