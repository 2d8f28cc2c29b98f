"""`python -m stack.clickhouse clickhouse serve ...`: the same commands without loading other components."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape

from base.errors import GpuledgerError
from base.outputs import install_log_masking
from stack.clickhouse.cli import register


def main() -> None:
    app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
    register(app, typer.Typer())
    install_log_masking()
    try:
        app()
    except GpuledgerError as exc:
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
