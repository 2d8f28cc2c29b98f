"""The `gpuledger` command. Each component registers its own sub-commands here."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from base.cli_common import settings_for
from base.errors import GpuledgerError
from base.outputs import install_log_masking

app = typer.Typer(
    help="gpuledger: who holds which GPU, whether it computes, and what that costs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
inspect_app = typer.Typer(help="Check a source before turning anything on.", no_args_is_help=True)
app.add_typer(inspect_app, name="inspect")

err_console = Console(stderr=True, soft_wrap=True)

# Modules that add commands: each exposes `register(app, inspect_app)`.
_COMMAND_MODULES = (
    "stack.cli",
    "stack.clickhouse.cli",
    "stack.kube.cli",
    "stack.slurm.cli",
    "stack.two_engines_cli",
    "schemas.cli",
    "streams.cli",
    "producers.cli",
    "processors.cli",
    "sinks.cli",
    "web.cli",
    "sinks.statement_cli",
    "sinks.appeal_cli",
    "sinks.reserve_cli",
    "sinks.escalate_cli",
    "processors.whatif_cli",  # adds `policy whatif` to producers' `policy` group, so it comes after it
)


# The modules that add to each top-level command. A command imports only its own (a call then costs about half
# the CPU: the modules' imports are most of it); anything else (`--help`, a mistyped name) imports them all.
# tests/unit/test_cli_modules.py derives this from what each module registers and fails when it differs.
MODULES_BY_COMMAND: dict[str, tuple[str, ...]] = {
    "alerts": ("sinks.cli",),
    "appeal": ("sinks.appeal_cli",),
    "attribution": ("producers.cli",),
    "chat": ("sinks.cli",),
    "clickhouse": ("stack.clickhouse.cli",),
    "db": ("sinks.cli",),
    "dcgm": ("producers.cli",),
    "dev": ("stack.kube.cli", "stack.slurm.cli", "stack.two_engines_cli"),
    "down": ("stack.cli",),
    "escalate": ("sinks.escalate_cli",),
    "inspect": ("producers.cli",),
    "inventory": ("producers.cli",),
    "kube": ("producers.cli",),
    "nvsmi": ("producers.cli",),
    "period": ("sinks.statement_cli",),
    "policy": ("producers.cli", "processors.whatif_cli"),
    "processors": ("processors.cli",),
    "ratecard": ("sinks.cli",),
    "reclaim": ("sinks.cli",),
    "report": ("sinks.cli",),
    "reserve": ("sinks.reserve_cli",),
    "schemas": ("schemas.cli",),
    "settings": (),
    "simulate": ("producers.cli",),
    "sink": ("sinks.cli",),
    "slurm": ("producers.cli",),
    "sql": ("stack.clickhouse.cli",),
    "statement": ("sinks.statement_cli",),
    "status": ("stack.cli",),
    "topics": ("streams.cli",),
    "up": ("stack.cli",),
    "web": ("web.cli",),
}


def modules_for(argv: list[str]) -> tuple[str, ...]:
    """The command modules a call needs, in registration order: its command's, or all of them."""
    command = argv[0] if argv and not argv[0].startswith("-") else None
    wanted = MODULES_BY_COMMAND.get(command or "")
    return _COMMAND_MODULES if wanted is None else tuple(m for m in _COMMAND_MODULES if m in wanted)


def _register(modules: tuple[str, ...]) -> None:
    for name in modules:
        module = importlib.import_module(name)
        module.register(app, inspect_app)


def _register_all() -> None:
    _register(_COMMAND_MODULES)


@app.command("settings")
def show_settings(
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Print the effective settings, secrets masked."""
    import json

    typer.echo(json.dumps(settings_for(state_dir).masked(), indent=2))


def main() -> None:
    install_log_masking()  # every log line of every command and component, whoever configures logging
    _register(modules_for(sys.argv[1:]))
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as exc:
        _report_usage_error(exc)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except GpuledgerError as exc:
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)  # masked, not markup
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


def _report_usage_error(exc: Exception) -> None:
    """A bad argument gets one line naming the problem and where the help is, never a panel."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())
        sys.exit(0)
    message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    err_console.print(f"[bold red]error:[/] {escape(message + where)}", highlight=False)
    sys.exit(getattr(exc, "exit_code", 2))
