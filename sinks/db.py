"""ClickHouse access for the sinks and reports: one client factory and the migration runner.

The product talks to ClickHouse only through clickhouse-connect (HTTP), the embedded chDB server
included. Tables, materialized views and data moves live in `sinks/migrations/NNN_name.sql`, applied once
each and recorded in `schema_migrations`; plain views live in `sinks/views/<name>.sql`, one file per view
(sinks/view_files.py), applied after the migrations and recorded in `schema_views`. `gpuledger db migrate`
is safe to run any number of times.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from base.errors import ConfigError, ServiceError
from base.settings import ClickHouseSettings
from sinks.view_files import ViewFile, load_views

# Matched whole (`fullmatch`): `$` would also accept a trailing newline.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MIGRATION_NAME = re.compile(r"(\d{3})_([a-z0-9_]+)\.sql")
# A migration whose text was rewritten once on purpose (its views moved to sinks/views) names the checksum its
# old text was recorded with, so a database that applied the old text upgrades without re-running it.
_SUPERSEDED = re.compile(r"^-- superseded-checksum: ([0-9a-f]{16})\b", re.MULTILINE)
# Server errors that mean "this server has no SQL access management", not "the SQL is wrong".
_NO_ACCESS_MANAGEMENT = {"ACCESS_DENIED", "UNKNOWN_ROLE", "ACCESS_STORAGE_READONLY", "SUPPORT_IS_DISABLED"}

MIGRATIONS_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS schema_migrations
(
    version UInt32,
    name String,
    checksum String,
    status LowCardinality(String),
    detail String,
    applied_ms Int64
)
ENGINE = ReplacingMergeTree(applied_ms)
ORDER BY version
"""

VIEWS_TABLE_DDL = """
CREATE TABLE IF NOT EXISTS schema_views
(
    name String,
    checksum String,
    status LowCardinality(String),
    applied_ms Int64
)
ENGINE = ReplacingMergeTree(applied_ms)
ORDER BY name
"""


def connect(ch: ClickHouseSettings, *, analyst: bool = False, database: str | None = None, **kwargs: Any) -> Any:
    """A clickhouse-connect client for the writer (default) or the read-only analyst user."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    user = ch.analyst_user if analyst else ch.user
    password = (ch.analyst_password if analyst else ch.password).get_secret_value()
    scheme = ch.url.split("://", 1)[0] if "://" in ch.url else "http"
    kwargs.setdefault("autogenerate_session_id", False)
    driver_log = logging.getLogger("clickhouse_connect")
    level = driver_log.level
    driver_log.setLevel(logging.CRITICAL)  # the error below says it once, in one line
    try:
        client = clickhouse_connect.get_client(
            host=ch.host,
            port=ch.port,
            interface="https" if scheme == "https" else "http",
            username=user,
            password=password,
            **kwargs,
        )
    except ClickHouseError as exc:
        raise ServiceError(f"cannot reach ClickHouse at {ch.url} as {user!r}: {_one_line(exc)}") from None
    finally:
        driver_log.setLevel(level)
    # Set after the handshake, so connecting works before `gpuledger db migrate` made the database.
    client.database = check_identifier(database if database is not None else ch.database)
    return client


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def check_identifier(name: str) -> str:
    if not _IDENT.fullmatch(name):
        raise ConfigError(f"not a valid ClickHouse identifier: {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    @property
    def superseded_checksums(self) -> frozenset[str]:
        return frozenset(_SUPERSEDED.findall(self.sql))

    @property
    def needs_access_management(self) -> bool:
        return "-- requires: access-management" in self.sql

    def statements(self, *, database: str, raw_sample_ttl_days: int) -> list[str]:
        """The file's statements with its two placeholders filled: a checked identifier and an int."""
        text = self.sql.replace("{database}", check_identifier(database)).replace(
            "{raw_sample_ttl_days}", str(int(raw_sample_ttl_days))
        )
        out = []
        for chunk in re.split(r";\s*(?:\n|$)", text):
            body = "\n".join(line for line in chunk.splitlines() if not line.strip().startswith("--")).strip()
            if body:
                out.append(body)
        return out


def load_migrations(folder: Path | Traversable | None = None) -> list[Migration]:
    """Every `NNN_name.sql` in the folder (default: the package's sinks/migrations), in version order."""
    folder = folder if folder is not None else resources.files("sinks") / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION_NAME.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(f"duplicate migration versions in sinks/migrations: {versions}")
    return found


@dataclass(frozen=True, slots=True)
class MigrationResult:
    version: int
    name: str
    status: str  # applied, already-applied, skipped
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ViewResult:
    name: str
    status: str  # created (new file), changed (its file changed), unchanged, dropped (its file was removed)


@dataclass(frozen=True, slots=True)
class Upgrade:
    migrations: list[MigrationResult]
    views: list[ViewResult]


def _error_name(exc: Exception) -> str:
    match = re.search(r"\(([A-Z_]+)\)", str(exc))
    return match.group(1) if match else ""


def migrate(
    client: Any,
    ch: ClickHouseSettings,
    *,
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
) -> list[MigrationResult]:
    """`upgrade` (the migrations, then the views); return what happened to each migration."""
    return upgrade(client, ch, clock_ms=clock_ms).migrations


def upgrade(
    client: Any,
    ch: ClickHouseSettings,
    *,
    clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    migrations_dir: Path | Traversable | None = None,
    views_dir: Path | Traversable | None = None,
) -> Upgrade:
    """Apply every migration not yet recorded, in version order, then the views folder; say what happened.

    Files are read and checked before anything runs, so a bad view file stops `db migrate` before any DDL.
    """
    migrations = load_migrations(migrations_dir)
    views = load_views(views_dir)
    database = check_identifier(ch.database)
    client.database = ""  # the ledger database may not exist yet
    client.command(f"CREATE DATABASE IF NOT EXISTS {database}")
    client.database = database  # unqualified names in the migrations land in the ledger database
    applied = _apply_migrations(client, ch, database, migrations, clock_ms)
    return Upgrade(
        applied,
        _apply_views(client, database, views, clock_ms, tables_changed=any(r.status == "applied" for r in applied)),
    )


def _apply_migrations(
    client: Any, ch: ClickHouseSettings, database: str, migrations: list[Migration], clock_ms: Callable[[], int]
) -> list[MigrationResult]:
    from clickhouse_connect.driver.exceptions import DatabaseError

    client.command(MIGRATIONS_TABLE_DDL.replace("schema_migrations", f"{database}.schema_migrations"))
    rows = client.query(f"SELECT version, checksum, status FROM {database}.schema_migrations FINAL").result_rows
    done = {int(v): (c, s) for v, c, s in rows}
    results = []
    for mig in migrations:
        if mig.version in done and done[mig.version][1] == "applied":
            recorded = done[mig.version][0]
            if recorded != mig.checksum and recorded not in mig.superseded_checksums:
                raise ConfigError(
                    f"migration {mig.version:03d}_{mig.name} changed after it was applied; add a new migration instead"
                )
            if recorded != mig.checksum:  # the old text, applied: record the new one so the next run reads it
                _record(client, database, mig, "applied", "text rewritten (views moved)", clock_ms())
            results.append(MigrationResult(mig.version, mig.name, "already-applied"))
            continue
        status, detail = "applied", ""
        try:
            for statement in mig.statements(database=database, raw_sample_ttl_days=ch.raw_sample_ttl_days):
                client.command(statement)
        except DatabaseError as exc:
            if mig.needs_access_management and _error_name(exc) in _NO_ACCESS_MANAGEMENT:
                status, detail = "skipped", f"server has no SQL access management ({_error_name(exc)})"
            else:
                raise ServiceError(f"migration {mig.version:03d}_{mig.name} failed: {exc}") from exc
        _record(client, database, mig, status, detail, clock_ms())
        results.append(MigrationResult(mig.version, mig.name, status, detail))
    return results


def _record(client: Any, database: str, mig: Migration, status: str, detail: str, applied_ms: int) -> None:
    """A migration's row, right after it ran (a failure later must not run it again), as one bound statement: a
    row is too small for the insert path's spooled body."""
    client.command(
        f"INSERT INTO {database}.schema_migrations (version, name, checksum, status, detail, applied_ms) VALUES "
        "({version:UInt32}, {name:String}, {checksum:String}, {status:String}, {detail:String}, {applied_ms:Int64})",
        parameters={
            "version": mig.version,
            "name": mig.name,
            "checksum": mig.checksum,
            "status": status,
            "detail": detail,
            "applied_ms": applied_ms,
        },
    )


def _apply_views(
    client: Any, database: str, views: list[ViewFile], clock_ms: Callable[[], int], *, tables_changed: bool
) -> list[ViewResult]:
    """Create or replace every view, dependencies first, when anything changed; drop the ones whose file is gone.

    When anything changed (a migration applied, a view file new or edited or removed, a view missing from
    the server) every view is re-created, not only the edited ones: a view stores its columns when created,
    so a `SELECT *` view, and every view above an edited one, must be created again to see new columns.
    CREATE OR REPLACE swaps each view atomically, so a report reading meanwhile sees the old or the new one.
    """
    from clickhouse_connect.driver.exceptions import DatabaseError

    client.command(VIEWS_TABLE_DDL.replace("schema_views", f"{database}.schema_views"))
    rows = client.query(f"SELECT name, checksum, status FROM {database}.schema_views FINAL").result_rows
    recorded = {str(n): str(c) for n, c, s in rows if s != "dropped"}
    present = {
        str(r[0])
        for r in client.query(
            "SELECT name FROM system.tables WHERE database = {db:String} AND engine = 'View'",
            parameters={"db": database},
        ).result_rows
    }
    wanted = {v.name for v in views}
    gone = sorted(recorded.keys() - wanted)
    stale = (
        tables_changed or bool(gone) or any(recorded.get(v.name) != v.checksum or v.name not in present for v in views)
    )
    results = []
    # Recorded in one insert after the DDL: a view created and not yet recorded (a failure half-way) only counts
    # as new again, and every view is created again then anyway (CREATE OR REPLACE).
    records: list[list[Any]] = []
    for name in gone:
        client.command(f"DROP VIEW IF EXISTS {database}.{check_identifier(name)}")
        records.append([name, "", "dropped", clock_ms()])
        results.append(ViewResult(name, "dropped"))
    for view in views:
        before = recorded.get(view.name)
        status = "created" if before is None else "unchanged" if before == view.checksum else "changed"
        if stale:
            try:
                client.command(view.statement)
            except DatabaseError as exc:
                raise ServiceError(f"{view.path} failed: {_one_line(exc)}") from exc
        if status != "unchanged":
            records.append([view.name, view.checksum, "applied", clock_ms()])
        results.append(ViewResult(view.name, status))
    if records:
        client.insert(f"{database}.schema_views", records, column_names=["name", "checksum", "status", "applied_ms"])
    return results
