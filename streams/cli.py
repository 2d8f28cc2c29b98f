"""`gpuledger topics apply`: the catalogue's topics (and each one's .dlq) onto the broker
(`streams/topics_admin.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streams.topics_admin import BrokerTopics, TopicPlan, desired_topics, plan

topics_app = typer.Typer(help="Kafka topics of the catalogue (plus each topic's .dlq).", no_args_is_help=True)

_STATUS_STYLE = {
    "ok": "green",
    "created": "cyan",
    "updated": "cyan",
    "missing": "yellow",
    "differs": "yellow",
    "drift": "red",
    "error": "red",
}


def _table(plans: list[TopicPlan], applied: bool) -> Table:
    table = Table(title="Topics" + ("" if applied else " (check only, nothing changed)"))
    table.add_column("topic", no_wrap=True)
    for column in ("partitions", "cleanup.policy", "retention.ms", "status", "notes"):
        table.add_column(column, overflow="fold")
    for item in plans:
        actual = item.actual

        def cell(have: object, want: object) -> str:
            if have == want or (have is None and applied):
                return str(want)
            return f"{'-' if have is None else have} -> {want}"

        status = item.status(applied)
        notes = "; ".join(item.drift + ([item.error] if item.error else []))
        table.add_row(
            escape(item.name),
            cell(actual.partitions if actual else None, item.desired.partitions),
            cell(actual.configs.get("cleanup.policy") if actual else None, item.desired.configs["cleanup.policy"]),
            cell(actual.configs.get("retention.ms") if actual else None, item.desired.configs["retention.ms"]),
            f"[{_STATUS_STYLE.get(status, 'white')}]{status}[/]",
            escape(notes),  # broker errors are text, not markup
        )
    return table


@topics_app.command("apply")
def topics_apply(
    check: bool = typer.Option(False, "--check", help="Only report what differs; change nothing (exit 1 if any)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    replication: int | None = typer.Option(None, "--replication", min=1, help="Replication factor for every topic."),
    timeout_s: float = typer.Option(10.0, "--timeout", help="Seconds to wait for the broker."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Create missing topics (and their .dlq), raise partitions, set cleanup.policy/retention.ms; report drift."""
    from base.settings import load_settings

    kafka = load_settings(state_dir).kafka
    broker = BrokerTopics(kafka, timeout_s)
    wanted = desired_topics(kafka, replication)
    plans = plan(wanted, broker.state(w.name for w in wanted))
    if not check:
        broker.apply(plans)
        broker.wait_until_visible(plans)
    if as_json:
        typer.echo(json.dumps([p.as_json(applied=not check) for p in plans], indent=2))
    else:
        console = Console()
        if not console.is_terminal:  # piped or captured: keep whole rows rather than 80 columns
            console = Console(width=200)
        console.print(_table(plans, applied=not check))
    failed = any(p.error for p in plans)
    if failed or (check and not all(p.in_sync for p in plans)):
        raise typer.Exit(1)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this layer's commands to the `gpuledger` command."""
    app.add_typer(topics_app, name="topics")
