"""Lean decoders for the hot topics: NodeScrape bodies (the fields the processors read) and flat records.

fastavro builds a Python object and a dict entry for every one of the ~24 fields of every device;
the windows need ten of them. These decoders follow a plan of the writer schema through the native
walk of `schemas.lean` (wanted fields decoded, the others skipped without allocating, every length
and count bounded by the record's size). They are used only when the record's framing names exactly
the schema the plan was built from (`Framed` checks the single-object header: the fingerprint in the
Avro specification's little-endian order, or in the big-endian order older gpuledger writers used,
counted like the codec counts it); anything else goes through the general codec. Anything that does
not decode raises `MalformedRecord` (a `ContractError`, what the dead-letter path takes). Unit tests
check them against fastavro on varied records, and on cut and corrupted ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from schemas.codec import SINGLE_OBJECT_HEADER_LEN, SINGLE_OBJECT_MAGIC, AvroCodec, MalformedRecord
from schemas.lean import Plan, UnsupportedSchema, decode_plan

__all__ = ["DEVICE_FIELDS", "TOP_FIELDS", "Framed", "UnsupportedSchema", "flat_decoder", "scrape_decoder"]

DEVICE_FIELDS = (
    "uuid",
    "index",
    "mig_instance_id",
    "mig_profile",
    "model",
    "sm_active_ratio",
    "gr_engine_active_ratio",
    "gpu_util_pct",
    "fb_used_mib",
    "power_w",
)
TOP_FIELDS = ("cluster", "node", "ts_ms", "mapping_version", "devices")


def scrape_decoder(schema: Mapping[str, Any]) -> Plan:
    """Decodes NodeScrape bodies (after the framing header) into {cluster, node, ts_ms, mapping_version,
    devices: [{uuid, index, mig_instance_id, mig_profile, model, sm_active_ratio, gr_engine_active_ratio,
    gpu_util_pct, fb_used_mib, power_w}]}; `decode(data, pos)` raises `MalformedRecord` for bytes that are
    not such a record."""
    return decode_plan(schema, MalformedRecord, "scrape body", TOP_FIELDS, "devices", DEVICE_FIELDS)


def flat_decoder(schema: Mapping[str, Any]) -> Plan:
    """Decodes a flat record (strings, ints, longs, doubles, booleans and [null, X] of those), every field:
    the job stage's DeviceMinute input."""
    return decode_plan(schema, MalformedRecord, "body")


class Framed:
    """A lean body decoder behind its guard: the single-object header must name exactly the schema the
    body decoder was built from (`subject`'s latest version in `codec`).

    `decode(value)` is None when the header names anything else (another version, Confluent framing,
    garbage): the caller then asks the general codec. A header in the old big-endian byte order is
    taken too, and counted in `gpuledger_legacy_fingerprint_records_total` once its body decodes.
    """

    __slots__ = ("_body", "_count_legacy", "_header", "_legacy_header")

    def __init__(self, body: Plan, codec: AvroCodec, subject: str) -> None:
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
