"""Every parser of untrusted input, fuzzed: random and mutated-valid inputs raise nothing but the
project's own errors, each example within its deadline, and the lean decoder without big allocations.

Plus the regressions that motivated the bounds: a negative Avro length, a 50-byte record claiming
2^60 devices (it filled memory), a hostlist of 99,999,999 hosts, hostile spool files and jobcomp records.
"""

from __future__ import annotations

import contextlib
import json
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.errors import ContractError, GpuledgerError, ParseError
from processors.fastdecode import flat_decoder, scrape_reader
from processors.testing import T0, device, poison_scrapes, scrape
from producers.dcgm import MAX_UNKNOWN_METRICS, UNKNOWN_OVERFLOW, ExpositionParser, Normalizer, normalize_text
from producers.jobevents import EventContext
from producers.kube import KubeTracker
from producers.slurm import (
    MAX_HOSTS,
    expand_hostlist,
    parse_capture,
    parse_gres,
    parse_index_list,
    parse_json_doc,
)
from producers.slurm_jobcomp import jobcomp_events, parse_jobcomp_bytes
from producers.slurm_spool import drain, hook_event, parse_hook_record
from schemas import load_schema
from schemas.codec import AvroCodec, MalformedRecord
from schemas.topics import DEVICE_MINUTES, DEVICE_SAMPLES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLES = DEVICE_SAMPLES.subject
CODEC = AvroCodec()
READER = scrape_reader(load_schema(SAMPLES))
FLAT = flat_decoder(load_schema(DEVICE_MINUTES.subject))
HEADER = b"\xc3\x01" + CODEC.fingerprint(SAMPLES)
VALID_BODY = CODEC.encode(
    SAMPLES, scrape("node-1", T0, [device(f"GPU-{i}", i, sm=0.5, util_pct=40.0, fb_mib=10.0) for i in range(2)])
)
# The deadline catches a parser that loops or expands (seconds and more), not a busy machine: at 200 ms a 0.09 ms
# decode failed once in a full `make test` when its first example took 289 ms beside four workers.
FUZZ = settings(max_examples=300, deadline=timedelta(seconds=1), suppress_health_check=[HealthCheck.too_slow])


# -- the lean Avro decoder (hot path) -----------------------------------------------------------

# processors.testing.poison_scrapes says what each one is.
_POISON = poison_scrapes(HEADER, CODEC.encode(SAMPLES, scrape("n", T0, [])))
MEMORY_BOMB, NEGATIVE_LENGTH = _POISON["memory-bomb"], _POISON["negative-length"]


def _peak_bytes(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
    except MalformedRecord:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("body", [MEMORY_BOMB, NEGATIVE_LENGTH], ids=["memory-bomb", "negative-length"])
def test_poison_bodies_are_refused_fast_and_small(body: bytes) -> None:
    assert len(body) <= 64
    t0 = time.perf_counter()
    with pytest.raises(MalformedRecord):
        READER.read(body, 10)
    assert time.perf_counter() - t0 < 0.05
    assert _peak_bytes(lambda: READER.read(body, 10)) < 64 * 1024
    with pytest.raises(MalformedRecord):  # the general codec agrees: the DLQ path names the reason
        CODEC.decode(body, SAMPLES)


def test_memory_bomb_reason_names_the_count() -> None:
    with pytest.raises(MalformedRecord, match=r"1152921504606846976 array items .* cannot fit"):
        READER.read(MEMORY_BOMB, 10)
    with pytest.raises(MalformedRecord, match=r"string length -5"):
        READER.read(NEGATIVE_LENGTH, 10)


@FUZZ
@given(st.binary(max_size=64))
def test_lean_decoder_random_bytes(data: bytes) -> None:
    for read in (READER.read, FLAT.decode):

        def run(read: Any = read) -> None:
            read(HEADER + data, 10)

        assert _peak_bytes(run) < 2 * 1024 * 1024


@FUZZ
@given(st.integers(0, len(VALID_BODY) - 1), st.binary(min_size=1, max_size=12), st.booleans())
def test_lean_decoder_mutated_valid_bodies(at: int, patch: bytes, insert: bool) -> None:
    at = max(at, 10)
    body = VALID_BODY[:at] + patch + VALID_BODY[at + (0 if insert else len(patch)) :]
    with contextlib.suppress(MalformedRecord):
        READER.read(body, 10)
    with contextlib.suppress(ContractError):
        CODEC.decode(body, SAMPLES)


@FUZZ
@given(st.binary(max_size=256))
def test_general_codec_random_bytes(data: bytes) -> None:
    for framed in (data, HEADER + data, b"\x00\x00\x00\x00\x01" + data):
        with contextlib.suppress(ContractError):
            CODEC.decode(framed, SAMPLES)


# -- Slurm ----------------------------------------------------------------------------------------


def test_huge_hostlist_is_one_line_error_in_milliseconds() -> None:
    t0 = time.perf_counter()
    with pytest.raises(ParseError, match="more than 65536 hosts") as info:
        expand_hostlist("a[1-99999999]")
    assert time.perf_counter() - t0 < 0.1
    assert "\n" not in str(info.value)
    with pytest.raises(ParseError):  # 300 x 300 across two bracket groups
        expand_hostlist("r[1-300]n[1-300]")
    with pytest.raises(ParseError):  # the cap is on the whole list, not each part
        expand_hostlist("a[1-40000],b[1-40000]")
    assert len(expand_hostlist(f"a[1-{MAX_HOSTS}]")) == MAX_HOSTS
    assert expand_hostlist("cn[08-10]-ib,x") == ("cn08-ib", "cn09-ib", "cn10-ib", "x")


def test_huge_index_ranges_are_refused() -> None:
    with pytest.raises(ParseError):
        parse_index_list("0-99999999")
    with pytest.raises(ParseError):
        parse_gres("gpu:h100:4(IDX:0-99999999)")
    with pytest.raises(ParseError):
        parse_index_list("٣")  # a Unicode digit: str.isdigit says yes, int() says no
    assert parse_index_list("0-3,7") == (0, 1, 2, 3, 7)


HOSTLIST_TEXT = st.text(alphabet="ab0123456789[]-,()", max_size=40)


@FUZZ
@given(HOSTLIST_TEXT)
def test_hostlist_and_indices_fuzz(text: str) -> None:
    for parse in (expand_hostlist.__wrapped__, parse_index_list, parse_gres.__wrapped__):
        try:
            out = parse(text)
        except ParseError:
            continue
        assert len(out) <= MAX_HOSTS


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
JOB_KEYS = st.sampled_from(
    ["job_id", "job_state", "nodes", "gres_detail", "tres_alloc_str", "start_time", "end_time", "state", "time",
     "array", "het", "tres", "exit_code", "job_resources", "user_name", "array_task_id", "tres_per_node"]
)
JOB_RECORDS = st.dictionaries(JOB_KEYS, JSON_VALUES | HOSTLIST_TEXT, max_size=10)


@FUZZ
@given(st.dictionaries(st.sampled_from(["jobs", "nodes", "meta", "errors"]), st.lists(JOB_RECORDS, max_size=3)
                       | JSON_VALUES, max_size=3))
def test_slurm_json_documents_fuzz(doc: dict[str, Any]) -> None:
    with contextlib.suppress(ParseError):
        parse_json_doc(doc)


def _fixture_texts(folder: str) -> list[str]:
    return [p.read_text(encoding="utf-8") for p in sorted((FIXTURES / folder).rglob("*")) if p.is_file()]


SLURM_TEXTS = _fixture_texts("slurm/sacct-json") + _fixture_texts("slurm/slurmrestd-json") + _fixture_texts(
    "slurm/scontrol-text"
)


@FUZZ
@given(st.sampled_from(SLURM_TEXTS), st.data())
def test_slurm_captures_mutated(text: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(text)))
    patch = data.draw(st.text(alphabet="{}[]\",:-0123456789eE.=\n ", max_size=8) | HOSTLIST_TEXT)
    with contextlib.suppress(ParseError):
        parse_capture(text[:at] + patch + text[at + len(patch) :])


def test_deep_json_is_a_parse_error() -> None:
    with pytest.raises(ParseError):
        parse_capture('{"jobs": ' + "[" * 100_000 + "]" * 100_000 + "}")


# -- jobcomp and spool ----------------------------------------------------------------------------

JOBCOMP_KEYS = st.sampled_from(["jobid", "state", "nodes", "tres_alloc", "@start", "@end", "@submit", "job_name",
                                "array_job_id", "array_task_id", "het_job_id", "exit_code", "wc_key", "username"])


@FUZZ
@given(st.dictionaries(JOBCOMP_KEYS, JSON_VALUES | HOSTLIST_TEXT, max_size=10))
def test_jobcomp_records_fuzz(rec: dict[str, Any]) -> None:
    try:
        events = jobcomp_events(parse_jobcomp_bytes(json.dumps(rec).encode()), EventContext("c"))
    except ParseError:
        return
    for ev in events:  # what a record yields, the contract takes (or the consumer dead-letters it)
        with contextlib.suppress(ContractError):
            CODEC.encode("sched.job-events", ev)


@pytest.mark.parametrize(
    "data", [b"[]", b"1e999999", b"[" * 100_000, b"\xff\xfe", b"x" * (2 << 20)],
    ids=["list", "inf", "deep", "not-utf8", "2MiB"],
)
def test_jobcomp_bytes_refused(data: bytes) -> None:
    with pytest.raises(ParseError):
        parse_jobcomp_bytes(data)


ENV_KEYS = st.sampled_from(["SLURM_JOB_ID", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_START_TIME",
                            "SLURM_JOB_END_TIME", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_JOB_ID",
                            "SLURM_JOB_EXIT_CODE2", "SLURM_HET_JOB_OFFSET", "SLURM_HET_JOB_ID"])


@FUZZ
@given(st.fixed_dictionaries({"kind": st.sampled_from(["start", "end", "x"]),
                              "env": st.dictionaries(ENV_KEYS, HOSTLIST_TEXT | st.integers().map(str), max_size=8),
                              "hook_ts_ms": JSON_VALUES}))
def test_spool_records_fuzz(data: dict[str, Any]) -> None:
    with contextlib.suppress(ParseError):
        hook_event(parse_hook_record(data), EventContext("c"))


class _Sink:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        CODEC.encode(topic.subject, record)  # as the real publisher: the contract may refuse
        self.records.append(record)


def test_hostile_spool_files_are_quarantined_and_the_drain_goes_on(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    good = {"kind": "start", "host": "gpu1", "hook_ts_ms": 1_762_529_700_000,
            "env": {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1", "SLURM_JOB_USER": "alice"}}
    hostile = {
        "a-list.json": "[1, 2]",
        "b-deep.json": "[" * 100_000,
        "c-huge.json": json.dumps({**good, "pad": "x" * (1 << 20)}),
        "d-range.json": json.dumps({**good, "env": {**good["env"], "SLURM_JOB_GPUS": "0-99999999",
                                                    "CUDA_VISIBLE_DEVICES": ",".join(["GPU-x"] * 5000)}}),
        "e-ts.json": json.dumps({**good, "hook_ts_ms": "soon"}),
        "f-contract.json": json.dumps({**good, "env": {**good["env"], "SLURM_ARRAY_JOB_ID": "41",
                                                       "SLURM_ARRAY_TASK_ID": "9" * 12}}),  # an Avro int
    }
    for name, text in hostile.items():
        (spool / name).write_text(text)
    (spool / "z-good.json").write_text(json.dumps(good))
    sink = _Sink()
    sent, bad = drain(spool, EventContext("hpc"), sink, flush=lambda: None)
    assert (sent, bad) == (1, len(hostile))
    assert sink.records[0]["job_id"] == "42"
    for name in hostile:
        assert (spool / "bad" / name).exists()
        reason = (spool / "bad" / (name + ".reason")).read_text()
        assert reason.startswith(("ParseError", "InvalidRecord")) and reason.count("\n") == 1
    assert sorted(p.name for p in spool.glob("*.json")) == []


# -- DCGM scrapes ---------------------------------------------------------------------------------

DCGM_TEXTS = _fixture_texts("dcgm/exposition")


# A malformed 15 KiB scrape is re-parsed line by line (~0.2 s on a busy core): a wider deadline here.
@settings(FUZZ, deadline=timedelta(seconds=2))
@given(st.sampled_from(DCGM_TEXTS), st.data())
def test_dcgm_scrapes_mutated(text: str, data: st.DataObject) -> None:
    at = data.draw(st.integers(0, len(text)))
    patch = data.draw(st.text(alphabet='{}",=#\n -+.eE0123456789NaInf_abcGPU', max_size=10))
    mutated = text[:at] + patch + text[at + len(patch) :]
    for parser in (ExpositionParser(), None):
        try:
            result = normalize_text(mutated, parser=parser)
        except ParseError:
            continue
        for dev in result.devices:  # what is carried is in range
            for name, value in dev.items():
                if value is not None and name.endswith("_ratio"):
                    assert 0.0 <= value <= 1.0
                if value is not None and name.endswith("_pct"):
                    assert 0.0 <= value <= 100.0


@FUZZ
@given(st.text(max_size=200))
def test_dcgm_random_text(text: str) -> None:
    with contextlib.suppress(ParseError):
        normalize_text(text, parser=ExpositionParser())


def test_unquoted_brace_in_labels_does_not_wedge_the_parser() -> None:
    # prometheus_client's parse_labels loops forever on `a="1"}`: the fast parser must not hand it one.
    text = 'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a"}} 1\nDCGM_FI_DEV_FB_USED{gpu="1",UUID="GPU-b"} 2\n'
    t0 = time.perf_counter()
    result = normalize_text(text, parser=ExpositionParser())
    assert time.perf_counter() - t0 < 1
    assert [d["uuid"] for d in result.devices] == ["GPU-b"] and result.skipped_lines == 1


def test_dcgm_values_out_of_range_are_dropped_and_counted() -> None:
    labels = 'gpu="0",UUID="GPU-a",Hostname="n1"'
    text = (f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 250\nDCGM_FI_DEV_POWER_USAGE{{{labels}}} -5\n"
            f"DCGM_FI_DEV_FB_USED{{{labels}}} 1024\n")
    result = normalize_text(text)
    (dev,) = result.devices
    assert dev["gpu_util_pct"] is None and dev["power_w"] is None and dev["fb_used_mib"] == 1024
    assert result.out_of_range == 2


def test_unknown_metric_names_remembered_are_capped() -> None:
    normalizer = Normalizer()
    labels = 'gpu="0",UUID="GPU-a"'
    junk = [f"junk_{i}{{{labels}}} 1" for i in range(MAX_UNKNOWN_METRICS + 500)]
    lines = [f"DCGM_FI_DEV_FB_USED{{{labels}}} 1", *junk]
    normalize_text("\n".join(lines) + "\n", normalizer=normalizer)
    assert len(normalizer.unknown_counts) == MAX_UNKNOWN_METRICS + 1
    assert normalizer.unknown_counts[UNKNOWN_OVERFLOW] == 500


# -- Kubernetes objects ---------------------------------------------------------------------------

POD_VALUES = JSON_VALUES | st.sampled_from(["99999999999", "8", "-1", "1e3"])


@FUZZ
@given(st.fixed_dictionaries({
    "metadata": st.dictionaries(st.sampled_from(["name", "namespace", "uid", "labels", "ownerReferences"]),
                                JSON_VALUES, max_size=4),
    "spec": st.fixed_dictionaries({
        "nodeName": st.one_of(st.none(), st.just("n1")),
        "containers": st.lists(st.fixed_dictionaries({"resources": st.fixed_dictionaries({
            "limits": st.dictionaries(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.5gb"]), POD_VALUES)})}),
            max_size=2),
    }),
    "status": st.dictionaries(st.sampled_from(["phase", "conditions", "startTime"]), JSON_VALUES, max_size=3),
}))
def test_kube_pods_fuzz(pod: dict[str, Any]) -> None:
    tracker = KubeTracker(EventContext("k"))
    for watch_type in ("ADDED", "MODIFIED", "DELETED"):
        try:
            events = tracker.on_pod(watch_type, pod, 1_715_955_000_000)
        except GpuledgerError:
            continue
        for ev in events:
            assert sum(len(a["devices"]) for a in ev["allocations"]) <= 1024


def test_kube_pod_asking_for_absurd_gpus_is_refused_fast() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "99999999999"}}}]},
           "status": {"phase": "Running", "startTime": "2024-05-17T14:02:54Z"}}
    t0 = time.perf_counter()
    with pytest.raises(ParseError):
        KubeTracker(EventContext("k")).on_pod("ADDED", pod, 1_715_955_000_000)
    assert time.perf_counter() - t0 < 0.1
