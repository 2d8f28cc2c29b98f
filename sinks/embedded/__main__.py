"""`python -m sinks.embedded clickhouse serve ...`: the same commands without loading other components."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from gpuledger.errors import GpuledgerError
from sinks.embedded.cli import register


def main() -> None:
    app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
    register(app, typer.Typer())
    try:
        app()
    except GpuledgerError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
