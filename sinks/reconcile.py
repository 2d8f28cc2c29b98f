"""The reconciled view (issue 18, item 5): one month over every cluster, and the device-seconds two clusters
both claimed.

- `chargeback_by_cluster`: the month per (team, cluster) (`v_chargeback_month_clusters`; a closed month from
  its frozen statements, `v_statement_month_clusters`), each team's lines followed by its total across
  clusters, then the month's total. A total is the sum of its lines
  (money, hours and jobs; utilisation and coverage from the summed seconds), so the report adds up.
- `overlaps`: the data-quality finding (`v_device_overlaps`): a device claimed in the same minutes by jobs
  of two clusters, naming both; the job that started later holds the seconds and is charged for them,
  the other cedes them (sinks/views/v_device_claims_resolved.sql, the processors' rule within a
  cluster).

`add_up` is pure; the readers bind every value and read fixed view names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from sinks.chargeback import LINE_COLUMNS, ChargebackLine, check_period

ALL_CLUSTERS = "ALL"
CLUSTER_COLUMNS = ("line", "cluster", *[c for c in LINE_COLUMNS if c != "line"])
_SUMMED = tuple(c for c in LINE_COLUMNS if c not in ("line", "utilisation_pct", "coverage_pct"))


@dataclass(frozen=True, slots=True)
class Seconds:
    """The exact seconds behind a line's rounded hours, for percentages of a sum."""

    allocated: int
    consumed: int  # active + starved
    dark: int

    def __add__(self, other: Seconds) -> Seconds:
        return Seconds(self.allocated + other.allocated, self.consumed + other.consumed, self.dark + other.dark)


@dataclass(frozen=True, slots=True)
class ClusterLine:
    """One line of the report: a team on one cluster, or (cluster ALL) a team's or the month's total."""

    cluster: str
    line: ChargebackLine
    seconds: Seconds


@dataclass(frozen=True, slots=True)
class ClusterReport:
    period: str
    lines: tuple[ClusterLine, ...]  # per team: its clusters in order, then its total across them
    total: ClusterLine


def _pct(part: int, whole: int) -> float:
    return 0.0 if whole == 0 else round(100 * part / whole, 1)


def add_up(name: str, lines: Sequence[ClusterLine]) -> ClusterLine:
    """The line `name` across clusters: every amount, hour and job count summed; utilisation and coverage
    from the summed seconds (never an average of percentages). A job is on one cluster, so jobs add."""
    seconds = sum((ln.seconds for ln in lines), Seconds(0, 0, 0))
    summed: dict[str, Any] = {c: sum((getattr(ln.line, c) for ln in lines), Decimal(0)) for c in _SUMMED}
    summed["jobs"] = int(summed["jobs"])
    total = ChargebackLine(
        line=name,
        utilisation_pct=_pct(seconds.consumed, seconds.allocated),
        coverage_pct=_pct(seconds.allocated - seconds.dark, seconds.allocated),
        **summed,
    )
    return ClusterLine(ALL_CLUSTERS, total, seconds)


def with_team_totals(lines: Sequence[ClusterLine]) -> tuple[tuple[ClusterLine, ...], ClusterLine]:
    """Each team's cluster lines followed by its total across them (teams and clusters in name order), and
    the month's total over the cluster lines."""
    teams: dict[str, list[ClusterLine]] = {}
    for ln in sorted(lines, key=lambda x: (x.line.line, x.cluster)):
        teams.setdefault(ln.line.line, []).append(ln)
    out: list[ClusterLine] = []
    for team, own in teams.items():
        out += [*own, add_up(team, own)]
    return tuple(out), add_up("TOTAL", lines)


def chargeback_by_cluster(client: Any, period: str, *, closed: bool = False) -> ClusterReport:
    """The month's ledger per (team, cluster), each device-second charged once (`v_chargeback_month_clusters`),
    or for a closed month its frozen statements' usage lines (`v_statement_month_clusters`)."""
    period = check_period(period)
    cols = ", ".join(c if c != "line" else "team" for c in LINE_COLUMNS)
    view = "v_statement_month_clusters" if closed else "v_chargeback_month_clusters"  # a fixed name
    result = client.query(
        f"SELECT cluster, {cols}, allocated_seconds, active_seconds + starved_seconds, dark_seconds "
        f"FROM {view}(period = {{period:String}}) ORDER BY team, cluster",
        parameters={"period": period},
    )
    lines = []
    for cluster, *row in result.result_rows:
        values = dict(zip(LINE_COLUMNS, row[: len(LINE_COLUMNS)], strict=True))
        alloc, consumed, dark = (int(v) for v in row[len(LINE_COLUMNS) :])
        lines.append(ClusterLine(str(cluster), ChargebackLine(**values), Seconds(alloc, consumed, dark)))
    grouped, total = with_team_totals(lines)
    return ClusterReport(period, grouped, total)


def report_rows(report: ClusterReport) -> list[dict[str, Any]]:
    return [
        {"period": report.period, "by": "cluster", "line": ln.line.line, "cluster": ln.cluster,
         **{k: v for k, v in asdict(ln.line).items() if k != "line"}}
        for ln in (*report.lines, report.total)
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Overlap:
    """A device two jobs of different clusters claimed in the same minutes: `holder` (the later-started job)
    is charged for them; `ceded` gave up `overlap_s` seconds."""

    device_uuid: str
    mig_instance_id: int
    holder_cluster: str
    holder_job_id: str
    ceded_cluster: str
    ceded_job_id: str
    first_minute_ms: int
    last_minute_ms: int
    overlap_s: int

    def text(self) -> str:
        device = self.device_uuid if self.mig_instance_id < 0 else f"{self.device_uuid} MIG {self.mig_instance_id}"
        return (
            f"{device}: {self.overlap_s} s claimed by both {self.ceded_cluster}/{self.ceded_job_id} and "
            f"{self.holder_cluster}/{self.holder_job_id}; charged once, to {self.holder_cluster}/{self.holder_job_id}"
            " (started later)"
        )


OVERLAP_COLUMNS = tuple(Overlap.__dataclass_fields__)


def overlaps(client: Any, period: str) -> list[Overlap]:
    """The month's device-seconds claimed by two clusters' jobs, one row per device and pair of jobs."""
    result = client.query(
        f"SELECT {', '.join(OVERLAP_COLUMNS)} FROM v_device_overlaps WHERE period = {{period:String}} "
        "ORDER BY device_uuid, mig_instance_id, first_minute_ms, ceded_cluster, ceded_job_id",
        parameters={"period": check_period(period)},
    )
    return [
        Overlap(str(uuid), int(mig), str(hc), str(hj), str(cc), str(cj), int(first), int(last), int(seconds))
        for uuid, mig, hc, hj, cc, cj, first, last, seconds in result.result_rows
    ]
