"""The statement policy over parse trees as chDB's `EXPLAIN AST` prints them (captured from chDB 4.4)."""

from __future__ import annotations

import pytest

from stack.clickhouse import access

SELECT_FILE_IN_CTE = """SelectWithUnionQuery (children 1)
 ExpressionList (children 1)
  SelectQuery (children 3)
   ExpressionList (children 1)
    WithElement (children 1)
     Subquery (children 1)
      SelectWithUnionQuery (children 1)
       ExpressionList (children 1)
        SelectQuery (children 2)
         ExpressionList (children 1)
          Asterisk
         TablesInSelectQuery (children 1)
          TablesInSelectQueryElement (children 1)
           TableExpression (children 1)
            Function url (children 1)
             ExpressionList (children 2)
              Literal 'http://x'
              Identifier CSV
   ExpressionList (children 1)
    Asterisk
   TablesInSelectQuery (children 1)
    TablesInSelectQueryElement (children 1)
     TableExpression (children 1)
      TableIdentifier t
"""
OUTFILE = """SelectWithUnionQuery (children 3)
 ExpressionList (children 1)
  SelectQuery (children 1)
   ExpressionList (children 1)
    Literal 'x'
 Literal '/tmp/pwn'
 Identifier TSVRaw
"""
LEDGER_SELECT = """SelectWithUnionQuery (children 1)
 ExpressionList (children 1)
  SelectQuery (children 2)
   ExpressionList (children 1)
    Function sum (children 1)
     ExpressionList (children 1)
      Identifier gpu_seconds
   TablesInSelectQuery (children 1)
    TablesInSelectQueryElement (children 1)
     TableExpression (children 1)
      TableIdentifier gpuledger.device_minutes (alias d)
"""
SYSTEM_USERS = LEDGER_SELECT.replace("gpuledger.device_minutes (alias d)", "system.users")
SPOOL_INSERT = """InsertQuery   (children 3)
 Literal '/spool/insert-1.data'
 Literal 'none'
 Identifier t
"""
INSERT_FUNCTION = """InsertQuery   (children 2)
 Function file (children 1)
  ExpressionList (children 1)
   Literal '/tmp/x'
 SelectWithUnionQuery (children 1)
  ExpressionList (children 1)
   SelectQuery (children 1)
    ExpressionList (children 1)
     Literal UInt64_1
"""
FILE_ENGINE = """CreateQuery t (children 3)
 Identifier t
 Columns definition (children 1)
  ExpressionList (children 1)
   ColumnDeclaration a (children 1)
    DataType Int32
 Storage definition (children 1)
  Function File (children 1)
   ExpressionList (children 2)
    Identifier CSV
    Literal '/etc/passwd'
"""
MERGE_TREE = FILE_ENGINE.replace("""  Function File (children 1)
   ExpressionList (children 2)
    Identifier CSV
    Literal '/etc/passwd'
""", """  Function ReplacingMergeTree
""").replace("Storage definition (children 1)", "Storage definition (children 1)")


def scope(role: access.Role, infile: str | None = None) -> access.Scope:
    return access.Scope(
        role=role, current_database="gpuledger", infile=infile,
        table_functions=frozenset({"file", "url", "numbers", "s3"}),
    )


@pytest.mark.parametrize("role", list(access.Role))
@pytest.mark.parametrize(
    ("text", "words"),
    [
        (SELECT_FILE_IN_CTE, "url"),
        (OUTFILE, "OUTFILE"),
        (SYSTEM_USERS, "system.users"),
        (INSERT_FUNCTION, "file"),
        (FILE_ENGINE, "File"),
    ],
)
def test_denied_for_everyone(role: access.Role, text: str, words: str) -> None:
    reason = access.denial(access.parse_tree(text), scope(role))
    assert reason is not None
    assert words in reason or (role is access.Role.ANALYST and "not allowed for the analyst" in reason)


def test_the_ledger_and_the_servers_own_spool_insert_pass() -> None:
    assert access.denial(access.parse_tree(LEDGER_SELECT), scope(access.Role.ANALYST)) is None
    tree = access.parse_tree(SPOOL_INSERT)
    assert access.denial(tree, scope(access.Role.WRITER, "/spool/insert-1.data")) is None
    assert "INFILE" in (access.denial(tree, scope(access.Role.WRITER, "/spool/other.data")) or "")
    assert "InsertQuery" in (access.denial(tree, scope(access.Role.ANALYST, "/spool/insert-1.data")) or "")
    assert access.denial(access.parse_tree(MERGE_TREE), scope(access.Role.WRITER)) is None


def test_parameterised_views_are_not_table_functions() -> None:
    text = LEDGER_SELECT.replace("TableIdentifier gpuledger.device_minutes (alias d)", "Function v_month (children 1)\n"
                                 "       ExpressionList (children 1)\n        Literal '2026-11'")
    assert access.denial(access.parse_tree(text), scope(access.Role.ANALYST)) is None
    assert access.denial(access.parse_tree(text.replace("v_month", "s3")), scope(access.Role.ANALYST)) is not None


def test_settings_the_parser_depends_on_are_refused() -> None:
    tree = access.parse_tree("Set\n")
    assert access.denial(tree, scope(access.Role.WRITER), "SET max_threads = 1, dialect = 'prql'") is not None
    assert access.denial(tree, scope(access.Role.WRITER), "SET max_threads = 1") is None
    assert access.denial(tree, scope(access.Role.ANALYST), "SET max_threads = 1") is not None


def test_a_forged_line_is_detected_by_the_children_counts() -> None:
    """An identifier with a newline prints raw; the extra line gives some node an unannounced child."""
    forged = LEDGER_SELECT.replace("      Identifier gpu_seconds\n", "      Identifier gpu_seconds\n      Literal 1\n")
    with pytest.raises(access.UnreadableTree):
        access.parse_tree(forged)
    moved = SELECT_FILE_IN_CTE.replace("           TableExpression (children 1)\n",
                                       "           TableExpression (children 1)\n          Literal x\n", 1)
    with pytest.raises(access.UnreadableTree):
        access.parse_tree(moved)
    with pytest.raises(access.UnreadableTree):
        access.parse_tree(LEDGER_SELECT + "SelectWithUnionQuery\n")
