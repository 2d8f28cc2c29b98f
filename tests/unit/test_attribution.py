from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.attribution import (
    AllocationTable,
    DeviceRef,
    Interval,
    allocated_seconds,
    attribute_scrape,
    owners_by_second,
)
from processors.testing import T0, device, job_event, scrape

S = 1000


def test_seconds_of_an_interval_follow_the_contract() -> None:
    # start 10.5 s: second 10 is not allocated (10*1000 < start); end 20.5 s: second 20 is (20000 < 20500)
    iv = Interval("c1/J", DeviceRef("GPU-A", 0), T0 + 10_500, T0 + 20_500)
    assert allocated_seconds([iv], T0 // 1000, T0 // 1000 + 60) == set(range(T0 // 1000 + 11, T0 // 1000 + 21))


def test_owner_at_each_second() -> None:
    t = AllocationTable()
    t.apply("n1", job_event("STARTED", "J1", T0 + 10 * S, {"n1": ["GPU-A"]}))
    t.apply("n1", job_event("ENDED", "J1", T0 + 20 * S))
    t.apply("n1", job_event("STARTED", "J2", T0 + 20 * S, {"n1": ["GPU-A"]}))
    s = scrape("n1", T0 + 9_999, [device("GPU-A", 0, sm=1.0), device("GPU-B", 1, sm=1.0)])
    assert [o for _, _, o in attribute_scrape(t, s)] == [None, None]
    owners = [t.owner_at("n1", "GPU-A", 0, None, T0 + x * S) for x in (10, 19, 20, 59)]
    assert [o.job_id if o else None for o in owners] == ["J1", "J1", "J2", "J2"]


def test_suspend_resume_and_index_only_allocations() -> None:
    t = AllocationTable()
    ev = job_event("STARTED", "J1", T0, {"n1": ["x"]})
    ev["allocations"][0]["devices"][0] = {"index": 3, "uuid": None, "mig_instance_id": None}
    t.apply("n1", ev)
    t.apply("n1", job_event("SUSPENDED", "J1", T0 + 10 * S))
    resumed = job_event("RESUMED", "J1", T0 + 30 * S, {"n1": ["x"]})
    resumed["allocations"] = ev["allocations"]
    t.apply("n1", resumed)
    owners = owners_by_second(t.intervals("n1"), T0)
    assert len(owners["c1/J1"]) == 10 + 30
    assert t.owner_at("n1", "GPU-Z", 3, None, T0 + 5 * S) is not None  # matched by index
    assert t.owner_at("n1", "GPU-Z", 2, None, T0 + 5 * S) is None


def test_duplicate_and_stale_events_are_ignored() -> None:
    t = AllocationTable()
    start = job_event("STARTED", "J1", T0, {"n1": ["GPU-A"]})
    assert t.apply("n1", start)
    assert not t.apply("n1", start)  # re-published by the re-keying stage after a crash
    t.apply("n1", job_event("ENDED", "J1", T0 + 60 * S))
    t.prune(T0 + 120 * S)
    assert len(t) == 0 and t.forgotten("c1/J1", T0) and not t.forgotten("c1/J1", T0 + 61 * S)
    assert not t.apply("n1", start)  # a late duplicate of a finished job does not reopen it
    assert len(t) == 0


def test_a_start_replayed_after_its_end_does_not_reopen_the_job() -> None:
    # After a restart the node stage can read a job's end (its start lay before the committed offset)
    # and only then the start, re-published by the re-keying stage; the end's copy is a duplicate.
    t = AllocationTable()
    start = job_event("STARTED", "J1", T0, {"n1": ["GPU-A"]})
    end = job_event("ENDED", "J1", T0 + 30 * S)
    assert t.apply("n1", end)
    assert t.apply("n1", start)
    assert not t.apply("n1", end)
    assert len(owners_by_second(t.intervals("n1"), T0)["c1/J1"]) == 30
    assert t.owner_at("n1", "GPU-A", 0, None, T0 + 30 * S) is None
    t.prune(T0 + 60 * S)
    assert len(t) == 0 and t.forgotten("c1/J1", T0 + 30 * S) and not t.forgotten("c1/J1", T0 + 31 * S)


def test_intervals_do_not_depend_on_the_order_events_arrive_in() -> None:
    events = [
        job_event("STARTED", "J1", T0, {"n1": ["GPU-A", "GPU-B"]}),
        job_event("UPDATED", "J1", T0 + 10 * S, {"n1": ["GPU-A"]}),  # gives GPU-B back
        job_event("SUSPENDED", "J1", T0 + 20 * S),
        job_event("RESUMED", "J1", T0 + 30 * S, {"n1": ["GPU-A"]}),
        job_event("ENDED", "J1", T0 + 40 * S),
        job_event("STARTED", "J2", T0 + 40 * S, {"n1": ["GPU-A"]}),  # same millisecond as J1's end
    ]

    def spans(order: tuple[int, ...]) -> list[tuple[str, str | None, int, int | None]]:
        t = AllocationTable()
        for i in order:
            t.apply("n1", events[i])
        return sorted((iv.job_id, iv.ref.uuid, iv.start_ms, iv.end_ms) for iv in t.intervals("n1"))

    expected = [
        ("c1/J1", "GPU-A", T0, T0 + 20 * S),
        ("c1/J1", "GPU-A", T0 + 30 * S, T0 + 40 * S),
        ("c1/J1", "GPU-B", T0, T0 + 10 * S),
        ("c1/J2", "GPU-A", T0 + 40 * S, None),
    ]
    assert all(spans(order) == expected for order in itertools.permutations(range(len(events))))


def test_double_booked_second_goes_to_the_later_allocation() -> None:
    t = AllocationTable()
    t.apply("n1", job_event("STARTED", "J1", T0, {"n1": ["GPU-A"]}))  # its end was never seen
    t.apply("n1", job_event("STARTED", "J2", T0 + 30 * S, {"n1": ["GPU-A"]}))
    owners = owners_by_second(t.intervals("n1"), T0)
    assert len(owners["c1/J1"]) == 30 and len(owners["c1/J2"]) == 30


def test_job_stage_counts_devices_per_minute_across_nodes() -> None:
    t = AllocationTable()
    t.apply_all(job_event("STARTED", "G", T0 + 30 * S, {"n1": ["A", "B"], "n2": ["C"]}))
    t.apply_all(job_event("ENDED", "G", T0 + 90 * S))  # no allocations listed: closes every node
    assert t.expected_devices("c1/G", T0 - 60 * S) == 0
    assert t.expected_devices("c1/G", T0) == 3
    assert t.expected_devices("c1/G", T0 + 60 * S) == 3
    assert t.expected_devices("c1/G", T0 + 120 * S) == 0
    assert t.job_last_end_ms("c1/G") == T0 + 90 * S


@settings(max_examples=200, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.integers(0, 20 * 60_000), st.one_of(st.none(), st.integers(0, 20 * 60_000))), max_size=4
    ),
    lo=st.integers(0, 20),
    n=st.integers(0, 20),
)
def test_expects_rows_between_is_the_minute_by_minute_answer(
    spans: list[tuple[int, int | None]], lo: int, n: int
) -> None:
    """The job stage's gap check looks at intervals once instead of stepping minute by minute (a hostile
    or long gap made that loop unbounded): both answers agree, edge-on-boundary intervals included."""
    from processors.windows import MINUTE_MS

    table = AllocationTable()
    for i, (start, end) in enumerate(spans):
        table.apply("n1", job_event("STARTED", "J1", start, {"n1": [f"GPU-{i}"]}) | {"event_id": f"s{i}"})
        if end is not None:
            ev = job_event("ENDED", "J1", max(start, end), {"n1": [f"GPU-{i}"]}) | {"event_id": f"e{i}"}
            ev["event_type"] = "PREEMPTED"  # ends the job's open intervals here (whatever the table makes of it)
            table.apply("n1", ev)
    lo_ms, hi_ms = lo * MINUTE_MS, (lo + n) * MINUTE_MS
    stepwise = any(table.expected_devices("c1/J1", t) > 0 for t in range(lo_ms, hi_ms, MINUTE_MS))
    assert table.expects_rows_between("c1/J1", lo_ms, hi_ms) == stepwise
