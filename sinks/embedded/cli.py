"""`gpuledger clickhouse serve` (the embedded ClickHouse) and `gpuledger sql` (SQL through it)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import typer

from gpuledger.errors import ConfigError, GpuledgerError, ServiceError
from gpuledger.settings import Settings


def _settings(state_dir: Path | None) -> Settings:
    return Settings(state_dir=state_dir) if state_dir is not None else Settings()


def serve(
    path: Path | None = typer.Option(None, "--path", help="Data directory (default: <state_dir>/clickhouse)."),
    host: str | None = typer.Option(None, "--host", help="Address to listen on (default: loopback)."),
    port: int | None = typer.Option(None, "--port", help="Port (default: from clickhouse.url, 8123; 0 = any free)."),
    max_body_mb: int = typer.Option(2048, "--max-body-mb", help="Largest request body accepted, in MiB."),
    session_timeout: float = typer.Option(60.0, "--session-timeout", help="Default idle expiry of a session, s."),
    max_sessions: int = typer.Option(256, "--max-sessions", help="Most sessions held at once."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Log every request (never passwords)."),
) -> None:
    """Run chDB behind the ClickHouse HTTP interface until SIGTERM/SIGINT."""
    from sinks.embedded.server import EmbeddedClickHouse, ServerConfig, User

    settings = _settings(state_dir)
    ch = settings.clickhouse
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    users = [User(ch.user, ch.password.get_secret_value(), readonly=0)]
    if ch.analyst_user and ch.analyst_user != ch.user:
        users.append(User(ch.analyst_user, ch.analyst_password.get_secret_value(), readonly=1))
    config = ServerConfig(
        path=(path or settings.clickhouse_path).resolve(),
        users=tuple(users),
        host=host or ch.host,
        port=ch.port if port is None else port,
        max_body_bytes=max_body_mb << 20,
        session_timeout_s=session_timeout,
        max_sessions=max_sessions,
    )
    server = EmbeddedClickHouse(config)

    def ready(url: str) -> None:
        names = ", ".join(f"{u.name} ({'read-only' if u.readonly else 'writer'})" for u in users)
        print(f"embedded ClickHouse listening on {url} (path {config.path}, users {names})", flush=True)

    server.serve_until_signalled(ready)


_QUERY_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})


def _parse_params(values: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--param takes name=value, got {item!r}")
        params[name] = value
    return params


def _one_line(exc: Exception) -> str:
    text = str(exc)
    start = text.find("Code: ")
    if start >= 0:
        text = text[start:]
        for marker in (" (version ", " (for url "):
            cut = text.find(marker)
            if cut > 0:
                text = text[:cut]
    return " ".join(text.split())


def run_sql(
    query: str,
    fmt: str,
    params: dict[str, str],
    settings: Settings,
    database: str | None,
    out: Any,
) -> None:
    """Run one statement through the configured ClickHouse and print its result."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError
    from rich.console import Console
    from rich.table import Table

    from sinks.embedded.sqltext import leading_keyword

    ch = settings.clickhouse
    scheme, _, _ = ch.url.partition("://")
    try:
        client = clickhouse_connect.get_client(
            interface=scheme or "http",
            host=ch.host,
            port=ch.port,
            username=ch.user,
            password=ch.password.get_secret_value(),
            autogenerate_session_id=False,
        )
    except ClickHouseError as exc:
        raise ServiceError(f"cannot reach ClickHouse at {ch.url}: {_one_line(exc)}") from None
    try:
        db = database if database is not None else ch.database
        if db and client.command("EXISTS DATABASE {db:Identifier}", parameters={"db": db}) == 1:
            client.database = db
        keyword = leading_keyword(query)
        if keyword not in _QUERY_KEYWORDS:
            result = client.command(query, parameters=params or None)
            if isinstance(result, (str, int)) and result != "":
                out.write(f"{result}\n")
            return
        if fmt == "table":
            res = client.query(query, parameters=params or None)
            table = Table(*res.column_names, header_style="bold")
            for row in res.result_rows:
                table.add_row(*("NULL" if v is None else str(v) for v in row))
            Console(file=out).print(table)
            rows = len(res.result_rows)
            Console(file=out).print(f"{rows} row{'s' if rows != 1 else ''}", style="dim")
            return
        server_fmt = {"csv": "CSVWithNames", "json": "JSONEachRow"}[fmt]
        data = client.raw_query(query, parameters=params or None, fmt=server_fmt)
        out.write(data.decode())
    except ClickHouseError as exc:
        raise ServiceError(_one_line(exc)) from None
    finally:
        client.close()


def sql(
    query: str = typer.Argument(..., help="One SQL statement."),
    fmt: str = typer.Option("table", "--format", "-f", help="table, csv or json (one object per line)."),
    param: list[str] = typer.Option([], "--param", "-p", help="Bound parameter name=value for {name:Type}."),
    database: str | None = typer.Option(None, "--database", "-d", help="Database (default: clickhouse.database)."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Run SQL through the ClickHouse server (the embedded one by default)."""
    from rich.console import Console

    try:
        if fmt not in ("table", "csv", "json"):
            raise ConfigError(f"--format must be table, csv or json, not {fmt!r}")
        run_sql(query, fmt, _parse_params(param), _settings(state_dir), database, sys.stdout)
    except GpuledgerError as exc:
        # One line whatever the terminal width: ClickHouse messages are long and rich would wrap them.
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    clickhouse_app = typer.Typer(help="The embedded ClickHouse (chDB behind the HTTP interface).", no_args_is_help=True)
    clickhouse_app.command("serve")(serve)
    app.add_typer(clickhouse_app, name="clickhouse")
    app.command("sql")(sql)
