"""`gpuledger period close|list` and `gpuledger statement show|verify` (issue 19): statements that close.

    gpuledger period close 2026-11 [--by WHO] [--dry-run]   freeze every team's statement of the month
    gpuledger period list                                   the closed months
    gpuledger statement show --period 2026-11 [--team T]    a closed month's frozen statements, or an open
                                                            month's as they would close now
    gpuledger statement verify --period 2026-11             each stored hash beside the lines read back (exit 1
                                                            on a difference)

Each command calls one function of `sinks/statement_service.py`; the arithmetic is `sinks/statements.py`, the
reads and writes `sinks/statement_store.py`.
"""

from __future__ import annotations

import getpass
from pathlib import Path

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for
from sinks import present, statement_service
from sinks.periods import check_period

period_app = typer.Typer(help="Accounting periods: close a month (its statements frozen).", no_args_is_help=True)
statement_app = typer.Typer(help="Team statements: closed (frozen, hashed) or open (as of now).",
                            no_args_is_help=True)  # fmt: skip


@period_app.command("close")
def period_close(
    period: str = typer.Argument(..., help="The month to close, YYYY-MM (it must have ended)."),
    by: str | None = typer.Option(None, "--by", help="Who closes it (default: the current user)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the statements it would freeze; write nothing."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Freeze every team's statement of PERIOD: lines, rates, data-quality figures and a content hash. Later
    corrections, credits, late data and rate changes become adjustment lines of the next open month."""
    from sinks.data_quality import frozen_figure

    check_period(period)
    cid, statements = statement_service.close(settings_for(state_dir), period, by or getpass.getuser(),
                                              dry_run=dry_run)  # fmt: skip
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
    present.show(statement_service.closed_periods(settings_for(state_dir)), fmt)


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
    check_period(period)
    report = statement_service.statement_lines(settings_for(state_dir), period, team, table=fmt == "table")
    present.show(report, fmt, output)


@statement_app.command("verify")
def statement_verify(
    period: str = typer.Option(..., "--period", help="A closed month, YYYY-MM."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Recompute each closed statement's hash from its stored lines; exit 1 if any differs."""
    check_period(period)
    results = statement_service.verify(settings_for(state_dir), period)
    for v in results:
        state = "ok" if v.ok else f"MISMATCH (lines now hash to {v.recomputed_hash})"
        typer.echo(f"{v.statement_id} {v.team or '(no team)'}: sha256 {v.stored_hash} {state}")
    if not all(v.ok for v in results):
        raise typer.Exit(1)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    del inspect_app
    app.add_typer(period_app, name="period")
    app.add_typer(statement_app, name="statement")
