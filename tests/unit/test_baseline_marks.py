"""A month against the attribution baseline (sinks/baseline.py `mark`): pure."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from schemas.governance_baseline import Baseline, day_start_ms
from sinks.baseline import before_until, mark
from sinks.data_quality import JobFacts, defaulted_pct, figure


def baseline(day: dt.date) -> Baseline:
    return Baseline(day, "POLICY_DATE", day_start_ms(dt.date(2026, 3, 2)), "ops1", "e1")


def job(hours: int, source: str) -> JobFacts:
    return JobFacts(hours * 3600, 0, 0, 0, 0, source, False)


MAR15 = baseline(dt.date(2026, 3, 15))


def test_months_before_during_and_after_the_baseline_day() -> None:
    assert before_until("2026-02", MAR15) == dt.date(2026, 3, 1)  # the whole month: until its end
    assert before_until("2026-03", MAR15) == dt.date(2026, 3, 15)  # 1 to 14 March
    assert before_until("2026-04", MAR15) is None
    assert before_until("2026-03", baseline(dt.date(2026, 3, 1))) is None  # from the first: none of it before
    assert before_until("2026-12", baseline(dt.date(2027, 1, 1))) == dt.date(2027, 1, 1)  # across a year
    assert before_until("2026-03", None) is None


def test_the_mark_states_and_the_share_charged_to_defaults() -> None:
    jobs = [job(6, "EXPLICIT"), job(3, "DEFAULT"), job(1, "MISSING")]
    before = mark("2026-02", MAR15, jobs)
    assert before.state == "before the baseline" and before.until == dt.date(2026, 3, 1)
    assert before.before_gpu_h == Decimal("10.000") and before.defaulted_pct == 40.0  # 3 + 1 of 10 GPU-h
    assert "2026-02 is before the baseline; 40.0% of its 10.000 allocated GPU-h" in before.text()
    partly = mark("2026-03", MAR15, jobs)
    assert partly.state == "partly before the baseline"
    assert "partly before the baseline (2026-03-01 to 2026-03-14)" in partly.text()
    after = mark("2026-04", MAR15, jobs)  # facts are not read for a month after it; none are used
    assert after.state == "after the baseline" and after.defaulted_pct is None and after.before_gpu_h is None
    assert after.text().endswith("2026-04 is after the baseline")
    assert after.columns() == {"baseline": "2026-03-15", "baseline_mark": "after the baseline",
                               "before_baseline_until": "", "before_baseline_gpu_h": None,
                               "before_baseline_defaulted_pct": None}  # fmt: skip


def test_no_baseline_is_said_and_no_hours_is_zero_not_an_error() -> None:
    none = mark("2026-02", None, [job(1, "DEFAULT")])
    assert none.state == "no baseline" and none.columns()["baseline"] == ""
    assert none.text().startswith("attribution baseline: none recorded")
    empty = mark("2026-02", MAR15, [])
    assert empty.before_gpu_h == Decimal("0.000") and empty.defaulted_pct == 0.0


def test_the_default_share_is_the_data_quality_figures_rule_plus_missing() -> None:
    """One rule (`allocated_from`): the figure's default-project share counts DEFAULT; the baseline's counts the
    jobs that named no project at all as well (MISSING)."""
    jobs = [job(5, "EXPLICIT"), job(4, "DEFAULT"), job(1, "MISSING")]
    assert figure("m", jobs).default_project_pct == 40.0
    assert defaulted_pct(jobs) == 50.0
