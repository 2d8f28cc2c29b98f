"""The ledger's plain views, one file per view in `sinks/views/`, in the order they can be created.

A view's current definition lives in one place: `sinks/views/<name>.sql`, one
`CREATE OR REPLACE VIEW <name> AS ...` statement. `gpuledger db migrate` applies them after the table
migrations (sinks/db.py `upgrade`), the way repeatable migrations work in Flyway, so a new report column
touches the view that computes it and the views that select it, in this one folder.

The order is derived, not declared: a file depends on every other file's view it reads (`FROM v_x`,
`JOIN v_x`, a parameterised `FROM v_x(period = ...)`), and the views are created dependencies first (ties by
name, so the order is the same on every run). A view read but defined by no file, a cycle, or a file whose
statement is not the view its name says is a one-line `ConfigError` naming the file.

Materialized views stay in the migrations: each one (`... TO table`) is a trigger that feeds a table, and
re-creating it drops the trigger for a moment, losing the rows inserted meanwhile; they are created and
rebuilt with their tables, inside the data moves that need them (migrations 010, 014, ...).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from base.errors import ConfigError

_FILE_NAME = re.compile(r"(v_[a-z0-9_]+)\.sql")
_HEAD = re.compile(r"CREATE OR REPLACE VIEW ([A-Za-z_][A-Za-z0-9_]*) AS\b")
# A view read: after FROM or JOIN, a name that starts with v_ (every plain view's prefix; tables never have it).
_READS = re.compile(r"\b(?:FROM|JOIN)\s+(v_[A-Za-z0-9_]+)\b", re.IGNORECASE)
_MAX_FILE_CHARS = 200_000


@dataclass(frozen=True, slots=True)
class ViewFile:
    name: str
    sql: str  # the file as written, comments included (the checksum covers them, as a migration's does)
    reads: frozenset[str]  # the other views this one reads

    @property
    def path(self) -> str:
        return f"sinks/views/{self.name}.sql"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    @property
    def statement(self) -> str:
        """The statement the server runs: whole-line comments out, `{name:Type}` parameters kept as written."""
        return _statement(self.sql)


def _statement(sql: str) -> str:
    body = "\n".join(line for line in sql.splitlines() if not line.strip().startswith("--")).strip()
    return body.removesuffix(";").rstrip()


def parse_view(name: str, sql: str) -> ViewFile:
    """One view file, checked: a single `CREATE OR REPLACE VIEW <name> AS` statement, and what it reads."""
    where = f"sinks/views/{name}.sql"
    if len(sql) > _MAX_FILE_CHARS:
        raise ConfigError(f"{where}: longer than {_MAX_FILE_CHARS} characters")
    body = _statement(sql)
    head = _HEAD.match(body)
    if head is None:
        raise ConfigError(f"{where}: must hold one `CREATE OR REPLACE VIEW {name} AS ...` statement")
    if head.group(1) != name:
        raise ConfigError(f"{where}: defines view {head.group(1)}, not {name} (one file per view, named after it)")
    if len([c for c in re.split(r";\s*(?:\n|$)", body) if c.strip()]) > 1:  # as migrations split statements
        raise ConfigError(f"{where}: holds more than one statement (one file per view)")
    reads = frozenset(m.group(1) for m in _READS.finditer(body)) - {name}
    return ViewFile(name=name, sql=sql, reads=reads)


def order_views(views: Iterable[ViewFile]) -> list[ViewFile]:
    """Dependencies first, ties by name; a missing dependency or a cycle raises ConfigError naming the file."""
    by_name = {v.name: v for v in views}
    for view in sorted(by_name.values(), key=lambda v: v.name):
        missing = sorted(view.reads - by_name.keys())
        if missing:
            raise ConfigError(f"{view.path}: reads {', '.join(missing)}, which no file in sinks/views defines")
    ordered: list[ViewFile] = []
    done: set[str] = set()
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            cycle = [*visiting[visiting.index(name) :], name]
            raise ConfigError(f"sinks/views/{cycle[0]}.sql: dependency cycle {' -> '.join(cycle)}")
        visiting.append(name)
        for dep in sorted(by_name[name].reads):
            visit(dep)
        visiting.pop()
        done.add(name)
        ordered.append(by_name[name])

    for name in sorted(by_name):
        visit(name)
    return ordered


def load_views(folder: Path | Traversable | None = None) -> list[ViewFile]:
    """Every `v_*.sql` in the folder (default: the package's sinks/views), in creation order."""
    root = folder if folder is not None else resources.files("sinks") / "views"
    found = []
    if root.is_dir():
        for entry in root.iterdir():
            match = _FILE_NAME.fullmatch(entry.name)
            if match:
                found.append(parse_view(match.group(1), entry.read_text(encoding="utf-8")))
            elif entry.name.endswith(".sql"):
                raise ConfigError(f"sinks/views/{entry.name}: a view file is named v_<name>.sql after its view")
    return order_views(found)
