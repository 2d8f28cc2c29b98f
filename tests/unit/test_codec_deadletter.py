"""decode_or_dead_letter without a broker: what is a dead letter, and what the DLQ record carries."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import ServiceError
from base.settings import KafkaSettings
from schemas.codec import AvroCodec, registry_client
from schemas.models import model_for
from streams.consume import (
    HEADER_ERROR_CLASS,
    HEADER_SCHEMA_FINGERPRINT,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
    SourceRecord,
    decode_or_dead_letter,
    expected_subject,
)


class FakePublisher:
    def __init__(self, codec: AvroCodec, prefix: str = "") -> None:
        self.codec = codec
        self.kafka = KafkaSettings(topic_prefix=prefix)
        self.sent: list[tuple[str, bytes | None, bytes, dict[str, bytes]]] = []

    def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers: Any = None) -> None:
        self.sent.append((topic, key, value, dict(headers or [])))


CODEC = AvroCodec()


def _scrape(**device: Any) -> dict[str, Any]:
    record = {
        "cluster": "c1",
        "node": "n1",
        "ts_ms": 1_700_000_000_000,
        "source": "dcgm-exporter",
        "mapping_version": "m1",
        "devices": [{"uuid": "GPU-0", "index": 0, "sm_active_ratio": 0.4}],
    }
    full = model_for("telemetry.device-samples").model_validate(record).model_dump()
    full["devices"][0].update(device)  # after validation: `device` may break the rules on purpose
    return full


def _msg(value: bytes | None, topic: str = "p.telemetry.device-samples.v1") -> SourceRecord:
    return SourceRecord(topic, 2, 41, b"c1/n1", value, 1_700_000_000_500)


def test_subject_of_a_topic_follows_the_catalogue():
    assert expected_subject("p.telemetry.device-samples.v1", "p.") == "telemetry.device-samples"
    assert expected_subject("p.telemetry.device-samples.v1.late", "p.") == "telemetry.device-samples"
    assert expected_subject("p.alerts.v1.dlq", "p.") == "deadletter"
    assert expected_subject("other.topic", "p.") is None


def test_a_good_record_is_returned_and_nothing_is_dead_lettered():
    publisher = FakePublisher(CODEC, "p.")
    record = _scrape()
    assert decode_or_dead_letter(_msg(CODEC.encode("telemetry.device-samples", record)), CODEC, publisher) == record
    assert publisher.sent == []


@pytest.mark.parametrize(
    ("value", "error_class"),
    [
        (b"garbage", "MalformedRecord"),
        (None, "MalformedRecord"),
        (b"\xc3\x01" + b"\x07" * 8 + b"\x00", "UnknownSchema"),
        (CODEC.encode("telemetry.device-samples", _scrape())[:-3], "MalformedRecord"),
        (CODEC.encode("alerts", {"alert_id": "a", "kind": "IDLE_WARNING", "ts_ms": 1, "cluster": "c", "message": "m"}),
         "WrongSubject"),
        (CODEC.encode("telemetry.device-samples", _scrape(sm_active_ratio=3.0)), "InvalidRecord"),
    ],
)
def test_bad_records_go_to_the_dlq_with_reason_and_source(value: bytes | None, error_class: str):
    publisher = FakePublisher(CODEC, "p.")
    assert decode_or_dead_letter(_msg(value), CODEC, publisher, clock=lambda: 123) is None
    [(topic, key, envelope_bytes, headers)] = publisher.sent
    assert topic == "p.telemetry.device-samples.v1.dlq" and key == b"c1/n1"
    assert headers[HEADER_ERROR_CLASS] == error_class.encode()
    assert headers[HEADER_SOURCE_TOPIC] == b"p.telemetry.device-samples.v1"
    assert (headers[HEADER_SOURCE_PARTITION], headers[HEADER_SOURCE_OFFSET]) == (b"2", b"41")
    envelope = CODEC.decode(envelope_bytes, expected_subject="deadletter").record
    assert envelope["value"] == value and envelope["key"] == b"c1/n1"
    assert envelope["error_class"] == error_class and envelope["ts_ms"] == 123
    assert envelope["source_subject"] == "telemetry.device-samples"
    assert envelope["source_timestamp_ms"] == 1_700_000_000_500
    assert headers[HEADER_SCHEMA_FINGERPRINT] == (envelope["schema_fingerprint"] or "").encode()
    if error_class in ("UnknownSchema", "InvalidRecord", "WrongSubject"):
        assert envelope["schema_fingerprint"].startswith("crc64:")


def test_validation_can_be_turned_off_for_hot_paths():
    publisher = FakePublisher(CODEC)
    bad = _scrape(sm_active_ratio=3.0)
    data = CODEC.encode("telemetry.device-samples", bad)
    assert decode_or_dead_letter(_msg(data, "telemetry.device-samples.v1"), CODEC, publisher, validate=False) == bad


def test_an_unreachable_registry_is_not_a_dead_letter():
    class DownRegistry:
        def get_schema(self, schema_id: int) -> Any:
            raise ConnectionError("registry down")

    codec = AvroCodec(DownRegistry())
    publisher = FakePublisher(codec)
    with pytest.raises(ServiceError, match="registry down"):
        decode_or_dead_letter(_msg(b"\x00\x00\x00\x00\x05\x02"), codec, publisher)
    assert publisher.sent == []


def test_dead_letters_use_the_registry_framing_when_configured():
    codec = AvroCodec(registry_client("mock://deadletter-unit"))
    publisher = FakePublisher(codec)
    assert decode_or_dead_letter(_msg(b"bad"), codec, publisher) is None
    assert publisher.sent[0][2][:1] == b"\x00"
    assert codec.decode(publisher.sent[0][2]).subject == "deadletter"


def test_dead_letter_message_is_pure_and_truncates_long_reasons():
    from schemas.codec import InvalidRecord
    from streams.consume import HEADER_ERROR_MESSAGE, MAX_HEADER_MESSAGE, dead_letter_message

    error = InvalidRecord("x" * 10_000, "crc64:00")
    out = dead_letter_message(_msg(b"v"), error, CODEC, subject="telemetry.device-samples", now_ms=7)
    assert out.topic == "p.telemetry.device-samples.v1.dlq" and out.key == b"c1/n1"
    assert len(dict(out.headers)[HEADER_ERROR_MESSAGE]) == MAX_HEADER_MESSAGE
    envelope = CODEC.decode(out.value).record
    assert envelope["schema_fingerprint"] == "crc64:00" and envelope["ts_ms"] == 7


def test_prefix_can_be_given_without_settings():
    class Sink:
        def __init__(self) -> None:
            self.topics: list[str] = []

        def publish_raw(self, topic_name: str, key: Any, value: Any, headers: Any = None) -> None:
            self.topics.append(topic_name)

    sink = Sink()
    data = CODEC.encode("alerts", {"alert_id": "a", "kind": "IDLE_WARNING", "ts_ms": 1, "cluster": "c", "message": "m"})
    assert decode_or_dead_letter(_msg(data), CODEC, sink, topic_prefix="p.") is None  # wrong subject
    assert sink.topics == ["p.telemetry.device-samples.v1.dlq"]


def test_source_record_from_aiokafka_and_faust_messages():
    from types import SimpleNamespace

    aiokafka = SimpleNamespace(topic="t", partition=1, offset=9, key=b"k", value=b"v", timestamp=1_700_000_000_123)
    faust = SimpleNamespace(topic="t", partition=1, offset=9, key=b"k", value=b"v", timestamp=1_700_000_000.123)
    assert SourceRecord.of(aiokafka) == SourceRecord("t", 1, 9, b"k", b"v", 1_700_000_000_123)
    assert SourceRecord.of(faust).timestamp_ms == 1_700_000_000_123
