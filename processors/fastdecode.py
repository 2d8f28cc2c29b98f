"""A lean decoder for the hot topic: NodeScrape bodies, reading only what the processors use.

fastavro builds a Python object and a dict entry for every one of the ~24 fields of every device
(about 10 us per device here); the windows need nine of them. This decoder walks the Avro binary
encoding directly, following a plan derived from the parsed writer schema: wanted fields are
decoded, the others are skipped without allocating. It is used only when the record's framing
names exactly the schema the plan was built from (`Framed` checks the single-object header: the
fingerprint in the Avro specification's little-endian order, or in the big-endian order older
gpuledger writers used, counted like the codec counts it); anything else goes through the general
codec. A unit test checks it against fastavro on varied records.

The bytes are untrusted (anyone who can produce to the topic writes them), so every length and count
is checked before it is used, with comparisons only (no extra pass): a string length is never
negative nor past the end, a varint is at most 10 bytes (64 bits), and a block of N array items
needs at least N times the smallest item's encoding in the bytes left. Work and memory are thus
bounded by the record's size. Anything that does not decode raises `MalformedRecord` (a
`ContractError`, what the dead-letter path takes), never a bare ValueError/IndexError.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import Struct
from struct import error as StructError
from typing import Any

from base.errors import ContractError
from schemas.codec import SINGLE_OBJECT_HEADER_LEN, SINGLE_OBJECT_MAGIC, AvroCodec, MalformedRecord

DEVICE_FIELDS = (
    "uuid",
    "index",
    "mig_instance_id",
    "model",
    "sm_active_ratio",
    "gr_engine_active_ratio",
    "gpu_util_pct",
    "fb_used_mib",
    "power_w",
)
TOP_FIELDS = ("cluster", "node", "ts_ms", "mapping_version", "devices")

# field kinds (the optional ones are [null, X] unions and sort after the plain ones)
STRING, LONG, DOUBLE, BOOLEAN, OPT_STRING, OPT_LONG, OPT_DOUBLE, DEVICES = range(8)
_DOUBLE = Struct("<d")
# Fewest bytes a value of each kind takes on the wire (a varint or union tag is at least one byte).
_MIN_BYTES = {STRING: 1, LONG: 1, DOUBLE: 8, BOOLEAN: 1, OPT_STRING: 1, OPT_LONG: 1, OPT_DOUBLE: 1, DEVICES: 1}
_MAX_VARINT_SHIFT = 63  # an Avro long is 64 bits: 10 bytes of 7 bits at most
# What a truncated or corrupt body raises inside the walk (an index or unpack past the end, bad UTF-8).
_WALK_ERRORS = (IndexError, StructError, UnicodeDecodeError)


class UnsupportedSchema(ContractError):
    """The writer schema has a shape this decoder does not handle: use the general codec."""


def _kind(avro_type: Any) -> int:
    if avro_type == "string":
        return STRING
    if avro_type in ("long", "int"):
        return LONG
    if avro_type == "double":
        return DOUBLE
    if avro_type == "boolean":
        return BOOLEAN
    if isinstance(avro_type, list) and len(avro_type) == 2 and avro_type[0] == "null":
        inner = avro_type[1]
        if inner == "string":
            return OPT_STRING
        if inner in ("long", "int"):
            return OPT_LONG
        if inner == "double":
            return OPT_DOUBLE
    raise UnsupportedSchema(f"unsupported field type {avro_type!r}")


def _type_of(field: Mapping[str, Any]) -> Any:
    t = field["type"]
    if isinstance(t, dict) and t.get("type") in ("long", "int", "string", "double"):
        return t["type"]  # logical types (timestamp-millis) keep their primitive encoding
    if isinstance(t, list):
        return [x["type"] if isinstance(x, dict) and x.get("type") in ("long", "int") else x for x in t]
    return t


class ScrapeDecoder:
    """Decode NodeScrape bodies (after the framing header) into {cluster, node, ts_ms, mapping_version,
    devices: [{uuid, index, mig_instance_id, model, sm_active_ratio, gr_engine_active_ratio,
    gpu_util_pct, fb_used_mib, power_w}]}."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        top: list[tuple[str | None, int]] = []
        device_plan: list[tuple[str | None, int]] = []
        for f in schema["fields"]:
            if f["name"] == "devices":
                t = f["type"]
                if not (isinstance(t, dict) and t.get("type") == "array" and isinstance(t["items"], dict)):
                    raise UnsupportedSchema("devices is not an array of records")
                for g in t["items"]["fields"]:
                    name = g["name"] if g["name"] in DEVICE_FIELDS else None
                    device_plan.append((name, _kind(_type_of(g))))
                top.append(("devices", DEVICES))
            else:
                top.append((f["name"] if f["name"] in TOP_FIELDS else None, _kind(_type_of(f))))
        missing = (set(DEVICE_FIELDS) - {n for n, _ in device_plan}) | (set(TOP_FIELDS) - {n for n, _ in top})
        if missing:
            raise UnsupportedSchema(f"schema lacks {sorted(missing)}")
        self._top = tuple(top)
        self._device = tuple(device_plan)
        self._device_min = max(1, sum(_MIN_BYTES[k] for _, k in device_plan))

    def decode(self, data: bytes, pos: int = 0) -> dict[str, Any]:
        """The scrape encoded in `data[pos:]`; raises `MalformedRecord` if it is not one."""
        try:
            return self._decode(data, pos)
        except _WALK_ERRORS as exc:
            raise MalformedRecord(
                f"scrape body does not decode ({len(data)} bytes): {type(exc).__name__}: {exc}"
            ) from exc

    def _decode(self, data: bytes, pos: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        end = len(data)
        for name, kind in self._top:
            if kind == DEVICES:
                devices: list[dict[str, Any]] = []
                while True:
                    count, pos = _long(data, pos)
                    if count == 0:
                        break
                    if count < 0:
                        count = -count
                        size, pos = _long(data, pos)  # block size in bytes
                        if size < 0 or size > end - pos:
                            raise MalformedRecord(f"devices block of {size} bytes at byte {pos} of {end}")
                    if count > (end - pos) // self._device_min:
                        raise MalformedRecord(
                            f"{count} devices at byte {pos} cannot fit in the {end - pos} bytes left"
                        )
                    for _ in range(count):
                        dev: dict[str, Any] = {}
                        pos = self._fields(self._device, data, pos, dev)
                        devices.append(dev)
                out["devices"] = devices
            else:
                pos = self._fields(((name, kind),), data, pos, out)
        if pos != end:
            raise MalformedRecord(f"{end - pos} trailing bytes")
        return out

    @staticmethod
    def _fields(plan: tuple[tuple[str | None, int], ...], data: bytes, pos: int, out: dict[str, Any]) -> int:
        unpack_double = _DOUBLE.unpack_from
        end = len(data)
        for name, kind in plan:
            if kind >= OPT_STRING:  # a [null, X] union: one byte says which
                tag = data[pos]
                pos += 1
                if tag == 0:
                    if name is not None:
                        out[name] = None
                    continue
                if tag != 2:
                    raise MalformedRecord(f"bad union index byte {tag} at byte {pos - 1}")
                if kind == OPT_DOUBLE:
                    if name is not None:
                        out[name] = unpack_double(data, pos)[0]
                    pos += 8
                    continue
                kind = STRING if kind == OPT_STRING else LONG
            elif kind == DOUBLE:
                if name is not None:
                    out[name] = unpack_double(data, pos)[0]
                pos += 8
                continue
            elif kind == BOOLEAN:
                if name is not None:
                    out[name] = data[pos] != 0
                pos += 1
                continue
            # kind is STRING or LONG: both start with a zigzag varint, read here as `_long` reads it (inlined,
            # with a one-byte fast path: a call per field is what this decoder exists to save)
            b = data[pos]
            pos += 1
            if b < 0x80:
                n = b
            else:
                n = b & 0x7F
                shift = 7
                while True:
                    b = data[pos]
                    pos += 1
                    n |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                    if shift > _MAX_VARINT_SHIFT:
                        raise MalformedRecord(f"varint longer than 10 bytes at byte {pos}")
            v = (n >> 1) ^ -(n & 1)
            if kind == STRING:
                if v < 0 or v > end - pos:
                    raise MalformedRecord(f"string length {v} at byte {pos} of {end}")
                if name is not None:
                    out[name] = data[pos : pos + v].decode()
                pos += v
            elif name is not None:
                out[name] = v
        return pos


class FlatDecoder:
    """Decode a flat record (strings, ints, longs, doubles, booleans and [null, X] of those), every
    field: the job stage's DeviceMinute input. Same guard as `ScrapeDecoder`: exact writer schema only."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._plan = tuple((f["name"], _kind(_type_of(f))) for f in schema["fields"])

    def decode(self, data: bytes, pos: int = 0) -> dict[str, Any]:
        """The record encoded in `data[pos:]`; raises `MalformedRecord` if it is not one."""
        out: dict[str, Any] = {}
        try:
            pos = ScrapeDecoder._fields(self._plan, data, pos, out)
        except _WALK_ERRORS as exc:
            raise MalformedRecord(f"body does not decode ({len(data)} bytes): {type(exc).__name__}: {exc}") from exc
        if pos != len(data):
            raise MalformedRecord(f"{len(data) - pos} trailing bytes")
        return out


class Framed:
    """A lean body decoder behind its guard: the single-object header must name exactly the schema the
    body decoder was built from (`subject`'s latest version in `codec`).

    `decode(value)` is None when the header names anything else (another version, Confluent framing,
    garbage): the caller then asks the general codec. A header in the old big-endian byte order is
    taken too, and counted in `gpuledger_legacy_fingerprint_records_total` once its body decodes.
    """

    __slots__ = ("_body", "_count_legacy", "_header", "_legacy_header")

    def __init__(self, body: ScrapeDecoder | FlatDecoder, codec: AvroCodec, subject: str) -> None:
        self._body = body
        self._header = SINGLE_OBJECT_MAGIC + codec.fingerprint(subject)
        self._legacy_header = SINGLE_OBJECT_MAGIC + codec.legacy_fingerprint(subject)

        def count_legacy() -> None:
            codec.count_legacy(subject)

        self._count_legacy = count_legacy

    def decode(self, value: bytes) -> dict[str, Any] | None:
        """The record, None if the header is not this decoder's; raises `MalformedRecord` on a bad body."""
        head = value[:SINGLE_OBJECT_HEADER_LEN]
        if head == self._header:
            return self._body.decode(value, SINGLE_OBJECT_HEADER_LEN)
        if head == self._legacy_header:
            record = self._body.decode(value, SINGLE_OBJECT_HEADER_LEN)
            self._count_legacy()
            return record
        return None


def _long(data: bytes, pos: int) -> tuple[int, int]:
    n = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > _MAX_VARINT_SHIFT:
            raise MalformedRecord(f"varint longer than 10 bytes at byte {pos}")
    return (n >> 1) ^ -(n & 1), pos
