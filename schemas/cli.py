"""Commands of the contracts: `gpuledger topics apply` and `gpuledger schemas check`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from streams.topics_admin import BrokerTopics, TopicPlan, desired_topics, plan

topics_app = typer.Typer(help="Kafka topics of the catalogue (plus each topic's .dlq).", no_args_is_help=True)
schemas_app = typer.Typer(help="The Avro contracts under schemas/.", no_args_is_help=True)

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


@schemas_app.command("check")
def schemas_check() -> None:
    """Check that every schema version reads data written with every older version (exit 1 if not)."""
    from schemas.evolution import main

    raise typer.Exit(main([]))


@schemas_app.command("export")
def schemas_export(
    dest: Path = typer.Argument(..., help="Directory to write the .avsc files (and history/) into."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Write every subject's schemas (latest and history/) and topics.json, for downstream consumers."""
    from base.settings import load_settings
    from schemas import DEFAULT_STORE
    from schemas.export import export_schemas

    written = export_schemas(DEFAULT_STORE, dest, load_settings(state_dir).kafka.topic_prefix)
    typer.echo(f"{len(written)} files written to {dest}")


@schemas_app.command("register")
def schemas_register(
    url: str | None = typer.Option(
        None, "--url", help="Registry URL (default: kafka.schema_registry_url, else the local stack's registry)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print what each subject holds as JSON."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Register every subject's history in order in the schema registry, compatibility BACKWARD (idempotent)."""
    from base.errors import ConfigError
    from base.settings import load_settings
    from schemas import DEFAULT_STORE
    from schemas.registry_sync import RegistryApi, plan, register_all
    from schemas.topics import all_topics

    settings = load_settings(state_dir)
    target = url or settings.registry_url
    if not target or target.startswith("mock://"):
        raise ConfigError(
            "no schema registry to register with: set kafka.schema_registry_url (GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL) "
            "or --url, or run the local one (registry.enabled with the local broker, `gpuledger up`)"
        )
    plans = plan(DEFAULT_STORE, all_topics(), settings.kafka.topic_prefix, settings.kafka.registry_subject)
    with RegistryApi(target) as api:
        done = register_all(api, plans)
    if as_json:
        typer.echo(json.dumps([asdict(d) | {"compatibility": "BACKWARD"} for d in done], indent=2))
        return
    table = Table(title=f"Schema registry subjects (compatibility BACKWARD), {escape(api.url)}")
    for column in ("subject", "versions", "ids", "new"):
        table.add_column(column, overflow="fold")
    for item in plans:
        mine = [d for d in done if d.subject == item.subject]
        table.add_row(
            escape(item.subject),
            ", ".join(str(d.version) for d in mine),
            ", ".join(str(d.schema_id) for d in mine),
            str(sum(d.created for d in mine)),
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    app.add_typer(topics_app, name="topics")
    app.add_typer(schemas_app, name="schemas")
