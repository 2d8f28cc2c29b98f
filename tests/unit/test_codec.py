"""The codec: both wire formats, older and newer writers, and every way bytes can be wrong."""

from __future__ import annotations

import contextlib
import io
import json
import struct
import uuid
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.errors import ContractError
from base.settings import KafkaSettings
from schemas import load_schema, subjects
from schemas.codec import (
    AvroCodec,
    InvalidRecord,
    MalformedRecord,
    UnknownSchema,
    WrongSubject,
    _strip_logical_types,
    crc64_fingerprint,
    registry_client,
    registry_subjects,
)
from schemas.evolution import sample_records
from schemas.models import model_for


def _mock_registry() -> Any:
    return registry_client(f"mock://test-{uuid.uuid4().hex}")


@pytest.fixture(scope="module")
def plain() -> AvroCodec:
    return AvroCodec()


@pytest.fixture
def confluent() -> AvroCodec:
    return AvroCodec(_mock_registry())


def _scrape(devices: int = 8) -> dict[str, Any]:
    """A node scrape with every field present (defaults filled in by the generated model)."""
    record = {
        "cluster": "c1",
        "node": "n1",
        "ts_ms": 1_700_000_000_000,
        "source": "dcgm-exporter",
        "exporter_version": "3.3.9",
        "mapping_version": "m1",
        "devices": [{"uuid": f"GPU-{i}", "index": i, "sm_active_ratio": 0.5, "power_w": None} for i in range(devices)],
    }
    return model_for("telemetry.device-samples").model_validate(record).model_dump()


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("subject", subjects())
def test_round_trip_every_subject_single_object(plain: AvroCodec, subject: str):
    for record in sample_records(load_schema(subject)):
        data = plain.encode(subject, record)
        assert data[:2] == b"\xc3\x01" and data[2:10] == plain.fingerprint(subject)
        assert plain.decode(data, expected_subject=subject).record == record


@pytest.mark.parametrize("subject", subjects())
def test_round_trip_every_subject_confluent(confluent: AvroCodec, subject: str):
    for record in sample_records(load_schema(subject)):
        data = confluent.encode(subject, record)
        assert data[:1] == b"\x00"
        assert struct.unpack(">I", data[1:5])[0] == confluent.schema_id(subject)
        assert confluent.decode(data, expected_subject=subject).record == record


def test_registry_holds_the_avsc_under_the_topic_name_strategy_subject():
    registry = _mock_registry()
    kafka = KafkaSettings(topic_prefix="staging.")
    codec = AvroCodec(registry, registry_subjects=registry_subjects(kafka))
    codec.encode("alerts", sample_records(load_schema("alerts"))[0])
    registered = registry.get_latest_version("staging.alerts.v1-value")
    assert json.loads(registered.schema.schema_str) == load_schema("alerts")


def test_decoder_reads_both_framings_whatever_it_encodes_with(plain: AvroCodec, confluent: AvroCodec):
    record = _scrape()
    for codec in (plain, confluent):
        data = codec.encode("telemetry.device-samples", record)
        assert confluent.decode(data).record == record
    with pytest.raises(UnknownSchema, match="no schema registry"):
        plain.decode(confluent.encode("alerts", sample_records(load_schema("alerts"))[1]))


def test_from_settings_picks_the_framing_and_shares_a_registry_per_url():
    assert AvroCodec.from_settings(KafkaSettings()).wire_format == "single-object"
    kafka = KafkaSettings(schema_registry_url=f"mock://{uuid.uuid4().hex}", topic_prefix="t1.")
    writer, reader = AvroCodec.from_settings(kafka), AvroCodec.from_settings(kafka)
    assert writer.wire_format == "confluent"
    data = writer.encode("telemetry.device-samples", _scrape(2))
    assert reader.decode(data).record == _scrape(2)  # the reader fetches the schema by id
    assert writer.registry_subject("alerts") == "t1.alerts.v1-value"
    assert writer.registry_subject("deadletter") == "t1.telemetry.device-samples.v1.dlq-value"
    record_named = KafkaSettings(schema_registry_url=kafka.schema_registry_url, schema_registry_subject="{record}")
    assert AvroCodec.from_settings(record_named).registry_subject("alerts").endswith(".Alert")


def test_timestamps_stay_epoch_milliseconds(plain: AvroCodec):
    decoded = plain.decode(plain.encode("telemetry.device-samples", _scrape(1))).record
    assert decoded["ts_ms"] == 1_700_000_000_000 and type(decoded["ts_ms"]) is int


# -- older and newer writers ------------------------------------------------------------------


def _v1_job_event() -> dict[str, Any]:
    record = sample_records(load_schema("sched.job-events", 1))[1]
    assert "projects" not in record["identity"]
    return record


def test_single_object_written_with_an_older_version_reads_as_the_latest(plain: AvroCodec):
    v1 = fastavro.parse_schema(_strip_logical_types(load_schema("sched.job-events", 1)))
    buf = io.BytesIO()
    buf.write(b"\xc3\x01" + crc64_fingerprint(v1))
    fastavro.schemaless_writer(buf, v1, _v1_job_event())
    decoded = plain.decode(buf.getvalue(), expected_subject="sched.job-events")
    assert decoded.record["identity"]["projects"] == []
    assert decoded.record["identity"]["primary_team"] is None
    assert decoded.record["allocations"][0]["devices"][0]["mig_profile"] is None
    assert decoded.record["job_id"] == _v1_job_event()["job_id"]


def test_confluent_written_with_an_older_version_reads_as_the_latest():
    registry = _mock_registry()
    v1_text = json.dumps(load_schema("sched.job-events", 1))
    old_id = registry.register_schema("sched.job-events", Schema(v1_text, "AVRO"))
    v1 = fastavro.parse_schema(_strip_logical_types(load_schema("sched.job-events", 1)))
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", old_id))
    fastavro.schemaless_writer(buf, v1, _v1_job_event())
    decoded = AvroCodec(registry).decode(buf.getvalue())
    assert decoded.subject == "sched.job-events"
    assert decoded.record["identity"]["projects"] == []


def test_confluent_written_with_a_newer_unknown_version_resolves_by_record_name():
    registry = _mock_registry()
    newer = json.loads(json.dumps(load_schema("alerts")))
    newer["fields"].append({"name": "severity", "type": "string", "default": "info", "doc": "new"})
    new_id = registry.register_schema("alerts", Schema(json.dumps(newer), "AVRO"))
    record = {**sample_records(load_schema("alerts"))[1], "severity": "high"}
    buf = io.BytesIO()
    buf.write(b"\x00" + struct.pack(">I", new_id))
    fastavro.schemaless_writer(buf, fastavro.parse_schema(_strip_logical_types(newer)), record)
    decoded = AvroCodec(registry).decode(buf.getvalue())
    assert "severity" not in decoded.record
    assert decoded.record["alert_id"] == record["alert_id"]


# -- errors -----------------------------------------------------------------------------------


def test_bad_bytes_are_malformed(plain: AvroCodec):
    good = plain.encode("telemetry.device-samples", _scrape(2))
    with pytest.raises(MalformedRecord, match="neither single-object"):
        plain.decode(b"{\"json\": true}")
    with pytest.raises(MalformedRecord):
        plain.decode(b"")
    with pytest.raises(MalformedRecord, match="cannot decode") as info:
        plain.decode(good[:-7])
    assert info.value.fingerprint == f"crc64:{plain.fingerprint('telemetry.device-samples')[::-1].hex()}"
    with pytest.raises(MalformedRecord, match="trailing"):
        plain.decode(good + b"\x00")


def test_unknown_writers(plain: AvroCodec):
    with pytest.raises(UnknownSchema, match="fingerprint") as info:
        plain.decode(b"\xc3\x01" + b"\x01" * 8 + b"\x00")
    assert info.value.fingerprint == "crc64:0101010101010101"
    with pytest.raises(UnknownSchema, match="no schema registry"):
        plain.decode(b"\x00\x00\x00\x00\x07\x02")
    with pytest.raises(UnknownSchema, match="not in the registry") as info:
        AvroCodec(_mock_registry()).decode(b"\x00\x00\x00\x30\x39\x02")
    assert info.value.fingerprint == "registry-id:12345"


def test_wrong_subject(plain: AvroCodec):
    data = plain.encode("alerts", sample_records(load_schema("alerts"))[0])
    with pytest.raises(WrongSubject, match=r"expected a 'telemetry\.device-samples' record, got 'alerts'"):
        plain.decode(data, expected_subject="telemetry.device-samples")


def test_encoding_a_record_that_does_not_match_raises_invalid_record(plain: AvroCodec):
    with pytest.raises(InvalidRecord):
        plain.encode("telemetry.device-samples", {**_scrape(1), "ts_ms": "yesterday"})
    with pytest.raises(ContractError, match="no schema"):
        plain.encode("nope", {})


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(body=st.binary(max_size=200), framing=st.sampled_from(["none", "single", "confluent"]))
def test_any_bytes_decode_or_raise_a_contract_error(plain: AvroCodec, body: bytes, framing: str):
    prefix = {
        "none": b"",
        "single": b"\xc3\x01" + plain.fingerprint("telemetry.device-samples"),
        "confluent": b"\x00\x00\x00\x00\x01",
    }[framing]
    codec = plain if framing != "confluent" else _REGISTRY_CODEC
    with contextlib.suppress(ContractError):  # anything else (or a hang) fails the test
        codec.decode(prefix + body)


_REGISTRY_CODEC = AvroCodec(_mock_registry())
_REGISTRY_CODEC.encode("telemetry.device-samples", _scrape(1))


@pytest.mark.parametrize("value", ["", "sim-gpu-007", "héllo ✓", "x" * 300])
def test_avro_string_and_long_are_what_fastavro_writes_and_reads(value: str) -> None:
    """The hand cutters of encoded records (the fleet publisher, the sink's seconds kept) against the reference
    library: a string as fastavro writes it, and a long read back where fastavro wrote it."""
    from schemas.codec import avro_string, read_avro_long

    out = io.BytesIO()
    fastavro.schemaless_writer(out, {"type": "string"}, value)
    assert avro_string(value) == out.getvalue()
    for n in (0, -1, 63, -64, 1_796_678_150_695, -(2**63), 2**63 - 1):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, {"type": "long"}, n)
        assert read_avro_long(b"\x00" + buf.getvalue() + b"\x7f", 1) == (n, 1 + len(buf.getvalue()))
