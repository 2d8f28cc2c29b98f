"""The ledger's plain views, one file per view in `sinks/views/`, in the order they can be created.

A view's current definition lives in one place: `sinks/views/<name>.sql`, one
`CREATE OR REPLACE VIEW <name> AS ...` statement. `gpuledger db migrate` applies them after the table
migrations (sinks/db.py `upgrade`), the way repeatable migrations work in Flyway, so a new report column
touches the view that computes it and the views that select it, in this one folder.

Said once. Two views that share text share it through one of two markers, both comment lines (so a file
still reads as SQL), expanded here before anything else looks at the text:

* `-- include: <fragment>`, a line of its own: replaced by `sinks/views/fragments/<fragment>.sql`, itself
  expanded (a fragment may include another; one that includes itself, directly or not, is an error). A
  fragment is lines of SQL, not a statement: the chargeback line's columns, its sums.
* `-- variant: <view> replaces <v_a> with <v_b>[, ...][, without <fragment>]`, in a view file's header:
  the file also defines `<view>`, its own text with those view names swapped (whole words, in the
  statement, each checked to occur) and those includes left out. `v_chargeback_month_single` is
  `v_chargeback_month` over `v_usage_priced_single`, declared in one line of v_chargeback_month.sql.
  `with <v_b>(period)` reads `v_b` as a view of one month, `v_b(period = {period:String})`: the variant then
  takes the month as its own parameter and passes it on.

Only files of this folder are read; nothing is built from input. A view's checksum (`schema_views`) is over
its expanded text, so `db migrate` names a variant, or every view including a fragment, as changed when
the text it is built from changed.

The order is derived, not declared: a view depends on every other view it reads (`FROM v_x`, `JOIN v_x`,
a parameterised `FROM v_x(period = ...)`, in its expanded text), and the views are created dependencies
first (ties by name, so the order is the same on every run). A view read but defined by no file, a cycle, a
file whose statement is not the view its name says, an unknown or unused fragment, or a bad variant line is
a one-line `ConfigError` naming the file.

Materialized views stay in the migrations: each one (`... TO table`) is a trigger that feeds a table, and
re-creating it drops the trigger for a moment, losing the rows inserted meanwhile; they are created and
rebuilt with their tables, inside the data moves that need them (migrations 010, 014, ...).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from base.errors import ConfigError

_FILE_NAME = re.compile(r"(v_[a-z0-9_]+)\.sql")
_FRAGMENT_NAME = re.compile(r"([a-z0-9_]+)\.sql")
_HEAD = re.compile(r"CREATE OR REPLACE VIEW ([A-Za-z_][A-Za-z0-9_]*) AS\b")
# A view read: after FROM or JOIN, a name that starts with v_ (every plain view's prefix; tables never have it).
_READS = re.compile(r"\b(?:FROM|JOIN)\s+(v_[A-Za-z0-9_]+)\b", re.IGNORECASE)
_INCLUDE = re.compile(r"^\s*--\s*include:\s*(.*?)\s*$")
_VARIANT = re.compile(r"^\s*--\s*variant:\s*(.*?)\s*$")
_VARIANT_HEAD = re.compile(r"(v_[a-z0-9_]+)\s+(.*)")
_REPLACES = re.compile(r"(?:replaces\s+)?(v_[a-z0-9_]+)\s+with\s+(v_[a-z0-9_]+(?:\(period\))?)")
# `with v_b(period)`: the view of one month, its parameter the variant's own (both named `period`).
_OF_THE_MONTH = "(period)", "(period = {period:String})"
_WITHOUT = re.compile(r"without\s+([a-z0-9_]+)")
_MAX_FILE_CHARS = 200_000
FRAGMENTS = "fragments"


@dataclass(frozen=True, slots=True)
class ViewFile:
    name: str
    sql: str  # the expanded text, comments included (the checksum covers them, as a migration's does)
    reads: frozenset[str]  # the other views this one reads
    path: str  # the file that defines it: its own, or for a variant its base's

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()[:16]

    @property
    def statement(self) -> str:
        """The statement the server runs: whole-line comments out, `{name:Type}` parameters kept as written."""
        return _statement(self.sql)


@dataclass(frozen=True, slots=True)
class Variant:
    """`-- variant: <name> replaces <a> with <b>, ..., without <fragment>`: another view from a file's text."""

    name: str
    replaces: tuple[tuple[str, str], ...]
    without: frozenset[str]


def _is_comment(line: str) -> bool:
    return line.strip().startswith("--")


def _statement(sql: str) -> str:
    body = "\n".join(line for line in sql.splitlines() if not _is_comment(line)).strip()
    return body.removesuffix(";").rstrip()


def _where(name: str) -> str:
    return f"sinks/views/{name}.sql"


def expand(where: str, text: str, fragments: Mapping[str, str], *, _within: tuple[str, ...] = ()) -> str:
    """`text` with every `-- include: <fragment>` line replaced by that fragment, expanded in turn."""
    out = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        marker = _INCLUDE.match(line)
        if marker is None:
            out.append(line)
            continue
        name = marker.group(1)
        if not _FRAGMENT_NAME.fullmatch(f"{name}.sql"):
            raise ConfigError(f"{where}:{number}: `-- include:` names a fragment as [a-z0-9_]+, not {name!r}")
        if name in _within:
            loop = " -> ".join([*_within[_within.index(name) :], name])
            raise ConfigError(f"{where}:{number}: fragment {name} includes itself ({loop})")
        if name not in fragments:
            raise ConfigError(f"{where}:{number}: includes {name}, which sinks/views/{FRAGMENTS} does not have")
        body = expand(f"sinks/views/{FRAGMENTS}/{name}.sql", fragments[name], fragments, _within=(*_within, name))
        out.append(body if body.endswith("\n") else body + "\n")
    return "".join(out)


def variants(name: str, text: str) -> list[Variant]:
    """The `-- variant:` lines of a view file, parsed; a line that does not parse raises naming the file."""
    where = _where(name)
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        marker = _VARIANT.match(line)
        if marker is None:
            continue
        head = _VARIANT_HEAD.fullmatch(marker.group(1))
        clauses = [c.strip() for c in head.group(2).split(",")] if head else []
        replaces = [m.groups() for c in clauses if (m := _REPLACES.fullmatch(c))]
        without = [m.group(1) for c in clauses if (m := _WITHOUT.fullmatch(c))]
        if head is None or not clauses or len(replaces) + len(without) != len(clauses):
            raise ConfigError(
                f"{where}:{number}: a variant line reads `-- variant: v_name replaces v_a with v_b[, v_c with v_d]"
                "[, without fragment]`"
            )
        found.append(Variant(head.group(1), tuple((a, b) for a, b in replaces), frozenset(without)))
    return found


def variant_text(base: str, text: str, variant: Variant, fragments: Mapping[str, str]) -> str:
    """The variant's expanded text: the base file's, its variant lines and the `without` includes left out,
    then, in the statement (not the comments), the view's own name and each `replaces` swapped."""
    where = _where(base)
    kept = []
    dropped: set[str] = set()
    for line in text.splitlines(keepends=True):
        marker = _INCLUDE.match(line)
        if _VARIANT.match(line) or (marker is not None and marker.group(1) in variant.without):
            dropped |= {marker.group(1)} if marker is not None else set()
            continue
        kept.append(line)
    for name in sorted(variant.without - dropped):
        raise ConfigError(f"{where}: variant {variant.name} is without {name}, which this file does not include")
    expanded = expand(where, "".join(kept), fragments)
    swaps = [(rf"(?<=\bCREATE OR REPLACE VIEW ){re.escape(base)}\b", variant.name)]
    swaps += [(rf"\b{re.escape(old)}\b", new.replace(*_OF_THE_MONTH)) for old, new in variant.replaces]
    lines = expanded.splitlines(keepends=True)
    for (pattern, new), label in zip(swaps, [base, *(old for old, _ in variant.replaces)], strict=True):
        hits = 0
        for i, line in enumerate(lines):
            if not _is_comment(line):
                lines[i], n = re.subn(pattern, new, line)
                hits += n
        if hits == 0:
            raise ConfigError(f"{where}: variant {variant.name} replaces {label}, which the statement does not name")
    return "".join(lines)


def parse_view(name: str, sql: str, *, path: str | None = None) -> ViewFile:
    """One view's expanded text, checked: a single `CREATE OR REPLACE VIEW <name> AS` statement, and what it reads."""
    where = path or _where(name)
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
    return ViewFile(name=name, sql=sql, reads=reads, path=where)


def parse_file(name: str, text: str, fragments: Mapping[str, str]) -> list[ViewFile]:
    """A view file's view and its variants' views, each from its expanded text."""
    where = _where(name)
    out = [parse_view(name, expand(where, text, fragments))]
    for variant in variants(name, text):
        out.append(parse_view(variant.name, variant_text(name, text, variant, fragments), path=where))
    return out


def order_views(views: Iterable[ViewFile]) -> list[ViewFile]:
    """Dependencies first, ties by name; a missing dependency or a cycle raises ConfigError naming the file."""
    by_name: dict[str, ViewFile] = {}
    for view in views:
        if view.name in by_name:
            raise ConfigError(f"{view.path}: defines {view.name}, which {by_name[view.name].path} defines too")
        by_name[view.name] = view
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
            raise ConfigError(f"{by_name[cycle[0]].path}: dependency cycle {' -> '.join(cycle)}")
        visiting.append(name)
        for dep in sorted(by_name[name].reads):
            visit(dep)
        visiting.pop()
        done.add(name)
        ordered.append(by_name[name])

    for name in sorted(by_name):
        visit(name)
    return ordered


def _fragments(root: Path | Traversable) -> dict[str, str]:
    folder = root / FRAGMENTS
    found = {}
    if folder.is_dir():
        for entry in folder.iterdir():
            match = _FRAGMENT_NAME.fullmatch(entry.name)
            if match is None:
                raise ConfigError(f"sinks/views/{FRAGMENTS}/{entry.name}: a fragment is named [a-z0-9_]+.sql")
            found[match.group(1)] = entry.read_text(encoding="utf-8")
    return found


def _included(text: str) -> set[str]:
    return {m.group(1) for line in text.splitlines() if (m := _INCLUDE.match(line))}


def load_views(folder: Path | Traversable | None = None) -> list[ViewFile]:
    """Every `v_*.sql` in the folder (default: the package's sinks/views) and its variants, in creation order."""
    root = folder if folder is not None else resources.files("sinks") / "views"
    if not root.is_dir():
        return []
    fragments = _fragments(root)
    found = []
    used: set[str] = set()
    for entry in root.iterdir():
        match = _FILE_NAME.fullmatch(entry.name)
        if match:
            text = entry.read_text(encoding="utf-8")
            found += parse_file(match.group(1), text, fragments)
            used |= _included(text)
        elif entry.name.endswith(".sql"):
            raise ConfigError(f"sinks/views/{entry.name}: a view file is named v_<name>.sql after its view")
    for name in sorted(fragments):
        used |= _included(fragments[name])
    for name in sorted(fragments.keys() - used):
        raise ConfigError(f"sinks/views/{FRAGMENTS}/{name}.sql: included by no view (remove it, or include it)")
    return order_views(found)
