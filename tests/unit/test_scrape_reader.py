"""The native scrape reader and `absorb` (processors/_window.c) against fastavro and the Python path.

A scrape read natively and added to the node stage (`NodePartition.on_read_scrape`) must leave exactly
the state that fastavro's decoding of the same bytes leaves through the Python path (`on_scrape`): every
window (index, model, MIG profile, mapping versions, each second's activity, framebuffer and power), the
coverage map (last seen, index, the devices not yet checked against their inventory), the verdicts and
the counters. Bytes that are not a scrape are refused whole, before any of it is used.
"""

from __future__ import annotations

import io
import itertools
import math
import random
from typing import Any

import fastavro
import pytest

from base.processor_settings import ProcessorSettings
from processors._window import Scrape, absorb, span_stats
from processors.fastdecode import UnsupportedSchema, scrape_reader
from processors.stages import NodePartition
from processors.testing import T0, device, scrape
from processors.windows import DeviceWindow
from producers.simulator import SimConfig, simulate
from schemas import load_schema
from schemas.codec import AvroCodec, MalformedRecord
from schemas.topics import DEVICE_SAMPLES

SUBJECT = DEVICE_SAMPLES.subject
CODEC = AvroCodec()
READER = scrape_reader(load_schema(SUBJECT))
PARSED = CODEC.parsed_schema(SUBJECT)


def _fastavro(body: bytes) -> dict[str, Any]:
    reader = io.BytesIO(body[10:])
    record = fastavro.schemaless_reader(reader, PARSED, None)
    assert reader.tell() == len(body) - 10
    return record


def _state(part: NodePartition) -> str:
    """Everything a scrape changes in the node stage, as text (a NaN equals itself there)."""
    windows = {
        m: sorted(
            (
                (key, w.index, w.model, w.mig_profile, w.mapping, w.minute_s, sorted(w.secs.items()))
                for key, w in devs.items()
            ),
            key=repr,
        )
        for m, devs in part.windows.open.items()
    }
    cov = part.coverage
    return repr(
        (
            windows,
            sorted(part.windows.first_offset.items()),
            part.windows.late_count,
            sorted(cov.last_seen.items(), key=repr),
            sorted(cov.index_of.items(), key=repr),
            cov.unchecked,
            part.max_sample_ts,
            part.samples_next_offset,
            part.horizon.refused,
        )
    )


def _both(bodies: list[bytes], settings: ProcessorSettings | None = None) -> tuple[str, str, list[Any]]:
    """Feed the bodies to two node stages, natively and through fastavro; their states and verdicts."""
    native, python = NodePartition(settings or ProcessorSettings()), NodePartition(settings or ProcessorSettings())
    verdicts = []
    for offset, body in enumerate(bodies):
        read = READER.read(body, 10)
        record = _fastavro(body)
        assert (read.cluster, read.node, read.ts_ms, read.mapping_version, read.devices) == (
            record["cluster"],
            record["node"],
            record["ts_ms"],
            record["mapping_version"],
            len(record["devices"]),
        )
        got, want = native.on_read_scrape(read, offset), python.on_scrape(record, offset)
        assert got is want
        verdicts.append(got)
    return _state(native), _state(python), verdicts


def _variants() -> list[dict[str, Any]]:
    values = [None, 0.0, 1.0, 0.123456789, -5.5, 1e300, math.nan, -0.0, math.inf]
    out = []
    for i, (sm, util, fb) in enumerate(itertools.product(values, [*values[:3], math.nan], values)):
        dev = device(f"GPU-é-{i % 40}", i * 1000, sm=sm, util_pct=util, fb_mib=fb, power_w=None if i % 2 else 650.25)
        dev["gr_engine_active_ratio"] = None if i % 4 else 0.25
        dev["mig_instance_id"] = None if i % 3 else i % 7
        dev["mig_profile"] = None if i % 6 else "1g.10gb"
        dev["model"] = None if i % 11 == 0 else "NVIDIA H100 80GB HBM3"
        dev["pod"] = "p" * (i % 200)
        dev["xid_last"] = -(2**31) if i % 5 == 0 else None
        dev["index"] = None if i % 7 == 0 else 2**31 - 1
        out.append(dev)
    return out


def test_every_field_the_windows_read_lands_as_the_python_path_puts_it() -> None:
    devices = _variants()
    bodies = []
    for k in range(0, len(devices), 9):
        # each group twice in its second (the first sample wins), in two seconds of one minute and one of the
        # next, under two mapping versions
        for ts in (T0 + 1_000, T0 + 1_500, T0 + 2_000, T0 + 61_000):
            rec = scrape(f"n-{k % 3}", ts, devices[k : k + 9])
            rec["mapping_version"] = "dcgm-3.x/1" if ts != T0 + 2_000 else "dcgm-4.x/2"
            bodies.append(CODEC.encode(SUBJECT, rec))
    native, python, _ = _both(bodies)
    assert native == python
    assert "dcgm-3.x/1,dcgm-4.x/2" in native and "inf" in native and "1g.10gb" in native


def test_late_replayed_and_future_scrapes_change_what_the_python_path_changes() -> None:
    devs = [device("GPU-a", 0, sm=0.5), device("GPU-b", 1, sm=None, util_pct=40.0)]
    bodies = [CODEC.encode(SUBJECT, scrape("n", T0 + s * 1000, devs)) for s in (0, 1, 2)]
    native, python = NodePartition(ProcessorSettings()), NodePartition(ProcessorSettings())
    for part, feed in (
        (native, lambda b, o: native.on_read_scrape(READER.read(b, 10), o)),
        (python, lambda b, o: python.on_scrape(_fastavro(b), o)),
    ):
        for o, b in enumerate(bodies):
            feed(b, o)
        part.windows.start_at(T0)
        part.windows.close_next(3)  # the minute is closed at offset 3
        assert feed(bodies[0], 1).value == "replayed"  # read before the close: counted already
        assert feed(CODEC.encode(SUBJECT, scrape("n", T0 + 5_000, devs)), 4).value == "late"
        part.horizon.observe_clock(T0 + 70_000)
        assert feed(CODEC.encode(SUBJECT, scrape("n", T0 + 10**12, devs)), 5).value == "future"
    assert _state(native) == _state(python)


def test_simulator_scrapes_land_as_the_python_path_puts_them() -> None:
    bodies = [
        CODEC.encode(SUBJECT, r)
        for t, _, r in simulate(SimConfig(seed=1, nodes=3, duration_s=150))
        if t is DEVICE_SAMPLES
    ]
    assert len(bodies) >= 300
    native, python, verdicts = _both(bodies)
    assert native == python
    assert {v.value for v in verdicts} == {"accepted"}


def test_bodies_that_are_not_a_scrape_are_refused_whole() -> None:
    body = CODEC.encode(SUBJECT, scrape("n", T0, [device("GPU-a", 0, sm=0.5)]))
    for bad, where in (
        (body[:-3], "truncated"),
        (body + b"\x00", "1 trailing bytes"),
        (body[:11], "string length 2 at byte 11 of 11"),
        (body[:10], "truncated varint"),
        (body.replace(b"GPU-a", b"GPU-\xff"), "not UTF-8"),
    ):
        with pytest.raises(MalformedRecord, match=where):
            READER.read(bad, 10)


def test_an_array_count_the_bytes_cannot_hold_is_refused_before_any_item() -> None:
    body = CODEC.encode(SUBJECT, scrape("n-1", T0, []))
    assert body.endswith(b"\x00")  # the devices array: no block
    for count in (
        b"\x80\x80\x80\x80\x08",
        b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    ):
        with pytest.raises(MalformedRecord):  # 2**30 devices; INT64_MAX; INT64_MIN (a block of -2**63)
            READER.read(body[:-1] + count + b"\x00", 10)
    with pytest.raises(MalformedRecord, match="block size past the end"):
        READER.read(body[:-1] + b"\x01\x7e\x00", 10)  # a block of 1 item said to be 63 bytes


def test_cut_and_corrupted_scrapes_are_refused_or_land_as_fastavro_reads_them() -> None:
    rng = random.Random(11)
    landed = refused = 0
    for trial in range(3000):
        devs = [device(f"GPU-{i}", i, sm=0.5, fb_mib=10.0, power_w=300.0) for i in range(1 + trial % 4)]
        body = bytearray(CODEC.encode(SUBJECT, scrape("n-1", T0, devs)))
        for _ in range(1 + trial % 3):
            at = rng.randrange(10, len(body))
            body[at] = rng.randrange(256)
        data = bytes(body[: rng.randrange(10, len(body) + 1)] if trial % 5 == 0 else body)
        try:
            READER.read(data, 10)
        except MalformedRecord:
            refused += 1
            continue
        try:
            _fastavro(data)
        except UnicodeDecodeError:  # in a field the walk skips unread (so never judges): nothing to compare
            continue
        settings = ProcessorSettings(max_future_ms=2**62)  # a corrupted time is not refused, it lands
        native, python, _ = _both([data], settings)
        assert native == python
        landed += 1
    assert landed > 100 and refused > 100


def test_schemas_the_reader_cannot_read_are_left_to_the_codec() -> None:
    schema = load_schema(SUBJECT)
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "node"]
    with pytest.raises(UnsupportedSchema, match="names cluster, node"):
        scrape_reader(schema)
    schema = load_schema(SUBJECT)
    for f in schema["fields"]:
        if f["name"] == "ts_ms":
            f["type"] = "double"
    with pytest.raises(UnsupportedSchema, match="ts_ms is a long"):
        scrape_reader(schema)


def test_a_window_puts_the_first_sample_of_a_second_and_refuses_a_second_outside_its_minute() -> None:
    w = DeviceWindow(3, "A100", None, T0 // 1000)
    assert w.count() == 0 and w.secs == {} and w.mapping == ""
    assert w.put(T0 // 1000 + 5, 0.5, None, 100.0) is True
    assert w.put(T0 // 1000 + 5, 0.9, 1.0, 1.0) is False
    assert w.secs == {T0 // 1000 + 5: (0.5, None, 100.0)} and w.count() == 1
    with pytest.raises(IndexError):
        w.put(T0 // 1000 + 60, 0.5, None, None)
    with pytest.raises(TypeError):
        w.put(T0 // 1000, "busy", None, None)
    assert span_stats(w, 0, 60)[:3] == (1, 1, 0.5)
    with pytest.raises(ValueError):
        span_stats(w, 0, 61)
    with pytest.raises(TypeError):
        span_stats(object(), 0, 1)  # type: ignore[arg-type]


def test_absorb_refuses_arguments_of_the_wrong_kind() -> None:
    read: Scrape = READER.read(CODEC.encode(SUBJECT, scrape("n", T0, [device("GPU-a", 0)])), 10)
    with pytest.raises(TypeError):
        absorb(read, "c1/n", {}, T0 // 1000, "not a dict", {}, [], {})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a DeviceWindow"):
        absorb(read, "c1/n", {("c1/n", "GPU-a", None): "x"}, T0 // 1000, {}, {}, [], {})  # type: ignore[dict-item]


def test_a_nodes_device_keys_are_made_once_and_follow_its_devices_as_they_change() -> None:
    a, b, c = (device(f"GPU-{x}", i, sm=0.5) for i, x in enumerate("abc"))
    mig_a = {**a, "mig_instance_id": 1}
    groups = [[a, b, c], [a, b, c], [mig_a, b, c], [a, b], [b, a, c], [a, b, c, c], [], [a]]
    bodies = [CODEC.encode(SUBJECT, scrape("n", T0 + s * 1000, g)) for s, g in enumerate(groups)]
    native, python, _ = _both(bodies)
    assert native == python
    part = NodePartition(ProcessorSettings())
    for offset, body in enumerate(bodies[:2]):
        part.on_read_scrape(READER.read(body, 10), offset)
    kept = part.device_keys["c1/n"]
    assert [k[1] for k in kept] == ["GPU-a", "GPU-b", "GPU-c"]
    # the second scrape took the first one's keys: the maps and the windows hold those very objects
    assert all(any(k is seen for seen in part.coverage.last_seen) for k in kept)
    assert all(any(k is w for w in part.windows.open[T0]) for k in kept)
    for offset, body in enumerate(bodies[2:], start=2):
        part.on_read_scrape(READER.read(body, 10), offset)
    assert part.device_keys["c1/n"] == (("c1/n", "GPU-a", None),)


def test_a_window_made_from_seconds_takes_their_minute_and_keeps_its_mapping_versions_sorted() -> None:
    import gc

    base = T0 // 1000
    w = DeviceWindow(1, "A100", {base + 70: (0.5, 1.0, None), base + 65: (None, None, 2.0)}, None, "1g.10gb")
    assert (w.minute_s, w.index, w.model, w.mig_profile) == (base + 60, 1, "A100", "1g.10gb")
    assert w.secs == {base + 65: (None, None, 2.0), base + 70: (0.5, 1.0, None)}
    for version in ("dcgm-4.x/2", "dcgm-3.x/1", "dcgm-4.x/2"):
        w.add_mapping(version)
    assert w.mapping == "dcgm-3.x/1,dcgm-4.x/2"
    with pytest.raises(TypeError):
        w.add_mapping(3)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        w.mapping = "x"  # type: ignore[misc]
    # a node stage holds one a device a minute: the cyclic collector must not walk them
    assert not gc.is_tracked(w)
