"""Scheduler commands (`inspect slurm`, `policy render`, `attribution correct`): filled in by their owner."""

from __future__ import annotations

import typer


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add the scheduler sources' commands to the `gpuledger` command."""
