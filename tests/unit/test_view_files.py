"""The views folder: one file per view, ordered by what each reads; migrations hold no plain view; text shared
by two views said once (a fragment included, a variant declared)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from base.errors import ConfigError
from sinks.db import load_migrations
from sinks.view_files import expand, load_views, order_views, parse_file, parse_view

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
    single = next(v for v in views if v.name == "v_chargeback_month_single")  # a variant, declared in month's file
    assert single.path == "sinks/views/v_chargeback_month.sql" and single.reads == {"v_usage_priced_single"}
    assert single.statement == month.statement.replace(
        "VIEW v_chargeback_month AS", "VIEW v_chargeback_month_single AS"
    ).replace("FROM v_usage_priced\n", "FROM v_usage_priced_single\n")
    assert "-- include:" not in month.sql and "idle_cost" in month.statement  # expanded: the fragment's columns


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


def _folder(tmp_path: Path, views: dict[str, str], fragments: dict[str, str] | None = None) -> Path:
    folder = tmp_path / "v"
    (folder / "fragments").mkdir(parents=True)
    for name, text in views.items():
        (folder / f"{name}.sql").write_text(text)
    for name, text in (fragments or {}).items():
        (folder / "fragments" / f"{name}.sql").write_text(text)
    return folder


BASE = """-- variant: v_a_single replaces v_src with v_src_single, v_dim with v_dim_single
CREATE OR REPLACE VIEW v_a AS
SELECT s.x AS x, v_src_x -- a column named like a view is not a view name
-- include: cols
FROM v_src AS s JOIN v_dim AS d USING x
"""


def test_a_fragment_is_expanded_and_a_variant_swaps_only_whole_view_names(tmp_path: Path) -> None:
    folder = _folder(tmp_path, {"v_a": BASE, "v_src": "CREATE OR REPLACE VIEW v_src AS SELECT 1 AS x",
                                "v_src_single": "CREATE OR REPLACE VIEW v_src_single AS SELECT 1 AS x",
                                "v_dim": "CREATE OR REPLACE VIEW v_dim AS SELECT 1 AS x",
                                "v_dim_single": "CREATE OR REPLACE VIEW v_dim_single AS SELECT 1 AS x"},
                     {"cols": "-- a fragment's own note\n    , 2 AS y -- from v_src\n"})  # fmt: skip
    views = {v.name: v for v in load_views(folder)}
    a, single = views["v_a"], views["v_a_single"]
    assert a.statement == (
        "CREATE OR REPLACE VIEW v_a AS\nSELECT s.x AS x, v_src_x -- a column named like a view is "
        "not a view name\n    , 2 AS y -- from v_src\nFROM v_src AS s JOIN v_dim AS d USING x"
    )
    assert single.statement == a.statement.replace("VIEW v_a AS", "VIEW v_a_single AS").replace(
        "FROM v_src AS s JOIN v_dim", "FROM v_src_single AS s JOIN v_dim_single"
    ).replace("from v_src", "from v_src_single")
    assert "v_src_x" in single.statement  # whole words only
    assert single.path == a.path == "sinks/views/v_a.sql"
    assert a.reads == {"v_src", "v_dim"} and single.reads == {"v_src_single", "v_dim_single"}
    assert "-- variant:" not in single.sql and "-- a fragment's own note" in single.sql
    # The order sees the variant's reads: each view after the ones it reads.
    order = [v.name for v in load_views(folder)]
    assert order.index("v_a_single") > order.index("v_src_single") and order.index("v_a") > order.index("v_src")


def test_checksums_are_over_the_expanded_text(tmp_path: Path) -> None:
    views = {"v_a": BASE, **{n: f"CREATE OR REPLACE VIEW {n} AS SELECT 1 AS x"
                             for n in ("v_src", "v_src_single", "v_dim", "v_dim_single")}}  # fmt: skip
    before = {v.name: v.checksum for v in load_views(_folder(tmp_path / "1", views, {"cols": ", 2 AS y\n"}))}
    fragment = {v.name: v.checksum for v in load_views(_folder(tmp_path / "2", views, {"cols": ", 3 AS y\n"}))}
    base = {**views, "v_a": BASE.replace("USING x", "USING (x)")}
    edited = {v.name: v.checksum for v in load_views(_folder(tmp_path / "3", base, {"cols": ", 2 AS y\n"}))}
    assert {n for n in before if before[n] != fragment[n]} == {"v_a", "v_a_single"}  # the fragment's includers
    assert {n for n in before if before[n] != edited[n]} == {"v_a", "v_a_single"}  # a base edited: its variant too


def test_a_variant_can_read_a_view_of_one_month() -> None:
    text = "-- variant: v_a_month replaces v_b with v_b_month(period)\nCREATE OR REPLACE VIEW v_a AS SELECT x FROM v_b"
    month = next(v for v in parse_file("v_a", text, {}) if v.name == "v_a_month")
    assert month.statement == "CREATE OR REPLACE VIEW v_a_month AS SELECT x FROM v_b_month(period = {period:String})"
    assert month.reads == {"v_b_month"}


def test_a_variant_can_leave_an_include_out(tmp_path: Path) -> None:
    text = "-- variant: v_all without some\nCREATE OR REPLACE VIEW v_some AS\nSELECT x FROM t\n-- include: some\n"
    views = {v.name: v for v in load_views(_folder(tmp_path, {"v_some": text}, {"some": "WHERE x > 1\n"}))}
    assert views["v_some"].statement.endswith("FROM t\nWHERE x > 1")
    assert views["v_all"].statement == "CREATE OR REPLACE VIEW v_all AS\nSELECT x FROM t"


@pytest.mark.parametrize(
    ("views", "fragments", "message"),
    [
        ({"v_a": "-- variant: v_b replaces v_nowhere with v_x\n-- v_nowhere\nCREATE OR REPLACE VIEW v_a AS SELECT 1\n"},
         {}, "sinks/views/v_a.sql: variant v_b replaces v_nowhere, which the statement does not name"),
        ({"v_a": "CREATE OR REPLACE VIEW v_a AS SELECT 1\n  -- include: nope\n"},
         {}, "sinks/views/v_a.sql:2: includes nope, which sinks/views/fragments does not have"),
        ({"v_a": "CREATE OR REPLACE VIEW v_a AS SELECT 1\n-- include: f\n"},
         {"f": "-- x\n-- include: g\n", "g": "-- include: f\n"},
         "sinks/views/fragments/g.sql:1: fragment f includes itself (f -> g -> f)"),
        ({"v_a": "CREATE OR REPLACE VIEW v_a AS SELECT 1\n-- include: f\n"}, {"f": "-- include: f\n"},
         "sinks/views/fragments/f.sql:1: fragment f includes itself (f -> f)"),
        ({"v_a": "CREATE OR REPLACE VIEW v_a AS SELECT 1\n"}, {"f": ", 2 AS y\n"},
         "sinks/views/fragments/f.sql: included by no view"),
        ({"v_a": "-- variant: v_b without f\nCREATE OR REPLACE VIEW v_a AS SELECT 1\n"}, {},
         "sinks/views/v_a.sql: variant v_b is without f, which this file does not include"),
        ({"v_a": "-- variant: v_b swaps v_x for v_y\nCREATE OR REPLACE VIEW v_a AS SELECT 1\n"}, {},
         "sinks/views/v_a.sql:1: a variant line reads `-- variant: v_name replaces v_a with v_b"),
        ({"v_a": "-- variant: v_b replaces t with v_y\nCREATE OR REPLACE VIEW v_a AS SELECT 1 FROM t\n"}, {},
         "sinks/views/v_a.sql:1: a variant line reads"),  # only view names are swapped
        ({"v_a": "-- variant: v_b replaces v_c with v_d\nCREATE OR REPLACE VIEW v_a AS SELECT * FROM v_c\n",
          "v_b": "CREATE OR REPLACE VIEW v_b AS SELECT 1\n", "v_c": "CREATE OR REPLACE VIEW v_c AS SELECT 1\n",
          "v_d": "CREATE OR REPLACE VIEW v_d AS SELECT 1\n"}, {},
         "sinks/views/v_b.sql: defines v_b, which sinks/views/v_a.sql defines too"),
        ({"v_a": "CREATE OR REPLACE VIEW v_a AS SELECT 1\n-- include: ../v_b\n"}, {},
         "sinks/views/v_a.sql:2: `-- include:` names a fragment as [a-z0-9_]+, not '../v_b'"),
    ],
)  # fmt: skip
def test_a_bad_include_or_variant_is_one_line_naming_the_file(
    tmp_path: Path, views: dict[str, str], fragments: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_views(_folder(tmp_path, views, fragments))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_expand_replaces_the_marker_line_whole() -> None:
    assert expand("x.sql", "a\n   -- include: f   \nb", {"f": "c\nd"}) == "a\nc\nd\nb"
    assert expand("x.sql", "a -- include: f\n", {}) == "a -- include: f\n"  # a marker is a line of its own
