"""Commands of the producers component: telemetry sources and the scheduler sources, each in its module."""

from __future__ import annotations

import typer

from producers import scheduler_cli, telemetry_cli


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    telemetry_cli.register(app, inspect_app)
    scheduler_cli.register(app, inspect_app)
