"""The job stage's input: device-minutes bundled by job (`processors.job-device-minutes.v1`).

The node stage sends every device-minute to `usage.device-minutes.v1`, one record a device, for the sinks
and downstream consumers. The job stage takes a job's devices together anyway, so the node stage also
sends it the same records bundled: one `JobDeviceMinutes` record per job and minute of each batch it sends,
its items the device-minute values exactly as `usage.device-minutes.v1` carries them (framing included). The
job stage then pays its per-record costs (the consumer's, faust's, the acks) once a job where it paid them
once a device.

The bundle's body is written here rather than by the codec: its items are the bytes already encoded for
`usage.device-minutes.v1`, so a bundle costs a few bytes of framing, not a second encoding. The layout is
plain Avro (an array of bytes in one block), which any Avro reader decodes with the registered schema.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from base.errors import ContractError
from processors.dlq import Decoder
from processors.fastdecode import device_minutes_reader
from schemas.codec import AvroCodec, InvalidRecord, MalformedRecord, avro_long
from schemas.models import validate
from schemas.topics import DEVICE_MINUTES, JOB_DEVICE_MINUTES

MAX_BUNDLE_ROWS = 512  # a larger group goes out as several bundles; a bundle read with more is refused

_LENGTHS = [avro_long(n) for n in range(4096)]  # items' lengths and counts, looked up: most are short


def _long(n: int) -> bytes:
    return _LENGTHS[n] if n < 4096 else avro_long(n)


def bundle_body(values: Iterable[bytes]) -> bytes:
    """A `JobDeviceMinutes` body (no framing): one array block holding `values`, then the end marker."""
    items = list(values)
    parts = [_long(len(items))] if items else []
    for value in items:
        parts.append(_long(len(value)))
        parts.append(value)
    parts.append(b"\x00")
    return b"".join(parts)


class Bundler:
    """Collects what one send of device-minutes holds for the job stage: (key, bundle value) per job and
    minute, at most `MAX_BUNDLE_ROWS` items each. Groups keep their order of first appearance within a run
    of one minute, and a new minute starts new groups, so no bundle of a later minute goes ahead of an
    earlier minute's rows that were sent before it."""

    __slots__ = ("_codec", "_groups", "_header", "_minute", "_out")

    def __init__(self, codec: AvroCodec) -> None:
        self._codec = codec
        self._header: bytes | None = None  # asked at the first bundle (with a registry: registered then)
        self._groups: dict[bytes, list[bytes]] = {}
        self._minute: int | None = None
        self._out: list[tuple[bytes, bytes]] = []

    def add(self, key: bytes, minute_ms: int, value: bytes) -> None:
        if minute_ms != self._minute:
            self._flush()
            self._minute = minute_ms
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = []
        elif len(group) == MAX_BUNDLE_ROWS:
            self._out.append((key, self._framing() + bundle_body(group)))
            group.clear()
        group.append(value)

    def _framing(self) -> bytes:
        if self._header is None:
            self._header = self._codec.header(JOB_DEVICE_MINUTES.subject)
        return self._header

    def _flush(self) -> None:
        if not self._groups:
            return
        header = self._framing()
        self._out.extend((key, header + bundle_body(group)) for key, group in self._groups.items())
        self._groups.clear()

    def bundles(self) -> list[tuple[bytes, bytes]]:
        """Every bundle so far, in order; the bundler starts empty again."""
        self._flush()
        self._minute = None
        out, self._out = self._out, []
        return out


class JobRows:
    """Reads a `JobDeviceMinutes` record into its device-minutes, or dead-letters it whole with the reason
    (an item that does not decode or validate refuses its bundle: none of its rows is taken, so replaying the
    dead letter counts each once)."""

    def __init__(self, decoder: Decoder) -> None:
        self._decoder = decoder
        self._codec = decoder.codec
        lean = device_minutes_reader(decoder.codec)
        self._lean = lean.decode if lean is not None else None

    def decode(self, msg: Any) -> list[dict[str, Any]] | None:
        bundle = self._decoder.decode(msg, JOB_DEVICE_MINUTES.subject)
        if bundle is None:
            return None
        items = bundle["rows"]
        try:
            if len(items) > MAX_BUNDLE_ROWS:
                raise MalformedRecord(f"{len(items)} device-minutes in one bundle, at most {MAX_BUNDLE_ROWS}")
            return list(self._rows(items))
        except ContractError as exc:
            self._decoder.refuse(msg, JOB_DEVICE_MINUTES.subject, exc)
            return None

    def _rows(self, items: list[bytes]) -> Iterator[dict[str, Any]]:
        lean, codec = self._lean, self._codec
        for n, item in enumerate(items):
            try:
                row = lean(item) if lean is not None else None
                if row is None:  # another writer's framing: the general codec and the model's rules
                    row = codec.decode(item, DEVICE_MINUTES.subject).record
                    validate(DEVICE_MINUTES.subject, row)
            except InvalidRecord as exc:
                raise InvalidRecord(f"device-minute {n} of the bundle: {exc}") from exc
            except ContractError as exc:
                raise MalformedRecord(f"device-minute {n} of the bundle: {exc}") from exc
            yield row
