"""Decode-or-dead-letter for the processors' consumers, on the shared helper (streams/consume.py).

A record that cannot be decoded (or breaks its model's rules) goes to `<topic>.dlq` as a DeadLetter
with the reason in the headers too; it never stops the worker and is never silently dropped. The
hot paths (node scrapes, device-minutes) first try the lean decoders of `processors.fastdecode`
and come here for anything those do not take. A record that decodes but is refused by a stage (an
event time beyond the horizon, `FutureTimestamp`) is dead-lettered the same way (`refuse`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from base.errors import ContractError
from processors.fastdecode import device_minutes_reader
from schemas.codec import AvroCodec, InvalidRecord
from schemas.models import validate
from schemas.topics import DEVICE_MINUTES
from streams.consume import DeadLetterSink, SourceRecord, dead_letter, decode_or_dead_letter


class FutureTimestamp(InvalidRecord):
    """The record decodes and validates, but its event time is further ahead of the processing clock than
    `processor.max_future_ms`: admitted, it would move the watermark and close real minutes early."""


class Decoder:
    """Decode a record of an expected subject, or dead-letter it through `sink` and return None."""

    def __init__(
        self,
        codec: AvroCodec,
        sink: DeadLetterSink,
        topic_prefix: str = "",
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self.codec = codec
        self._sink = sink
        self._prefix = topic_prefix
        self._clock_ms = clock_ms
        self.dead_lettered = 0

    def decode(self, msg: Any, subject: str) -> dict[str, Any] | None:
        record = decode_or_dead_letter(
            msg, self.codec, self._sink, subject=subject, topic_prefix=self._prefix, clock=self._clock_ms
        )
        if record is None:
            self.dead_lettered += 1
        return record

    def refuse(self, msg: Any, subject: str, error: ContractError) -> None:
        """Dead-letter a record that decoded but that a stage does not admit (or whose contents do not
        decode), with the reason."""
        dead_letter(SourceRecord.of(msg), error, self.codec, self._sink, subject=subject, clock=self._clock_ms)
        self.dead_lettered += 1


class LeanFirst:
    """Records of one subject read by its lean reader (`read(value)`: the record, or None when the framing is
    not the one it was built for) and, for anything it does not take, by the general codec, which has the
    last word: it decodes the record and checks the model's rules, or raises. `read` None: the codec alone."""

    def __init__(self, read: Callable[[bytes], dict[str, Any] | None] | None, codec: AvroCodec, subject: str) -> None:
        self._read = read
        self._codec = codec
        self._subject = subject

    def record(self, value: bytes) -> dict[str, Any]:
        """The record of `value`; raises `ContractError` (`MalformedRecord`, `InvalidRecord`) with the reason."""
        if self._read is not None:
            try:
                record = self._read(value)
            except ContractError:  # a body only the lean reader refuses goes to the codec; a bad one raises there
                record = None
            if record is not None:
                return record
        decoded = self._codec.decode(value, expected_subject=self._subject)
        validate(decoded.subject, decoded.record)
        return decoded.record


def device_minutes(codec: AvroCodec) -> LeanFirst:
    """Device-minutes by the lean decoder of their latest schema, the rest by the general codec."""
    lean = device_minutes_reader(codec)
    return LeanFirst(lean.decode if lean is not None else None, codec, DEVICE_MINUTES.subject)
