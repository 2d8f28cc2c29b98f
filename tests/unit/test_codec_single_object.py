"""Single-object encoding as the Avro specification defines it, checked against the reference implementation.

The expected values below were computed by Apache Avro Java 1.12.1 (`SchemaNormalization.
parsingFingerprint64` and `BinaryMessageEncoder`, the program under tests/interop), never by this
codec; the history schemas are frozen, so their headers never change. The integration test
tests/integration/test_interop_java.py checks every current schema on a real broker.
"""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest
from contract_records import job_event
from prometheus_client import REGISTRY

from base.settings import KafkaSettings
from processors.fastdecode import Framed, flat_decoder, scrape_reader
from processors.testing import T0, device, scrape
from schemas import load_schema
from schemas.codec import (
    AvroCodec,
    UnknownSchema,
    _parse,
    crc64_fingerprint,
    fingerprint64,
)
from schemas.topics import DEVICE_MINUTES, DEVICE_SAMPLES
from streams.consume import SourceRecord, decode_or_dead_letter

CODEC = AvroCodec()
SAMPLES = DEVICE_SAMPLES.subject

# Java: SchemaNormalization.parsingFingerprint64(new Schema.Parser().parse(text)), as a signed long.
JAVA_FINGERPRINT64 = {
    '"null"': 7195948357588979594,  # also in the Avro specification's own test data
    '"int"': 8247732601305521295,
    '{"type":"record","name":"r","namespace":"io.x","fields":[{"name":"a","type":"long"}]}': 8457251786309160624,
}
# Java: BinaryMessageEncoder of that record with a = 300.
JAVA_ENCODED_R = bytes.fromhex("c301b0cefef2b0315e75d804")
# Java: "C3 01" + parsingFingerprint64 little-endian, of the frozen history versions.
JAVA_HEADERS = {
    ("sched.job-events", 1): bytes.fromhex("c3011b59c7efb4c4e160"),
    ("deadletter", 1): bytes.fromhex("c301cdfe068caa1c4d8b"),
}


def _legacy_count(subject: str) -> float:
    return REGISTRY.get_sample_value("gpuledger_legacy_fingerprint_records_total", {"subject": subject}) or 0.0


def _legacy(data: bytes) -> bytes:
    """The same record as gpuledger wrote it before issue 15: the fingerprint big-endian."""
    return data[:2] + data[2:10][::-1] + data[10:]


@pytest.mark.parametrize(("text", "java"), list(JAVA_FINGERPRINT64.items()))
def test_fingerprint_bytes_are_javas_fingerprint_little_endian(text: str, java: int):
    import json

    fp = crc64_fingerprint(fastavro.parse_schema(json.loads(text)))
    assert fp == java.to_bytes(8, "little", signed=True)
    assert fingerprint64(fp) == java & (2**64 - 1)


def test_a_record_java_encoded_decodes_with_its_schema():
    schema = fastavro.parse_schema(
        {"type": "record", "name": "r", "namespace": "io.x", "fields": [{"name": "a", "type": "long"}]}
    )
    assert JAVA_ENCODED_R[:10] == b"\xc3\x01" + crc64_fingerprint(schema)
    assert fastavro.schemaless_reader(io.BytesIO(JAVA_ENCODED_R[10:]), schema, None) == {"a": 300}


@pytest.mark.parametrize(("subject", "version"), list(JAVA_HEADERS))
def test_headers_of_frozen_versions_match_java(subject: str, version: int):
    assert b"\xc3\x01" + crc64_fingerprint(_parse(load_schema(subject, version))) == JAVA_HEADERS[subject, version]


def test_encode_writes_the_spec_order_and_the_dlq_names_the_fingerprint_as_java_does():
    data = CODEC.encode(SAMPLES, scrape("n1", T0, [device("GPU-0", 0, sm=0.5)]))
    assert data[2:10] == CODEC.fingerprint(SAMPLES) == crc64_fingerprint(_parse(load_schema(SAMPLES)))
    assert CODEC.writer_fingerprint(data) == f"crc64:{int.from_bytes(data[2:10], 'little'):016x}"


def test_an_old_writers_version_is_resolved_from_javas_header():
    body = io.BytesIO()
    fastavro.schemaless_writer(body, _parse(load_schema("sched.job-events", 1)), job_event("STARTED", T0))
    decoded = CODEC.decode(JAVA_HEADERS["sched.job-events", 1] + body.getvalue(), "sched.job-events")
    assert decoded.record["job_id"] == "4242" and decoded.record["project_claimed"] is None


def test_big_endian_records_still_decode_and_are_counted():
    data = CODEC.encode(SAMPLES, scrape("n1", T0, [device("GPU-0", 0, sm=0.5)]))
    before = _legacy_count(SAMPLES)
    assert CODEC.decode(_legacy(data), SAMPLES).record == CODEC.decode(data, SAMPLES).record
    assert _legacy_count(SAMPLES) == before + 1
    CODEC.decode(data, SAMPLES)
    assert _legacy_count(SAMPLES) == before + 1  # the spec's order is not counted


def test_a_fingerprint_known_in_neither_order_says_so_in_the_dead_letter():
    unknown = b"\xc3\x01" + bytes(range(1, 9)) + b"\x00"
    with pytest.raises(UnknownSchema) as info:
        CODEC.decode(unknown)
    assert info.value.fingerprint == "crc64:0807060504030201"
    message = str(info.value)
    assert "little-endian" in message and "big-endian" in message and "crc64:0102030405060708" in message

    class Sink:
        codec = CODEC
        kafka = KafkaSettings()
        sent: list[tuple[str, Any, bytes, Any]] = []

        def publish_raw(self, topic: str, key: Any, value: bytes, headers: Any = None) -> None:
            self.sent.append((topic, key, value, headers))

    sink = Sink()
    msg = SourceRecord("telemetry.device-samples.v1", 0, 7, b"c1/n1", unknown, 1)
    assert decode_or_dead_letter(msg, CODEC, sink) is None
    [(_, _, envelope, _)] = sink.sent
    reason = CODEC.decode(envelope, "deadletter").record["error_message"]
    assert "neither read little-endian" in reason and "nor big-endian" in reason


def test_lean_decoders_take_both_orders_and_nothing_else():
    lean = Framed(scrape_reader(load_schema(SAMPLES)).read, CODEC, SAMPLES)
    data = CODEC.encode(SAMPLES, scrape("n1", T0, [device("GPU-0", 0, sm=0.5)]))
    want = lean.decode(data)
    assert want is not None and (want.node, want.ts_ms, want.devices) == ("n1", T0, 1)
    before = _legacy_count(SAMPLES)
    legacy = lean.decode(_legacy(data))
    assert legacy is not None and (legacy.node, legacy.ts_ms, legacy.devices) == ("n1", T0, 1)
    assert _legacy_count(SAMPLES) == before + 1
    assert lean.decode(b"\x00\x00\x00\x00\x01" + data[10:]) is None  # Confluent framing: the codec's job
    assert lean.decode(b"\xc3\x01" + b"\x07" * 8 + data[10:]) is None

    rows = Framed(flat_decoder(load_schema(DEVICE_MINUTES.subject)).decode, CODEC, DEVICE_MINUTES.subject)
    assert rows.decode(data) is None  # a samples header is not a device-minute's
