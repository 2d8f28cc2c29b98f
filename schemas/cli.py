"""Commands of the contracts: `gpuledger schemas check|export|register` (`gpuledger topics apply`, which talks to
the broker, is the stream runtime's: `streams/cli.py`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

schemas_app = typer.Typer(help="The Avro contracts under schemas/.", no_args_is_help=True)


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
    app.add_typer(schemas_app, name="schemas")
