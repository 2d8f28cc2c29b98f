"""The lean NodeScrape decoder gives exactly what fastavro gives, for the fields the processors read."""

from __future__ import annotations

import io
import itertools

import fastavro
import pytest

from processors.fastdecode import DEVICE_FIELDS, TOP_FIELDS, UnsupportedSchema, scrape_decoder
from processors.testing import T0, device, scrape
from producers.simulator import SimConfig, simulate
from schemas import load_schema
from schemas.codec import AvroCodec, MalformedRecord
from schemas.topics import DEVICE_SAMPLES

SUBJECT = DEVICE_SAMPLES.subject
CODEC = AvroCodec()
LEAN = scrape_decoder(load_schema(SUBJECT))


def _both(record: dict) -> tuple[dict, dict]:
    body = CODEC.encode(SUBJECT, record)
    assert body[:2] == b"\xc3\x01"
    full = fastavro.schemaless_reader(io.BytesIO(body[10:]), CODEC.parsed_schema(SUBJECT), None)
    want = {k: full[k] for k in TOP_FIELDS if k != "devices"}
    want["devices"] = [{k: d[k] for k in DEVICE_FIELDS} for d in full["devices"]]
    return want, LEAN.decode(body, 10)


def _variants() -> list[dict]:
    values = [None, 0.0, 1.0, 0.123456789, -5.5, 1e300]
    out = []
    for i, (sm, util, fb) in enumerate(itertools.product(values, values[:3], values)):
        dev = device(f"GPU-é-{i}", i * 1000, sm=sm, util_pct=util, fb_mib=fb, power_w=None if i % 2 else 650.25)
        dev["mig_instance_id"] = None if i % 3 else i
        dev["pod"] = "p" * (i % 200)
        dev["xid_last"] = -(2**31) if i % 5 == 0 else None
        dev["index"] = None if i % 7 == 0 else 2**31 - 1
        out.append(dev)
    return [scrape("n-1", T0 + 123, out[k : k + 9]) for k in range(0, len(out), 9)] + [scrape("n", -1, [])]


@pytest.mark.parametrize("record", _variants())
def test_matches_fastavro_on_varied_records(record: dict) -> None:
    want, got = _both(record)
    assert got == want


def test_matches_fastavro_on_simulator_records() -> None:
    n = 0
    for topic, _, record in simulate(SimConfig(seed=1, nodes=2, duration_s=120)):
        if topic is DEVICE_SAMPLES:
            want, got = _both(record)
            assert got == want
            n += 1
    assert n >= 100


def test_corrupt_bodies_raise_malformed_record() -> None:
    body = CODEC.encode(SUBJECT, scrape("n", T0, [device("GPU-a", 0, sm=0.5)]))
    for bad in (body[:-3], body + b"\x00", body[:11], body[:10]):
        with pytest.raises(MalformedRecord):
            LEAN.decode(bad, 10)


def test_unsupported_shape_is_refused() -> None:
    schema = load_schema(SUBJECT)
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "node"]
    with pytest.raises(UnsupportedSchema):
        scrape_decoder(schema)


def test_flat_decoder_matches_fastavro_on_device_minutes() -> None:
    from base.processor_settings import ProcessorSettings
    from processors.fastdecode import flat_decoder
    from processors.pipeline import run_in_memory

    subject = "usage.device-minutes"
    lean = flat_decoder(load_schema(subject))
    records = list(simulate(SimConfig(seed=1, nodes=2, duration_s=300)))
    rows = run_in_memory(records, ProcessorSettings()).device_minutes
    assert rows
    for row in rows:
        body = CODEC.encode(subject, row)
        full = fastavro.schemaless_reader(io.BytesIO(body[10:]), CODEC.parsed_schema(subject), None)
        assert lean.decode(body, 10) == full
