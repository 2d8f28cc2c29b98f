"""The attribution baseline on every report (issue 38; `docs/governance.md` "The attribution baseline").

The baseline in force is read from `attribution_baseline_events` (migration 033) and chosen by the pure function
`policy apply` uses (`schemas.governance_baseline.in_force`). A month is marked against it:

- no baseline recorded: the reports say so (every month's attribution may rest on defaults);
- the whole month before the baseline day: "before the baseline";
- the baseline day inside the month (not its first day): "partly before the baseline", the days before it;
- otherwise: "after the baseline".

Beside a mark with days before the baseline: the share of those days' allocated GPU-hours charged to a default
(`sinks.data_quality.defaulted_pct`, the data-quality figure's rule: the job named no project and was charged to
its user's default project, DEFAULT, or to none, MISSING). `mark` is pure; `month_mark` reads.

The mark is read from the ledger when a report is made, also for a closed month: the baseline is a fact about the
organisation recorded when a policy was applied, not a charge, and is not in a statement's hash.
"""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from schemas.governance_baseline import Baseline, in_force
from sinks.chargeback import check_period
from sinks.data_quality import JobFacts, defaulted_pct, job_facts

EVENT_COLUMNS = ("event_id", "event_type", "ts_ms", "actor", "baseline_start_ms", "source")
State = Literal["no baseline", "before the baseline", "partly before the baseline", "after the baseline"]
BASELINE_COLUMNS = ("baseline", "baseline_mark", "before_baseline_until", "before_baseline_gpu_h",
                    "before_baseline_defaulted_pct")  # fmt: skip


def month_days(period: str) -> tuple[dt.date, dt.date]:
    """The month's first day and the first day after it."""
    year, month = (int(p) for p in check_period(period).split("-"))
    first = dt.date(year, month, 1)
    return first, first + dt.timedelta(days=calendar.monthrange(year, month)[1])


def before_until(period: str, baseline: Baseline | None) -> dt.date | None:
    """The first day of `period` not before the baseline when some of its days are before it (the month's end when
    all are); None when none is, or no baseline is recorded."""
    if baseline is None:
        return None
    first, end = month_days(period)
    return None if baseline.day <= first else min(baseline.day, end)


@dataclass(frozen=True, slots=True)
class MonthMark:
    period: str
    baseline: Baseline | None
    until: dt.date | None  # days of the month before this one are before the baseline (None: none)
    before_gpu_h: Decimal | None  # allocated GPU-hours of those days (None: none before)
    defaulted_pct: float | None  # of them, the share charged to a default

    @property
    def state(self) -> State:
        if self.baseline is None:
            return "no baseline"
        if self.until is None:
            return "after the baseline"
        return "before the baseline" if self.until == month_days(self.period)[1] else "partly before the baseline"

    def text(self) -> str:
        """One line under a report."""
        if self.baseline is None:
            return ("attribution baseline: none recorded (no policy applied with attribution strict or a baseline "
                    f"date): {self.period}'s projects may rest on defaults")  # fmt: skip
        head = f"{self.baseline.text()}: {self.period} is {self.state}"
        if self.until is None:
            return head
        first = month_days(self.period)[0]
        last = self.until - dt.timedelta(days=1)
        span = "" if self.state == "before the baseline" else f" ({first.isoformat()} to {last.isoformat()})"
        return (f"{head}{span}; {self.defaulted_pct}% of its {self.before_gpu_h} allocated GPU-h before the "
                "baseline charged to defaults (no project named)")  # fmt: skip

    def columns(self) -> dict[str, Any]:
        """The mark as columns, for rows of CSV, JSON and Parquet outputs."""
        return {
            "baseline": self.baseline.day.isoformat() if self.baseline else "",
            "baseline_mark": self.state,
            "before_baseline_until": self.until.isoformat() if self.until else "",
            "before_baseline_gpu_h": self.before_gpu_h,
            "before_baseline_defaulted_pct": self.defaulted_pct,
        }


def mark(period: str, baseline: Baseline | None, before: Iterable[JobFacts] = ()) -> MonthMark:
    """Pure: `period` marked against `baseline`, `before` the jobs' facts over its days before the baseline."""
    until = before_until(period, baseline)
    if until is None:
        return MonthMark(period, baseline, None, None, None)
    listed = list(before)
    seconds = sum(j.allocated_s for j in listed)
    return MonthMark(period, baseline, until, (Decimal(seconds) / 3600).quantize(Decimal("0.001")),
                     defaulted_pct(listed))  # fmt: skip


def baseline_events(client: Any) -> list[dict[str, Any]]:
    rows = client.query(f"SELECT {', '.join(EVENT_COLUMNS)} FROM attribution_baseline_events FINAL").result_rows
    return [dict(zip(EVENT_COLUMNS, row, strict=True)) for row in rows]


def baseline_now(client: Any) -> Baseline | None:
    """The baseline in force, as `policy apply` decides it, over the events stored."""
    return in_force(baseline_events(client))


@dataclass(frozen=True, slots=True)
class MonthMarks:
    """A month's mark over every job, and each team's over its own jobs (one read for a report of many teams)."""

    period: str
    baseline: Baseline | None
    by_team: dict[str, list[JobFacts]]

    @property
    def whole(self) -> MonthMark:
        return mark(self.period, self.baseline, (f for facts in self.by_team.values() for f in facts))

    def team(self, team: str) -> MonthMark:
        return mark(self.period, self.baseline, self.by_team.get(team, ()))


def month_marks(client: Any, period: str, baseline: Baseline | None) -> MonthMarks:
    """`period` marked against `baseline` (`baseline_now`): the facts of its days before the baseline, by team,
    read once (none read when no day is before it)."""
    until = before_until(period, baseline)
    by_team: dict[str, list[JobFacts]] = {}
    if until is not None:
        for team, facts in job_facts(client, period, until=until):
            by_team.setdefault(team, []).append(facts)
    return MonthMarks(period, baseline, by_team)


def month_mark(client: Any, period: str) -> MonthMark:
    """`period` over every job, against the baseline in force."""
    return month_marks(client, period, baseline_now(client)).whole
