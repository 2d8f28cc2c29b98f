"""`gpuledger period close|list` and `gpuledger statement show|verify` (issue 19): statements that close.

    gpuledger period close 2026-11 [--by WHO] [--dry-run]   freeze every team's statement of the month
    gpuledger period list                                   the closed months
    gpuledger statement show --period 2026-11 [--team T]    a closed month's frozen statements, or an open
                                                            month's as they would close now
    gpuledger statement verify --period 2026-11             each stored hash beside the lines read back (exit 1
                                                            on a difference)

The arithmetic is `sinks/statements.py`, the reads and writes `sinks/statement_store.py`.
"""

from __future__ import annotations

import getpass
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for
from base.errors import ConfigError
from base.settings import Settings
from sinks.cli import _client, _emit, _warehouse_errors

period_app = typer.Typer(help="Accounting periods: close a month (its statements frozen).", no_args_is_help=True)
statement_app = typer.Typer(help="Team statements: closed (frozen, hashed) or open (as of now).",
                            no_args_is_help=True)  # fmt: skip

STATEMENT_LINE_COLUMNS = (
    "period", "team", "statement", "kind", "source_period", "cluster", "job_id", "user", "project", "cost_centre",
    "generation", "pricing_tier", "preemptible", "rate_per_gpu_hour", "allocated_gpu_h", "charge", "cause_kind",
    "cause_ref", "note",
)  # fmt: skip
TABLE_COLUMNS = ("team", "kind", "source_period", "job_id", "project", "generation", "pricing_tier",
                 "allocated_gpu_h", "charge", "cause_kind", "cause_ref")  # fmt: skip
CLOSED_COLUMNS = ("period", "closed_at", "closed_by", "statements", "total_charge", "close_id")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _charges(settings: Settings, client: Any) -> list[Any]:
    """Credits (appeals granted as credit) and reservation charges, judged under the settings' policy."""
    from sinks.governance_charges import configured_charges

    return configured_charges(settings, client, _now_ms())


def _team_quality(statement: Any, state: str) -> Any:
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
        quality = _team_quality(s, state)
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


@period_app.command("close")
def period_close(
    period: str = typer.Argument(..., help="The month to close, YYYY-MM (it must have ended)."),
    by: str | None = typer.Option(None, "--by", help="Who closes it (default: the current user)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the statements it would freeze; write nothing."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Freeze every team's statement of PERIOD: lines, rates, data-quality figures and a content hash. Later
    corrections, credits, late data and rate changes become adjustment lines of the next open month."""
    from sinks import statement_store as store_mod
    from sinks.chargeback import check_period
    from sinks.data_quality import frozen_figure
    from sinks.statements import check_closable

    check_period(period)
    settings = settings_for(state_dir)
    client = _client(settings)
    with _warehouse_errors():
        store = store_mod.StatementStore(client)
        charges = _charges(settings, client)
        if dry_run:
            check_closable(period, _now_ms(), store.closes(), store.months_with_usage())
            statements = store_mod.prepare(store, period, charges)
            cid = "(dry run)"
        else:
            cid, statements = store_mod.close_period(store, period, by or getpass.getuser(), _now_ms(), charges)
    for s in statements:
        parts = ", ".join(f"{kind} {s.total(kind)}" for kind in ("usage", "adjustment", "credit", "reservation"))
        typer.echo(f"{s.statement_id}  {s.team or '(no team)'}: {s.total()} over {len(s.lines)} lines ({parts}; "
                   f"coverage {s.coverage_pct}%)  sha256 {s.content_hash}")
    verb = "would close" if dry_run else "closed"
    typer.echo(f"{period} {verb}: {len(statements)} statements, close {cid}")
    quality = frozen_figure(period, (s.quality for s in statements))
    if quality is not None:
        typer.echo(f"frozen with it: {quality.text()}")


@period_app.command("list")
def period_list(
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The closed months: when, by whom, how many statements, the total."""
    import datetime as dt

    from sinks.statement_store import StatementStore

    settings = settings_for(state_dir)
    with _warehouse_errors():
        closes = StatementStore(_client(settings, analyst=True)).closes()
    rows = [{"period": c.period, "closed_at": dt.datetime.fromtimestamp(c.closed_ms / 1000, dt.UTC).isoformat(),
             "closed_by": c.closed_by, "statements": c.statements, "total_charge": c.total_charge,
             "close_id": c.close_id} for c in sorted(closes.values(), key=lambda c: c.period)]  # fmt: skip
    _emit(rows, fmt, None, "closed periods", CLOSED_COLUMNS)


@statement_app.command("show")
def statement_show(
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
    team: str | None = typer.Option(None, "--team", help="Only this team's statement."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o"),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """A month's statement lines: frozen when the month is closed, as it would close now when open; each team's
    with its month against the attribution baseline."""
    from sinks import statement_store as store_mod
    from sinks.baseline import baseline_now, month_marks
    from sinks.chargeback import check_period

    check_period(period)
    settings = settings_for(state_dir)
    client = _client(settings, analyst=True)
    with _warehouse_errors():
        store = store_mod.StatementStore(client)
        if period in store.closes():
            statements: Sequence[Any] = store.statements(period)
            state = "closed"
        else:
            statements = store_mod.prepare(store, period, _charges(settings, client))
            state = "open"
        marks = month_marks(client, period, baseline_now(client))  # issue 38: the months before the baseline
    chosen = [s for s in statements if team is None or s.team == team]
    if team is not None and not chosen:
        raise ConfigError(f"no statement for team {team!r} in {period}")
    rows = line_rows(chosen, state, marks)
    notes: dict[str, list[str]] = {}
    if fmt == "table":
        from sinks.identities import cluster_identities, self_declared_notes

        with _warehouse_errors():
            notes = {s.team: self_declared_notes(cluster_identities(client, period, s.team)) for s in chosen
                     if s.team}  # fmt: skip
        for s in chosen:
            total = getattr(s, "total_charge", None) or s.total()
            typer.echo(f"{s.period} {s.team or '(no team)'} [{state}] total {total}  statement "
                       f"{s.statement_id}")  # fmt: skip
            typer.echo(f"  {marks.team(s.team).text()}")
            quality = _team_quality(s, state)
            if quality is not None:
                typer.echo(f"  {quality.text()}")
            for note in notes.get(s.team, []):  # where the team's jobs' names are only self-declared (issue 38)
                typer.echo(f"  data quality (the ledger now): {note}" if state == "closed" else f"  {note}")
    _emit(rows, fmt, output, f"statements {period} ({state})", TABLE_COLUMNS if fmt == "table" else
          STATEMENT_LINE_COLUMNS)  # fmt: skip


@statement_app.command("verify")
def statement_verify(
    period: str = typer.Option(..., "--period", help="A closed month, YYYY-MM."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Recompute each closed statement's hash from its stored lines; exit 1 if any differs."""
    from sinks.chargeback import check_period
    from sinks.statement_store import StatementStore, verify

    check_period(period)
    settings = settings_for(state_dir)
    with _warehouse_errors():
        store = StatementStore(_client(settings, analyst=True))
        if period not in store.closes():
            raise ConfigError(f"period {period} is not closed")
        results = verify(store, period)
    for v in results:
        state = "ok" if v.ok else f"MISMATCH (lines now hash to {v.recomputed_hash})"
        typer.echo(f"{v.statement_id} {v.team or '(no team)'}: sha256 {v.stored_hash} {state}")
    if not all(v.ok for v in results):
        raise typer.Exit(1)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    del inspect_app
    app.add_typer(period_app, name="period")
    app.add_typer(statement_app, name="statement")
