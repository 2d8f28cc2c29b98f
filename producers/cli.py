"""Commands of this component (filled in by its issue)."""

from __future__ import annotations

import typer


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
