"""The data-quality figure every chargeback output carries (DESIGN principle 4; issue 19, "Fair units").

How far a month's charges can be trusted, over the jobs behind them (the whole month, or one project's line):

- `coverage_pct`: allocated GPU-seconds with telemetry / allocated (dark seconds are charged, never idle);
- `unidentified_gpu_h`, `unidentified_jobs`: allocated time on devices no source identified
  (device_uuid `unidentified:*`, processors/attribution.py), charged per device and counted dark;
- `default_project_pct`: share of allocated GPU-seconds of jobs charged to their user's default project
  (the job named none: `project_source` DEFAULT);
- `claimed_project_pct`: share of allocated GPU-seconds of jobs that named a project their user is not a
  member of (charged to the default instead, `v_job_claims`);
- `unpriced_gpu_h`, `unknown_mig_gpu_h`: allocated time with no rate, and the part of it on MIG slices
  whose share of the GPU is unknown (left unpriced rather than guessed, schemas/mig.py);
- `overlap_gpu_h`, `overlap_jobs`: device time two clusters' jobs both claimed, ceded by the job that started
  first and charged to the other (migration 016; `report chargeback` names each pair, sinks/reconcile.py);
- `claimed_user_jobs`: jobs whose self-declared user (a label the submitter wrote) disagreed with the verified
  submitter (charged to the verified one; `user_claimed`, migration 032);
- `self_declared_gpu_h`: allocated time of jobs whose user is only self-declared (`user_source` SELF_DECLARED or
  NAMESPACE: a Kubernetes cluster without the admission stamp); per cluster, sinks/identities.py says which.

`figure` is pure over per-job facts; `data_quality` reads them (bound parameters, fixed identifiers).

A closed month keeps the figure it closed with: each team's statement freezes its jobs' `Tally` (the figure's
additive sums, integers, in the statement's content hash; sinks/statements.py), and the month's figure is the
figure of their sum (`Tally.figure`), so data arriving later changes the live figure, never the closed one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from sinks.chargeback import check_period

# The month, or its days before `until` when one is given (the part of a month before the attribution baseline).
_MONTH = ("day >= toDate(concat({p:String}, '-01')) AND day < addMonths(toDate(concat({p:String}, '-01')), 1) "
          "AND ({until:String} = '' OR day < toDateOrNull({until:String}))")


@dataclass(frozen=True, slots=True)
class JobFacts:
    """One job's month, as the data-quality figure needs it."""

    allocated_s: int
    dark_s: int
    unpriced_s: int
    unknown_mig_s: int  # allocated seconds on MIG slices of unknown share
    unidentified_s: int  # allocated seconds on devices no source identified
    project_source: str  # EXPLICIT, DEFAULT or MISSING (the job's latest event)
    claimed: bool  # named a project its user is not a member of
    ceded_s: int = 0  # seconds it claimed that a later-started job of another cluster held (not charged to it)
    user_source: str | None = None  # SCHEDULER, STAMPED, SELF_DECLARED, NAMESPACE; None: not recorded (before v4)
    claimed_user: bool = False  # its self-declared user disagreed with the verified one


@dataclass(frozen=True, slots=True)
class DataQuality:
    scope: str  # what the figure covers: "2026-11", "2026-11 project p-x", "2026-11 as closed"
    jobs: int
    coverage_pct: float
    unidentified_gpu_h: Decimal
    unidentified_jobs: int
    default_project_pct: float
    claimed_project_pct: float
    unpriced_gpu_h: Decimal
    unknown_mig_gpu_h: Decimal
    overlap_gpu_h: Decimal = Decimal("0.000")
    overlap_jobs: int = 0
    claimed_user_jobs: int = 0
    self_declared_gpu_h: Decimal = Decimal("0.000")
    frozen: bool = False  # the figure a closed month's statements froze, not the ledger's now

    def columns(self) -> dict[str, Any]:
        """The figure as `dq_*` columns, for rows of CSV, JSON and Parquet outputs."""
        return {f"dq_{k}": v for k, v in asdict(self).items() if k != "scope"}

    def text(self) -> str:
        """One line under a table."""
        line = (f"data quality ({self.scope}, {self.jobs} jobs): coverage {self.coverage_pct}%, "
                f"unidentified devices {self.unidentified_gpu_h} GPU-h ({self.unidentified_jobs} jobs), "
                f"default project {self.default_project_pct}%, claimed project {self.claimed_project_pct}% "
                f"of allocated GPU-h, unpriced {self.unpriced_gpu_h} GPU-h")  # fmt: skip
        if self.unknown_mig_gpu_h:
            line += f" ({self.unknown_mig_gpu_h} on MIG slices of unknown profile)"
        if self.overlap_jobs:
            line += (f"; claimed by two clusters at once {self.overlap_gpu_h} GPU-h, ceded by {self.overlap_jobs} "
                     "jobs (charged once)")  # fmt: skip
        if self.claimed_user_jobs:
            line += (f"; self-declared user disagreed with the verified submitter on {self.claimed_user_jobs} jobs "
                     "(charged to the verified one)")  # fmt: skip
        if self.self_declared_gpu_h:
            line += f"; identity only self-declared {self.self_declared_gpu_h} GPU-h"
        return line


DQ_COLUMNS = tuple(f"dq_{name}" for name in DataQuality.__dataclass_fields__ if name != "scope")


def _pct(part: int, whole: int) -> float:
    return 0.0 if whole == 0 else round(100 * part / whole, 1)


def _gpu_h(seconds: int) -> Decimal:
    return (Decimal(seconds) / 3600).quantize(Decimal("0.001"))


@dataclass(frozen=True, slots=True)
class Tally:
    """The figure's additive sums over a set of jobs: what a closed statement freezes. Integers only, so a
    statement's hash covers them exactly, and the sum of the teams' tallies is the month's."""

    jobs: int = 0
    allocated_s: int = 0
    dark_s: int = 0
    unidentified_s: int = 0
    unidentified_jobs: int = 0
    default_project_s: int = 0
    claimed_project_s: int = 0
    unpriced_s: int = 0
    unknown_mig_s: int = 0
    ceded_s: int = 0
    overlap_jobs: int = 0
    # issue 38 (migration 032): left out of a statement's hashed text while 0, so statements closed before keep theirs
    claimed_user_jobs: int = 0
    self_declared_s: int = 0

    @classmethod
    def of(cls, jobs: Iterable[JobFacts]) -> Tally:
        listed = list(jobs)
        return cls(
            jobs=len(listed),
            allocated_s=sum(j.allocated_s for j in listed),
            dark_s=sum(j.dark_s for j in listed),
            unidentified_s=sum(j.unidentified_s for j in listed),
            unidentified_jobs=sum(1 for j in listed if j.unidentified_s > 0),
            default_project_s=allocated_from(listed, ("DEFAULT",)),
            claimed_project_s=sum(j.allocated_s for j in listed if j.claimed),
            unpriced_s=sum(j.unpriced_s for j in listed),
            unknown_mig_s=sum(j.unknown_mig_s for j in listed),
            ceded_s=sum(j.ceded_s for j in listed),
            overlap_jobs=sum(1 for j in listed if j.ceded_s > 0),
            claimed_user_jobs=sum(1 for j in listed if j.claimed_user),
            self_declared_s=sum(j.allocated_s for j in listed if j.user_source in SELF_DECLARED_SOURCES),
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(*(getattr(self, name) + getattr(other, name) for name in TALLY_FIELDS))

    def figure(self, scope: str, *, frozen: bool = False) -> DataQuality:
        """Percentages of allocated GPU-seconds, one decimal; hours to 3 places."""
        alloc = self.allocated_s
        return DataQuality(
            scope=scope,
            jobs=self.jobs,
            coverage_pct=_pct(alloc - self.dark_s, alloc),
            unidentified_gpu_h=_gpu_h(self.unidentified_s),
            unidentified_jobs=self.unidentified_jobs,
            default_project_pct=_pct(self.default_project_s, alloc),
            claimed_project_pct=_pct(self.claimed_project_s, alloc),
            unpriced_gpu_h=_gpu_h(self.unpriced_s),
            unknown_mig_gpu_h=_gpu_h(self.unknown_mig_s),
            overlap_gpu_h=_gpu_h(self.ceded_s),
            overlap_jobs=self.overlap_jobs,
            claimed_user_jobs=self.claimed_user_jobs,
            self_declared_gpu_h=_gpu_h(self.self_declared_s),
            frozen=frozen,
        )


    def canonical(self) -> dict[str, int]:
        """The tally as a statement's hash covers it: the fields added later only when not 0, so a statement closed
        before they existed (read back with 0) keeps the hash it closed with."""
        return {k: v for k, v in asdict(self).items() if v or k not in LATER_FIELDS}


TALLY_FIELDS = tuple(Tally.__dataclass_fields__)
LATER_FIELDS = frozenset({"claimed_user_jobs", "self_declared_s"})
SELF_DECLARED_SOURCES = frozenset({"SELF_DECLARED", "NAMESPACE"})


# Where a job's project came from when nobody named one: its user's default project, or none at all.
DEFAULTED_SOURCES = frozenset({"DEFAULT", "MISSING"})


def allocated_from(jobs: Iterable[JobFacts], sources: Collection[str]) -> int:
    """Allocated GPU-seconds of the jobs whose project came from one of `sources` (`project_source`): the one rule
    behind the attribution shares (the figure's default-project share, the attribution baseline's mark)."""
    return sum(j.allocated_s for j in jobs if j.project_source in sources)


def defaulted_pct(jobs: Iterable[JobFacts]) -> float:
    """Share of the jobs' allocated GPU-seconds charged to a default (DEFAULTED_SOURCES), one decimal: how much of
    the time before the attribution baseline no job named its project (sinks/baseline.py)."""
    listed = list(jobs)
    return _pct(allocated_from(listed, DEFAULTED_SOURCES), sum(j.allocated_s for j in listed))


def figure(scope: str, jobs: Iterable[JobFacts]) -> DataQuality:
    """The figure over `jobs` (pure)."""
    return Tally.of(jobs).figure(scope)


def frozen_figure(period: str, tallies: Iterable[Tally | None]) -> DataQuality | None:
    """A closed month's figure from its statements' frozen tallies; None when there are none, or when a statement
    froze none (closed before the figure was frozen with it)."""
    listed = list(tallies)
    if not listed or any(t is None for t in listed):
        return None
    return sum((t for t in listed if t is not None), Tally()).figure(f"{period} as closed", frozen=True)


def data_quality(client: Any, period: str, project: str | None = None) -> DataQuality:
    """The month's figure from the ledger as it is now, over every job or over one project's (as charged:
    corrections applied)."""
    facts = [f for _, f in job_facts(client, period, project)]
    return figure(period if project is None else f"{period} project {project}", facts)


def team_tallies(client: Any, period: str) -> dict[str, Tally]:
    """Each team's tally of the month from the ledger as it is now: what `period close` freezes per statement."""
    by_team: dict[str, list[JobFacts]] = {}
    for team, facts in job_facts(client, period):
        by_team.setdefault(team, []).append(facts)
    return {team: Tally.of(facts) for team, facts in by_team.items()}


def job_facts(client: Any, period: str, project: str | None = None,
              until: dt.date | None = None) -> list[tuple[str, JobFacts]]:  # fmt: skip
    """(team, facts) of each job with usage in the month (one project's, when given). A job's team is the one its
    usage is charged to (the smallest, in the odd case of two)."""
    period = check_period(period)
    params = {"p": period, "project": project or "", "until": until.isoformat() if until else ""}
    usage = client.query(
        "SELECT cluster, job_id, sum(allocated_s), sum(dark_s), sum(unpriced_s), "
        f"sumIf(allocated_s, gpu_share_slices = 0), min(team) FROM v_usage_priced WHERE {_MONTH} "
        "AND ({project:String} = '' OR project = {project:String}) GROUP BY cluster, job_id",
        parameters=params,
    ).result_rows
    sources = client.query(
        "SELECT cluster, job_id, argMax(project_source, ts_ms), max(project_claimed IS NOT NULL), "
        "argMax(user_source, ts_ms), max(user_claimed IS NOT NULL) FROM job_events "
        f"WHERE (cluster, job_id) IN (SELECT cluster, job_id FROM usage_daily WHERE {_MONTH} AND job_id != '') "
        "GROUP BY cluster, job_id",
        parameters=params,
    ).result_rows
    unidentified = client.query(
        f"SELECT cluster, job_id, sum(allocated_s) FROM unidentified_daily WHERE {_MONTH} GROUP BY cluster, job_id",
        parameters=params,
    ).result_rows
    ceded = client.query(
        f"SELECT cluster, job_id, sum(ceded_s) FROM v_device_claims_resolved WHERE ceded_s > 0 AND {_MONTH} "
        "GROUP BY cluster, job_id",
        parameters=params,
    ).result_rows
    source = {(c, j): (str(s), bool(claimed), None if us is None else str(us), bool(uc))
              for c, j, s, claimed, us, uc in sources}  # fmt: skip
    unknown = {(c, j): int(s) for c, j, s in unidentified}
    given = {(c, j): int(s) for c, j, s in ceded}
    facts = []
    for c, j, a, d, u, m, team in usage:
        project_source, claimed, user_source, claimed_user = source.get((c, j), ("MISSING", False, None, False))
        facts.append((str(team), JobFacts(int(a), int(d), int(u), int(m), unknown.get((c, j), 0), project_source,
                                          claimed, given.get((c, j), 0), user_source, claimed_user)))  # fmt: skip
    return facts
