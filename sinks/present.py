"""How the sinks' commands print: rows as a table, CSV, JSON or Parquet (`emit`), a `sinks.reports.Report`
with what a table prints under it (`show`), and the rate card's arithmetic as a table. Output only: the rows
and figures come from the report code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from base.errors import ConfigError

if TYPE_CHECKING:
    from sinks.ratecard import RateCard
    from sinks.reports import Report


def emit(rows: list[dict[str, Any]], fmt: str, output: Path | None, title: str, columns: tuple[str, ...]) -> None:
    """`rows` in `fmt` (table, csv, json, parquet) to stdout, or to `output` (parquet needs one)."""
    from sinks import chargeback as cb

    if fmt not in cb.FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(cb.FORMATS)}, got {fmt!r}")
    if fmt == "parquet":
        if output is None:
            raise ConfigError("--format parquet needs --output FILE")
        cb.write_parquet(rows, output, columns)
        typer.echo(f"wrote {len(rows)} rows to {output}")
        return
    if fmt == "table":
        Console(width=220).print(cb.render_table(title, rows, columns))
        return
    text = cb.to_csv(rows, columns) if fmt == "csv" else cb.to_json(rows) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {len(rows)} rows to {output}")


def show(report: Report, fmt: str, output: Path | None = None) -> None:
    """A report: a machine-readable output's rows carry its data-quality figure and baseline mark as columns; a
    table prints them, and whatever else the report puts under it, as lines below itself (and its `above`
    lines first)."""
    rows = report.rows
    if fmt != "table":
        for figure in (report.quality, report.marked):
            if figure is not None:
                rows = [{**row, **figure.columns()} for row in rows]
    else:
        for line in report.above:
            typer.echo(line)
    emit(rows, fmt, output, report.title, report.columns)
    if fmt != "table":
        return
    for item in report.under:
        if isinstance(item, str):
            typer.echo(item)
        else:
            show(item, fmt)


def rate_card_table(rc: RateCard) -> None:
    """Every rate of the card and the arithmetic that produced it."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(f"rate card {rc.version} ({rc.currency} per GPU-hour)"), show_lines=True)
    for col in ("generation", "tier", "preemptible", "from", "rate", "arithmetic"):
        table.add_column(col, justify="right" if col == "rate" else "left")
    for r in rc.rates():
        how = "\n".join(f"{what}: {text}" for what, text in r.steps)
        cells = (r.generation, r.pricing_tier, "yes" if r.preemptible else "no", r.effective_from.isoformat(),
                 str(r.per_gpu_hour), how)  # fmt: skip
        table.add_row(*map(escape, cells))  # the card's names are text, not markup
    Console(width=max(Console().width, 160)).print(table)
