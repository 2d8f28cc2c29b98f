from __future__ import annotations

from processors.classify import activity_of
from processors.testing import T0, device, scrape
from processors.windows import Admit, MinuteWindows, minute_of


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
