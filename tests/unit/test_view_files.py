"""The views folder: one file per view, ordered by what each reads; migrations hold no plain view."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from base.errors import ConfigError
from sinks.db import load_migrations
from sinks.view_files import load_views, order_views, parse_view

VIEW_DDL = re.compile(r"CREATE\s+(OR\s+REPLACE\s+)?VIEW\b", re.IGNORECASE)  # not MATERIALIZED VIEW


def _write(folder: Path, **views: str) -> Path:
    folder.mkdir(exist_ok=True)
    for name, body in views.items():
        (folder / f"{name}.sql").write_text(f"-- {name}\nCREATE OR REPLACE VIEW {name} AS\n{body};\n")
    return folder


def test_the_package_views_come_dependencies_first() -> None:
    views = load_views()
    position = {v.name: i for i, v in enumerate(views)}
    assert all(position[dep] < position[v.name] for v in views for dep in v.reads)
    assert {"v_usage_priced", "v_chargeback_month", "v_statement_month", "v_chargeback_month_single"} <= set(position)
    month = next(v for v in views if v.name == "v_chargeback_month")
    assert month.reads == {"v_usage_priced"} and "{period:String}" in month.statement  # parameters kept as written
    assert not month.statement.lstrip().startswith("--") and not month.statement.endswith(";")


def test_no_migration_defines_a_plain_view_and_each_view_is_one_file() -> None:
    for mig in load_migrations():
        assert not VIEW_DDL.search(mig.sql), f"{mig.version:03d}_{mig.name} defines a view: it belongs in sinks/views"
    names = [v.name for v in load_views()]
    assert len(names) == len(set(names))


def test_the_order_is_derived_and_ties_go_by_name(tmp_path: Path) -> None:
    folder = _write(tmp_path / "v", v_c="SELECT 1 AS x", v_b="SELECT x FROM v_c", v_a="SELECT * FROM v_b(p = 'x')",
                    v_d="SELECT 1 AS x FROM t JOIN v_c USING x")  # fmt: skip
    assert [v.name for v in load_views(folder)] == ["v_c", "v_b", "v_a", "v_d"]
    assert [v.name for v in load_views(folder)] == [v.name for v in order_views(reversed(load_views(folder)))]


def test_a_missing_dependency_names_the_file(tmp_path: Path) -> None:
    folder = _write(tmp_path / "v", v_a="SELECT * FROM v_nowhere")
    with pytest.raises(ConfigError, match=r"^sinks/views/v_a\.sql: reads v_nowhere, which no file"):
        load_views(folder)


def test_a_cycle_names_the_file_and_the_loop(tmp_path: Path) -> None:
    folder = _write(tmp_path / "v", v_a="SELECT * FROM v_b", v_b="SELECT * FROM v_c", v_c="SELECT * FROM v_a")
    with pytest.raises(ConfigError, match=r"^sinks/views/v_a\.sql: dependency cycle v_a -> v_b -> v_c -> v_a$"):
        load_views(folder)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("CREATE OR REPLACE VIEW v_other AS SELECT 1", "defines view v_other, not v_a"),
        ("CREATE VIEW IF NOT EXISTS v_a AS SELECT 1", "must hold one `CREATE OR REPLACE VIEW v_a AS"),
        ("CREATE MATERIALIZED VIEW v_a TO t AS SELECT 1", "must hold one"),
        ("CREATE OR REPLACE VIEW v_a AS SELECT 1;\nDROP TABLE t;", "more than one statement"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)) as err:
        parse_view("v_a", text)
    assert str(err.value).startswith("sinks/views/v_a.sql: ") and "\n" not in str(err.value)


def test_a_semicolon_inside_a_string_is_not_a_second_statement() -> None:
    view = parse_view("v_a", "CREATE OR REPLACE VIEW v_a AS\nSELECT arrayStringConcat(['a', 'b'], ';') AS s;\n")
    assert view.statement.endswith("AS s") and view.reads == frozenset()


def test_a_file_not_named_after_a_view_is_refused(tmp_path: Path) -> None:
    folder = _write(tmp_path / "v", v_a="SELECT 1")
    (folder / "chargeback.sql").write_text("CREATE OR REPLACE VIEW v_b AS SELECT 1")
    with pytest.raises(ConfigError, match=r"^sinks/views/chargeback\.sql: "):
        load_views(folder)


def test_superseded_checksums_are_read_from_the_rewritten_migrations() -> None:
    rewritten = [m for m in load_migrations() if m.superseded_checksums]
    assert {m.name for m in rewritten} >= {"analyst_views", "job_lives", "single_lives_views"}
    assert all(len(c) == 16 and c != m.checksum for m in rewritten for c in m.superseded_checksums)
