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
from processors.dlq import Decoder, device_minutes
from schemas.codec import AvroCodec, InvalidRecord, MalformedRecord, avro_long
from schemas.topics import DEVICE_MINUTES, JOB_DEVICE_MINUTES, job_key, node_key

MAX_BUNDLE_ROWS = 512  # a larger group goes out as several bundles; a bundle read with more is refused

_SHORT = 4096
_LENGTHS = [avro_long(n) for n in range(_SHORT)]  # items' lengths and counts, looked up: most are short


def bundle_body(values: Iterable[bytes]) -> bytes:
    """A `JobDeviceMinutes` body (no framing): one array block holding `values`, then the end marker."""
    items = list(values)
    if not items:
        return b"\x00"
    lengths = _LENGTHS
    n = len(items)
    parts = [lengths[n] if n < _SHORT else avro_long(n)]
    append = parts.append
    for value in items:
        n = len(value)
        append(lengths[n] if n < _SHORT else avro_long(n))
        append(value)
    append(b"\x00")
    return b"".join(parts)


Keyed = list[tuple[bytes, bytes]]


def encode_rows(codec: AvroCodec, rows: Iterable[dict[str, Any]]) -> tuple[Keyed, Keyed]:
    """What the node stage sends for `rows`: each row's (key, value) for `usage.device-minutes.v1`, and the
    job stage's bundles of the allocated ones, (key, value) for `processors.job-device-minutes.v1`.

    A bundle holds one job's rows of one minute, at most `MAX_BUNDLE_ROWS`, in the order given. Bundles
    follow the rows' order of first appearance within a run of one minute, and a new minute starts new
    bundles, so no bundle of a later minute goes ahead of rows of an earlier one that came before it."""
    subject, encode = DEVICE_MINUTES.subject, codec.encode
    encoded: Keyed = []
    bundles: Keyed = []
    groups: dict[bytes, list[bytes]] = {}
    minute: int | None = None
    job: str | None = None
    cluster: str | None = None
    key = b""
    group: list[bytes] = []
    for row in rows:
        value = encode(subject, row)
        jid = row["job_id"]
        if jid is None:
            encoded.append((node_key(row["cluster"], row["node"]), value))
            continue
        m = row["minute_start_ms"]
        if m != minute:
            _bundle(codec, groups, bundles)
            minute, job = m, None
        if jid != job or row["cluster"] != cluster:  # rows of a job on a node come together: one lookup
            job, cluster = jid, row["cluster"]
            key = job_key(cluster, jid)
            group = groups.setdefault(key, [])
        group.append(value)
        encoded.append((key, value))
    _bundle(codec, groups, bundles)
    return encoded, bundles


def _bundle(codec: AvroCodec, groups: dict[bytes, list[bytes]], out: Keyed) -> None:
    """`groups` (one minute's, by job) as bundles onto `out`; `groups` is left empty."""
    if not groups:
        return
    header = codec.header(JOB_DEVICE_MINUTES.subject)
    for key, values in groups.items():
        for at in range(0, len(values), MAX_BUNDLE_ROWS):
            out.append((key, header + bundle_body(values[at : at + MAX_BUNDLE_ROWS])))
    groups.clear()


class JobRows:
    """Reads a `JobDeviceMinutes` record into its device-minutes, or dead-letters it whole with the reason
    (an item that does not decode or validate refuses its bundle: none of its rows is taken, so replaying the
    dead letter counts each once)."""

    def __init__(self, decoder: Decoder) -> None:
        self._decoder = decoder
        self._device_minutes = device_minutes(decoder.codec)

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
        read = self._device_minutes.record
        for n, item in enumerate(items):
            try:
                row = read(item)
            except InvalidRecord as exc:
                raise InvalidRecord(f"device-minute {n} of the bundle: {exc}") from exc
            except ContractError as exc:
                raise MalformedRecord(f"device-minute {n} of the bundle: {exc}") from exc
            yield row
