"""Decode-or-dead-letter for the processors' consumers.

Local, minimal helper (a shared one is planned in `gpuledger/consumer.py`; switch to it when it
lands). A record that cannot be decoded goes to `<topic>.dlq` as a DeadLetter with the reason in
the headers too; it never stops the worker and is never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpuledger.errors import ContractError
from schemas.codec import AvroCodec

DEADLETTER_SUBJECT = "deadletter"


def dead_letter(
    codec: AvroCodec,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    error: Exception,
    subject: str | None,
    kafka_ts_ms: int | None,
    now_ms: int,
) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
    """The encoded DeadLetter record and its headers."""
    record: dict[str, Any] = {
        "source_topic": topic,
        "source_partition": partition,
        "source_offset": offset,
        "key": key,
        "value": value,
        "error_class": type(error).__name__,
        "error_message": str(error)[:2000],
        "schema_fingerprint": AvroCodec.writer_fingerprint(value) if value else None,
        "ts_ms": now_ms,
        "source_subject": subject,
        "source_timestamp_ms": kafka_ts_ms,
    }
    headers: list[tuple[str, str | bytes | None]] = [
        ("error_class", type(error).__name__.encode()),
        ("error_message", str(error)[:500].encode()),
    ]
    return codec.encode(DEADLETTER_SUBJECT, record), headers


class Decoder:
    """Decode a record of an expected subject, or hand it to `send_dlq` and return None."""

    def __init__(
        self,
        codec: AvroCodec,
        send_dlq: Callable[[str, bytes | None, bytes, list[tuple[str, str | bytes | None]]], None],
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.codec = codec
        self._send = send_dlq
        self._clock_ms = clock_ms
        self.dead_lettered = 0

    def decode(self, msg: Any, subject: str) -> dict[str, Any] | None:
        value = msg.value()
        try:
            if value is None:
                raise ContractError("record has no value")
            return self.codec.decode(value, subject).record
        except ContractError as exc:
            ts_type, ts = msg.timestamp()
            payload, headers = dead_letter(
                self.codec,
                topic=msg.topic(),
                partition=msg.partition(),
                offset=msg.offset(),
                key=msg.key(),
                value=value,
                error=exc,
                subject=subject,
                kafka_ts_ms=ts if ts_type else None,
                now_ms=self._clock_ms(),
            )
            self._send(f"{msg.topic()}.dlq", msg.key(), payload, headers)
            self.dead_lettered += 1
            return None
