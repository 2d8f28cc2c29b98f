"""Just enough reading of SQL text to route a request: pure functions, no engine.

The engine parses every statement itself. The server only needs to know what kind of statement
arrives (to stream it, buffer it or spool its data), which output format it asks for, and where the
data of an `INSERT ... FORMAT X` starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMMENT_OR_SPACE = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|#[^\n]*(?:\n|$)|/\*.*?\*/)+", re.DOTALL)
_WORD = re.compile(r"[A-Za-z_]+")
_TRAILING_FORMAT = re.compile(
    r"\bFORMAT\s+([A-Za-z0-9_]+)(?:\s+SETTINGS\s+[^;]*?)?\s*;?\s*$", re.IGNORECASE | re.DOTALL
)
_INSERT_FORMAT = re.compile(
    r"^\s*INSERT\s+INTO\s+(?P<target>.*?)"
    r"(?P<settings>\s+SETTINGS\s+.*?)?"
    r"\s*(?:\bFORMAT\s+(?P<fmt>[A-Za-z0-9_]+)|\b(?P<values>VALUES)\b)",
    re.IGNORECASE | re.DOTALL,
)
_NOT_IN_TARGET = re.compile(r"\b(?:VALUES|SELECT|WITH|FROM\s+INFILE)\b", re.IGNORECASE)

# Statements that produce a result set (a FORMAT applies to them).
RESULT_KEYWORDS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN", "CHECK"})
# Statements chDB can stream (its streaming API takes SELECT only).
STREAMABLE_KEYWORDS = frozenset({"SELECT", "WITH"})
# Statements that change the state of the handle that runs them (not the data).
STATEFUL_KEYWORDS = frozenset({"SET", "USE"})
# Output formats whose per-block encodings concatenate into one valid stream.
STREAM_SAFE_FORMATS = frozenset(
    {
        "Native",
        "TabSeparated",
        "TSV",
        "TabSeparatedRaw",
        "TSVRaw",
        "CSV",
        "RowBinary",
        "JSONEachRow",
        "JSONCompactEachRow",
        "JSONStringsEachRow",
        "LineAsString",
        "Values",
    }
)


def strip_leading(sql: str) -> str:
    """The statement without leading whitespace, comments and opening parentheses."""
    pos = 0
    while True:
        match = _COMMENT_OR_SPACE.match(sql, pos)
        if match:
            pos = match.end()
        if pos < len(sql) and sql[pos] == "(":
            pos += 1
            continue
        if not match:
            return sql[pos:]


def leading_keyword(sql: str) -> str:
    """The first keyword of a statement, upper-cased ('' when there is none)."""
    match = _WORD.match(strip_leading(sql[:4096]))
    return match.group(0).upper() if match else ""


def trailing_format(sql: str) -> str | None:
    """The format named by a trailing `FORMAT X` clause, if the statement has one."""
    match = _TRAILING_FORMAT.search(sql[-512:])
    return match.group(1) if match else None


_CREATE_TEMPORARY = re.compile(r"^CREATE\s+(?:OR\s+REPLACE\s+)?TEMPORARY\s+TABLE\b", re.IGNORECASE)


def statement_has_temporary_table(sql: str) -> bool:
    return _CREATE_TEMPORARY.match(strip_leading(sql[:4096])) is not None


@dataclass(frozen=True)
class InsertWithData:
    """An `INSERT INTO target [SETTINGS ...] FORMAT fmt` head and the offset where its data starts."""

    target: str
    settings: str
    fmt: str
    data_offset: int

    def from_infile(self, path: str) -> str:
        """The statement that reads the data from a spooled file instead of the request body."""
        quoted = "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"
        settings = f" {self.settings.strip()}" if self.settings else ""
        return f"INSERT INTO {self.target.strip()} FROM INFILE {quoted} COMPRESSION 'none'{settings} FORMAT {self.fmt}"


def split_insert(head: str) -> InsertWithData | None:
    """Find the `FORMAT X` (or `VALUES`) of an INSERT whose data follows the statement.

    `head` is the start of the request text (binary data decoded as latin-1 keeps offsets equal to
    byte offsets). Returns None for an INSERT without inline data (`INSERT ... SELECT`), which runs as
    ordinary SQL. `VALUES` rows are data in the `Values` format: they are spooled like any other, and
    never reach the engine as text where a `;` could start a second statement. Data starts after the
    format name, spaces or tabs, and at most one newline: ClickHouse's rule, which keeps a Native block
    that starts with byte 0x0A intact.
    """
    match = _INSERT_FORMAT.match(head)
    if match is None or _NOT_IN_TARGET.search(match.group("target")):
        return None
    if match.group("values"):
        return InsertWithData(
            target=match.group("target"),
            settings=match.group("settings") or "",
            fmt="Values",
            data_offset=match.end(),
        )
    pos = match.end()
    while pos < len(head) and head[pos] in " \t\r":
        pos += 1
    if pos < len(head) and head[pos] == "\n":
        pos += 1
    return InsertWithData(
        target=match.group("target"),
        settings=match.group("settings") or "",
        fmt=match.group("fmt"),
        data_offset=pos,
    )
