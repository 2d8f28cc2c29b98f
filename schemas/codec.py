"""Avro encoding of every record on the wire.

Two framings, told apart by the first bytes:
- Avro single-object encoding (`C3 01` + 8-byte little-endian CRC-64-AVRO fingerprint + body),
  used when no Schema Registry is configured;
- Confluent's wire format (`00` + 4-byte big-endian schema id + body), when one is.

Records are plain dicts; times are epoch milliseconds (ints), never datetimes.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from gpuledger.errors import ContractError
from schemas import load_schema, subjects

SINGLE_OBJECT_MAGIC = b"\xc3\x01"


def _strip_logical_types(node: Any) -> Any:
    """Same wire encoding, but decoded timestamps stay epoch-millisecond ints."""
    if isinstance(node, dict):
        return {k: _strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical_types(v) for v in node]
    return node


@dataclass(frozen=True, slots=True)
class Decoded:
    subject: str
    record: dict[str, Any]


class AvroCodec:
    """Encoder/decoder for every subject in `schemas/` (single-object encoding)."""

    def __init__(self) -> None:
        self._parsed: dict[str, Any] = {}
        self._fingerprints: dict[str, bytes] = {}
        self._by_fingerprint: dict[bytes, str] = {}
        for subject in subjects():
            raw = _strip_logical_types(load_schema(subject))
            parsed = fastavro.parse_schema(raw)
            fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))[::-1]
            self._parsed[subject] = parsed
            self._fingerprints[subject] = fp
            self._by_fingerprint[fp] = subject

    def parsed_schema(self, subject: str) -> Any:
        return self._parsed[subject]

    def fingerprint(self, subject: str) -> bytes:
        """The 8 fingerprint bytes as they appear in the single-object header."""
        return self._fingerprints[subject]

    def encode(self, subject: str, record: dict[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(SINGLE_OBJECT_MAGIC)
        buf.write(self._fingerprints[subject])
        try:
            fastavro.schemaless_writer(buf, self._parsed[subject], record)
        except (ValueError, TypeError, KeyError, AttributeError, struct.error) as exc:
            raise ContractError(f"record does not match schema {subject!r}: {exc}") from exc
        return buf.getvalue()

    def decode(self, data: bytes, expected_subject: str | None = None) -> Decoded:
        if len(data) < 10 or data[:2] != SINGLE_OBJECT_MAGIC:
            raise ContractError("not an Avro single-object encoded record (bad magic bytes)")
        subject = self._by_fingerprint.get(data[2:10])
        if subject is None:
            raise ContractError(f"unknown schema fingerprint {data[2:10].hex()}")
        if expected_subject is not None and subject != expected_subject:
            raise ContractError(f"expected a {expected_subject!r} record, got {subject!r}")
        try:
            record = fastavro.schemaless_reader(io.BytesIO(data[10:]), self._parsed[subject], None)
        except (EOFError, ValueError, TypeError, IndexError, UnicodeDecodeError, struct.error) as exc:
            raise ContractError(f"cannot decode {subject!r} record: {exc}") from exc
        if not isinstance(record, dict):
            raise ContractError(f"decoded {subject!r} record is not a record")
        return Decoded(subject, record)
