"""`gpuledger up`, `down` and `status`: the local stack from the command line.

Each command builds the stack's supervisor (`stack.local.supervisor`) and calls it; `stack/present.py` prints.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from stack import present
from stack.local import check_broker_address, supervisor
from stack.present import command_prefix, console, shlex_quote, web_url
from stack.supervisor import Supervisor

STATE_DIR_OPTION = typer.Option(None, "--state-dir", help="State directory (pid files, logs, data).")


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add `up`, `down` and `status` to the `gpuledger` command."""
    app.command("up")(up)
    app.command("down")(down)
    app.command("status")(status)


def _supervisor(state_dir: Path | None) -> Supervisor:
    return supervisor(state_dir, lambda msg: console.print(f"[dim]·[/] {msg}", highlight=False))


def up(
    state_dir: Path | None = STATE_DIR_OPTION,
    only: str | None = typer.Option(None, "--only", help="Comma-separated components to start."),
    wait_s: float = typer.Option(
        180, "--wait", help="Seconds to wait for the simulated cluster's first rollups (0: don't wait)."
    ),
) -> None:
    """Start the local stack in the background (broker, ClickHouse, topics, pipeline)."""
    sup = _supervisor(state_dir)
    check_broker_address(sup.settings)
    wanted = {n.strip() for n in only.split(",") if n.strip()} if only else None
    with console.status("starting the local stack…"):
        results = sup.up(wanted)
    console.print(present.components_table(results))
    sd = f" --state-dir {shlex_quote(str(state_dir))}" if state_dir else ""
    console.print(f"state: {sup.settings.state_dir}   logs: {sup.log_dir}   stop: {command_prefix()} down{sd}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    present.print_policy(sup.settings)
    running = {c.name for c in results if c.state in ("ready", "running", "done")}
    if {"simulator", "sinks"} <= running:
        present.wait_for_first_rollups(sup.settings, wait_s)
        present.print_next_steps(sup.settings, state_dir)
    if "web" in running:
        console.print(f"\n[bold]The team page:[/] {web_url(sup.settings)}", highlight=False, soft_wrap=True)


def down(state_dir: Path | None = STATE_DIR_OPTION) -> None:
    """Stop every component of the local stack; no process is left behind."""
    sup = _supervisor(state_dir)
    with console.status("stopping…"):
        stopped = sup.down()
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


def status(
    state_dir: Path | None = STATE_DIR_OPTION,
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
) -> None:
    """Each component's state, broker and topics, consumer lag, schema registry, ClickHouse and row counts."""
    sup = _supervisor(state_dir)
    st = sup.status()
    if as_json:
        typer.echo(json.dumps(st.to_json(), indent=2))
    else:
        present.print_status(st)
    if not st.healthy:
        raise typer.Exit(1)
