"""Native readers for the processors' hot inputs: node scrapes (into the node stage's windows) and flat records.

fastavro builds a Python object and a dict entry for every one of the ~24 fields of every device; the
windows need ten of them, and not as objects. `scrape_reader` reads a NodeScrape body natively
(`processors/_window.c`: every length and count bounded by the record's size, the whole body checked
before any of it is used) and `processors._window.absorb` adds its devices to their windows and the
coverage map with no Python object per device but its key. `flat_decoder` decodes a flat record (the
job stage's device-minutes) along a plan of `schemas.lean`. Both are used only when the record's framing
names exactly the schema they were built from (`Framed` checks the single-object header: the fingerprint
in the Avro specification's little-endian order, or in the big-endian order older gpuledger writers
used, counted like the codec counts it); anything else goes through the general codec. Anything that
does not read raises `MalformedRecord` (a `ContractError`, what the dead-letter path takes). Unit tests
hold them against fastavro on varied records, and on cut, corrupted and random bytes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from processors._window import ScrapeReader
from schemas import load_schema
from schemas.codec import SINGLE_OBJECT_HEADER_LEN, SINGLE_OBJECT_MAGIC, AvroCodec, MalformedRecord
from schemas.lean import RECORDS, Plan, UnsupportedSchema, decode_plan, field_kind
from schemas.topics import DEVICE_MINUTES

log = logging.getLogger("gpuledger.processors")

__all__ = [
    "DEVICE_ROLES",
    "SCRAPE_ROLES",
    "Framed",
    "UnsupportedSchema",
    "device_minutes_reader",
    "flat_decoder",
    "scrape_reader",
]

T = TypeVar("T")

# What each NodeScrape field is to the node stage (processors/_window.c numbers them the same).
SCRAPE_ROLES = {"cluster": 1, "node": 2, "ts_ms": 3, "mapping_version": 4, "devices": 5}
DEVICE_ROLES = {
    "uuid": 6,
    "index": 7,
    "mig_instance_id": 8,
    "mig_profile": 9,
    "model": 10,
    "sm_active_ratio": 11,
    "gr_engine_active_ratio": 12,
    "gpu_util_pct": 13,
    "fb_used_mib": 14,
    "power_w": 15,
}


def scrape_reader(schema: Mapping[str, Any]) -> ScrapeReader:
    """Reads NodeScrape bodies (after the framing header) natively: `read(data, pos)` checks the whole body
    and gives a `Scrape` (cluster, node, ts_ms, mapping_version and how many devices) whose devices
    `processors._window.absorb` adds to their windows; bytes that are not such a record raise
    `MalformedRecord`. UnsupportedSchema for a schema whose fields are not of the shapes the walk reads."""
    top: list[tuple[int, int]] = []
    items: list[tuple[int, int]] = []
    for f in schema["fields"]:
        name = f["name"]
        if name == "devices":
            t = f["type"]
            if not (isinstance(t, dict) and t.get("type") == "array" and isinstance(t.get("items"), dict)):
                raise UnsupportedSchema("devices is not an array of records")
            items = [(DEVICE_ROLES.get(d["name"], 0), field_kind(d["type"])) for d in t["items"]["fields"]]
            top.append((SCRAPE_ROLES[name], RECORDS))
        else:
            top.append((SCRAPE_ROLES.get(name, 0), field_kind(f["type"])))
    try:
        return ScrapeReader(tuple(top), tuple(items), MalformedRecord, "scrape body")
    except ValueError as exc:  # a role missing or of a kind the walk does not read it as
        raise UnsupportedSchema(f"NodeScrape schema: {exc}") from exc


def device_minutes_reader(codec: AvroCodec) -> Framed[dict[str, Any]] | None:
    """The latest device-minutes schema's single-object framing decoded natively (the job stage's input;
    anything else, older writers or Confluent framing included, goes through the codec); None, logged,
    when that schema has a shape the lean walk does not read."""
    try:
        return Framed(flat_decoder(load_schema(DEVICE_MINUTES.subject)).decode, codec, DEVICE_MINUTES.subject)
    except UnsupportedSchema as exc:
        log.warning("lean device-minute decoder unavailable (%s): using the general codec", exc)
        return None


def flat_decoder(schema: Mapping[str, Any]) -> Plan:
    """Decodes a flat record (strings, ints, longs, doubles, booleans and [null, X] of those), every field:
    the job stage's DeviceMinute input."""
    return decode_plan(schema, MalformedRecord, "body")


class Framed(Generic[T]):
    """A lean body reader behind its guard: the single-object header must name exactly the schema the
    body reader was built from (`subject`'s latest version in `codec`); `body(data, pos)` reads it.

    `decode(value)` is None when the header names anything else (another version, Confluent framing,
    garbage): the caller then asks the general codec. A header in the old big-endian byte order is
    taken too, and counted in `gpuledger_legacy_fingerprint_records_total` once its body decodes.
    """

    __slots__ = ("_body", "_count_legacy", "_header", "_legacy_header")

    def __init__(self, body: Callable[[bytes, int], T], codec: AvroCodec, subject: str) -> None:
        self._body = body
        self._header = SINGLE_OBJECT_MAGIC + codec.fingerprint(subject)
        self._legacy_header = SINGLE_OBJECT_MAGIC + codec.legacy_fingerprint(subject)

        def count_legacy() -> None:
            codec.count_legacy(subject)

        self._count_legacy = count_legacy

    def decode(self, value: bytes) -> T | None:
        """The record, None if the header is not this decoder's; raises `MalformedRecord` on a bad body."""
        head = value[:SINGLE_OBJECT_HEADER_LEN]
        if head == self._header:
            return self._body(value, SINGLE_OBJECT_HEADER_LEN)
        if head == self._legacy_header:
            record = self._body(value, SINGLE_OBJECT_HEADER_LEN)
            self._count_legacy()
            return record
        return None
