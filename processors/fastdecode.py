"""A lean decoder for the hot topic: NodeScrape bodies, reading only what the processors use.

fastavro builds a Python object and a dict entry for every one of the ~24 fields of every device
(about 10 us per device here); the windows need nine of them. This decoder walks the Avro binary
encoding directly, following a plan derived from the parsed writer schema: wanted fields are
decoded, the others are skipped without allocating. It is used only when the record's framing
names exactly the schema the plan was built from (callers check the fingerprint); anything else
goes through the general codec. A unit test checks it against fastavro on varied records.
"""

from __future__ import annotations

from collections.abc import Mapping
from struct import Struct
from typing import Any

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


class UnsupportedSchema(ValueError):
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

    def decode(self, data: bytes, pos: int = 0) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, kind in self._top:
            if kind == DEVICES:
                devices: list[dict[str, Any]] = []
                while True:
                    count, pos = _long(data, pos)
                    if count == 0:
                        break
                    if count < 0:
                        count = -count
                        _, pos = _long(data, pos)  # block size in bytes
                    for _ in range(count):
                        dev: dict[str, Any] = {}
                        pos = self._fields(self._device, data, pos, dev)
                        devices.append(dev)
                out["devices"] = devices
            else:
                pos = self._fields(((name, kind),), data, pos, out)
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} trailing bytes")
        return out

    @staticmethod
    def _fields(plan: tuple[tuple[str | None, int], ...], data: bytes, pos: int, out: dict[str, Any]) -> int:
        unpack_double = _DOUBLE.unpack_from
        for name, kind in plan:
            if kind >= OPT_STRING:  # a [null, X] union: one byte says which
                tag = data[pos]
                pos += 1
                if tag == 0:
                    if name is not None:
                        out[name] = None
                    continue
                if tag != 2:
                    raise ValueError(f"bad union index byte {tag}")
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
            # kind is STRING or LONG: both start with a zigzag varint
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
            v = (n >> 1) ^ -(n & 1)
            if kind == STRING:
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
        out: dict[str, Any] = {}
        pos = ScrapeDecoder._fields(self._plan, data, pos, out)
        if pos != len(data):
            raise ValueError(f"{len(data) - pos} trailing bytes")
        return out


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
    return (n >> 1) ^ -(n & 1), pos
