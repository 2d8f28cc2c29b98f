"""The pure statement arithmetic (sinks/statements.py): cents that add up, adjustments with their causes, a
hash that covers the content, and the checks before a close. The same rules on a real ClickHouse and broker:
tests/integration/test_statements_close.py."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import pytest

from base.errors import ConfigError
from sinks.ratecard import CENT_UNITS, allocate_cents
from sinks.statements import (
    Charge,
    Segment,
    allocate_to_total,
    build_statements,
    check_closable,
    month_after,
    pending_adjustments,
    period_end_ms,
    signed_cents,
    usage_lines,
)

H = 3600


def seg(job: str, team: str = "vision", project: str = "p-v", rate: int = 2_000_000, alloc: int = H,
        correction: str = "", **kw: Any) -> Segment:  # fmt: skip
    values: dict[str, Any] = dict(
        team=team, cluster="c1", job_id=job, user="alice", project=project, original_project=project,
        correction_id=correction, cost_centre="CC", generation="hopper", pricing_tier="on-prem", preemptible=False,
        rate_micro=rate, allocated_s=alloc, active_s=alloc, starved_s=0, idle_s=0, dark_s=0, unpriced_s=0,
        charge_num=alloc * rate,
    )  # fmt: skip
    values.update(kw)
    return Segment(**values)


def test_months_and_their_ends() -> None:
    assert month_after("2026-11") == "2026-12" and month_after("2026-12") == "2027-01"
    assert period_end_ms("2026-12") == 1798761600000  # 2027-01-01T00:00Z


def test_signed_cents_round_half_away_from_zero() -> None:
    half = CENT_UNITS // 2
    assert [signed_cents(n) for n in (0, half - 1, half, -half, -half + 1, 3 * CENT_UNITS)] == [0, 0, 1, -1, 0, 3]


def test_allocation_hits_the_total_and_stays_within_a_cent() -> None:
    nums = {"a": CENT_UNITS * 10 + CENT_UNITS // 3, "b": CENT_UNITS * 5 + 2 * CENT_UNITS // 3, "c": CENT_UNITS // 2}
    for total in (15, 16, 17):
        cents = allocate_to_total(nums, total)
        assert sum(cents.values()) == total
        assert all(nums[k] // CENT_UNITS <= cents[k] <= nums[k] // CENT_UNITS + 1 for k in nums)
    assert allocate_to_total(nums, 16) == {"a": 10, "b": 6, "c": 0}  # the largest remainder first
    with pytest.raises(ValueError, match="cannot allocate"):
        allocate_to_total(nums, 19)


def test_usage_lines_add_up_to_the_reports_team_lines() -> None:
    # Three thirds of a cent per team: the report gives one team the cent; the statement agrees.
    third = CENT_UNITS // 3
    segs = [seg("a", team="t1", alloc=1, rate=third), seg("b", team="t2", alloc=1, rate=third),
            seg("c", team="t3", alloc=1, rate=third + 1)]  # fmt: skip
    report = allocate_cents({s.team: s.charge_num for s in segs})
    lines = usage_lines("2026-11", segs)
    assert {t: sum(line.charge for line in ls) for t, ls in lines.items()} == report
    assert sum(report.values()) == Decimal("0.01")


def test_a_rate_change_is_one_rate_card_adjustment() -> None:
    frozen = usage_lines("2026-09", [seg("a1")])["vision"]
    now = [seg("a1", rate=3_000_000)]
    (adj,) = pending_adjustments("2026-09", frozen, [], now, "card-2")
    assert (adj.kind, adj.charge, adj.cause_kind, adj.cause_ref, adj.allocated_s) == (
        "adjustment", Decimal("1.00"), "rate-card", "card-2", 0)
    # Once posted, it is not owed again; a later change owes only the difference.
    assert pending_adjustments("2026-09", frozen, [adj], now, "card-2") == []
    (again,) = pending_adjustments("2026-09", frozen, [adj], [seg("a1", rate=2_500_000)], "card-3")
    assert (again.charge, again.cause_ref) == (Decimal("-0.50"), "card-3")


def test_a_correction_reverses_and_recharges_naming_the_correction() -> None:
    frozen = usage_lines("2026-09", [seg("b1", project="p-wrong")])["vision"]
    now = [seg("b1", project="p-nlp", original_project="p-wrong", correction="corr-9")]
    adj = pending_adjustments("2026-09", frozen, [], now, "card-1")
    assert {(a.project, a.charge, a.cause_kind, a.cause_ref) for a in adj} == {
        ("p-wrong", Decimal("-2.00"), "correction", "corr-9"), ("p-nlp", Decimal("2.00"), "correction", "corr-9")}
    assert sum(a.charge_num for a in adj) == 0
    # Late data after the correction was posted: late data, not the correction again.
    later = [seg("b1", project="p-nlp", original_project="p-wrong", correction="corr-9", alloc=H + 180)]
    (late,) = pending_adjustments("2026-09", frozen, adj, later, "card-1")
    assert (late.cause_kind, late.charge, late.allocated_s) == ("late-data", Decimal("0.10"), 180)


def test_a_new_job_after_the_close_is_late_data() -> None:
    (adj,) = pending_adjustments("2026-09", [], [], [seg("z9", correction="corr-1")], "card-1")
    assert (adj.cause_kind, adj.charge) == ("late-data", Decimal("2.00"))


def test_the_hash_covers_every_line_and_figure_but_not_the_order() -> None:
    charges = [Charge("credit", "ap-1", "vision", "2026-09", cents=-150, job_id="a1", note="eleven hours lost")]
    (st,) = build_statements("2026-09", [seg("a1"), seg("a2")], [], charges, "card-1")
    assert st.total() == Decimal("2.50") and st.total("credit") == Decimal("-1.50")
    assert st.statement_id == f"2026-09/vision/{st.content_hash[:16]}"
    reordered = dataclasses.replace(st, lines=tuple(reversed(st.lines)))
    assert reordered.content_hash == st.content_hash
    for change in ({"cents": st.lines[0].cents + 1}, {"note": "x"}, {"rate_micro": 1}):
        touched = dataclasses.replace(st, lines=(dataclasses.replace(st.lines[0], **change), *st.lines[1:]))
        assert touched.content_hash != st.content_hash, change
    assert dataclasses.replace(st, card_version="card-2").content_hash != st.content_hash


def test_the_hash_covers_the_data_quality_tally_frozen_with_it() -> None:
    import hashlib
    import json

    from sinks.data_quality import Tally

    tally = Tally(jobs=2, allocated_s=2 * H, dark_s=600, default_project_s=H)
    (st,) = build_statements("2026-09", [seg("a1"), seg("a2")], [], [], "card-1", {"vision": tally})
    assert st.quality == tally and st.canonical()["data_quality"]["dark_s"] == 600
    for change in ({"dark_s": 0}, {"jobs": 3}, {"unidentified_s": 1}, {"ceded_s": 60}):
        assert dataclasses.replace(st, quality=dataclasses.replace(tally, **change)).content_hash != st.content_hash
    # Without a tally (a statement closed before figures were frozen) the hash is the lines' alone, as it was.
    (plain,) = build_statements("2026-09", [seg("a1"), seg("a2")], [], [], "card-1")
    assert plain.quality is None and "data_quality" not in plain.canonical()
    text = json.dumps({"period": "2026-09", "team": "vision", "card_version": "card-1",
                       "lines": sorted((line.canonical() for line in plain.lines), key=lambda c: c["line_id"])},
                      sort_keys=True, separators=(",", ":"))  # fmt: skip
    assert plain.content_hash == hashlib.sha256(text.encode()).hexdigest()
    # A team with no usage still gets its tally frozen; a team with lines and no jobs gets a zero tally.
    both = build_statements("2026-09", [seg("a1")], [], [], "card-1", {"nlp": Tally(jobs=1, allocated_s=60)})
    assert [(s.team, s.quality) for s in both] == [("nlp", Tally(jobs=1, allocated_s=60)), ("vision", Tally())]


def test_closing_checks_each_give_one_line() -> None:
    now = period_end_ms("2026-11") + 1
    check_closable("2026-11", now, closed={"2026-10"}, with_usage={"2026-10", "2026-11"})
    for period, closed, used, needle in (
        ("2026-11", {"2026-11"}, set(), "already closed"),
        ("2026-12", set(), set(), "has not ended yet"),
        ("2026-11", set(), {"2026-09", "2026-10"}, "close 2026-09 first"),
    ):
        with pytest.raises(ConfigError, match=needle) as info:
            check_closable(period, now, closed, used)
        assert "\n" not in str(info.value)
