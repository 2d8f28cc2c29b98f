"""The embedded ClickHouse and SQL as the commands use them (`stack/clickhouse/cli.py`): the server's
configuration from the settings (`server_config`), one statement run and printed (`run_sql`), and the DSN a
person pastes into a tool (`dsn_text`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from base.errors import ConfigError, ServiceError
from base.outputs import csv_cell
from base.settings import Settings


def server_config(settings: Settings, *, path: Path | None, host: str | None, port: int | None, max_body_mb: int,
                  session_timeout: float, max_sessions: int, allow_empty_password: bool) -> Any:  # fmt: skip
    """`clickhouse serve`'s ServerConfig: the writer and the read-only analyst of the settings, with their limits;
    a passwordless user is refused unless `allow_empty_password` (tests)."""
    from stack.clickhouse.server import AnalystLimits, ServerConfig, User

    ch = settings.clickhouse
    users = [User(ch.user, ch.password.get_secret_value(), readonly=0)]
    if ch.analyst_user and ch.analyst_user != ch.user:
        users.append(User(ch.analyst_user, ch.analyst_password.get_secret_value(), readonly=1))
    if not allow_empty_password:
        _refuse_empty_passwords(settings, [u.name for u in users if not u.password])
    return ServerConfig(
        path=(path or settings.clickhouse_path).resolve(),
        users=tuple(users),
        host=host or ch.host,
        port=ch.port if port is None else port,
        max_body_bytes=max_body_mb << 20,
        max_query_bytes=ch.max_query_kb << 10,
        session_timeout_s=session_timeout,
        max_sessions=max_sessions,
        max_connections=ch.max_connections,
        ledger_database=ch.database,
        analyst_limits=AnalystLimits(
            max_execution_time_s=ch.analyst_limits.max_execution_time_s,
            max_memory_usage_bytes=ch.analyst_limits.max_memory_mb << 20,
            max_result_rows=ch.analyst_limits.max_result_rows,
            max_result_bytes=ch.analyst_limits.max_result_mb << 20,
            max_threads=ch.analyst_limits.max_threads,
        ),
    )


def _refuse_empty_passwords(settings: Settings, names: list[str]) -> None:
    """One line, exit 2: an embedded server with a passwordless user is open to every local process."""
    from stack.security import materials

    if names:
        raise ConfigError(
            f"refusing to serve with an empty password for ClickHouse user {', '.join(repr(n) for n in names)}: "
            f"`gpuledger up` generates them into {materials(settings.state_dir).dir}; or set "
            "clickhouse.password_file and clickhouse.analyst_password_file; --allow-empty-password is for tests"
        )


_QUERY_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})


def parse_params(values: list[str]) -> dict[str, str]:
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


_CSV_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def neutralise_clickhouse_csv(text: str) -> str:
    """ClickHouse's CSV with each text cell a spreadsheet would run as a formula neutralised
    (`base.outputs.csv_cell`). ClickHouse quotes every string and prints numbers bare, so only
    quoted fields can hold text and everything else is kept byte for byte."""

    def cell(m: re.Match[str]) -> str:
        value = m.group(1).replace('""', '"')
        safe = csv_cell(value)
        return m.group(0) if safe == value else '"' + safe.replace('"', '""') + '"'

    return _CSV_QUOTED.sub(cell, text)


def run_sql(
    query: str,
    fmt: str,
    params: dict[str, str],
    settings: Settings,
    database: str | None,
    out: Any,
    *,
    writer: bool = False,
) -> None:
    """Run one statement through the configured ClickHouse, as the analyst unless `writer`, and print it."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from stack.clickhouse.sqltext import leading_keyword

    ch = settings.clickhouse
    scheme, _, _ = ch.url.partition("://")
    try:
        client = clickhouse_connect.get_client(
            interface=scheme or "http",
            host=ch.host,
            port=ch.port,
            username=ch.user if writer else ch.analyst_user,
            password=(ch.password if writer else ch.analyst_password).get_secret_value(),
            autogenerate_session_id=False,
        )
    except ClickHouseError as exc:
        who = ch.user if writer else ch.analyst_user
        raise ServiceError(f"cannot reach ClickHouse at {ch.url} as {who!r}: {_one_line(exc)}") from None
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
            # Cells are data, not markup: a value like `[/]` or `[link=...]` is printed as it is.
            table = Table(*(escape(name) for name in res.column_names), header_style="bold")
            for row in res.result_rows:
                table.add_row(*("NULL" if v is None else escape(str(v)) for v in row))
            Console(file=out).print(table)
            rows = len(res.result_rows)
            Console(file=out).print(f"{rows} row{'s' if rows != 1 else ''}", style="dim")
            return
        server_fmt = {"csv": "CSVWithNames", "json": "JSONEachRow"}[fmt]
        text = client.raw_query(query, parameters=params or None, fmt=server_fmt).decode()
        out.write(neutralise_clickhouse_csv(text) if fmt == "csv" else text)
    except ClickHouseError as exc:
        raise ServiceError(_one_line(exc)) from None
    finally:
        client.close()


def dsn_text(settings: Settings, *, writer: bool = False) -> str:
    """The URL (password included) of the analyst, or of the writer, and how tools use it."""
    from urllib.parse import quote

    from stack.security import materials

    ch = settings.clickhouse
    user, secret = (ch.user, ch.password) if writer else (ch.analyst_user, ch.analyst_password)
    password = secret.get_secret_value()
    if not user:
        raise ConfigError("no analyst user is configured (clickhouse.analyst_user); use --writer")
    if not password and ch.embedded:
        raise ConfigError(
            f"ClickHouse user {user!r} has no password yet: `gpuledger up` generates it into "
            f"{materials(settings.state_dir).dir}, or set clickhouse.{'' if writer else 'analyst_'}password_file"
        )
    scheme = ch.url.split("://", 1)[0] if "://" in ch.url else "http"
    login = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    url = f"{scheme}://{login}@{ch.host}:{ch.port}/{quote(ch.database, safe='')}"
    interface = ", interface='https'" if scheme == "https" else ""
    return (
        f"{url}\n\n"
        "# clickhouse-connect (Python)\n"
        "import clickhouse_connect\n"
        f"client = clickhouse_connect.get_client(host={ch.host!r}, port={ch.port}{interface}, "
        f"username={user!r}, password={password!r}, database={ch.database!r})\n\n"
        f"# DBeaver, Grafana: ClickHouse over {scheme.upper()}, host {ch.host}, port {ch.port}, "
        f"database {ch.database}, user {user}, password as in the URL above\n"
    )
