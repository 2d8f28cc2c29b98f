"""Commands of the producers component: telemetry sources and the scheduler sources, each in its module."""

from __future__ import annotations

import typer

from producers.scheduler_cli import register as register_scheduler
from producers.telemetry_cli import register as register_telemetry


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    register_telemetry(app, inspect_app)
    register_scheduler(app, inspect_app)
