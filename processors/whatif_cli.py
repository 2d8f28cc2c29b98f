"""`gpuledger policy whatif --policy proposed.yaml --period YYYY-MM [--against current]` (issue 43).

Wiring only: the month comes from the warehouse (`sinks.whatif.load_month`), is replayed through the live idle
state machine under the proposal's idle rules (`processors.whatif.replay`), priced by the live views over the
proposal's rate card (`sinks.whatif.proposed_prices`) and put beside the month as stored (`sinks.whatif.compare`).
Nothing is enforced and nothing is written: every query is a read.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for
from base.errors import ConfigError
from base.processor_settings import IdlePolicy
from base.settings import Settings
from schemas.policy import Policy, PolicyError, load_policy

AGAINST = ("current",)


def _policy_or_exit(path: Path) -> Policy:
    """The policy, or one line per problem (`file:line: what`) and exit 2: nothing runs."""
    try:
        return load_policy(path)
    except PolicyError as exc:
        for line in exc.problems:
            typer.echo(line, err=True)
        raise typer.Exit(2) from exc


def whatif(
    client: Any,
    settings: Settings,
    period: str,
    proposal: Policy,
    by: str = "team",
    base_idle: IdlePolicy | None = None,
) -> Any:
    """The comparison of `period` as stored with the same month under `proposal` (a `sinks.whatif.Comparison`):
    `sinks.whatif.whatif` with the live idle state machine's replay (`processors.whatif.replay_month`)."""
    from processors.whatif import replay_month, run_classes
    from sinks import whatif as compare

    return compare.whatif(client, settings, period, proposal, by, replay_month, int(time.time() * 1000), base_idle,
                          run_classes())  # fmt: skip


def policy_whatif(
    policy_path: Path = typer.Option(..., "--policy", help="The proposed policy.yaml (optional idle: section)."),
    period: str = typer.Option(..., "--period", help="The month to replay, YYYY-MM."),
    against: str = typer.Option(
        "current", "--against", help="What the proposal is put beside: current (the month as the ledger holds it)."
    ),
    by: str = typer.Option("team", "--by", help="team, project or generation."),
    show: str = typer.Option(
        "lines", "--show", help="lines (per team/project/generation), events (which jobs, when) or reservations "
        "(the proposal's rules refuse or end them otherwise)."
    ),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """What last month would have looked like under a proposed policy: warnings, reclaims, released GPU-hours,
    charges and quota queueing, beside the month as it was. Enforces nothing, writes nothing."""
    from sinks.chargeback import render_table, to_csv, to_json
    from sinks.periods import check_period
    from sinks.warehouse import client as _client
    from sinks.warehouse import warehouse_errors as _warehouse_errors
    from sinks.whatif import BY_CHOICES, EVENT_COLUMNS, LINE_COLUMNS, RESERVATION_COLUMNS

    if against not in AGAINST:
        raise ConfigError(f"--against must be one of {', '.join(AGAINST)}, got {against!r}")
    if by not in BY_CHOICES:
        raise ConfigError(f"--by must be one of {', '.join(BY_CHOICES)}, got {by!r}")
    if show not in ("lines", "events", "reservations"):
        raise ConfigError(f"--show must be lines, events or reservations, got {show!r}")
    if fmt not in ("table", "csv", "json"):
        raise ConfigError(f"--format must be table, csv or json, got {fmt!r}")
    check_period(period)
    proposal = _policy_or_exit(policy_path)  # before any query: a bad proposal runs nothing
    settings = settings_for(state_dir)
    with _warehouse_errors():
        result = whatif(_client(settings), settings, period, proposal, by)
    rows, columns = {"lines": (result.lines, LINE_COLUMNS), "events": (result.events, EVENT_COLUMNS),
                     "reservations": (result.reservations, RESERVATION_COLUMNS)}[show]  # fmt: skip
    if fmt == "table":
        from rich.console import Console

        title = f"what if {policy_path.name}, {period}, by {by}" if show == "lines" else f"what if: {show}, {period}"
        console = Console(width=220)
        console.print(render_table(title, rows, columns))
        for text in result.assumptions:
            console.print(f"assumes: {text}", highlight=False, markup=False)
        return
    if fmt == "json":
        rows = [{"period": period, "by": by, **r, "assumptions": list(result.assumptions)} for r in rows]
        sys.stdout.write(to_json(rows) + "\n")
        return
    # csv: the assumptions ride on every row, so a sheet opened alone still says what the figures assume
    stated = " | ".join(result.assumptions)
    sys.stdout.write(to_csv([{"period": period, **r, "assumptions": stated} for r in rows],
                            ("period", *columns, "assumptions")))  # fmt: skip


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add `policy whatif` to the `policy` group (registered before this module by producers.scheduler_cli)."""
    from producers.scheduler_cli import policy_app

    policy_app.command("whatif")(policy_whatif)
