"""The team page's view model: pure functions from query rows to what a page shows.

No web framework, no ClickHouse client (tests/unit/test_web_model.py imports this with neither in use).
Quantities arrive as seconds and exact charge numerators (seconds x micro-dollars per GPU-hour, as the
analyst views compute them); GPU-hours are rounded half-up to 4 places and money to the cent here, once,
the same way `v_chargeback_month` does, so every figure can be checked against `report chargeback`:

- a grouping's charges (projects, users) split the team's statement charge exactly: each line its exact
  charge rounded down, the cents left over one each to the largest remainders (ties by name), so the
  lines add up to the statement;
- idle cost is informational and rounded half-up per line, like the report.

Every table is a `Table` (name, columns, rows): the HTML page and its CSV download come from the same one.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

CENT_UNITS = 36_000_000  # one cent in (seconds x micro-dollars per hour): sinks.ratecard.CENT_UNITS
CLASSES = ("active", "starved", "idle", "dark")
ENDED_STATES = frozenset({"ENDED", "PREEMPTED", "REQUEUED"})
WARNING_KINDS = ("IDLE_WARNING", "IDLE_RESOLVED", "RECLAIM_NOTICE")
CENT = Decimal("0.01")


def gpu_h(seconds: int) -> Decimal:
    """GPU-hours, half-up to 4 places (the report's rounding)."""
    return (Decimal(int(seconds)) / 3600).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)


def money(numerator: int) -> Decimal:
    """An exact charge numerator in dollars, half-up to the cent."""
    return (Decimal((int(numerator) + CENT_UNITS // 2) // CENT_UNITS) / 100).quantize(Decimal("0.01"))


def pct(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(100 * part / whole, 1)


def split_cents(total: Decimal, numerators: Mapping[str, int]) -> dict[str, Decimal]:
    """`total` (dollars, to the cent) over the lines in proportion to their exact numerators: each line its
    exact charge rounded down, then the cents left over one each to the largest remainders (ties by name).
    The lines add up to `total` whenever `total` is within a cent per line of the exact sum."""
    floors = {line: int(num) // CENT_UNITS for line, num in numerators.items()}
    leftover = int((total * 100).to_integral_value()) - sum(floors.values())
    order = sorted(numerators, key=lambda line: (-(int(numerators[line]) % CENT_UNITS), line))
    out = dict(floors)
    for i in range(abs(leftover)):
        line = order[i % len(order)] if leftover > 0 else order[-1 - i % len(order)]
        out[line] += 1 if leftover > 0 else -1
    return {line: (Decimal(cents) / 100).quantize(Decimal("0.01")) for line, cents in out.items()}


# -- usage at job granularity ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobUsage:
    """One job's priced usage in the period (one row of the team's query, price segments summed)."""

    cluster: str
    job_id: str
    user: str
    team: str
    project: str
    original_project: str
    correction_id: str
    generation: str
    pricing_tier: str
    preemptible: bool
    allocated_s: int
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    charge_num: int
    idle_charge_num: int
    unpriced_s: int
    first_day: dt.date | None = None
    last_day: dt.date | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.cluster, self.job_id)


@dataclass(slots=True)
class Sums:
    """Additive quantities of a set of jobs."""

    allocated_s: int = 0
    active_s: int = 0
    starved_s: int = 0
    idle_s: int = 0
    dark_s: int = 0
    charge_num: int = 0
    idle_charge_num: int = 0
    unpriced_s: int = 0
    jobs: set[tuple[str, str]] = field(default_factory=set)
    counted_jobs: int | None = None  # the jobs, counted where the sums were made (SQL); else len(jobs)

    @property
    def job_count(self) -> int:
        return len(self.jobs) if self.counted_jobs is None else self.counted_jobs

    def add(self, job: JobUsage) -> None:
        self.allocated_s += job.allocated_s
        self.active_s += job.active_s
        self.starved_s += job.starved_s
        self.idle_s += job.idle_s
        self.dark_s += job.dark_s
        self.charge_num += job.charge_num
        self.idle_charge_num += job.idle_charge_num
        self.unpriced_s += job.unpriced_s
        self.jobs.add(job.key)

    @property
    def consumed_s(self) -> int:
        return self.active_s + self.starved_s

    def figures(self) -> dict[str, Any]:
        """The report's columns for this set (charge left to the caller: it depends on the grouping)."""
        return {
            "jobs": self.job_count,
            "allocated_gpu_h": gpu_h(self.allocated_s),
            "consumed_gpu_h": gpu_h(self.consumed_s),
            "utilisation_pct": pct(self.consumed_s, self.allocated_s),
            "active_gpu_h": gpu_h(self.active_s),
            "starved_gpu_h": gpu_h(self.starved_s),
            "idle_gpu_h": gpu_h(self.idle_s),
            "dark_gpu_h": gpu_h(self.dark_s),
            "idle_cost": money(self.idle_charge_num),
            "coverage_pct": pct(self.allocated_s - self.dark_s, self.allocated_s),
        }


def merge_segments(rows: Iterable[JobUsage]) -> list[JobUsage]:
    """One row per job: a job priced at two rates (a rate change, two generations) has one row per price."""
    merged: dict[tuple[str, str], JobUsage] = {}
    for row in rows:
        seen = merged.get(row.key)
        if seen is None:
            merged[row.key] = row
            continue
        days = [d for d in (seen.first_day, row.first_day, seen.last_day, row.last_day) if d is not None]
        merged[row.key] = JobUsage(
            **{**_fields(seen), **{k: getattr(seen, k) + getattr(row, k) for k in _ADDITIVE}},
            first_day=min(days) if days else None,
            last_day=max(days) if days else None,
        )
    return list(merged.values())


_ADDITIVE = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s", "charge_num", "idle_charge_num", "unpriced_s")


def _fields(job: JobUsage) -> dict[str, Any]:
    return {k: getattr(job, k) for k in JobUsage.__slots__ if k not in _ADDITIVE and k not in ("first_day", "last_day")}


def total(jobs: Iterable[JobUsage]) -> Sums:
    sums = Sums()
    for job in jobs:
        sums.add(job)
    return sums


def lines_by(jobs: Sequence[JobUsage], key: str, charge_total: Decimal) -> list[dict[str, Any]]:
    """One line per value of `key` (project, user): the report's figures, the charge split from
    `charge_total` (the statement's), sorted by charge then name."""
    groups: dict[str, Sums] = {}
    for job in jobs:
        groups.setdefault(str(getattr(job, key)), Sums()).add(job)
    return grouped_lines(groups, key, charge_total)


def grouped_lines(groups: Mapping[str, Sums], key: str, charge_total: Decimal) -> list[dict[str, Any]]:
    """`lines_by` over sums already grouped by `key` (the warehouse groups a team's month: `TeamUsage`)."""
    charges = split_cents(charge_total, {line: s.charge_num for line, s in groups.items()}) if groups else {}
    team_alloc = sum(s.allocated_s for s in groups.values())
    lines = [
        {key: line, **s.figures(), "charge": charges[line], "share_pct": pct(s.allocated_s, team_alloc)}
        for line, s in groups.items()
    ]
    return sorted(lines, key=lambda r: (-r["charge"], r[key]))


def job_lines(jobs: Iterable[JobUsage]) -> list[dict[str, Any]]:
    """Per job: the report's figures, charge and idle cost each half-up to the cent (a job's own line)."""
    out = []
    for job in merge_segments(jobs):
        sums = total([job])
        out.append({
            "cluster": job.cluster, "job_id": job.job_id, "user": job.user, "project": job.project,
            "original_project": job.original_project if job.original_project != job.project else "",
            "generation": job.generation, "pricing_tier": job.pricing_tier,
            **sums.figures(), "charge": money(job.charge_num), "_idle_num": job.idle_charge_num,
            "first_day": job.first_day, "last_day": job.last_day,
        })  # fmt: skip
    return out


def most_idle_cost(jobs: Iterable[JobUsage], limit: int = 10) -> list[dict[str, Any]]:
    """The `limit` jobs with the most idle cost; only those are turned into lines (a team's month can hold
    thousands of jobs)."""
    idle = [job for job in merge_segments(jobs) if job.idle_charge_num > 0]
    top = heapq.nsmallest(limit, idle, key=lambda j: (-j.idle_charge_num, j.cluster, j.job_id))
    return job_lines(top)


@dataclass(frozen=True, slots=True)
class TeamUsage:
    """A team's month grouped where it is stored (one query, not one row per job): the sums per project, user and
    cluster, the on-prem seconds per generation (quota use), the total, the days, the jobs with the most idle cost."""

    by: Mapping[str, Mapping[str, Sums]]  # "project" | "user" | "cluster" -> line -> sums
    onprem_s: Mapping[str, int]  # generation -> on-prem allocated seconds
    total: Sums
    most_idle: list[JobUsage]  # one row per job (segments merged), the most idle cost first
    days: list[Day] | None = None  # the open ledger's days with usage (the chart); None: read them apart


# -- the daily chart ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Day:
    day: dt.date
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int

    @property
    def allocated_s(self) -> int:
        return self.active_s + self.starved_s + self.idle_s + self.dark_s

    @property
    def consumed_s(self) -> int:
        return self.active_s + self.starved_s


def daily_series(rows: Iterable[Day], start: dt.date, days: int) -> list[Day]:
    """Every day of the period, a day without usage as zeros (a gap in the chart is a real zero)."""
    by_day = {r.day: r for r in rows}
    series = []
    for i in range(days):
        d = start + dt.timedelta(days=i)
        series.append(by_day.get(d, Day(d, 0, 0, 0, 0)))
    return series


# -- open idle warnings ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlertRow:
    kind: str
    ts_ms: int
    cluster: str
    job_id: str
    user: str
    project: str
    idle_minutes: int | None
    cost_so_far: float | None
    action: str | None
    action_at_ms: int | None
    dry_run: bool


Gangs = Mapping[tuple[str, str], Mapping[str, str]]  # (cluster, gang id) -> member job -> its latest event


def open_warnings(alerts: Iterable[AlertRow], job_states: Mapping[tuple[str, str], str], now_ms: int,
                  gangs: Gangs | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """The idle warnings still open: a job's latest idle alert is a warning (not resolved, not reclaimed)
    and the job has not ended. Each with when its action is due, relative to `now_ms` (soonest first).

    `gangs`: (cluster, gang id) -> each member pod -> its latest event. A gang is one line, as chat warns it
    (`sinks/gang.py`): open once every member still holding devices is warned and not all of them reclaimed; due
    when its latest member's action is; its pods' own warnings are not lines of their own."""
    latest: dict[tuple[str, str], AlertRow] = {}
    for alert in alerts:
        if alert.kind not in WARNING_KINDS:
            continue
        key = (alert.cluster, alert.job_id)
        seen = latest.get(key)
        if seen is None or _order(alert) > _order(seen):
            latest[key] = alert
    in_gang = {(cluster, job) for (cluster, _), members in (gangs or {}).items() if len(members) > 1 for job in members}
    out = []
    for key, alert in latest.items():
        if key in in_gang or alert.kind != "IDLE_WARNING" or job_states.get(key) in ENDED_STATES:
            continue
        out.append(_warning_line(alert.cluster, alert.job_id, [alert], now_ms, gang=False))
    for (cluster, gang), members in sorted((gangs or {}).items()):
        live = [latest.get((cluster, job)) for job, state in sorted(members.items()) if state not in ENDED_STATES]
        if len(members) <= 1 or not live or any(a is None or a.kind == "IDLE_RESOLVED" for a in live):
            continue
        warned = [a for a in live if a is not None]
        if any(a.kind == "IDLE_WARNING" for a in warned):
            out.append(_warning_line(cluster, gang, warned, now_ms, gang=True))
    out.sort(key=lambda r: (r["_due_ms"], r["cluster"], r["job_id"]))
    return out


def _warning_line(cluster: str, job_id: str, warned: list[AlertRow], now_ms: int, *, gang: bool) -> dict[str, Any]:
    """One open warning: a job's, or a gang's from its members' latest alerts (the last warned names the owner and
    the time; the grace is one for all, so a pod past its notice was warned before; due at the latest member's
    action; the cost theirs together)."""
    last = max(warned, key=lambda a: (a.kind == "IDLE_WARNING", a.ts_ms))  # the gang's warning: its last pod's
    due_all = [a.action_at_ms for a in warned if a.action_at_ms is not None]
    due = max(due_all) if due_all else None
    costs = [a.cost_so_far for a in warned]
    cost = None if any(c is None for c in costs) else sum((Decimal(str(c)) for c in costs if c is not None), Decimal(0))
    line = {
        "cluster": cluster, "job_id": job_id, "user": last.user, "project": last.project,
        "idle_minutes": min((a.idle_minutes for a in warned if a.idle_minutes is not None), default=None),
        "warned_at": _utc(last.ts_ms), "action": last.action or "",
        "due_at": _utc(due) if due is not None else "", "due": due_text(due, now_ms), "dry_run": last.dry_run,
        "cost_so_far": None if cost is None else cost.quantize(CENT), "_due_ms": due if due is not None else 1 << 62,
    }  # fmt: skip
    if gang:
        line["_gang"] = True
    return line


def _order(alert: AlertRow) -> tuple[int, int]:
    """Later first; at the same minute, a resolution or a reclaim closes the warning it follows."""
    return (alert.ts_ms, WARNING_KINDS.index(alert.kind))


def due_text(due_ms: int | None, now_ms: int) -> str:
    if due_ms is None:
        return "no action set"
    minutes = (due_ms - now_ms) // 60_000 if due_ms >= now_ms else -((now_ms - due_ms) // 60_000)
    if minutes >= 0:
        return f"in {_span(minutes)}"
    return f"overdue by {_span(-minutes)}"


def _span(minutes: int) -> str:
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {rest} min"
    return f"{hours // 24} d {hours % 24} h"


def _utc(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def utc_minute(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


# -- data quality ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quality:
    """What the data-quality figure is and what lowers it."""

    coverage_pct: float | None  # allocated GPU-seconds with telemetry / allocated
    dark_gpu_h: Decimal
    dark_nodes: list[dict[str, Any]]  # node, dark GPU-h, share of the team's dark time
    unpriced_gpu_h: Decimal
    default_project_jobs: int  # charged to the user's default project (none given on the job)
    claimed_project_jobs: int  # named a project their user is not a member of: charged elsewhere
    jobs: int
    latest_data: str  # the newest device-minute stored, any team
    age_text: str


@dataclass(frozen=True, slots=True)
class ProjectSources:
    """Of a team's jobs in a period, as their job events recorded them: how many were charged to their user's
    default project (none given on the job), and how many named a project their user is not a member of."""

    default_project_jobs: int
    claimed_project_jobs: int


def quality(sums: Sums, dark_by_node: Iterable[tuple[str, int]], sources: ProjectSources,
            latest_ms: int | None, now_ms: int, unpriced_s: int) -> Quality:  # fmt: skip
    dark = [(node, int(s)) for node, s in dark_by_node if int(s) > 0]
    dark.sort(key=lambda r: (-r[1], r[0]))
    dark_total = sum(s for _, s in dark)
    return Quality(
        coverage_pct=pct(sums.allocated_s - sums.dark_s, sums.allocated_s),
        dark_gpu_h=gpu_h(sums.dark_s),
        dark_nodes=[{"node": n, "dark_gpu_h": gpu_h(s), "share_pct": pct(s, dark_total)} for n, s in dark[:10]],
        unpriced_gpu_h=gpu_h(unpriced_s),
        default_project_jobs=sources.default_project_jobs,
        claimed_project_jobs=sources.claimed_project_jobs,
        jobs=sums.job_count,
        latest_data=_utc(latest_ms) if latest_ms is not None else "no data",
        age_text=age_text(latest_ms, now_ms),
    )


def age_text(latest_ms: int | None, now_ms: int) -> str:
    """How old the newest data is, in words."""
    if latest_ms is None:
        return "no data"
    if latest_ms > now_ms:
        return "ahead of this server's clock"
    return f"{_span((now_ms - latest_ms) // 60_000)} ago"


# -- device-minutes -------------------------------------------------------------------------------


def minute_class(allocated_s: int, active_s: int, starved_s: int, idle_s: int, dark_s: int) -> str:
    """A device-minute's class: every sampled allocated second takes one class (classifier c1), the
    unsampled ones are dark; a minute partly dark says both."""
    sampled = next((c for c, s in (("active", active_s), ("starved", starved_s), ("idle", idle_s)) if s), None)
    if allocated_s == 0:
        return "unallocated"
    if sampled is None:
        return "dark"
    return sampled if dark_s == 0 else f"{sampled} + dark {dark_s}s"


# -- tables ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    title: str
    kind: str = "text"  # text, int, gpu_h, money, pct, ratio, link


@dataclass(frozen=True, slots=True)
class Table:
    """One table of a page; `name` is what `?csv=<name>` downloads."""

    name: str
    title: str
    columns: tuple[Column, ...]
    rows: list[dict[str, Any]]
    note: str = ""
    links: Mapping[str, str] = field(default_factory=dict)  # column key -> row key holding that cell's URL

    def csv_rows(self) -> tuple[list[str], list[list[Any]]]:
        header = [c.key for c in self.columns]
        return header, [[_plain(row.get(c.key)) for c in self.columns] for row in self.rows]


def _plain(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


USAGE_COLUMNS = (
    Column("jobs", "jobs", "int"),
    Column("allocated_gpu_h", "allocated GPU-h", "gpu_h"),
    Column("charge", "charge", "money"),
    Column("consumed_gpu_h", "consumed GPU-h", "gpu_h"),
    Column("utilisation_pct", "utilisation %", "pct"),
    Column("active_gpu_h", "active", "gpu_h"),
    Column("starved_gpu_h", "starved", "gpu_h"),
    Column("idle_gpu_h", "idle", "gpu_h"),
    Column("dark_gpu_h", "dark", "gpu_h"),
    Column("idle_cost", "idle cost", "money"),
    Column("coverage_pct", "coverage %", "pct"),
)
