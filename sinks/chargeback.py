"""Chargeback, explain and alert listings, read from the analyst views.

The CLI reads the views analysts query (`v_chargeback_month(period, by)`, the one-month form of
`v_chargeback`; `v_chargeback_jobs`), so the two cannot disagree; this module only selects,
totals and formats.
Values are bound parameters; the only identifiers come from fixed tables in this module.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from decimal import Decimal
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from base.outputs import csv_text
from sinks.identities import identity_text, job_identities
from sinks.periods import check_period

BY_CHOICES = ("team", "project", "user", "cost-centre", "tier")
REPORT_BY = (*BY_CHOICES, "cluster")  # `report chargeback --by`: per cluster is sinks/reconcile.py's view
FORMATS = ("table", "csv", "json", "parquet")


def check_by(by: str, choices: tuple[str, ...] = BY_CHOICES) -> str:
    if by not in choices:
        raise ConfigError(f"--by must be one of {', '.join(choices)}, got {by!r}")
    return by


@dataclass(frozen=True, slots=True)
class ChargebackLine:
    line: str
    jobs: int
    allocated_gpu_h: Decimal
    charge: Decimal
    consumed_gpu_h: Decimal
    utilisation_pct: float
    active_gpu_h: Decimal
    starved_gpu_h: Decimal
    idle_gpu_h: Decimal
    dark_gpu_h: Decimal
    idle_cost: Decimal
    coverage_pct: float
    unpriced_gpu_h: Decimal
    # owned hardware vs cloud burst, each at its own tier's rate; the two charges add up to `charge`
    onprem_gpu_h: Decimal
    cloud_gpu_h: Decimal
    onprem_charge: Decimal
    cloud_charge: Decimal


LINE_COLUMNS = tuple(f.name for f in fields(ChargebackLine))


@dataclass(frozen=True, slots=True)
class ChargebackReport:
    period: str
    by: str
    lines: tuple[ChargebackLine, ...]
    total: ChargebackLine


def _pct(part: int, whole: int) -> float:
    return 0.0 if whole == 0 else round(100 * part / whole, 1)


def chargeback(client: Any, period: str, by: str, *, closed: bool = False) -> ChargebackReport:
    """The month's report from the ledger as it is now (`v_chargeback_month`), or, for a closed month, from its
    frozen statements (`v_statement_month`, the same columns over the lines frozen at the close)."""
    period, by = check_period(period), check_by(by)
    cols = ", ".join(LINE_COLUMNS)
    view = "v_statement_month" if closed else "v_chargeback_month"  # a fixed name, never user input
    result = client.query(
        f"SELECT {cols}, allocated_seconds, active_seconds, starved_seconds, dark_seconds "
        f"FROM {view}(period = {{period:String}}, by = {{by:String}}) ORDER BY line",
        parameters={"period": period, "by": by},
    )
    lines = []
    alloc = consumed = dark = 0
    for row in result.result_rows:
        values = dict(zip((*LINE_COLUMNS, "a", "act", "st", "dk"), row, strict=True))
        alloc += int(values["a"])
        consumed += int(values["act"]) + int(values["st"])
        dark += int(values["dk"])
        lines.append(ChargebackLine(**{k: values[k] for k in LINE_COLUMNS}))
    # A job is in exactly one line per grouping, so line sums are the totals.
    total = ChargebackLine(
        line="TOTAL",
        jobs=sum(line.jobs for line in lines),
        allocated_gpu_h=sum((line.allocated_gpu_h for line in lines), Decimal(0)),
        charge=sum((line.charge for line in lines), Decimal(0)),
        consumed_gpu_h=sum((line.consumed_gpu_h for line in lines), Decimal(0)),
        utilisation_pct=_pct(consumed, alloc),
        active_gpu_h=sum((line.active_gpu_h for line in lines), Decimal(0)),
        starved_gpu_h=sum((line.starved_gpu_h for line in lines), Decimal(0)),
        idle_gpu_h=sum((line.idle_gpu_h for line in lines), Decimal(0)),
        dark_gpu_h=sum((line.dark_gpu_h for line in lines), Decimal(0)),
        idle_cost=sum((line.idle_cost for line in lines), Decimal(0)),
        coverage_pct=_pct(alloc - dark, alloc),
        unpriced_gpu_h=sum((line.unpriced_gpu_h for line in lines), Decimal(0)),
        onprem_gpu_h=sum((line.onprem_gpu_h for line in lines), Decimal(0)),
        cloud_gpu_h=sum((line.cloud_gpu_h for line in lines), Decimal(0)),
        onprem_charge=sum((line.onprem_charge for line in lines), Decimal(0)),
        cloud_charge=sum((line.cloud_charge for line in lines), Decimal(0)),
    )
    return ChargebackReport(period, by, tuple(lines), total)


# device_uuid of a device-minute whose device no source identified (processors/attribution.py UNIDENTIFIED):
# a pod's GPUs before the kubelet or dcgm-exporter named them, charged per device and counted dark
UNIDENTIFIED_PREFIX = "unidentified:"


@dataclass(frozen=True, slots=True)
class Unidentified:
    """The month's data-quality finding for device identity: allocated GPU-hours on unidentified devices."""

    gpu_h: Decimal
    jobs: int


def unidentified(client: Any, period: str) -> Unidentified:
    """Allocated time on devices of unknown identity in the month (bound parameters; the `unidentified:` devices'
    daily rollup, migration 028)."""
    rows = client.query(
        "SELECT sum(allocated_s), uniqExact(cluster, job_id) FROM unidentified_daily "
        "WHERE formatDateTime(day, '%Y-%m') = {period:String}",
        parameters={"period": check_period(period)},
    ).result_rows
    seconds, jobs = rows[0] if rows else (0, 0)
    return Unidentified((Decimal(int(seconds or 0)) / 3600).quantize(Decimal("0.001")), int(jobs or 0))


EXPLAIN_COLUMNS = (
    "cluster", "job_id", "job_start", "user", "user_uid", "identity", "user_source", "team", "project",
    "original_project", "correction_id", "cost_centre", "generation", "pricing_tier", "preemptible", "gpu_share_slices",
    "gpu_share_of", "first_day", "last_day", "allocated_s", "active_s", "starved_s", "idle_s", "dark_s", "charge",
    "claimed_project", "claimed_user",
)  # fmt: skip
_IDENTITY_COLUMNS = ("user_uid", "identity", "user_source", "claimed_user")  # read beside the charge (032)
# `job_start`: the job's first start, UTC (ISO 8601; empty when its job events never arrived). Job ids are reused
# (a reinstalled scheduler counts from 1 again), so a job is (cluster, job_id, job_start): two jobs that shared an
# id are two lines (v_job_lives, migration 022).
# `claimed_project`: the project the job named but its user is not a member of (v_job_claims); the
# job is charged to `project`, never to the claim. Empty for every other job.
# `user_uid`, `identity`, `user_source`: who the job ran as, a name and its identifier (`alice (uid 1001)`; `(uid
# unknown)` where the source gave none) and where the name came from (SCHEDULER, STAMPED, SELF_DECLARED, NAMESPACE;
# empty before sched.job-events v4). Two identifiers under one name are two identities (`explain_identities`).
# `claimed_user`: a self-declared user that disagreed with the verified one; the job is charged to `user`.
# `gpu_share_slices` of `gpu_share_of`: the share of its GPU the segment's device held (1 of 1 a whole GPU, 1 of 7
# a 1g MIG slice, 0 of 1 a slice of unknown profile, unpriced); a job on slices of two sizes has two segments.

_EXPLAIN_READ = {"job_start": "j.job_start_ms"}  # a column read from another (fixed text)


def explain(client: Any, period: str, project: str) -> list[dict[str, Any]]:
    """The jobs (and their price segments) behind one project's line, corrections applied, claims flagged."""
    period = check_period(period)
    if not project:
        raise ConfigError("--project must not be empty")

    read = [c for c in EXPLAIN_COLUMNS if c != "claimed_project" and c not in _IDENTITY_COLUMNS]
    selected = ", ".join(_EXPLAIN_READ.get(c, f"j.{c}") for c in read)
    result = client.query(
        f"SELECT {selected}, c.claimed_project FROM v_chargeback_jobs AS j "
        "LEFT JOIN v_job_claims AS c ON j.cluster = c.cluster AND j.job_id = c.job_id "
        "WHERE j.period = {period:String} AND j.project = {project:String} "
        "ORDER BY j.cluster, j.job_id, j.job_start_ms, j.generation, j.pricing_tier, j.preemptible, j.gpu_share_of, "
        "j.gpu_share_slices",
        parameters={"period": period, "project": project},
    )
    read_rows = [dict(zip((*read, "claimed_project"), row, strict=True)) for row in result.result_rows]
    who = job_identities(client, ((r["cluster"], r["job_id"]) for r in read_rows))
    rows = []
    for row in read_rows:
        found = who.get((row["cluster"], row["job_id"], int(row["job_start"])))
        row.update(user_uid=found.uid if found else None, user_source=found.source if found else None,
                   claimed_user=found.claimed if found else None)  # fmt: skip
        # the identity is the usage's user (as charged) with the events' identifier of that job
        row["identity"] = identity_text(str(row["user"]), row["user_uid"])
        row["job_start"] = utc_text(int(row["job_start"]))
        rows.append({c: row[c] for c in EXPLAIN_COLUMNS})
    return rows


IDENTITY_SUMMARY_COLUMNS = ("identity", "user", "user_uid", "user_source", "jobs", "allocated_s", "charge")


def explain_identities(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The identities behind explain's rows: one per (name, identifier), never one per name, with their jobs,
    allocated seconds and charge (pure)."""
    out: dict[tuple[str, str | None], dict[str, Any]] = {}
    jobs: dict[tuple[str, str | None], set[tuple[str, str, str]]] = {}
    for row in rows:
        key = (str(row["user"]), row["user_uid"])
        line = out.setdefault(key, {"identity": row["identity"], "user": key[0], "user_uid": key[1],
                                    "user_source": row["user_source"], "jobs": 0, "allocated_s": 0,
                                    "charge": Decimal(0)})  # fmt: skip
        jobs.setdefault(key, set()).add((row["cluster"], row["job_id"], row["job_start"]))
        line["allocated_s"] += int(row["allocated_s"])
        line["charge"] += Decimal(row["charge"])
    for key, line in out.items():
        line["jobs"] = len(jobs[key])
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1] or ""))]


def utc_text(epoch_ms: int) -> str:
    """An epoch-millisecond time as ISO 8601 UTC to the second; 0 (unknown) as empty."""
    if epoch_ms == 0:
        return ""
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


ALERT_LIST_COLUMNS = ("ts_ms", "kind", "cluster", "job_id", "user", "team", "project", "idle_minutes", "message")


def recent_alerts(client: Any, *, limit: int = 50, kind: str | None = None) -> list[dict[str, Any]]:
    if limit <= 0 or limit > 10_000:
        raise ConfigError(f"--limit must be between 1 and 10000, got {limit}")
    result = client.query(
        f"SELECT {', '.join(ALERT_LIST_COLUMNS)} FROM alerts FINAL "
        "WHERE {kind:String} = '' OR kind = {kind:String} ORDER BY ts_ms DESC LIMIT {limit:UInt32}",
        parameters={"kind": kind or "", "limit": limit},
    )
    return [dict(zip(ALERT_LIST_COLUMNS, row, strict=True)) for row in result.result_rows]


# -- formatting -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def report_rows(report: ChargebackReport) -> list[dict[str, Any]]:
    return [{"period": report.period, "by": report.by, **asdict(line)} for line in (*report.lines, report.total)]


def to_csv(rows: list[dict[str, Any]], columns: Sequence[str] = ()) -> str:
    """CSV for spreadsheets and finance tools: a text cell that would start a formula is neutralised. No
    rows: the header of `columns` alone (a loader still finds its columns)."""
    if not rows:
        return csv_text(columns, []) if columns else ""
    header = list(rows[0])
    return csv_text(header, ([_plain(row.get(k)) for k in header] for row in rows))


def to_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps([{k: _plain(v) for k, v in row.items()} for row in rows], indent=2)


def write_parquet(rows: list[dict[str, Any]], path: Path, columns: Sequence[str] = ()) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Decimals become decimal128 columns (exact); no rows: the columns still, as text (no type to infer)
    empty = {c: pa.array([], pa.string()) for c in columns}
    table = pa.Table.from_pylist(rows) if rows else pa.table(empty)
    pq.write_table(table, path)


def render_table(title: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> Any:
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title))  # names and messages come from users: text, not markup
    for col in columns:
        numeric = (
            bool(rows)
            and isinstance(rows[0].get(col), int | float | Decimal)
            and not isinstance(rows[0].get(col), bool)
        )
        widest = max((len(str(row.get(col, ""))) for row in rows), default=0) if col == "line" else None
        table.add_column(col, justify="right" if numeric else "left", min_width=widest)  # a line's name whole
    for i, row in enumerate(rows):
        style = "bold" if row.get("line") == "TOTAL" and i == len(rows) - 1 else None
        table.add_row(*(escape(str(_plain(row.get(c, "")))) for c in columns), style=style)
    return table


# -- quota beside use -----------------------------------------------------------------------------

QUOTA_COLUMNS = ("period", "team", "generation", "allocated_gpu_h", "quota_gpu_h", "quota_used_pct")


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """A team's allocated GPU-hours of one generation in a month beside its guaranteed quota's hours
    (quota GPUs x the month's hours). `quota_used_pct` is None where the team has no quota there."""

    period: str
    team: str
    generation: str
    allocated_gpu_h: Decimal
    quota_gpu_h: Decimal
    quota_used_pct: float | None


def period_hours(period: str) -> int:
    import calendar

    year, month = (int(p) for p in check_period(period).split("-"))
    return calendar.monthrange(year, month)[1] * 24


def quota_lines(quota: Mapping[str, Mapping[str, int]], period: str,
                allocated_s: Mapping[tuple[str, str], int]) -> list[QuotaLine]:  # fmt: skip
    """Pure: `quota` team -> generation -> GPUs (the policy's), `allocated_s` (team, generation) -> seconds
    charged in `period`. One line per pair with a quota or with use, sorted."""
    from sinks.ratecard import gpu_hours

    hours = period_hours(period)
    pairs = {(t, g) for t, gens in quota.items() for g, n in gens.items() if n > 0} | set(allocated_s)
    out = []
    for team, gen in sorted(pairs):
        gpus = quota.get(team, {}).get(gen, 0)
        used = allocated_s.get((team, gen), 0)
        pct = None if gpus == 0 else round(100 * used / (gpus * hours * 3600), 1)
        out.append(QuotaLine(period, team, gen, gpu_hours(used), Decimal(gpus * hours), pct))
    return out


def quota_usage(client: Any, period: str, quota: Mapping[str, Mapping[str, int]]) -> list[QuotaLine]:
    """`quota_lines` over the month's allocated seconds per team and generation (v_chargeback_jobs) on owned
    hardware: quota is a share of the fleet, and cloud burst is not in the fleet."""
    from sinks.ratecard import ONPREM

    period = check_period(period)
    result = client.query(
        "SELECT team, generation, sum(allocated_s) FROM v_chargeback_jobs WHERE period = {period:String} "
        "AND pricing_tier = {tier:String} GROUP BY team, generation",
        parameters={"period": period, "tier": ONPREM},
    )
    return quota_lines(quota, period, {(str(t), str(g)): int(s) for t, g, s in result.result_rows})
