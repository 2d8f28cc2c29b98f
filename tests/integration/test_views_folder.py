"""The views folder (sinks/views, one file per view) on the real engine: moving every view out of the
migrations changed no object's definition, and a database that applied the old migrations upgrades to
exactly what a fresh one gets. Saying each view once (variants and fragments, sinks/view_files.py) changed no
definition either: the folder before that change, from git, and the folder now build identical databases.

The old layout is read from git (`git show <commit>:sinks/migrations/...`), the migrations as they were
before the views moved, and applied by the same applier (sinks/db.py `upgrade`) as the new one. Objects are
compared as the server describes them (system.tables create_table_query: columns, engine, the view's query
as the server formats it), with only the database name and whitespace normalised.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from base.settings import ClickHouseSettings
from sinks.db import connect, load_migrations, upgrade
from sinks.view_files import load_views

REPO = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def _move_commit() -> str | None:
    """The commit that added sinks/views (the move); None in a work tree that has not committed it yet."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "sinks/views").split()
    return added[-1] if added else None


def _said_once_commit() -> str | None:
    """The commit that added sinks/views/fragments (views said once); None before it is committed."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "sinks/views/fragments").split()
    return added[-1] if added else None


def _layout(rev: str, dest: Path) -> tuple[Path, Path]:
    """sinks/migrations and sinks/views (its subfolders included) as they were at `rev`, written under dest."""
    out = {}
    for folder in ("migrations", "views"):
        target = dest / folder
        target.mkdir(parents=True)
        for path in _git("ls-tree", "-r", "--name-only", f"{rev}:sinks/{folder}").split() if _has(rev, folder) else []:
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            (target / path).write_text(_git("show", f"{rev}:sinks/{folder}/{path}"), encoding="utf-8")
        out[folder] = target
    return out["migrations"], out["views"]


def _has(rev: str, folder: str) -> bool:
    return bool(_git("ls-tree", "--name-only", rev, f"sinks/{folder}").strip())


def _definitions(client: Any, database: str) -> dict[str, tuple[str, str]]:
    rows = client.query(
        "SELECT name, engine, create_table_query FROM system.tables WHERE database = {db:String}",
        parameters={"db": database},
    ).result_rows
    return {
        str(name): (str(engine), " ".join(re.sub(rf"\b{database}\.", "DB.", str(query)).split()))
        for name, engine, query in rows
    }


@pytest.fixture
def databases(clickhouse_server: Any) -> Iterator[Any]:
    made: list[str] = []
    clients: list[Any] = []

    def make() -> tuple[ClickHouseSettings, Any]:
        name = "views_" + uuid.uuid4().hex[:12]
        made.append(name)
        ch = ClickHouseSettings(url=clickhouse_server.url, database=name, password=clickhouse_server.password,
                                analyst_password=clickhouse_server.analyst_password)  # fmt: skip
        client = connect(ch)
        clients.append(client)
        return ch, client

    yield make
    admin = clickhouse_server.client()
    for name in made:
        admin.command(f"DROP DATABASE IF EXISTS {name} SYNC")
    admin.close()
    for client in clients:
        client.close()


def test_moving_the_views_changed_no_definition(databases: Any, tmp_path: Path) -> None:
    move = _move_commit()
    old_rev, new_rev = (f"{move}^", move) if move else ("HEAD", None)
    old_migrations, old_views = _layout(old_rev, tmp_path / "old")
    assert not list(old_views.iterdir()), "the old layout has no views folder"
    assert sum("CREATE OR REPLACE VIEW" in p.read_text() for p in old_migrations.iterdir()) > 10
    new_migrations, new_views = _layout(new_rev, tmp_path / "new") if new_rev else (None, None)

    old_ch, old_client = databases()
    upgrade(old_client, old_ch, migrations_dir=old_migrations, views_dir=old_views)
    new_ch, new_client = databases()
    done = upgrade(new_client, new_ch, migrations_dir=new_migrations, views_dir=new_views)

    old, new = _definitions(old_client, old_ch.database), _definitions(new_client, new_ch.database)
    views = {n for n, (engine, _) in old.items() if engine == "View"}
    assert len(views) >= 36 and {v.name for v in done.views} == views  # every plain view came from the folder
    assert {n for n, (e, _) in old.items() if e == "MaterializedView"} >= {"usage_daily_mv", "node_daily_mv"}
    assert sorted(old) == sorted(new)
    # One difference, and it is the old layout's: a view stores its columns' types when created. Migration 023
    # created v_usage_priced (and 022 v_chargeback_jobs above it) while v_job_lives read job_events; 027 then
    # re-pointed v_job_lives at the job_lives rollup, whose job_start_ms is SimpleAggregateFunction(min, Int64),
    # and the two views kept the Int64 they had stored. Created after every table, as now, they store the type
    # their query has. Same query text, same values (the type is Int64 underneath).
    stale = {"v_usage_priced", "v_chargeback_jobs"}
    saf = "`job_start_ms` SimpleAggregateFunction(min, Int64)"
    assert {n for n in old if old[n] != new[n]} == stale
    assert all(saf not in old[n][1] and saf in new[n][1] for n in stale)
    assert {n: (old[n], new[n][0], new[n][1].replace(saf, "`job_start_ms` Int64")) for n in stale} == {
        n: (old[n], *old[n]) for n in stale
    }


def test_saying_each_view_once_changed_no_definition(databases: Any, tmp_path: Path) -> None:
    """The views as whole files (the commit before the fragments and variants) and as that commit said them: every
    object of the two databases, as system.tables describes it, is identical. Both sides come from that commit, so
    a later migration or view change (a new column, a new table) is not read as a change the move made."""
    said_once = _said_once_commit()
    old_migrations, old_views = _layout(f"{said_once}^" if said_once else "HEAD", tmp_path / "old")
    assert not (old_views / "fragments").exists()
    restated = {"v_chargeback_month_single", "v_usage_priced_single", "v_job_lives"}  # now variants
    assert all((old_views / f"{n}.sql").is_file() and not (REPO / f"sinks/views/{n}.sql").exists() for n in restated)

    old_ch, old_client = databases()
    upgrade(old_client, old_ch, migrations_dir=old_migrations, views_dir=old_views)
    new_ch, new_client = databases()
    if said_once:
        new_migrations, new_views = _layout(said_once, tmp_path / "new")
        done = upgrade(new_client, new_ch, migrations_dir=new_migrations, views_dir=new_views)
    else:  # not committed yet: the package's folder
        done = upgrade(new_client, new_ch)

    old, new = _definitions(old_client, old_ch.database), _definitions(new_client, new_ch.database)
    views = {n for n, (engine, _) in old.items() if engine == "View"}
    assert len(views) >= 36 and {v.name for v in done.views} == views and restated <= views
    assert old == new
    # The line's columns, said once in a fragment, are in each of the six chargeback views the server holds.
    line_views = {n for n, (_, query) in new.items() if "AS idle_cost" in query and "leftover_cents" in query}
    assert line_views == {"v_chargeback", "v_chargeback_month", "v_chargeback_month_single",
                          "v_chargeback_month_clusters", "v_statement_month", "v_statement_month_clusters"}  # fmt: skip


def test_an_old_database_upgrades_to_what_a_fresh_one_gets(databases: Any, tmp_path: Path) -> None:
    move = _move_commit()
    old_migrations, old_views = _layout(f"{move}^" if move else "HEAD", tmp_path / "old")
    ch, client = databases()
    upgrade(client, ch, migrations_dir=old_migrations, views_dir=old_views)
    client.command("INSERT INTO rate_card (generation) VALUES ('hopper')")

    first = upgrade(client, ch)  # the new db-migrate on a database the old migrations built
    old_versions = len(list(old_migrations.iterdir()))
    assert {r.status for r in first.migrations[:old_versions] if r.name != "analyst_role"} == {"already-applied"}
    assert {v.status for v in first.views} == {"created"}
    fresh_ch, fresh = databases()
    upgrade(fresh, fresh_ch)
    assert _definitions(client, ch.database) == _definitions(fresh, fresh_ch.database)
    assert client.query("SELECT count() FROM rate_card").result_rows == [(1,)]  # nothing re-ran over the data

    again = upgrade(client, ch)
    assert {r.status for r in again.migrations if r.name != "analyst_role"} == {"already-applied"}
    assert {v.status for v in again.views} == {"unchanged"}
    recorded = dict(client.query("SELECT version, checksum FROM schema_migrations FINAL").result_rows)
    assert recorded == {m.version: m.checksum for m in load_migrations()}  # the rewritten files' new checksums
    # A parameterised view answers after the upgrade, its {period:String} and {by:String} bound by the server.
    lines = "SELECT count() FROM v_chargeback_month(period = {p:String}, by = 'team')"
    assert client.query(lines, parameters={"p": "2026-11"}).result_rows == [(0,)]


def test_an_edited_view_is_reported_changed_and_a_removed_one_dropped(databases: Any, tmp_path: Path) -> None:
    package = REPO / "sinks"
    views = tmp_path / "views"
    shutil.copytree(package / "views", views)
    ch, client = databases()
    assert {v.status for v in upgrade(client, ch, views_dir=views).views} == {"created"}

    # A new column in the view that computes it: the views that read it are re-created with it.
    jobs = views / "v_chargeback_jobs.sql"
    jobs.write_text(jobs.read_text().replace(" AS\nSELECT", " AS\nSELECT 1 AS probe_column,", 1))
    (views / "v_coverage_daily.sql").unlink()
    # A fragment edited: every view that includes it is changed, a variant of an including file too.
    sums = views / "fragments" / "chargeback_sums_open_month.sql"
    sums.write_text(sums.read_text() + "-- a note\n")
    done = upgrade(client, ch, views_dir=views)
    assert {v.name: v.status for v in done.views if v.status != "unchanged"} == {
        "v_chargeback_jobs": "changed", "v_coverage_daily": "dropped", "v_chargeback_month": "changed",
        "v_chargeback_month_single": "changed", "v_chargeback_month_lives": "changed",
        "v_chargeback_month_clusters": "changed"}  # fmt: skip
    columns = client.query(
        "SELECT name FROM system.columns WHERE database = {db:String} AND table = 'v_chargeback_jobs'",
        parameters={"db": ch.database},
    ).result_rows
    assert ("probe_column",) in columns
    assert "v_coverage_daily" not in {str(r[0]) for r in client.query("SHOW TABLES").result_rows}
    assert {v.name for v in load_views(views)} == {v.name for v in done.views} - {"v_coverage_daily"}
