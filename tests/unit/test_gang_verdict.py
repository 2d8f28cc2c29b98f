"""`gang_verdict` (sinks/gang.py): every other member of the gang idle or ended, else the reason of the first
member (in job id order) that is not."""

from __future__ import annotations

from sinks.gang import gang_verdict
from sinks.reclaim import JobNow

T = 1_000_000
IDLE = JobNow(T, None, T + 60_000, (0, 0, 60))
BUSY = JobNow(T, None, T + 60_000, (50, 0, 10))
DARK = JobNow(T, None, T + 60_000, (0, 0, 0))
ENDED = JobNow(T, T + 120_000, T + 60_000, (50, 0, 10))


def test_members_idle_or_ended_let_the_gang_go() -> None:
    v = gang_verdict("g", "a", {"b": IDLE, "c": ENDED})
    assert v.ok and v.detail == "gang g: all 2 member(s) idle or ended"


def test_one_busy_or_dark_member_keeps_the_gang() -> None:
    v = gang_verdict("g", "a", {"c": BUSY, "b": DARK})
    assert (v.ok, v.reason) == (False, "gang-dark") and v.detail.startswith("gang g: member b: no telemetry")
    v = gang_verdict("g", "a", {"b": IDLE, "c": BUSY})
    assert (v.ok, v.reason) == (False, "gang-busy") and "member c" in v.detail


def test_the_job_itself_is_not_judged_again() -> None:
    assert gang_verdict("g", "a", {"a": BUSY, "b": IDLE}).ok


def test_an_idle_member_whose_grace_is_not_over_keeps_the_gang_until_it_is() -> None:
    v = gang_verdict("g", "a", {"b": IDLE, "c": ENDED}, due={"b": False})
    assert (v.ok, v.reason) == (False, "gang-not-due") and "member b" in v.detail
    assert gang_verdict("g", "a", {"b": IDLE, "c": ENDED}, due={"b": True}).ok  # an ended member need not be due
    v = gang_verdict("g", "a", {"b": BUSY}, due={"b": True})
    assert v.reason == "gang-busy"  # busy outranks due: it woke up since its notice
