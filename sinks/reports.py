"""What the report commands show (`gpuledger report chargeback|explain|journal`, `alerts`): each a `Report` read
from the ledger, the rows and, for a table, the lines and tables printed under it. The figures are the
report code's (`sinks/chargeback.py`, `sinks/reconcile.py`, `sinks/statement_store.py`); how a report is printed
is `sinks/present.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base.errors import ConfigError
from base.settings import Settings
from sinks.warehouse import client, now_ms, warehouse_errors

ADJUSTMENT_COLUMNS = ("posted_in", "team", "job_id", "project", "charge", "cause_kind", "cause_ref")


@dataclass(frozen=True, slots=True)
class Report:
    """Rows to print or write. `quality` / `marked`: the data-quality figure and the baseline mark a
    machine-readable output carries as columns of every row (a table prints their lines in `under` instead);
    `above` / `under`: what a table prints above and below itself, in order (below: a line or another report)."""

    title: str
    columns: tuple[str, ...]
    rows: list[dict[str, Any]]
    quality: Any = None
    marked: Any = None
    under: list[str | Report] = field(default_factory=list)
    above: list[str] = field(default_factory=list)


def _closed_title(title: str, closed: Any) -> str:
    if closed is None:
        return title
    return title + f" (closed {closed.close_id[:12]} by {closed.closed_by}: the frozen statements)"


def chargeback(settings: Settings, period: str, by: str, *, table: bool) -> Report:
    """`report chargeback --by team|project|user|cost-centre|tier`: the month charged on allocation, the frozen
    statements of a closed month; under a table, its findings and the adjustments posted since it closed."""
    from sinks import chargeback as cb
    from sinks.baseline import month_mark
    from sinks.statement_store import StatementStore, adjustments_since, month_quality

    db = client(settings, analyst=True)
    with warehouse_errors():
        store = StatementStore(db)
        closed = store.closes().get(period)
        report = cb.chargeback(db, period, by, closed=closed is not None)
        since = adjustments_since(store, period) if closed is not None and table else []
        quality = month_quality(store, period, closed is not None)
        marked = month_mark(db, period)
    columns = ("line", *[c for c in cb.LINE_COLUMNS if c != "line"])
    under: list[str | Report] = []
    if table:
        under += [marked.text(), quality.text()]
        # The findings behind the figure are read from the ledger now: a frozen figure keeps its own numbers.
        with warehouse_errors():
            unknown = cb.unidentified(db, period)
        if unknown.jobs and not quality.frozen:
            under.append(f"data quality: {unknown.gpu_h} GPU-h of {unknown.jobs} job(s) on devices no source "
                         f"identified (device_uuid {cb.UNIDENTIFIED_PREFIX}*: charged per device, counted dark)")
        under += findings(db, period, quality.frozen)
        if closed is not None:
            rows = [{"posted_in": where, "team": a.team, "job_id": a.job_id, "project": a.project, "charge": a.charge,
                     "cause_kind": a.cause_kind, "cause_ref": a.cause_ref} for where, a in since]  # fmt: skip
            under.append(Report(f"adjustments to {period} since it closed", ADJUSTMENT_COLUMNS, rows))
    return Report(_closed_title(f"chargeback {period} by {by}", closed), columns, cb.report_rows(report), quality,
                  marked, under)  # fmt: skip


def chargeback_by_cluster(settings: Settings, period: str, *, table: bool) -> Report:
    """`report chargeback --by cluster`: a line per (team, cluster), each team's total across clusters (cluster
    ALL), and the device-seconds two clusters both claimed (charged once, sinks/reconcile.py)."""
    from sinks import reconcile
    from sinks.baseline import month_mark
    from sinks.statement_store import StatementStore, month_quality

    db = client(settings, analyst=True)
    with warehouse_errors():
        store = StatementStore(db)
        closed = store.closes().get(period)
        report = reconcile.chargeback_by_cluster(db, period, closed=closed is not None)
        quality = month_quality(store, period, closed is not None)
        marked = month_mark(db, period)
    under: list[str | Report] = [marked.text(), quality.text(), *findings(db, period, quality.frozen)] if table else []
    return Report(_closed_title(f"chargeback {period} by cluster", closed), reconcile.CLUSTER_COLUMNS,
                  reconcile.report_rows(report), quality, marked, under)  # fmt: skip


def findings(db: Any, period: str, frozen: bool) -> list[str]:
    """The data-quality findings under a table, read from the ledger now: devices two clusters' jobs both claimed
    (naming both), each cluster whose jobs' users are only self-declared (no admission stamp seen), and how many
    self-declared users disagreed with the verified one (issue 38)."""
    from sinks import reconcile
    from sinks.identities import cluster_identities

    label = "data quality (the ledger now)" if frozen else "data quality"
    with warehouse_errors():
        overlaps = reconcile.overlaps(db, period)
        clusters = cluster_identities(db, period, None)
    lines = [f"{label}: {overlap.text()}" for overlap in overlaps]
    for cluster in clusters:
        note = cluster.note()
        if note is not None:
            lines.append(f"{label}: {note}")
        if cluster.claimed_user_jobs:
            lines.append(f"{label}: on {cluster.cluster}, {cluster.claimed_user_jobs} job(s) named a user other than "
                         "their verified submitter (charged to the submitter)")
    return lines


def quota(settings: Settings, period: str, policy_path: Path | None) -> Report:
    """`report chargeback --quota`: per team and generation, allocated GPU-hours beside the policy's quota."""
    from schemas.policy import load_policy
    from sinks import chargeback as cb

    chosen = policy_path or settings.policy_path
    if chosen is None:
        raise ConfigError("--quota needs a policy: pass --policy FILE or set policy_path (GPULEDGER_POLICY_PATH)")
    policy = load_policy(chosen)
    with warehouse_errors():
        lines = cb.quota_usage(client(settings, analyst=True), period, {t.name: t.quota for t in policy.teams})
    return Report(f"quota use {period}", cb.QUOTA_COLUMNS, [dataclasses.asdict(line) for line in lines])


def explain(settings: Settings, period: str, project: str) -> Report:
    """`report explain`: the jobs behind a project's charge and their data-quality figure; under a table, one
    line per identity behind them (a name recreated with another identifier is two)."""
    from sinks import chargeback as cb
    from sinks.data_quality import data_quality

    db = client(settings, analyst=True)
    with warehouse_errors():
        rows = cb.explain(db, period, project)
        quality = data_quality(db, period, project)
    identities = Report(f"identities behind {project} in {period}", cb.IDENTITY_SUMMARY_COLUMNS,
                        cb.explain_identities(rows))  # fmt: skip
    return Report(f"jobs behind {project} in {period}", cb.EXPLAIN_COLUMNS, rows, quality,
                  under=[identities, quality.text()])  # fmt: skip


def seconds(settings: Settings, cluster: str, node: str, start: str, minutes: int, device: str | None, *,
            from_kafka: bool = False) -> Report:  # fmt: skip
    """`report seconds`: a node's (or a device's) per-second samples for `minutes` from `start` (ISO 8601 with a
    zone), from the warehouse or, when it keeps minutes only or `from_kafka`, from Kafka (sinks/seconds.py); the
    line under a table says which, and what the warehouse keeps."""
    import datetime as dt

    from sinks import seconds as sec
    from sinks.seconds_kept import SecondsKept

    try:
        at = dt.datetime.fromisoformat(start)
    except ValueError as exc:
        raise ConfigError(f"--start must be ISO 8601 with a zone (2026-12-07T10:03:00Z), got {start!r}") from exc
    if at.tzinfo is None:
        raise ConfigError(f"--start needs a zone (Z or +hh:mm), got {start!r}")
    if not 1 <= minutes <= 60:
        raise ConfigError(f"--minutes must be 1-60, got {minutes}")
    start_ms = int(at.timestamp() * 1000)
    kept = SecondsKept.of(settings.clickhouse)
    with warehouse_errors():
        found = sec.device_seconds(kept, lambda: client(settings, analyst=True), settings.kafka, cluster, node,
                                   start_ms, start_ms + minutes * 60_000, device, from_kafka_=from_kafka)  # fmt: skip
    what = f"{device} on {node}" if device else node
    return Report(f"seconds of {what} ({cluster}) from {at.isoformat()} for {minutes} min", sec.SECOND_COLUMNS,
                  found.rows, under=[f"{len(found.rows):,} device-seconds {found.note()}"])  # fmt: skip


def journal(settings: Settings, period: str, *, account: str, contra_account: str | None,
            contra_cost_centre: str | None) -> Report:  # fmt: skip
    """`report journal`: the finance export of `period` (sinks/journal.py), from its frozen statements when it is
    closed, else as it would close now; every line carries the month's data-quality figure."""
    from sinks.governance_charges import configured_charges
    from sinks.journal import JOURNAL_COLUMNS
    from sinks.statement_store import StatementStore, journal, month_quality

    contra = contra_cost_centre or settings.cluster_cost_centre or f"CLUSTER-{settings.cluster}"
    db = client(settings, analyst=True)
    with warehouse_errors():
        store = StatementStore(db)
        lines = journal(store, period, lambda: configured_charges(settings, db, now_ms()),
                        account=account, contra_cost_centre=contra, contra_account=contra_account)  # fmt: skip
        quality = month_quality(store, period, bool(lines) and lines[0].status == "closed")
    return Report("", JOURNAL_COLUMNS, [dataclasses.asdict(line) for line in lines], quality)


def alerts(settings: Settings, limit: int, kind: str | None) -> Report:
    """`gpuledger alerts`: the most recent alerts in the ledger."""
    from sinks import chargeback as cb

    with warehouse_errors():
        rows = cb.recent_alerts(client(settings, analyst=True), limit=limit, kind=kind)
    return Report("recent alerts", cb.ALERT_LIST_COLUMNS, rows)
