"""`gpuledger clickhouse serve` (the embedded ClickHouse), `clickhouse dsn` and `gpuledger sql` (SQL through it).

Each command parses its options and calls `stack/clickhouse/service.py` (the server's configuration, one statement
run and printed, the DSN text).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from base.cli_common import settings_for, start_service
from base.errors import ConfigError, GpuledgerError
from stack.clickhouse.service import dsn_text, parse_params, run_sql, server_config


def serve(
    path: Path | None = typer.Option(None, "--path", help="Data directory (default: <state_dir>/clickhouse)."),
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default: loopback)."),
    port: int | None = typer.Option(None, "--port", help="Port (default: from clickhouse.url, 8123; 0 = any free)."),
    max_body_mb: int = typer.Option(2048, "--max-body-mb", help="Largest request body accepted, in MiB."),
    session_timeout: float = typer.Option(60.0, "--session-timeout", help="Default idle expiry of a session, s."),
    max_sessions: int = typer.Option(256, "--max-sessions", help="Most sessions held at once."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every request (never passwords)."),
    allow_empty_password: bool = typer.Option(
        False, "--allow-empty-password", help="Start even when a user has no password (tests only)."
    ),
) -> None:
    """Run chDB behind the ClickHouse HTTP interface until SIGTERM/SIGINT."""
    from stack.clickhouse.server import EmbeddedClickHouse

    config = server_config(start_service(state_dir, verbose), path=path, host=host, port=port, max_body_mb=max_body_mb,
                           session_timeout=session_timeout, max_sessions=max_sessions,
                           allow_empty_password=allow_empty_password)  # fmt: skip

    def ready(url: str) -> None:
        names = ", ".join(f"{u.name} ({'read-only' if u.readonly else 'writer'})" for u in config.users)
        print(f"embedded ClickHouse listening on {url} (path {config.path}, users {names})", flush=True)

    EmbeddedClickHouse(config).serve_until_signalled(ready)


def sql(
    query: str = typer.Argument(..., help="One SQL statement."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json (one object per line)."),
    param: list[str] = typer.Option([], "--param", "-p", help="Bound parameter name=value for {name:Type}."),
    database: str | None = typer.Option(None, "--database", "-d", help="Database (default: clickhouse.database)."),
    writer: bool = typer.Option(False, "--writer", help="Run as the writer (DDL, inserts) instead of the analyst."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Run SQL through the ClickHouse server (the embedded one by default), as the read-only analyst."""
    try:
        if fmt not in ("table", "csv", "json"):
            raise ConfigError(f"--format must be table, csv or json, not {fmt!r}")
        run_sql(query, fmt, parse_params(param), settings_for(state_dir), database, sys.stdout, writer=writer)
    except GpuledgerError as exc:
        _print_error(exc)
        raise typer.Exit(2) from None


def _print_error(exc: GpuledgerError) -> None:
    from rich.console import Console
    from rich.markup import escape

    # One line whatever the terminal width: ClickHouse messages are long and rich would wrap them.
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)


def dsn(
    analyst: bool = typer.Option(False, "--analyst", help="The read-only analyst (the default)."),
    writer: bool = typer.Option(False, "--writer", help="The writer (sinks, migrations) instead of the analyst."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Print the ClickHouse URL WITH ITS PASSWORD and a clickhouse-connect snippet: what to paste into
    DBeaver, Grafana or a notebook. Showing the secret is the purpose of this command; keep its
    output out of shared terminals, tickets and logs."""
    if analyst and writer:
        raise ConfigError("--analyst and --writer exclude each other")
    sys.stdout.write(dsn_text(settings_for(state_dir), writer=writer))


clickhouse_app = typer.Typer(help="The embedded ClickHouse (chDB behind the HTTP interface).", no_args_is_help=True)
clickhouse_app.command("serve")(serve)
clickhouse_app.command("dsn")(dsn)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    app.add_typer(clickhouse_app, name="clickhouse")
    app.command("sql")(sql)
