from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.processor_settings import ProcessorSettings
from processors.classify import activity_of
from processors.stages import NodePartition
from processors.testing import T0, device, inventory, scrape
from processors.windows import Admit, Horizon, MinuteWindows, minute_of


def _add(w: MinuteWindows, ts: int, offset: int, sm: float = 0.5) -> Admit:
    return w.add_scrape("c1/n1", scrape("n1", ts, [device("GPU-A", 0, sm=sm)]), activity_of, offset)


def test_half_open_minutes() -> None:
    assert minute_of(T0 + 59_999) == T0
    assert minute_of(T0 + 60_000) == T0 + 60_000
    w = MinuteWindows(grace_ms=10_000)
    _add(w, T0 + 59_999, 0)
    _add(w, T0 + 60_000, 1)
    assert sorted(w.open) == [T0, T0 + 60_000]


def test_grace_then_late_destination() -> None:
    w = MinuteWindows(grace_ms=10_000)
    _add(w, T0 + 1_000, 0)
    w.start_at(T0)
    assert not w.closable(T0 + 69_999)
    assert w.closable(T0 + 70_000)
    closed = w.close_next(next_offset=1)
    assert closed.minute_ms == T0 and len(closed.devices[("c1/n1", "GPU-A", None)].secs) == 1
    assert _add(w, T0 + 2_000, 1) is Admit.LATE
    assert w.late_count == 1
    assert _add(w, T0 + 60_000, 2) is Admit.ACCEPTED


def test_same_second_counts_once_first_wins() -> None:
    w = MinuteWindows(grace_ms=0)
    _add(w, T0 + 5_000, 0, sm=0.9)
    _add(w, T0 + 5_999, 1, sm=0.1)
    secs = w.open[T0][("c1/n1", "GPU-A", None)].secs
    assert secs == {(T0 + 5_000) // 1000: (0.9, 0.0, 100.0)}


def test_replay_after_restart_tells_counted_from_late() -> None:
    """A sample of an emitted minute is skipped if it arrived before that minute closed, late otherwise."""
    w = MinuteWindows(grace_ms=10_000)
    w.next_close_ms = T0 + 60_000  # restored from the commit metadata
    w.close_offsets = {T0: 40}  # minute T0 closed when the input was at offset 40
    assert _add(w, T0 + 59_000, 39) is Admit.REPLAYED
    assert _add(w, T0 + 59_500, 41) is Admit.LATE
    assert _add(w, T0 + 60_500, 42) is Admit.ACCEPTED
    w.forget_close_offsets(committed_offset=45)
    assert w.close_offsets == {}


def test_commit_offset_is_first_input_of_an_open_minute() -> None:
    w = MinuteWindows(grace_ms=0)
    _add(w, T0 + 1_000, 7)
    _add(w, T0 + 61_000, 9)
    assert w.min_needed_offset() == 7
    w.start_at(T0)
    w.close_next(next_offset=10)
    assert w.min_needed_offset() == 9


# -- hostile times: the horizon, and bounded work per watermark advance -------------------------------
HOUR_MS = 3_600_000


def _node(realtime: bool = False, max_lookback_ms: int = 2 * 24 * HOUR_MS) -> NodePartition:
    return NodePartition(ProcessorSettings(realtime=realtime, max_lookback_ms=max_lookback_ms))


def _feed(part: NodePartition, ts: int, offset: int) -> Admit:
    return part.on_scrape(scrape("n1", ts, [device("GPU-A", 0, sm=0.5)]), offset)


def test_horizon_real_time_is_the_clock_event_time_also_follows_events() -> None:
    h = Horizon(300_000)
    assert h.admits(2**62)  # no clock yet: nothing to judge by
    h.observe_clock(T0)
    assert h.admits(T0 + 300_000) and not h.admits(T0 + 300_001) and h.refused == 1
    h.observe_clock(T0 - HOUR_MS)  # a clock stepped back refuses nothing it admitted before
    assert h.limit_ms == T0 + 300_000
    replay = Horizon(300_000, follow_events=True)
    replay.observe_clock(T0)
    assert replay.admits(T0 + 200_000) and replay.admits(T0 + 450_000)  # each within the bound of the last
    assert not replay.admits(T0 + 450_000 + 300_001)
    assert "processor.max_future_ms" in replay.reason(2**62)


@pytest.mark.parametrize("realtime", [True, False])
def test_a_far_future_sample_is_refused_and_moves_nothing(realtime: bool) -> None:
    part = _node(realtime)
    part.horizon.observe_clock(T0 + 120_000)  # the processing clock (wall clock, given by the runtime)
    for i in range(90):
        assert _feed(part, T0 + i * 1000, i) is Admit.ACCEPTED
    for bad in (2**62, T0 + 365 * 24 * HOUR_MS):
        assert _feed(part, bad, 100) is Admit.FUTURE
    assert part.max_sample_ts == T0 + 89_000 and part.samples_next_offset == 101
    assert sorted(part.windows.open) == [T0, T0 + 60_000] and part.horizon.refused == 2
    assert part.coverage.last_seen[("c1/n1", "GPU-A", None)] == T0 + 89_000
    out = part.advance(part.max_sample_ts)  # the watermark it gives closes the first minute only
    assert [r["minute_start_ms"] for r in out.device_minutes] == [T0] and part.windows.next_close_ms == T0 + 60_000


def test_a_replay_of_history_is_never_refused_however_long_its_quiet_gaps() -> None:
    """Event time: the clock is the later of the wall clock and the latest event, so ten hours of quiet
    in a replay of last week pass, and so does a replay of data past a pinned clock (step by step)."""
    part = _node(realtime=False)
    part.horizon.observe_clock(T0 + 30 * 24 * HOUR_MS)  # history: the wall clock is a month later
    assert _feed(part, T0, 0) is Admit.ACCEPTED
    assert _feed(part, T0 + 10 * HOUR_MS, 1) is Admit.ACCEPTED
    pinned = _node(realtime=False)
    pinned.horizon.observe_clock(T0)
    assert all(_feed(pinned, T0 + i * 60_000, i) is Admit.ACCEPTED for i in range(100))


def test_hours_of_quiet_close_in_bounded_steps() -> None:
    """Ten hours with no sample: with nothing to emit for them (no inventory, no allocation) the loop
    jumps over them; with an inventory each quiet minute is a real (dark) coverage row, unless it lies
    further back than the lookback."""
    gap = 10 * HOUR_MS
    bare = _node()
    _feed(bare, T0, 0)
    _feed(bare, T0 + gap, 1)
    out = bare.advance(T0 + gap)
    assert bare.windows.next_close_ms == T0 + gap - 60_000 and bare.advance_steps <= 3
    assert [r["minute_start_ms"] for r in out.device_minutes] == [T0]

    expected = _node()
    expected.on_inventory(inventory("n1", ["GPU-A"]))
    _feed(expected, T0, 0)
    _feed(expected, T0 + gap, 1)
    out = expected.advance(T0 + gap)
    assert len(out.coverage_minutes) == 599 == expected.advance_steps  # the last minute waits for its grace

    short = _node(max_lookback_ms=HOUR_MS)
    short.on_inventory(inventory("n1", ["GPU-A"]))
    _feed(short, T0, 0)
    short.advance(T0)  # started: minute T0 is open
    _feed(short, T0 + gap, 1)
    out = short.advance(T0 + gap)
    assert [r["minute_start_ms"] for r in out.coverage_minutes][:2] == [T0, T0 + gap - HOUR_MS]
    assert len(out.coverage_minutes) == 1 + 59 and short.advance_steps == 1 + 1 + 59  # T0, a skip, the last hour


def test_a_first_sample_from_long_ago_does_not_start_the_partition_there() -> None:
    """A partition that has closed nothing starts no further back than the lookback: a first sample from
    1970 is counted late, not followed by 29 million minutes of dark rows."""
    part = _node()
    part.horizon.observe_clock(T0 + 120_000)
    part.on_inventory(inventory("n1", ["GPU-A"]))
    _feed(part, 5_000, 0)
    for i in range(1, 90):
        _feed(part, T0 + i * 1000, i)
    out = part.advance(T0 + 2 * 60_000 + 10_000)
    assert [r["minute_start_ms"] for r in out.coverage_minutes] == [T0, T0 + 60_000]
    assert part.windows.late_count == 1 and part.advance_steps <= 3


@settings(max_examples=150, deadline=None)
@given(
    bad=st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=5),
    at=st.integers(min_value=0, max_value=180),
    realtime=st.booleans(),
    inventoried=st.booleans(),
)
def test_no_timestamp_makes_advance_loop_unboundedly(
    bad: list[int], at: int, realtime: bool, inventoried: bool
) -> None:
    """Any ts_ms among three minutes of normal samples: each advance takes at most the lookback's minutes
    plus the minutes that hold samples, whatever the values."""
    lookback_min = 30
    part = _node(realtime, max_lookback_ms=lookback_min * 60_000)
    if inventoried:
        part.on_inventory(inventory("n1", ["GPU-A"]))
    part.horizon.observe_clock(T0 + 180_000)
    seq = [T0 + i * 1000 for i in range(180)]
    seq[at:at] = bad
    for off, ts in enumerate(seq):
        _feed(part, ts, off)
        before = part.advance_steps
        part.advance(part.max_sample_ts or T0)
        assert part.advance_steps - before <= lookback_min + len(part.windows.open) + 5 + len(bad)
    assert part.max_sample_ts is not None and part.max_sample_ts <= T0 + 180_000 + 300_000


def test_a_refused_record_goes_to_its_topics_dlq_with_the_reason() -> None:
    """What the runtime does with Admit.FUTURE: the record, untouched, to `<topic>.dlq`, class and reason in
    the headers (so gpuledger_dead_letters_total counts it under error_class="FutureTimestamp")."""
    from processors.dlq import Decoder, FutureTimestamp
    from schemas.codec import AvroCodec
    from schemas.topics import DEVICE_SAMPLES
    from streams.consume import HEADER_ERROR_CLASS, HEADER_ERROR_MESSAGE, SourceRecord

    sent: list[tuple[str, bytes | None, dict[str, bytes]]] = []

    class Sink:
        def publish_raw(
            self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]] | None = None
        ) -> None:
            sent.append((topic, key, {k: v for k, v in headers or []}))

    codec = AvroCodec()
    bad = scrape("n1", 2**62, [device("GPU-A", 0, sm=0.5)])
    part = _node(realtime=True)
    part.horizon.observe_clock(T0)
    assert part.on_scrape(bad, 7) is Admit.FUTURE
    source = SourceRecord(DEVICE_SAMPLES.name, 0, 7, b"c1/n1", codec.encode(DEVICE_SAMPLES.subject, bad))
    decoder = Decoder(codec, Sink(), clock_ms=lambda: T0)
    decoder.refuse(source, DEVICE_SAMPLES.subject, FutureTimestamp(part.horizon.reason(bad["ts_ms"])))
    ((topic, key, headers),) = sent
    assert topic == DEVICE_SAMPLES.name + ".dlq" and key == b"c1/n1" and decoder.dead_lettered == 1
    assert headers[HEADER_ERROR_CLASS] == b"FutureTimestamp"
    assert b"max_future_ms" in headers[HEADER_ERROR_MESSAGE]
