"""What `gpuledger period close|list` and `gpuledger statement show|verify` do (issue 19): a month's
statements closed, listed, shown as rows, verified. The arithmetic is `sinks/statements.py`, the reads and
writes `sinks/statement_store.py`; `sinks/present.py` prints.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from base.errors import ConfigError
from base.settings import Settings
from sinks.reports import Report
from sinks.warehouse import client, now_ms, warehouse_errors

STATEMENT_LINE_COLUMNS = (
    "period", "team", "statement", "kind", "source_period", "cluster", "job_id", "user", "project", "cost_centre",
    "generation", "pricing_tier", "preemptible", "rate_per_gpu_hour", "allocated_gpu_h", "charge", "cause_kind",
    "cause_ref", "note",
)  # fmt: skip
TABLE_COLUMNS = ("team", "kind", "source_period", "job_id", "project", "generation", "pricing_tier",
                 "allocated_gpu_h", "charge", "cause_kind", "cause_ref")  # fmt: skip
CLOSED_COLUMNS = ("period", "closed_at", "closed_by", "statements", "total_charge", "close_id")


def _charges(settings: Settings, db: Any) -> list[Any]:
    """Credits (appeals granted as credit) and reservation charges, judged under the settings' policy."""
    from sinks.governance_charges import configured_charges

    return configured_charges(settings, db, now_ms())


def team_quality(statement: Any, state: str) -> Any:
    """The data-quality figure a statement froze (or, open, would freeze): its team's jobs; None if it has none."""
    if statement.quality is None:
        return None
    scope = f"{statement.period} {statement.team or '(no team)'}" + (" as closed" if state == "closed" else "")
    return statement.quality.figure(scope, frozen=state == "closed")


def line_rows(statements: Iterable[Any], state: str, marks: Any = None) -> list[dict[str, Any]]:
    """A row per line; each carries its statement's data-quality figure as dq_* columns when it has one, and its
    team's attribution baseline mark (`marks`, sinks/baseline.py MonthMarks) when given."""
    from decimal import Decimal

    from sinks.ratecard import gpu_hours

    rows = []
    for s in statements:
        quality = team_quality(s, state)
        dq = {} if quality is None else quality.columns()
        if marks is not None:
            dq = {**dq, **marks.team(s.team).columns()}
        for line in s.lines:
            rows.append({
                "period": s.period, "team": s.team, "statement": state, "kind": line.kind,
                "source_period": line.source_period, "cluster": line.cluster, "job_id": line.job_id,
                "user": line.user, "project": line.project, "cost_centre": line.cost_centre,
                "generation": line.generation, "pricing_tier": line.pricing_tier, "preemptible": line.preemptible,
                "rate_per_gpu_hour": (Decimal(line.rate_micro) / 1_000_000).quantize(Decimal("0.000001")),
                "allocated_gpu_h": gpu_hours(line.allocated_s), "charge": line.charge, "cause_kind": line.cause_kind,
                "cause_ref": line.cause_ref, "note": line.note, **dq,
            })  # fmt: skip
    rows.sort(key=lambda r: (r["team"], ("usage", "adjustment", "reservation", "credit").index(r["kind"]),
                             r["job_id"], r["project"], r["generation"], r["rate_per_gpu_hour"]))  # fmt: skip
    return rows


def close(settings: Settings, period: str, by: str, *, dry_run: bool) -> tuple[str, list[Any]]:
    """`period close`: every team's statement of `period` frozen (with `dry_run`, only prepared after the same
    checks); (the close id, the statements)."""
    from sinks import statement_store as store_mod
    from sinks.statements import check_closable

    db = client(settings)
    with warehouse_errors():
        store = store_mod.StatementStore(db)
        charges = _charges(settings, db)
        if dry_run:
            check_closable(period, now_ms(), store.closes(), store.months_with_usage())
            return "(dry run)", list(store_mod.prepare(store, period, charges))
        cid, statements = store_mod.close_period(store, period, by, now_ms(), charges)
    return cid, list(statements)


def closed_periods(settings: Settings) -> Report:
    """`period list`: the closed months, when, by whom, how many statements, the total."""
    from sinks.statement_store import StatementStore

    with warehouse_errors():
        closes = StatementStore(client(settings, analyst=True)).closes()
    rows = [{"period": c.period, "closed_at": dt.datetime.fromtimestamp(c.closed_ms / 1000, dt.UTC).isoformat(),
             "closed_by": c.closed_by, "statements": c.statements, "total_charge": c.total_charge,
             "close_id": c.close_id} for c in sorted(closes.values(), key=lambda c: c.period)]  # fmt: skip
    return Report("closed periods", CLOSED_COLUMNS, rows)


def statement_lines(settings: Settings, period: str, team: str | None, *, table: bool) -> Report:
    """`statement show`: a month's statement lines, frozen when it is closed, as it would close now when open; a
    table has each statement's total, baseline mark, data-quality figure and identity notes above it."""
    from sinks import statement_store as store_mod
    from sinks.baseline import baseline_now, month_marks

    db = client(settings, analyst=True)
    with warehouse_errors():
        store = store_mod.StatementStore(db)
        if period in store.closes():
            statements: Sequence[Any] = store.statements(period)
            state = "closed"
        else:
            statements = store_mod.prepare(store, period, _charges(settings, db))
            state = "open"
        marks = month_marks(db, period, baseline_now(db))  # issue 38: the months before the baseline
    chosen = [s for s in statements if team is None or s.team == team]
    if team is not None and not chosen:
        raise ConfigError(f"no statement for team {team!r} in {period}")
    rows = line_rows(chosen, state, marks)
    title = f"statements {period} ({state})"
    if not table:
        return Report(title, STATEMENT_LINE_COLUMNS, rows)
    return Report(title, TABLE_COLUMNS, rows, above=_heads(db, period, chosen, state, marks))


def _heads(db: Any, period: str, chosen: list[Any], state: str, marks: Any) -> list[str]:
    """The lines above a statements table: each statement's total, its baseline mark and data-quality figure, and
    where its team's jobs' names are only self-declared (issue 38)."""
    from sinks.identities import cluster_identities, self_declared_notes

    with warehouse_errors():
        notes = {s.team: self_declared_notes(cluster_identities(db, period, s.team)) for s in chosen if s.team}
    lines = []
    for s in chosen:
        total = getattr(s, "total_charge", None) or s.total()
        lines.append(f"{s.period} {s.team or '(no team)'} [{state}] total {total}  statement {s.statement_id}")
        lines.append(f"  {marks.team(s.team).text()}")
        quality = team_quality(s, state)
        if quality is not None:
            lines.append(f"  {quality.text()}")
        for note in notes.get(s.team, []):
            lines.append(f"  data quality (the ledger now): {note}" if state == "closed" else f"  {note}")
    return lines


def verify(settings: Settings, period: str) -> list[Any]:
    """`statement verify`: each closed statement's stored hash beside its lines' hash now."""
    from sinks.statement_store import StatementStore, verify

    with warehouse_errors():
        store = StatementStore(client(settings, analyst=True))
        if period not in store.closes():
            raise ConfigError(f"period {period} is not closed")
        return list(verify(store, period))
