"""The native lean walk (schemas/_leanavro.c) against fastavro: the bytes it writes, what it reads, what it refuses."""

from __future__ import annotations

import io
import math
import random

import fastavro
import pytest

from base.processor_settings import ProcessorSettings
from processors.fastdecode import flat_decoder
from processors.pipeline import run_in_memory
from producers.simulator import SimConfig, simulate
from schemas import load_schema
from schemas.codec import AvroCodec, InvalidRecord, MalformedRecord
from schemas.lean import LONG, OPT_DOUBLE, OPT_STRING, Plan, UnsupportedSchema, decode_plan, encode_plan
from schemas.topics import DEVICE_SAMPLES

CODEC = AvroCodec()
FLAT_SUBJECTS = ("usage.device-minutes", "usage.job-minutes", "usage.coverage-minutes")


def _fastavro_body(subject: str, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, CODEC.parsed_schema(subject), record)
    return buf.getvalue()


@pytest.fixture(scope="module")
def pipeline_rows() -> dict[str, list[dict]]:
    out = run_in_memory(list(simulate(SimConfig(seed=3, nodes=3, duration_s=420))), ProcessorSettings())
    rows = {
        "usage.device-minutes": out.device_minutes,
        "usage.job-minutes": out.job_minutes,
        "usage.coverage-minutes": out.coverage_minutes,
    }
    assert all(rows.values())
    return rows


@pytest.mark.parametrize("subject", FLAT_SUBJECTS)
def test_the_codec_writes_fastavros_bytes_for_the_pipelines_rows(subject: str, pipeline_rows: dict) -> None:
    plan = encode_plan(load_schema(subject))
    assert plan is not None
    for row in pipeline_rows[subject]:
        body = _fastavro_body(subject, row)
        assert plan.encode(row) == body
        assert CODEC.encode(subject, row)[10:] == body


def test_edge_values_are_written_as_fastavro_writes_them() -> None:
    schema = {
        "type": "record",
        "name": "Edges",
        "fields": [
            {"name": "s", "type": "string"},
            {"name": "n", "type": "long"},
            {"name": "i", "type": "int"},
            {"name": "d", "type": "double"},
            {"name": "b", "type": "boolean"},
            {"name": "os", "type": ["null", "string"]},
            {"name": "on", "type": ["null", "long"]},
            {"name": "od", "type": ["null", "double"]},
            {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    parsed = fastavro.parse_schema(schema)
    plan = encode_plan(schema)
    assert plan is not None
    strings = ["", "a", "é日本🎉", "x" * 300, "\x00"]
    longs = [0, 1, -1, 63, 64, -64, -65, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)]
    doubles = [0.0, -0.0, 1.5, -1e-300, 1e300, math.inf, -math.inf, math.nan]
    rng = random.Random(7)
    for _ in range(400):
        record = {
            "s": rng.choice(strings),
            "n": rng.choice(longs),
            "i": rng.choice(longs),  # fastavro writes an "int" beyond 32 bits as it writes a long: so does the walk
            "d": rng.choice(doubles),
            "b": rng.choice([True, False]),
            "os": rng.choice([None, *strings]),
            "on": rng.choice([None, *longs]),
            "od": rng.choice([None, *doubles]),
            "t": rng.choice(longs),
            "extra": "ignored, as fastavro ignores it",
        }
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        assert plan.encode(record) == buf.getvalue(), record


@pytest.mark.parametrize(
    "field, value",
    [
        ("sm_weighted_s", 3),  # an int for a double
        ("active_s", True),  # a bool for an int
        ("active_s", 2**64),  # beyond a long
        ("preemptible", 1),  # an int for a boolean
        ("cluster", b"sim"),  # bytes for a string
        ("cluster", "\ud800"),  # a string that does not encode
        ("minute_start_ms", 1.0),
    ],
)
def test_a_value_off_the_plain_path_is_left_to_fastavro(field: str, value: object, pipeline_rows: dict) -> None:
    subject = "usage.device-minutes"
    plan = encode_plan(load_schema(subject))
    assert plan is not None
    row = dict(pipeline_rows[subject][0], **{field: value})
    assert plan.encode(row) is None
    try:
        want = _fastavro_body(subject, row)
    except Exception:  # fastavro refuses it: so does the codec, as before the native walk
        with pytest.raises(InvalidRecord):
            CODEC.encode(subject, row)
    else:
        assert CODEC.encode(subject, row)[10:] == want


def test_a_missing_field_is_left_to_fastavro(pipeline_rows: dict) -> None:
    subject = "usage.device-minutes"
    row = dict(pipeline_rows[subject][0])
    del row["cluster"]
    plan = encode_plan(load_schema(subject))
    assert plan is not None and plan.encode(row) is None
    with pytest.raises(InvalidRecord):
        CODEC.encode(subject, row)


def test_shapes_without_a_plan() -> None:
    assert encode_plan(load_schema(DEVICE_SAMPLES.subject)) is None  # an array of records
    with pytest.raises(UnsupportedSchema):
        decode_plan(load_schema(DEVICE_SAMPLES.subject), MalformedRecord, "scrape body")
    assert encode_plan({"type": "record", "name": "E", "fields": [{"name": "e", "type": "bytes"}]}) is None
    with pytest.raises(UnsupportedSchema):
        decode_plan(
            {"type": "record", "name": "M", "fields": [{"name": "m", "type": "string"}]}, MalformedRecord, "x", ["n"]
        )
    with pytest.raises(ValueError):
        Plan((("a", 99),), MalformedRecord, "x")
    with pytest.raises(TypeError):
        Plan((("a", LONG),), "not an exception", "x")  # type: ignore[arg-type]


# -- decoding hostile bytes ------------------------------------------------------------------------

ONE_LONG = Plan((("n", LONG),), MalformedRecord, "body")
ONE_OPT = Plan((("s", OPT_STRING), ("d", OPT_DOUBLE)), MalformedRecord, "body")


@pytest.mark.parametrize(
    "plan, data, where",
    [
        (ONE_LONG, b"\x80" * 10 + b"\x01", "longer than 10 bytes"),
        (ONE_LONG, b"\xff" * 9 + b"\x02", "beyond 64 bits"),
        (ONE_LONG, b"\x80", "truncated varint"),
        (ONE_LONG, b"", "truncated varint"),
        (ONE_LONG, b"\x02\x00", "1 trailing bytes"),
        (ONE_OPT, b"\x04", "bad union index"),
        (ONE_OPT, b"\x02\x01", "string length -1"),
        (ONE_OPT, b"\x02\x7e", "string length 63 at byte 2 of 2"),
        (ONE_OPT, b"\x02\x02\xff\x00", "not UTF-8"),
        (ONE_OPT, b"\x00\x02\x00\x00", "truncated double"),
    ],
)
def test_bytes_that_are_not_a_record_raise_malformed_record_saying_where(plan: Plan, data: bytes, where: str) -> None:
    with pytest.raises(MalformedRecord, match=where):
        plan.decode(data, 0)


def test_the_job_stages_decoder_gives_what_fastavro_reads_from_the_pipelines_device_minutes(
    pipeline_rows: dict,
) -> None:
    subject = "usage.device-minutes"
    lean = flat_decoder(load_schema(subject))
    for row in pipeline_rows[subject]:
        body = CODEC.encode(subject, row)
        full = fastavro.schemaless_reader(io.BytesIO(body[10:]), CODEC.parsed_schema(subject), None)
        assert lean.decode(body, 10) == full
