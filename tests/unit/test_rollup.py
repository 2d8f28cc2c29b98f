"""Worked ledger: a few devices, jobs and seconds, every class asserted to the second (classifier c1)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from base.processor_settings import IdlePolicy, ProcessorSettings
from processors.classify import JobMinuteClass, classify_job_minute
from processors.pipeline import PipelineResult, run_in_memory
from processors.testing import T0, device, inventory, job_event, scrape
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key

S = 1000


def _samples(second: int) -> list[tuple[str, dict[str, Any]]]:
    """Per node, what the exporter reports at run second `second` (0..179)."""
    m = second // 60
    n1 = [
        device("GPU-A", 0, sm=0.9, fb_mib=30000),  # J1 holds it over [10 s, 130 s): active
        device("GPU-B", 1, util_pct=0.0, fb_mib=2000),  # J2 (gang part 1): idle, via the gpu_util fallback
        # J4, a poker: 2 s at 1.0 every few minutes, else 0 with memory loaded -> idle (mean 0.033)
        device("GPU-E", 2, sm=1.0 if second in (0, 1) else 0.0, fb_mib=4000),
    ]
    n2 = [
        # J3 starved: low real activity with memory loaded
        device("GPU-D", 1, sm=0.1 if m == 0 else 0.2, fb_mib=8192),
    ]
    if m == 0:
        n2.append(device("GPU-C", 0, sm=0.5, fb_mib=9000))  # J2 (gang part 2) busy in minute 0
    elif m == 2:
        # minute 1: no sample at all (dark); minute 2: 10 s with no activity metric (dark), then idle
        n2.append(device("GPU-C", 0, sm=None if second < 130 else 0.0, fb_mib=9000))
    # GPU-F (n2) never reports: J5 is dark all along.
    return [("n1", scrape("n1", T0 + second * S, n1)), ("n2", scrape("n2", T0 + second * S, n2))]


def records() -> list[tuple[Any, bytes, dict[str, Any]]]:
    out: list[tuple[Any, bytes, dict[str, Any]]] = [
        (INVENTORY, node_key("c1", "n1"), inventory("n1", ["GPU-A", "GPU-B", "GPU-E"])),
        (INVENTORY, node_key("c1", "n2"), inventory("n2", ["GPU-C", "GPU-D", "GPU-F"])),
    ]
    starts = {
        0: [
            job_event("STARTED", "J2", T0, {"n1": ["GPU-B"], "n2": ["GPU-C"]}, interactive=True),
            job_event("STARTED", "J3", T0, {"n2": ["GPU-D"]}),
            job_event("STARTED", "J4", T0, {"n1": ["GPU-E"]}),
            job_event("STARTED", "J5", T0, {"n2": ["GPU-F"]}),
        ],
        10: [job_event("STARTED", "J1", T0 + 10 * S, {"n1": ["GPU-A"]})],
        120: [job_event("ENDED", "J3", T0 + 120 * S, {"n2": ["GPU-D"]})],
        130: [job_event("ENDED", "J1", T0 + 130 * S)],  # no allocations listed: closes what J1 holds
    }
    for second in range(180):
        for ev in starts.get(second, ()):
            out.append((JOB_EVENTS, job_key("c1", ev["job_id"]), ev))
        for node, rec in _samples(second):
            out.append((DEVICE_SAMPLES, node_key("c1", node), rec))
        if second == 30:  # a second sample of the same second counts once
            dup = scrape("n1", T0 + 30_500, [device("GPU-A", 0, sm=0.0, fb_mib=0)])
            out.append((DEVICE_SAMPLES, node_key("c1", "n1"), dup))
    for jid in ("J2", "J4", "J5"):
        ev = job_event("ENDED", jid, T0 + 180 * S)
        out.append((JOB_EVENTS, job_key("c1", jid), ev))
    return out


EXPECTED = {
    "J1": {"allocated_s": 120, "active_s": 120, "starved_s": 0, "idle_s": 0, "dark_s": 0},
    "J2": {"allocated_s": 360, "active_s": 60, "starved_s": 0, "idle_s": 230, "dark_s": 70},
    "J3": {"allocated_s": 120, "active_s": 0, "starved_s": 120, "idle_s": 0, "dark_s": 0},
    "J4": {"allocated_s": 180, "active_s": 0, "starved_s": 0, "idle_s": 180, "dark_s": 0},
    "J5": {"allocated_s": 180, "active_s": 0, "starved_s": 0, "idle_s": 0, "dark_s": 180},
}


def settings() -> ProcessorSettings:
    idle = IdlePolicy(idle_after_min_interactive=2, idle_after_min_batch=2, grace_min=1)
    return ProcessorSettings(idle=idle, coverage_timeout_ms=60_000)


@pytest.fixture(scope="module")
def result() -> PipelineResult:
    return run_in_memory(records(), settings())


@pytest.mark.parametrize("partitions", [1, 2, 4])
def test_job_ledger_to_the_second(partitions: int) -> None:
    assert run_in_memory(records(), settings(), partitions).ledger() == EXPECTED


def test_unallocated_seconds_and_effective_seconds(result: PipelineResult) -> None:
    free = [r for r in result.device_minutes if r["job_id"] is None]
    per_device: Counter[str] = Counter()
    for r in free:
        per_device[r["device_uuid"]] += r["unallocated_s"]
    assert per_device == {"GPU-A": 10 + 50, "GPU-D": 60}  # before/after J1; after J3 ended
    assert all(r["allocated_s"] == 0 for r in free)
    j1 = [r for r in result.device_minutes if r["job_id"] == "J1"]
    assert sum(r["sm_weighted_s"] for r in j1) == pytest.approx(0.9 * 120)
    j4 = [r for r in result.device_minutes if r["job_id"] == "J4"]
    assert sum(r["sm_weighted_s"] for r in j4) == pytest.approx(2.0)


def test_rows_are_additive_and_stamped(result: PipelineResult) -> None:
    for r in result.device_minutes + result.job_minutes:
        assert r["allocated_s"] == r["active_s"] + r["starved_s"] + r["idle_s"] + r["dark_s"]
        assert r["classifier_version"] == "c1"
    for r in result.device_minutes:
        if r["sample_count"]:
            assert r["mapping_version"] == "dcgm-3.x/1"
    codec = AvroCodec()
    for r in result.device_minutes:
        codec.encode("usage.device-minutes", r)
    for r in result.job_minutes:
        codec.encode("usage.job-minutes", r)
    for r in result.coverage_minutes:
        codec.encode("usage.coverage-minutes", r)
    for a in result.alerts:
        codec.encode("alerts", a)
    for a in result.actions:
        codec.encode("actions.reclaim", a)


def test_gang_minute_with_one_busy_device_is_not_idle(result: PipelineResult) -> None:
    j2 = sorted((r for r in result.job_minutes if r["job_id"] == "J2"), key=lambda r: r["minute_start_ms"])
    classes = [classify_job_minute(r["active_s"], r["starved_s"], r["idle_s"]) for r in j2]
    assert classes == [JobMinuteClass.BUSY, JobMinuteClass.IDLE, JobMinuteClass.IDLE]
    assert [r["device_count"] for r in j2] == [2, 2, 2]


def test_dark_is_never_idle(result: PipelineResult) -> None:
    j5 = [r for r in result.job_minutes if r["job_id"] == "J5"]
    assert len(j5) == 3 and all(r["idle_s"] == 0 and r["dark_s"] == 60 for r in j5)
    assert not [a for a in result.alerts if a["job_id"] == "J5"]


def test_idle_alerts_poker_caught_starved_spared(result: PipelineResult) -> None:
    kinds = Counter((a["job_id"], a["kind"]) for a in result.alerts if a["job_id"])
    assert kinds[("J4", "IDLE_WARNING")] == 1  # the poker does not escape
    assert kinds[("J4", "RECLAIM_NOTICE")] == 1
    assert kinds[("J2", "IDLE_WARNING")] == 1  # gang idle in minutes 1 and 2
    assert not [k for k in kinds if k[0] in ("J1", "J3", "J5")]  # active, starved, dark: never warned
    (action,) = result.actions
    assert action["job_id"] == "J4" and action["dry_run"] is True and action["action"] == "CANCEL"
    assert action["device_uuids"] == ["GPU-E"]
    warn = next(a for a in result.alerts if a["kind"] == "IDLE_WARNING" and a["job_id"] == "J4")
    assert warn["ts_ms"] == T0 + 120 * S and warn["action_at_ms"] == T0 + 180 * S
    assert warn["idle_minutes"] == 2 and warn["cost_so_far"] is None and warn["appeal_route"]


def test_coverage_minutes_and_gap(result: PipelineResult) -> None:
    cov = {(c["node"], (c["minute_start_ms"] - T0) // 60_000): c for c in result.coverage_minutes}
    assert cov[("n2", 1)]["expected_devices"] == 3
    assert cov[("n2", 1)]["reporting_devices"] == 1  # GPU-C silent in minute 1, GPU-F always
    assert cov[("n2", 1)]["reporting_device_s"] == 60
    assert cov[("n1", 0)]["reporting_device_s"] == 180
    gaps = [a for a in result.alerts if a["kind"] == "COVERAGE_GAP"]
    assert {tuple(a["device_uuids"]) for a in gaps} == {("GPU-F",), ("GPU-C",)}
    assert next(a for a in result.alerts if a["kind"] == "COVERAGE_RECOVERED")["device_uuids"] == ["GPU-C"]


def test_single_job_fast_path_equals_the_general_path() -> None:
    import random

    from base.processor_settings import Thresholds
    from processors.rollup import allocated_row, span_row
    from processors.windows import DeviceWindow

    rng = random.Random(11)
    th = Thresholds()
    for i in range(600):
        # every second seen or some dark (or none); metrics always there, sometimes or never
        p_seen = (1.0, 0.8, 0.0)[i % 3]
        p_none = (0.0, 0.15, 1.0)[(i // 3) % 3]
        win = DeviceWindow(0, None, None, T0 // 1000)

        def maybe(v: float, p_none: float = p_none) -> float | None:
            return None if rng.random() < p_none else v

        for s in range(60):
            if rng.random() < p_seen:
                win.put(
                    T0 // 1000 + s, maybe(rng.random() * 0.4), maybe(rng.random() * 3000), maybe(rng.random() * 700)
                )
        base = {"allocated_s": 0, "active_s": 0, "starved_s": 0, "idle_s": 0, "dark_s": 0, "sm_weighted_s": 0.0}
        i0, i1 = (0, 60) if i % 2 else sorted((rng.randint(0, 60), rng.randint(0, 60)))  # whole minute or a span
        general = allocated_row(base, set(range(T0 // 1000 + i0, T0 // 1000 + i1)), win.secs, th)
        assert span_row(dict(base), win, i0, i1, th) == general


def test_job_events_after_their_minute_closed_are_counted_once_and_not_on_replay() -> None:
    """A job event later than the grace is applied from arrival (the closed minute keeps its owner) and
    counted; a duplicate is not; after a restart, events read before the restored commit are replays."""
    from base.processor_settings import ProcessorSettings
    from processors.stages import NodePartition

    def run(part: NodePartition, first_offset: int) -> None:
        part.on_allocation("c1/n1", job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}), first_offset)
        for s in range(75):
            part.on_scrape(scrape("n1", T0 + s * 1000, [device("GPU-a", 0, sm=0.9)]), s)
        part.advance(T0 + 60_000 + 10_000)  # minute T0 closes with j1 holding the device throughout

    part = NodePartition(ProcessorSettings())
    run(part, 0)
    assert part.windows.next_close_ms == T0 + 60_000 and part.late_allocations == 0
    ended = job_event("ENDED", "j1", T0 + 30_000, {"n1": ["GPU-a"]})
    part.on_allocation("c1/n1", ended, 1)
    part.on_allocation("c1/n1", ended, 2)  # the same event again
    assert part.late_allocations == 1 and part.last_late_allocation == ("c1/j1", T0 + 30_000, T0 + 60_000)
    # A restart restores the commit (metadata) and replays from before the late event: not counted.
    restarted = NodePartition(ProcessorSettings())
    restarted.restore(part.metadata())
    run(restarted, 0)
    restarted.on_allocation("c1/n1", ended, 1)
    assert restarted.late_allocations == 0
    late_again = job_event("ENDED", "j1", T0 + 40_000, {"n1": ["GPU-a"]})  # read for the first time
    late_again["event_id"] = "another"
    restarted.on_allocation("c1/n1", late_again, 3)
    assert restarted.late_allocations == 1


def test_rekey_replay_after_a_restart_relearns_nodes_without_publishing_again() -> None:
    from processors.stages import RekeyStage

    events = [
        job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}),
        job_event("STARTED", "j2", T0 + 1000, {"n2": ["GPU-b"]}),
        job_event("ENDED", "j2", T0 + 2000),
    ]
    stage = RekeyStage()
    assert [stage.route(ev, off) for off, ev in enumerate(events)] == [["c1/n1"], ["c1/n2"], ["c1/n2"]]
    assert stage.commit_offset(3) == 0  # j1 still runs: a restart replays its start to learn its nodes
    again = RekeyStage.restore(stage.metadata(3))
    replayed = [off for off, ev in enumerate(events) if again.route(ev, off)]
    assert replayed == []  # all three were delivered before the commit
    end = job_event("ENDED", "j1", T0 + 3000)  # names no nodes: the stage still knows j1's
    assert again.route(end, 3) == ["c1/n1"] and again.published_below == 3
    assert RekeyStage.restore(None).published_below == 0


def test_a_restart_that_replays_a_jobs_end_before_its_start_does_not_reopen_it() -> None:
    """The committed allocations offset can fall between an ended job's start and its end; the start
    comes back later, published again by the re-keying stage. The job must not hold the device on."""
    import json

    from base.processor_settings import ProcessorSettings
    from processors.stages import NodePartition

    start = job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]})
    end = job_event("ENDED", "j1", T0 + 30_000)
    part = NodePartition(ProcessorSettings())
    part.restore(json.dumps({"nc": T0 + 60_000, "co": {}, "ao": 10}))  # minute T0 was out before the crash
    part.on_allocation("c1/n1", end, 5)  # replayed from the committed offset: the end only
    part.on_allocation("c1/n1", start, 11)  # the start, published again
    part.on_allocation("c1/n1", end, 12)  # and the end again: a duplicate
    for s in range(60, 135):
        part.on_scrape(scrape("n1", T0 + s * 1000, [device("GPU-a", 0, sm=0.0)]), 20 + s)
    rows = part.advance(T0 + 130_000).device_minutes
    assert [(r["minute_start_ms"], r["job_id"], r["unallocated_s"]) for r in rows] == [(T0 + 60_000, None, 60)]


def _with(extra: list[tuple[int, tuple[Any, bytes, dict[str, Any]]]]) -> list[tuple[Any, bytes, dict[str, Any]]]:
    """The worked ledger's records with `extra` inserted after the record at each given index."""
    out = records()
    for at, rec in sorted(extra, key=lambda e: -e[0]):
        out.insert(at, rec)
    return out


YEAR_MS = 365 * 24 * 3600 * S


@pytest.mark.parametrize("bad_ts", [2**62, T0 + 90 * S + YEAR_MS], ids=["2^62", "a-year-ahead"])
@pytest.mark.parametrize("partitions", [1, 2])
def test_a_far_future_sample_is_refused_and_the_ledger_is_untouched(bad_ts: int, partitions: int) -> None:
    """A scrape that decodes fine but is far ahead of event time, in the middle of the run (second 90):
    refused (the runtime dead-letters it), it moves no watermark, so it closes nothing early and no later
    sample is late; every row is the one the run gives without it."""
    base = run_in_memory(records(), settings(), partitions)
    bad = scrape("n1", bad_ts, [device("GPU-A", 0, sm=0.9, fb_mib=30000), device("GPU-Z", 9, sm=1.0)])
    at = next(i for i, (_, _, r) in enumerate(records()) if r["ts_ms"] == T0 + 90 * S)
    got = run_in_memory(_with([(at, (DEVICE_SAMPLES, node_key("c1", "n1"), bad))]), settings(), partitions)
    assert got.refused == [bad]
    assert got.late == [] == base.late
    assert got.ledger() == EXPECTED
    assert got.device_minutes == base.device_minutes
    assert got.coverage_minutes == base.coverage_minutes
    assert got.job_minutes == base.job_minutes


def test_a_far_future_job_event_is_refused_on_both_job_stages() -> None:
    """J1 "ending" in 2^62 and a job "starting" a year ahead: neither reaches the allocations (re-keying
    stage) nor the job stage, and the ledger is exactly the one without them."""
    end = job_event("ENDED", "J1", 2**62)
    ghost = job_event("STARTED", "J9", T0 + YEAR_MS, {"n1": ["GPU-A"]})
    at = next(i for i, (_, _, r) in enumerate(records()) if r["ts_ms"] == T0 + 60 * S)
    extra = [(at, (JOB_EVENTS, job_key("c1", "J1"), end)), (at, (JOB_EVENTS, job_key("c1", "J9"), ghost))]
    for partitions in (1, 2):
        got = run_in_memory(_with(extra), settings(), partitions)
        assert sorted(r["event_id"] for r in got.refused) == sorted([end["event_id"], ghost["event_id"]])
        assert got.ledger() == EXPECTED


def test_the_native_span_pass_adds_and_compares_as_the_general_path_on_awkward_values() -> None:
    """Magnitudes where the order of additions shows in the last bits (1e16 + 1.0), signed zeros, ties and
    infinity: the one native pass and the general path's Python give the same row, bit for bit."""
    import random
    import struct

    from base.processor_settings import Thresholds
    from processors.rollup import allocated_row, span_row
    from processors.windows import DeviceWindow

    values = [0.0, -0.0, 1e16, 1.0, 0.1, 3.0, -1e16, float("inf"), None]
    rng = random.Random(5)
    th = Thresholds()
    for i in range(2000):
        win = DeviceWindow(0, None, None, T0 // 1000)
        for s in range(60):
            if rng.random() < 0.9:
                act = rng.choice([*values[:6], None]) if i % 2 else rng.choice([*values[:7], None])
                win.put(T0 // 1000 + s, act, rng.choice(values), rng.choice([*values[:6], None]))
        base = {"allocated_s": 0, "active_s": 0, "starved_s": 0, "idle_s": 0, "dark_s": 0, "sm_weighted_s": 0.0}
        i0, i1 = sorted((rng.randint(0, 60), rng.randint(0, 60)))
        general = allocated_row(base, set(range(T0 // 1000 + i0, T0 // 1000 + i1)), win.secs, th)
        fast = span_row(dict(base), win, i0, i1, th)

        def bits(row: dict) -> dict:
            return {k: struct.pack("<d", v) if isinstance(v, float) else v for k, v in row.items()}

        assert bits(fast) == bits(general), (i, i0, i1)


def test_a_close_in_two_steps_gives_the_rows_of_one_close_and_learns_which_nodes_waited() -> None:
    from base.processor_settings import ProcessorSettings
    from processors.stages import NodePartition, computed

    def fed() -> NodePartition:
        part = NodePartition(ProcessorSettings())
        part.on_allocation("c1/n1", job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}), 0)
        part.on_allocation("c1/n2", job_event("STARTED", "j2", T0, {"n2": ["GPU-b"]}), 1)
        for s in range(135):  # n1 idle throughout; n2 busy in minute 0, idle in minute 1
            part.on_scrape(scrape("n1", T0 + s * 1000, [device("GPU-a", 0, sm=0.0)]), 2 * s)
            part.on_scrape(scrape("n2", T0 + s * 1000, [device("GPU-b", 0, sm=0.9 if s < 60 else 0.0)]), 2 * s + 1)
        return part

    whole = fed().advance(T0 + 130_000)  # minutes 0 and 1
    part = fed()
    first, rest = part.closing(T0 + 130_000, frozenset({"c1/n2"}))
    assert [(r["node"], r["minute_start_ms"]) for r in first.device_minutes] == [("n2", T0)]
    assert [c["node"] for c in first.coverage_minutes] == ["n2"]

    def same(rows: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(r, sort_keys=True) for r in rows)

    assert same(first.device_minutes + rest.device_minutes) == same(whole.device_minutes)
    assert same(first.coverage_minutes + rest.coverage_minutes) == same(whole.coverage_minutes)
    assert [r["minute_start_ms"] for r in rest.device_minutes] == [T0, T0 + 60_000, T0 + 60_000]  # minute by minute
    assert part.waiting_nodes == {"c1/n1", "c1/n2"}  # the last closed minute's nodes with a device not computing
    assert [computed(r) for r in first.device_minutes] == [True]
    # no minute to close: two empty steps
    assert [s.device_minutes for s in part.closing(T0 + 130_000, frozenset({"c1/n1"}))] == [[], []]


def test_a_first_close_with_no_minute_to_go_by_puts_the_nodes_that_look_idle_first() -> None:
    """`ahead` None (a partition that has closed nothing yet): the first step holds the nodes holding a job
    whose device looks idle or dark over the minute; the busy node and the node nobody holds wait."""
    from base.processor_settings import ProcessorSettings
    from processors.stages import NodePartition, computed

    def fed() -> NodePartition:
        part = NodePartition(ProcessorSettings())
        part.on_allocation("c1/n1", job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}), 0)
        part.on_allocation("c1/n2", job_event("STARTED", "j2", T0, {"n2": ["GPU-b"]}), 1)
        part.on_allocation("c1/n3", job_event("STARTED", "j3", T0, {"n3": ["GPU-c"]}), 2)
        part.on_allocation("c1/n4", job_event("STARTED", "j4", T0, {"n4": ["GPU-d", "GPU-e"]}), 3)
        for s in range(75):  # n1 idle, n2 busy, n3 starved, n4 one device busy and one idle, n5 held by nobody
            ts = T0 + s * 1000
            part.on_scrape(scrape("n1", ts, [device("GPU-a", 0, sm=0.0)]), 5 * s)
            part.on_scrape(scrape("n2", ts, [device("GPU-b", 0, sm=0.9)]), 5 * s + 1)
            part.on_scrape(scrape("n3", ts, [device("GPU-c", 0, sm=0.2, fb_mib=40_000)]), 5 * s + 2)
            part.on_scrape(scrape("n4", ts, [device("GPU-d", 0, sm=0.9), device("GPU-e", 1, sm=0.0)]), 5 * s + 3)
            part.on_scrape(scrape("n5", ts, [device("GPU-f", 0, sm=0.0)]), 5 * s + 4)
        return part

    whole = fed().advance(T0 + 75_000)
    part = fed()
    assert part.waiting_nodes is None
    first, rest = part.closing(T0 + 75_000, None)
    assert sorted({r["node"] for r in first.device_minutes}) == ["n1", "n4"]
    assert sorted({r["node"] for r in rest.device_minutes}) == ["n2", "n3", "n5"]
    assert [computed(r) for r in rest.device_minutes if r["node"] in ("n2", "n3")] == [True, True]
    assert sorted(json.dumps(r, sort_keys=True) for r in first.device_minutes + rest.device_minutes) == sorted(
        json.dumps(r, sort_keys=True) for r in whole.device_minutes
    )
    assert part.waiting_nodes == {"c1/n1", "c1/n4", "c1/n5"}  # from here on, the rows say
