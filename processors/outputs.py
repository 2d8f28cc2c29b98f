"""The processors' one producer: every record the stages emit, and the proof it was delivered.

A commit may name an input offset only once everything emitted from the input before it is delivered
(`flush`), so delivery errors are collected here and turn the next flush into an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from base.errors import ServiceError
from base.kafka import new_producer
from base.settings import KafkaSettings
from base.shutdown import CLOSE_RESERVE_S, CLOSE_WAIT_S, StopSignal, flush_within
from schemas.codec import AvroCodec

FLUSH_WAIT_S = 30.0  # the longest outputs may take to be delivered before a commit gives up (and raises)

Headers = list[tuple[str, str | bytes | None]]
OnDelivery = Callable[[Any, Any], None]


class Outputs:
    """Produce (retrying while the local queue is full), encode, and flush within the stop's budget."""

    def __init__(self, kafka: KafkaSettings, codec: AvroCodec, shutdown: StopSignal) -> None:
        self.producer = new_producer(kafka, **{"linger.ms": "5"})
        self.codec = codec
        self.shutdown = shutdown
        self._errors: list[str] = []  # failed deliveries since the last flush

    def on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err}")

    def send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Headers | None = None,
        on_delivery: OnDelivery | None = None,
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=on_delivery or self.on_delivery
                )
                return
            except BufferError:
                self.producer.poll(0.05)  # local queue full: let deliveries drain, then retry

    def send(self, topic: str, subject: str, key: bytes, record: dict[str, Any]) -> None:
        self.send_raw(topic, key, self.codec.encode(subject, record))

    def send_to_partition(self, topic: str, key: bytes, value: bytes, partition: int) -> None:
        """To a chosen partition (the idle states: partition p of the state topic for input partition p).
        Unlike `send_raw`, no retry while the local queue is full: a BufferError propagates (as it always
        has; a commit writes few states)."""
        self.producer.produce(topic, value=value, key=key, partition=partition, on_delivery=self.on_delivery)

    def poll(self) -> None:
        """Serve delivery reports without waiting."""
        self.producer.poll(0)

    def flush(self) -> None:
        """Everything produced so far delivered, or ServiceError: a commit must not go past it."""
        remaining = flush_within(self.producer, FLUSH_WAIT_S, self.shutdown, keep=CLOSE_RESERVE_S)
        if remaining:
            raise ServiceError(f"{remaining} output records not delivered in time: no commit")
        if self._errors:
            errors, self._errors = self._errors, []
            raise ServiceError(f"{len(errors)} output records failed delivery, first: {errors[0]}")

    def drain(self) -> None:
        """Wait for deliveries (bounded) without judging them: the next `flush` does."""
        flush_within(self.producer, FLUSH_WAIT_S, self.shutdown, keep=CLOSE_RESERVE_S)

    def release(self) -> int:
        """Deliver what is left within CLOSE_WAIT_S (after a failed run); the number not delivered."""
        return flush_within(self.producer, CLOSE_WAIT_S, self.shutdown)
