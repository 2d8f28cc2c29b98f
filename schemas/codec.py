"""Avro encoding of every record on the wire.

Two framings, told apart by the first bytes:
- Avro single-object encoding (`C3 01` + the 8-byte CRC-64-AVRO fingerprint of the schema's
  Parsing Canonical Form, little-endian, + body: the Avro specification's "Single object
  encoding", what Java's `BinaryMessageEncoder` writes), used when no Schema Registry is configured;
- Confluent's wire format (`00` + 4-byte big-endian schema id + body), when one is
  (`settings.kafka.schema_registry_url`; `mock://...` gives confluent-kafka's in-process mock).

The decoder reads both whatever the codec encodes with. Data written with an older version of a
subject (its fingerprint is in `schemas/history/`, or the registry holds it) is resolved to the
latest version (fastavro schema resolution), so readers always see the latest shape. A registry
schema this checkout does not know (a newer writer) is resolved to the latest known version by
record name, which works for any compatible change.

Registry subjects are named `<topic_prefix><subject>` (one per contract subject, like
Confluent's RecordNameStrategy: several topics share a subject, e.g. the late-samples topic).

Before issue 15 this codec wrote the fingerprint big-endian, which no other Avro implementation
reads. Such records can still be on the topics (retention up to 30 days, dead letters, spools), so
the decoder also accepts that byte order, and counts each one in
`gpuledger_legacy_fingerprint_records_total{subject}`; encoders only ever write the spec's order.

Records are plain dicts; times are epoch milliseconds (ints), never datetimes.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fastavro
from fastavro.schema import fingerprint as avro_fingerprint
from fastavro.schema import to_parsing_canonical_form
from prometheus_client import Counter as PromCounter

from base.errors import ContractError, ServiceError
from base.settings import KafkaSettings
from schemas import DEFAULT_STORE, SchemaStore
from schemas.lean import Plan, encode_plan

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
CONFLUENT_MAGIC = b"\x00"
SINGLE_OBJECT_HEADER_LEN = 10
CONFLUENT_HEADER_LEN = 5

LEGACY_FINGERPRINT_RECORDS = PromCounter(
    "gpuledger_legacy_fingerprint_records",
    "Single-object records decoded whose fingerprint is big-endian (gpuledger writers before issue 15; "
    "other Avro implementations cannot read them). Zero once they have aged out of every topic.",
    ["subject"],
)


class MalformedRecord(ContractError):
    """The bytes are not a record in either framing, or the body does not decode with its writer schema."""

    def __init__(self, message: str, fingerprint: str | None = None) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint


class UnknownSchema(MalformedRecord):
    """The framing names a writer schema (fingerprint or registry id) this codec cannot find."""


class WrongSubject(MalformedRecord):
    """The record decodes, but as another subject than the topic carries."""


class InvalidRecord(ContractError):
    """The record does not satisfy its schema (encoding) or its model's rules (validation)."""

    def __init__(self, message: str, fingerprint: str | None = None) -> None:
        super().__init__(message)
        self.fingerprint = fingerprint


def avro_long(n: int) -> bytes:
    """`n` as Avro writes a long (zig-zag, then a varint): for containers and hand-made records, hostile ones
    included."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def avro_string(s: str) -> bytes:
    """`s` as Avro writes a string: its UTF-8 length as a long, then the bytes."""
    raw = s.encode()
    return avro_long(len(raw)) + raw


def read_avro_long(buf: bytes | memoryview, at: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint) at `at`: (value, the offset after it)."""
    shift = n = 0
    while True:
        b = buf[at]
        at += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), at
        shift += 7
        if shift > 63:
            raise ValueError("an Avro long longer than 10 bytes")


def _strip_logical_types(node: Any) -> Any:
    """Same wire encoding, but decoded timestamps stay epoch-millisecond ints."""
    if isinstance(node, dict):
        return {k: _strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_strip_logical_types(v) for v in node]
    return node


def _parse(schema: dict[str, Any]) -> Any:
    return fastavro.parse_schema(_strip_logical_types(schema))


def crc64_fingerprint(parsed: Any) -> bytes:
    """CRC-64-AVRO of the parsing canonical form as the 8 bytes of the single-object header.

    That is the 64-bit fingerprint (Java's `SchemaNormalization.parsingFingerprint64`) written
    little-endian, which is exactly the hex string fastavro returns: its bytes are used as they are.
    """
    return bytes.fromhex(avro_fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))


def fingerprint64(header_bytes: bytes) -> int:
    """The unsigned 64-bit fingerprint that 8 header bytes (little-endian) stand for."""
    return int.from_bytes(header_bytes, "little")


def record_name(schema: dict[str, Any]) -> str:
    """A record schema's full name (`namespace.name`)."""
    name = str(schema["name"])
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


@dataclass(frozen=True, slots=True)
class Decoded:
    subject: str
    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A schema some producer wrote with, and what reading it takes."""

    subject: str
    version: int | None  # None: not in this checkout (a newer writer, found through the registry)
    fingerprint: bytes  # single-object header bytes
    parsed: Any
    reader: Any  # None when the writer is the latest version (no resolution needed)


_REGISTRY_CLIENTS: dict[str, Any] = {}


def registry_client(url: str) -> Any:
    """One Schema Registry client per URL per process (so `mock://` registries are shared in-process)."""
    client = _REGISTRY_CLIENTS.get(url)
    if client is None:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        client = SchemaRegistryClient.new_client({"url": url})
        _REGISTRY_CLIENTS[url] = client
    return client


def registry_subjects(kafka: KafkaSettings, store: SchemaStore = DEFAULT_STORE) -> dict[str, str]:
    """Each contract subject's registry subject under `kafka.schema_registry_subject`, named after the
    first topic of the catalogue that carries it."""
    from schemas.topics import all_topics

    out: dict[str, str] = {}
    for topic in all_topics():
        if topic.subject in out or topic.subject not in store.subjects():
            continue
        record = record_name(store.versions(topic.subject)[-1])
        out[topic.subject] = kafka.registry_subject(kafka.topic(topic.name), record)
    return out


class AvroCodec:
    """Encoder/decoder for every subject in `schemas/`.

    `AvroCodec()` encodes with single-object framing; `AvroCodec(registry=client)` or
    `AvroCodec.from_settings(kafka)` with a registry URL configured encodes with Confluent's.
    """

    def __init__(
        self,
        registry: Any | None = None,
        *,
        store: SchemaStore = DEFAULT_STORE,
        registry_subjects: Mapping[str, str] | None = None,
    ) -> None:
        self._registry = registry
        self._registry_subjects = dict(registry_subjects or {})  # contract subject -> registry subject
        self._store = store
        self._parsed: dict[str, Any] = {}
        self._raw: dict[str, dict[str, Any]] = {}
        self._fingerprints: dict[str, bytes] = {}
        self._headers: dict[str, bytes] = {}
        self._lean_writers: dict[str, Plan | None] = {}  # the native walk for flat subjects (schemas.lean)
        self._by_fingerprint: dict[bytes, WriterSchema] = {}
        self._by_legacy_fingerprint: dict[bytes, WriterSchema] = {}  # the same, big-endian (pre-fix writers)
        self._legacy_counters: dict[str, Any] = {}
        self._by_name: dict[str, str] = {}
        self._by_registry_id: dict[int, WriterSchema] = {}
        for subject in store.subjects():
            versions = store.versions(subject)
            latest = _parse(versions[-1])
            self._raw[subject] = versions[-1]
            self._parsed[subject] = latest
            self._lean_writers[subject] = encode_plan(versions[-1])
            self._by_name[record_name(versions[-1])] = subject
            for number, schema in enumerate(versions, start=1):
                is_latest = number == len(versions)
                parsed = latest if is_latest else _parse(schema)
                fp = crc64_fingerprint(parsed)
                if fp in self._by_fingerprint:  # a version identical to an older one: same writer
                    continue
                self._by_fingerprint[fp] = WriterSchema(subject, number, fp, parsed, None if is_latest else latest)
            self._fingerprints[subject] = crc64_fingerprint(latest)
            self._headers[subject] = SINGLE_OBJECT_MAGIC + self._fingerprints[subject]
            self._legacy_counters[subject] = LEGACY_FINGERPRINT_RECORDS.labels(subject)
        for fp, writer in self._by_fingerprint.items():
            legacy = fp[::-1]
            if legacy not in self._by_fingerprint:  # the spec's order always wins a (2^-64) clash
                self._by_legacy_fingerprint[legacy] = writer

    @classmethod
    def from_settings(cls, kafka: KafkaSettings, *, store: SchemaStore = DEFAULT_STORE) -> AvroCodec:
        """The codec a process uses: Confluent framing when `kafka.schema_registry_url` is set."""
        if kafka.schema_registry_url:
            return cls(
                registry_client(kafka.schema_registry_url),
                store=store,
                registry_subjects=registry_subjects(kafka, store),
            )
        return cls(store=store)

    # -- schema facts -------------------------------------------------------------------------

    @property
    def wire_format(self) -> str:
        """`confluent` or `single-object`: the framing `encode` writes."""
        return "confluent" if self._registry is not None else "single-object"

    def subjects(self) -> list[str]:
        return sorted(self._parsed)

    def parsed_schema(self, subject: str) -> Any:
        return self._parsed[subject]

    def fingerprint(self, subject: str) -> bytes:
        """The 8 fingerprint bytes of the latest version as they appear in the single-object header."""
        return self._fingerprints[subject]

    def legacy_fingerprint(self, subject: str) -> bytes:
        """The same 8 bytes in the big-endian order gpuledger wrote before issue 15 (read, never written)."""
        return self._fingerprints[subject][::-1]

    def count_legacy(self, subject: str, n: int = 1) -> None:
        """Count `n` records of `subject` read with a big-endian fingerprint (the lean decoders call this too)."""
        self._legacy_counters[subject].inc(n)

    def registry_subject(self, subject: str) -> str:
        """Where `subject`'s schema is registered: the subject `gpuledger schemas register` gives the
        first topic that carries it (TopicNameStrategy by default), else the contract's own name."""
        return self._registry_subjects.get(subject, subject)

    def schema_id(self, subject: str) -> int:
        """The registry id of `subject`'s latest schema, registering it on first use."""
        if self._registry is None:
            raise ContractError("no schema registry configured")
        if subject not in self._raw:
            raise ContractError(f"no schema for subject {subject!r}")
        header = self._headers[subject]
        if header[:1] == CONFLUENT_MAGIC:
            return int(struct.unpack(">I", header[1:5])[0])
        from confluent_kafka.schema_registry import Schema

        try:
            schema_id = int(
                self._registry.register_schema(
                    self.registry_subject(subject), Schema(json.dumps(self._raw[subject]), "AVRO")
                )
            )
        except Exception as exc:  # registry errors: HTTP, connection, incompatibility
            raise ServiceError(f"schema registry: cannot register {subject!r}: {exc}") from exc
        self._headers[subject] = CONFLUENT_MAGIC + struct.pack(">I", schema_id)
        self._by_registry_id[schema_id] = self._by_fingerprint[self._fingerprints[subject]]
        return schema_id

    @staticmethod
    def writer_fingerprint(data: bytes) -> str | None:
        """What the framing says about the writer schema: `crc64:<hex>` or `registry-id:<n>`; None if neither.

        `<hex>` is the 64-bit fingerprint read little-endian, as the specification says (the number
        Java's `SchemaNormalization.parsingFingerprint64` gives, as 16 unsigned hex digits)."""
        if len(data) >= SINGLE_OBJECT_HEADER_LEN and data[:2] == SINGLE_OBJECT_MAGIC:
            return f"crc64:{fingerprint64(data[2:10]):016x}"
        if len(data) >= CONFLUENT_HEADER_LEN and data[:1] == CONFLUENT_MAGIC:
            return f"registry-id:{struct.unpack('>I', data[1:5])[0]}"
        return None

    # -- encode / decode ----------------------------------------------------------------------

    def header(self, subject: str) -> bytes:
        """The framing `encode` puts before a `subject` body (registering the schema on first use with a
        registry): for writers that build a body themselves."""
        header = self._headers.get(subject)
        if header is None:
            raise ContractError(f"no schema for subject {subject!r}")
        if self._registry is not None and header[:1] != CONFLUENT_MAGIC:
            self.schema_id(subject)
            header = self._headers[subject]
        return header

    def encode(self, subject: str, record: dict[str, Any]) -> bytes:
        header = self._headers.get(subject)
        if header is None or (self._registry is not None and header[:1] != CONFLUENT_MAGIC):
            header = self.header(subject)
        lean = self._lean_writers[subject]
        if lean is not None:
            body = lean.encode(record)
            if body is not None:  # None: a value off the plain path, which fastavro decides below
                return header + body
        buf = io.BytesIO()
        buf.write(header)
        try:
            fastavro.schemaless_writer(buf, self._parsed[subject], record)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, struct.error) as exc:
            raise InvalidRecord(f"record does not match schema {subject!r}: {exc}") from exc
        return buf.getvalue()

    def _writer(self, data: bytes) -> tuple[WriterSchema, int]:
        """The writer schema named by the framing, and where the body starts."""
        if data[:2] == SINGLE_OBJECT_MAGIC and len(data) >= SINGLE_OBJECT_HEADER_LEN:
            fp_bytes = data[2:10]
            writer = self._by_fingerprint.get(fp_bytes)
            if writer is None:
                writer = self._by_legacy_fingerprint.get(fp_bytes)
                if writer is None:
                    fp = self.writer_fingerprint(data)
                    raise UnknownSchema(
                        f"unknown schema fingerprint {fp}: no known schema has it, neither read little-endian "
                        f"(the Avro specification's order) nor big-endian (crc64:{fp_bytes.hex()}, the order "
                        "older gpuledger writers used)",
                        fp,
                    )
                self._legacy_counters[writer.subject].inc()
            return writer, SINGLE_OBJECT_HEADER_LEN
        if data[:1] == CONFLUENT_MAGIC and len(data) >= CONFLUENT_HEADER_LEN:
            schema_id = int(struct.unpack(">I", data[1:5])[0])
            writer = self._by_registry_id.get(schema_id)
            if writer is None:
                writer = self._fetch_registry_schema(schema_id)
            return writer, CONFLUENT_HEADER_LEN
        raise MalformedRecord(
            "not an Avro record: neither single-object (C3 01 + fingerprint) nor Confluent (00 + schema id) framing"
        )

    def _fetch_registry_schema(self, schema_id: int) -> WriterSchema:
        fp_text = f"registry-id:{schema_id}"
        if self._registry is None:
            raise UnknownSchema(
                f"Confluent-framed record (schema id {schema_id}) but no schema registry configured", fp_text
            )
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self._registry.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise UnknownSchema(f"schema id {schema_id} is not in the registry", fp_text) from exc
            raise ServiceError(f"schema registry: cannot fetch schema id {schema_id}: {exc}") from exc
        except Exception as exc:
            raise ServiceError(f"schema registry: cannot fetch schema id {schema_id}: {exc}") from exc
        try:
            raw = json.loads(registered.schema_str)
            parsed = _parse(raw)
        except Exception as exc:
            raise UnknownSchema(f"schema id {schema_id} is not a usable Avro schema: {exc}", fp_text) from exc
        fp = crc64_fingerprint(parsed)
        writer = self._by_fingerprint.get(fp)
        if writer is None:
            subject = self._by_name.get(record_name(raw)) if isinstance(raw, dict) and "name" in raw else None
            if subject is None:
                raise UnknownSchema(f"schema id {schema_id} is not a schema of any known subject", fp_text)
            writer = WriterSchema(subject, None, fp, parsed, self._parsed[subject])
        self._by_registry_id[schema_id] = writer
        return writer

    def framing(self, data: bytes) -> tuple[WriterSchema, int]:
        """The writer schema `data`'s framing names (asking the registry for an id not seen yet) and where the body
        starts; raises as `decode` does for a framing it cannot resolve."""
        return self._writer(data)

    def decode(self, data: bytes, expected_subject: str | None = None) -> Decoded:
        writer, start = self._writer(data)
        if expected_subject is not None and writer.subject != expected_subject:
            raise WrongSubject(
                f"expected a {expected_subject!r} record, got {writer.subject!r}", self.writer_fingerprint(data)
            )
        buf = io.BytesIO(data)
        buf.seek(start)
        try:
            record = fastavro.schemaless_reader(buf, writer.parsed, writer.reader)
        except Exception as exc:  # fastavro raises many kinds on corrupt bodies
            raise MalformedRecord(
                f"cannot decode {writer.subject!r} record: {type(exc).__name__}: {exc}", self.writer_fingerprint(data)
            ) from exc
        if buf.tell() != len(data):
            raise MalformedRecord(
                f"{writer.subject!r} record has {len(data) - buf.tell()} trailing bytes", self.writer_fingerprint(data)
            )
        if not isinstance(record, dict):
            raise MalformedRecord(f"decoded {writer.subject!r} record is not a record", self.writer_fingerprint(data))
        return Decoded(writer.subject, record)
