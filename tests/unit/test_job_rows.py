"""The job stage's bundles (`processors/job_rows.py`): the hand-written body read by fastavro against the
registered schema, the grouping the node stage relies on, and a bad bundle refused whole."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from base.errors import ContractError
from base.processor_settings import ProcessorSettings
from processors.dlq import Decoder, LeanFirst
from processors.job_rows import MAX_BUNDLE_ROWS, JobRows, bundle_body, encode_rows
from processors.stages import JobPartition
from processors.testing import T0, job_rows
from schemas import load_schema
from schemas.codec import AvroCodec, MalformedRecord
from schemas.topics import DEVICE_MINUTES, JOB_DEVICE_MINUTES, job_key

M = 60_000
CODEC = AvroCodec()


def _row(job: str, dev: str, minute_ms: int, node: str = "n1") -> dict[str, Any]:
    """A device-minute with every field of the latest schema (its defaults where not given)."""
    defaults = {f["name"]: f["default"] for f in load_schema(DEVICE_MINUTES.subject)["fields"] if "default" in f}
    return defaults | {
        "cluster": "c1", "node": node, "device_uuid": dev, "mig_instance_id": None, "minute_start_ms": minute_ms,
        "model": "NVIDIA H100 80GB HBM3", "generation": "hopper", "job_id": job, "user": "ana", "project": "p",
        "team": "vision", "cost_centre": "cc1", "preemptible": False, "pricing_tier": "on-prem",
        "allocated_s": 60, "active_s": 0, "starved_s": 0, "idle_s": 60, "dark_s": 0, "sample_count": 60,
        "sm_weighted_s": 0.0, "activity_mean_ratio": 0.0, "activity_max_ratio": 0.0, "fb_used_mib_max": 10,
        "power_w_mean": 70.0, "job_node_rows": 2, "mapping_version": "dcgm-3.x/1",
        "classifier_version": "c1",
    }  # fmt: skip


class Sink:
    def __init__(self) -> None:
        self.dead: list[tuple[str, dict[str, Any]]] = []

    def publish_raw(self, topic: str, key: Any, value: bytes, headers: Any = None) -> None:
        self.dead.append((topic, dict(headers or [])))


class Msg:
    """The part of a confluent-kafka Message the decoder reads."""

    def __init__(self, value: bytes, offset: int = 7) -> None:
        self._value = value
        self._offset = offset

    def topic(self) -> str:
        return JOB_DEVICE_MINUTES.name

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return job_key("c1", "j1")

    def value(self) -> bytes:
        return self._value

    def headers(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (1, T0)


def _fastavro_items(value: bytes) -> list[bytes]:
    """The bundle's items as fastavro reads the body with the registered schema (not our reader)."""
    assert value[:10] == b"\xc3\x01" + CODEC.fingerprint(JOB_DEVICE_MINUTES.subject)
    schema = fastavro.parse_schema(load_schema(JOB_DEVICE_MINUTES.subject))
    buf = io.BytesIO(value)
    buf.seek(10)
    record = fastavro.schemaless_reader(buf, schema)
    assert buf.read() == b"", "bytes after the record"
    return list(record["rows"])  # type: ignore[index,call-overload]


def test_a_bundle_is_the_registered_schema_with_the_device_minute_records_as_items() -> None:
    rows = [_row("j1", f"GPU-{d}", T0) for d in range(3)] + [_row("j1", "GPU-x" * 200, T0)]  # a 2-byte length
    rows.append({**_row("j1", "GPU-u", T0), "job_id": None})  # unallocated: keyed by node, not bundled
    encoded, bundles = encode_rows(CODEC, rows)
    values = [CODEC.encode(DEVICE_MINUTES.subject, r) for r in rows]
    keys = [job_key("c1", "j1")] * 4 + [b"c1/n1"]
    assert encoded == list(zip(keys, values, strict=True))
    ((key, bundle),) = bundles
    assert key == job_key("c1", "j1")
    assert _fastavro_items(bundle) == values[:4]
    assert bundle == CODEC.encode(JOB_DEVICE_MINUTES.subject, {"rows": values[:4]})  # fastavro's writer, same bytes
    assert bundle_body([]) == b"\x00"
    assert encode_rows(CODEC, []) == ([], [])


def test_bundles_group_by_job_within_a_minute_and_keep_minutes_in_order() -> None:
    sent = [("a", T0), ("b", T0), ("a", T0), ("a", T0 + M), ("b", T0 + M), ("b", T0), ("a", T0)]
    rows = [_row(job, f"GPU-{n}", minute) for n, (job, minute) in enumerate(sent)]
    rows.insert(1, {**_row("b", "GPU-c2", T0), "cluster": "c2"})  # job b of another cluster: another job
    got = [
        (key.decode(), [CODEC.decode(v, DEVICE_MINUTES.subject).record["device_uuid"] for v in _fastavro_items(b)])
        for key, b in encode_rows(CODEC, rows)[1]
    ]
    assert got == [
        ("c1/a", ["GPU-0", "GPU-2"]),
        ("c2/b", ["GPU-c2"]),
        ("c1/b", ["GPU-1"]),
        ("c1/a", ["GPU-3"]),
        ("c1/b", ["GPU-4"]),
        ("c1/b", ["GPU-5"]),  # back to the earlier minute: after the later one, as sent
        ("c1/a", ["GPU-6"]),
    ]


def test_a_large_group_is_split_at_the_bound() -> None:
    rows = [_row("j1", f"GPU-{n}", T0) for n in range(MAX_BUNDLE_ROWS * 2 + 1)]
    bundles = encode_rows(CODEC, rows)[1]
    assert [len(_fastavro_items(b)) for _, b in bundles] == [MAX_BUNDLE_ROWS, MAX_BUNDLE_ROWS, 1]
    items = [item for _, b in bundles for item in _fastavro_items(b)]
    assert items == [CODEC.encode(DEVICE_MINUTES.subject, r) for r in rows]


def test_the_reader_takes_a_bundle_whole_or_dead_letters_it_whole() -> None:
    sink = Sink()
    reader = JobRows(Decoder(CODEC, sink))
    rows = [_row("j1", "GPU-0", T0), _row("j1", "GPU-1", T0)]
    good = CODEC.encode(JOB_DEVICE_MINUTES.subject, job_rows(rows, CODEC))
    assert reader.decode(Msg(good)) == rows
    assert sink.dead == []

    items = job_rows(rows, CODEC)["rows"]
    for bad_items, reason in (
        ([items[0], items[1][:20]], "device-minute 1 of the bundle"),  # a truncated item
        ([items[0], b"\x00" * 30], "device-minute 1 of the bundle"),  # neither framing
        ([items[0]] * (MAX_BUNDLE_ROWS + 1), f"at most {MAX_BUNDLE_ROWS}"),
    ):
        sink.dead.clear()
        assert reader.decode(Msg(CODEC.encode(JOB_DEVICE_MINUTES.subject, {"rows": bad_items}))) is None
        ((topic, headers),) = sink.dead
        assert topic == JOB_DEVICE_MINUTES.dlq
        assert reason in headers["dlq.error.message"].decode(), headers
    sink.dead.clear()
    assert reader.decode(Msg(good[:-3])) is None  # the bundle itself truncated
    assert [t for t, _ in sink.dead] == [JOB_DEVICE_MINUTES.dlq]


def test_an_older_writers_item_is_read_by_the_general_codec() -> None:
    """An item the lean reader does not take (Confluent-less but an older schema version) still decodes."""
    old = load_schema(DEVICE_MINUTES.subject, 1)
    row = {f["name"]: _row("j1", "GPU-0", T0)[f["name"]] for f in old["fields"]}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(old), row)
    from schemas.codec import SINGLE_OBJECT_MAGIC, crc64_fingerprint

    item = SINGLE_OBJECT_MAGIC + crc64_fingerprint(fastavro.parse_schema(old)) + buf.getvalue()
    sink = Sink()
    (got,) = JobRows(Decoder(CODEC, sink)).decode(Msg(CODEC.encode(JOB_DEVICE_MINUTES.subject, {"rows": [item]})))
    assert sink.dead == []
    assert got["device_uuid"] == "GPU-0" and got["job_id"] == "j1"


def test_a_bundle_beyond_the_horizon_takes_none_of_its_rows() -> None:
    part = JobPartition(ProcessorSettings(max_future_ms=3_600_000, realtime=True))
    part.horizon.observe_clock(T0)
    near, far = _row("j1", "GPU-0", T0), _row("j1", "GPU-1", T0 + 2 * 3_600_000)
    assert part.on_job_rows([near, far], 5) == T0 + 2 * 3_600_000
    assert part.pending == {} and part.rows_commit_offset() == 0
    assert part.on_job_rows([near], 6) is None
    assert part.rows_commit_offset() == 6
    assert part.on_job_rows([], 9) is None  # an empty bundle is read past


@pytest.mark.parametrize("n", [0, 1, 127, 128, 4095, 4096, 70_000])
def test_lengths_are_avro_longs(n: int) -> None:
    body = bundle_body([b"x" * n])
    schema = fastavro.parse_schema(load_schema(JOB_DEVICE_MINUTES.subject))
    assert fastavro.schemaless_reader(io.BytesIO(body), schema) == {"rows": [b"x" * n]}


def test_an_item_only_the_lean_reader_refuses_is_the_codecs_to_judge() -> None:
    """`dlq.LeanFirst`, which the bundles' reader uses per item: the lean reader's refusal is not the last word."""
    def refuses(value: bytes) -> dict[str, Any] | None:
        raise ContractError("the lean reader cannot take this one")

    row = _row("j1", "GPU-0", T0)
    value = CODEC.encode(DEVICE_MINUTES.subject, row)
    reader = LeanFirst(refuses, CODEC, DEVICE_MINUTES.subject)
    assert reader.record(value) == CODEC.decode(value, DEVICE_MINUTES.subject).record
    with pytest.raises(MalformedRecord, match="trailing"):
        reader.record(value + b"\x00")  # the codec refuses it too: the reason is its own
