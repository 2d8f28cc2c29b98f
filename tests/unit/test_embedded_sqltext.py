"""Routing SQL text in the embedded ClickHouse server: keywords, FORMAT clauses, insert data."""

from __future__ import annotations

import pytest

from stack.clickhouse import sqltext


@pytest.mark.parametrize(
    ("sql", "keyword"),
    [
        ("SELECT 1", "SELECT"),
        ("  -- note\n/* block */ (select 1)", "SELECT"),
        ("\n\twith x as (select 1) select * from x", "WITH"),
        ("insert into t values (1)", "INSERT"),
        ("DESC t", "DESC"),
        ("", ""),
        ("   ", ""),
    ],
)
def test_leading_keyword(sql: str, keyword: str) -> None:
    assert sqltext.leading_keyword(sql) == keyword


def test_trailing_format() -> None:
    assert sqltext.trailing_format("SELECT 1 FORMAT Native") == "Native"
    assert sqltext.trailing_format("SELECT 1\n FORMAT JSONEachRow ;  ") == "JSONEachRow"
    assert sqltext.trailing_format("SELECT 'FORMAT x' AS f") is None
    assert sqltext.trailing_format("SELECT 1") is None
    assert sqltext.trailing_format("SELECT 1 FORMAT JSON SETTINGS max_threads = 1") == "JSON"


def test_split_insert_finds_where_native_data_starts() -> None:
    head = "INSERT INTO db.t (`a`, `b`) FORMAT Native\n\n\x02"  # the block itself starts with 0x0A
    insert = sqltext.split_insert(head)
    assert insert is not None
    assert insert.fmt == "Native" and insert.target.strip() == "db.t (`a`, `b`)"
    assert head[insert.data_offset :] == "\n\x02"
    assert insert.from_infile("/tmp/x'y.data") == (
        "INSERT INTO db.t (`a`, `b`) FROM INFILE '/tmp/x\\'y.data' COMPRESSION 'none' FORMAT Native"
    )


def test_split_insert_keeps_settings_and_inline_data() -> None:
    insert = sqltext.split_insert("insert into t SETTINGS async_insert=0 FORMAT CSV 1,2\n")
    assert insert is not None
    assert insert.settings.strip() == "SETTINGS async_insert=0"
    assert insert.from_infile("/f").endswith("COMPRESSION 'none' SETTINGS async_insert=0 FORMAT CSV")
    assert "insert into t SETTINGS async_insert=0 FORMAT CSV 1,2\n"[insert.data_offset :] == "1,2\n"


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t SELECT * FROM s FORMAT Native",
        "INSERT INTO t FROM INFILE 'x' FORMAT CSV",
        "SELECT 1 FORMAT CSV",
    ],
)
def test_split_insert_leaves_statements_without_body_data(sql: str) -> None:
    assert sqltext.split_insert(sql) is None


def test_temporary_table_detection() -> None:
    assert sqltext.statement_has_temporary_table("CREATE TEMPORARY TABLE x (a UInt8)")
    assert not sqltext.statement_has_temporary_table("CREATE TABLE temporary_things (a UInt8) ENGINE = Memory")


def test_values_rows_are_data_in_the_values_format() -> None:
    """`VALUES` rows are spooled as data: text after them can never run as a second statement."""
    sql = "INSERT INTO t (a) VALUES ('FORMAT CSV'); SELECT file('/etc/hostname')"
    insert = sqltext.split_insert(sql)
    assert insert is not None
    assert (insert.target.strip(), insert.fmt) == ("t (a)", "Values")
    assert sql[insert.data_offset :] == " ('FORMAT CSV'); SELECT file('/etc/hostname')"
