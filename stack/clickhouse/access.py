"""What a statement may do, decided on the engine's own parse of it: pure functions, no engine.

The server asks chDB to parse every statement (`formatQuery` proves it is one statement, `EXPLAIN AST`
gives its tree) and hands the tree to `check`. So every spelling the engine accepts (backquoted,
escaped, commented, nested in a subquery, a CTE, a view definition, an `INSERT ... SELECT`, an
`IN table`) reaches this module as the same node: `Function file`, `TableIdentifier system.users`.

What the tree cannot show, the engine enforces itself: analysts run on handles with `readonly = 1`
and their limits set before it (chDB refuses to change either afterwards), so a parser miss on a
table function or a setting is still refused by the engine. What neither readonly nor chDB's
`user_files_path` stops (chDB is clickhouse-local: absolute paths are allowed) is the scalar `file()`
and `INTO OUTFILE`; those are refused here, for every user.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum

from base.errors import ParseError

_CHILDREN = re.compile(r"\s*\(children (\d+)\)\s*$")
_ALIAS = re.compile(r"\s*\(alias [^()]*\)\s*$")


@dataclass
class Node:
    """One line of `EXPLAIN AST`: its kind (`Function`, `TableIdentifier`, ...), the rest of the line
    (a function's or table's name), and its children."""

    kind: str
    text: str
    children: list[Node] = field(default_factory=list)
    declared: int = 0  # the children its line announces

    @property
    def name(self) -> str:
        return self.text.split(" ", 1)[0] if self.text else ""

    def walk(self) -> list[Node]:
        out: list[Node] = []
        stack = [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out


class UnreadableTree(ParseError):
    """The engine's tree did not have the shape `parse_tree` reads; the statement is refused."""


# Kinds that are two words in EXPLAIN AST's output.
_TWO_WORD_KINDS = ("Storage definition", "Columns definition", "Dictionary definition", "SYSTEM query",
                   "Dictionary lifetime", "Dictionary layout", "Dictionary range", "Dictionary settings")


def parse_tree(text: str) -> Node:
    """Read `EXPLAIN AST` output (one node a line, one space of indent per level) into a tree.

    An identifier with a newline in it prints raw and could imitate a node line. Every node line
    announces how many children it has, and a forged line always gives some node one child more than
    it announced (lines are only ever added), so a tree whose counts disagree is refused.
    """
    root: Node | None = None
    stack: list[Node] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        stripped = raw.lstrip(" ")
        depth = len(raw) - len(stripped)
        counted = _CHILDREN.search(stripped)
        line = _ALIAS.sub("", stripped[: counted.start()] if counted else stripped)
        kind = next((k for k in _TWO_WORD_KINDS if line.startswith(k)), line.split(" ", 1)[0])
        node = Node(kind, line[len(kind) :].strip(), declared=int(counted.group(1)) if counted else 0)
        if depth == 0:
            if root is not None:
                raise UnreadableTree("more than one statement in the tree")
            root = node
            stack = [node]
            continue
        if root is None or depth > len(stack):
            raise UnreadableTree(f"a line of the tree is out of place: {stripped[:60]!r}")
        del stack[depth:]
        stack[-1].children.append(node)
        stack.append(node)
    if root is None:
        raise UnreadableTree("the engine returned no tree")
    for node in root.walk():
        if len(node.children) != node.declared:
            raise UnreadableTree(f"{node.kind} announces {node.declared} children and has {len(node.children)}")
    return root


class Role(Enum):
    ANALYST = "analyst"
    WRITER = "writer"


# Table functions that only compute (no files, network, processes, other databases or this
# process's memory). Everything else is refused: `file`, `url`, `s3`, `remote`, `executable`,
# `input`, `Python`, `merge`, `mergeTreeIndex` (names any table), ...
SAFE_TABLE_FUNCTIONS = frozenset(
    {"numbers", "numbers_mt", "zeros", "zeros_mt", "values", "view", "generaterandom", "generate_series",
     "generateseries", "null", "format"}
)
# Scalar functions that read files, dictionaries (which may have external sources), other tables by
# name, or load code; and the names of outside-reaching table functions, should one gain a scalar twin.
DENIED_FUNCTIONS = frozenset(
    {"file", "url", "urlcluster", "s3", "s3cluster", "gcs", "oss", "cosn", "azureblobstorage",
     "azureblobstoragecluster", "hdfs", "hdfscluster", "remote", "remotesecure", "cluster",
     "clusterallreplicas", "mysql", "postgresql", "sqlite", "mongodb", "redis", "odbc", "jdbc", "executable",
     "python", "input", "merge", "dictionary", "iceberg", "icebergs3", "icebergazure", "iceberghdfs",
     "iceberglocal", "deltalake", "deltalakelocal", "hudi", "arrowflight", "ytsaurus", "joinget",
     "joingetornull", "catboostevaluate", "modelevaluate", "naivebayesclassifier", "getmacro",
     "getclienthttpheader", "getserversetting", "filesystemavailable", "filesystemcapacity",
     "filesystemunreserved", "mergetreeindex", "mergetreeprojection", "mergetreeanalyzeindexes",
     "loop", "fuzzquery", "fuzzjson", "timeseriesdata", "timeseriestags", "timeseriesmetrics"}
)
DENIED_FUNCTION_PREFIXES = ("dictget", "dicthas", "dictisin")
# `system` tables an analyst may read: catalogue and engine statistics, none holding a secret, a
# path to one, or another user's query text.
ANALYST_SYSTEM_TABLES = frozenset(
    {"one", "numbers", "numbers_mt", "zeros", "zeros_mt", "tables", "columns", "databases", "functions",
     "table_functions", "table_engines", "formats", "data_type_families", "settings", "time_zones", "parts",
     "parts_columns", "merges", "mutations", "metrics", "events", "asynchronous_metrics", "build_options",
     "contributors", "licenses", "collations", "aggregate_function_combinators", "keywords", "data_skipping_indices"}
)
_RESULT_ROOTS = frozenset(
    {"SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "Explain", "ShowTables", "ShowColumns",
     "ShowIndexes", "ShowFunctions", "ShowEngineQuery", "ShowCreateTableQuery", "ShowCreateViewQuery",
     "ShowCreateDatabaseQuery", "ShowCreateDictionaryQuery", "DescribeQuery", "ExistsTableQuery",
     "ExistsDatabaseQuery", "ExistsViewQuery", "ExistsDictionaryQuery", "CheckQuery"}
)
_WRITER_ROOTS = _RESULT_ROOTS | frozenset(
    {"InsertQuery", "CreateQuery", "AlterQuery", "DropQuery", "Rename", "TruncateQuery", "OptimizeQuery",
     "DeleteQuery", "UpdateQuery", "Set", "UseQuery", "UndropQuery"}
)
# Storage engines the writer may create: data that lives in the server's own data path.
_SAFE_DATABASE_ENGINES = frozenset({"Atomic", "Ordinary", "Memory", "Lazy"})
_SAFE_TABLE_ENGINES = frozenset({"Memory", "Null", "Log", "TinyLog", "StripeLog", "Set", "Join"})
_IN_FUNCTIONS = frozenset({"in", "notin", "globalin", "globalnotin", "nullin", "notnullin", "globalnullin",
                           "globalnotnullin"})


@dataclass(frozen=True)
class Scope:
    """Who is asking, and in which database."""

    role: Role
    current_database: str
    # Lower-cased names of the engine's table functions (`system.table_functions`); a call in FROM
    # that is none of them is a parameterised view of the current database.
    table_functions: frozenset[str] = frozenset()
    infile: str | None = None  # the one spool path the server itself put into an INSERT


# Settings that change how the next statements parse: the checker parses with the defaults, so a
# session may not change them (a `dialect = 'prql'` query would be read otherwise than it was checked).
PARSER_SETTINGS = frozenset({"dialect", "allow_settings_after_format_in_insert", "implicit_select"})
_ASSIGNED = re.compile(r"(?:\bSET(?:TINGS)?|,)\s+`?([A-Za-z_][A-Za-z0-9_]*)`?\s*=")


def denial(tree: Node, scope: Scope, formatted: str = "") -> str | None:
    """Why `tree` may not run for `scope` (one sentence), or None when it may.

    `formatted` is the engine's canonical text of the statement; it is read only for the names a
    `SET` or `SETTINGS` assigns, which `EXPLAIN AST` does not print.
    """
    roots = _RESULT_ROOTS if scope.role is Role.ANALYST else _WRITER_ROOTS
    if tree.kind not in roots:
        return f"Not enough privileges: {tree.kind} statements are not allowed for the {scope.role.value}"
    reason = _output_file(tree, scope) or _statement_shape(tree, scope)
    if reason:
        return reason
    nodes = tree.walk()
    for node in nodes:
        reason = _node_denial(node, scope)
        if reason:
            return reason
    if any(node.kind == "Set" for node in nodes):
        assigned = {name.lower() for name in _ASSIGNED.findall(formatted)}
        if changed := sorted(assigned & PARSER_SETTINGS):
            return f"the setting {changed[0]} may not be changed on this server"
    return None


def _output_file(tree: Node, scope: Scope) -> str | None:
    """`INTO OUTFILE` (and `FROM INFILE`) print as a literal child of the statement itself."""
    literals = [c for c in tree.children if c.kind == "Literal"]
    if not literals:
        return None
    if tree.kind in ("CreateQuery", "DeleteQuery"):  # a COMMENT, a WHERE constant
        return None
    if tree.kind == "InsertQuery":
        texts = [_literal_text(node) for node in literals]
        if scope.infile is not None and texts[0] == scope.infile and texts[1:] in ([], ["none"]):
            return None  # the server's own spool file, uncompressed
        return "INSERT ... FROM INFILE reads a file of the server: send the data in the request body"
    return "INTO OUTFILE writes a file of the server: the result comes back in the response"


def _literal_text(node: Node) -> str:
    text = node.text
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    return text


def _statement_shape(tree: Node, scope: Scope) -> str | None:
    if tree.kind == "Explain":
        inner = [c for c in tree.children if c.kind not in ("Literal", "Set", "Identifier")]
        if len(inner) == 1 and inner[0].kind not in _RESULT_ROOTS:
            return f"EXPLAIN of {inner[0].kind} is not allowed for the {scope.role.value}"
    if tree.kind in ("ShowTables", "ShowCreateTableQuery", "ShowCreateViewQuery", "ShowCreateDictionaryQuery",
                     "ExistsTableQuery", "ExistsViewQuery", "CheckQuery", "OptimizeQuery", "TruncateQuery",
                     "DropQuery", "AlterQuery", "DeleteQuery", "UndropQuery", "ShowCreateDatabaseQuery",
                     "ExistsDatabaseQuery"):
        names = [c.text for c in tree.children if c.kind == "Identifier"]
        if tree.kind in ("ShowTables", "ShowCreateDatabaseQuery", "ExistsDatabaseQuery"):
            return None  # names only
        if len(names) >= 2:
            return _table_denial(f"{names[0]}.{names[1]}", scope)
        if names:
            return _table_denial(names[0], scope)
    if tree.kind == "InsertQuery":
        first = tree.children[0] if tree.children else None
        if first is not None and first.kind == "Function":
            return f"INSERT INTO FUNCTION {first.name} is not allowed"
        names = [c.text for c in tree.children if c.kind == "Identifier"]
        if len(names) >= 2:
            return _table_denial(f"{names[0]}.{names[1]}", scope)
        if names:
            return _table_denial(names[0], scope)
    if tree.kind == "CreateQuery":
        return _create_denial(tree)
    return None


def _create_denial(tree: Node) -> str | None:
    if any(c.kind == "Dictionary definition" for c in tree.children):
        return "CREATE DICTIONARY is not allowed: a dictionary's source can read files and the network"
    for child in tree.children:
        if child.kind == "Function":  # CREATE TABLE t AS table_function(...)
            return f"CREATE TABLE ... AS {child.name}(...) is not allowed"
        if child.kind != "Storage definition":
            continue
        engine = next((c.name for c in child.children if c.kind == "Function"), "")
        has_columns = any(c.kind == "Columns definition" for c in tree.children)
        is_database = not has_columns and engine in _SAFE_DATABASE_ENGINES
        if not (engine.endswith("MergeTree") or engine in _SAFE_TABLE_ENGINES or is_database):
            return f"the {engine} engine is not allowed: tables keep their data in the server's own storage"
    return None


def _node_denial(node: Node, scope: Scope) -> str | None:
    if node.kind == "Set" and scope.role is Role.ANALYST:
        return "the analyst may not change settings (its limits are fixed by the server)"
    if node.kind == "Function":
        lowered = node.name.lower()
        if lowered in DENIED_FUNCTIONS or lowered.startswith(DENIED_FUNCTION_PREFIXES):
            return f"Not enough privileges to use function {node.name}: it reaches outside the ledger"
        if lowered in _IN_FUNCTIONS:
            args = node.children[0].children if node.children else []
            if len(args) == 2 and args[1].kind == "Identifier" and "." in args[1].text:
                return _table_denial(args[1].text, scope)
    if node.kind == "TableExpression":
        for child in node.children:
            if child.kind == "Function":
                lowered = child.name.lower()
                if lowered in SAFE_TABLE_FUNCTIONS:
                    continue
                if lowered in scope.table_functions or lowered in DENIED_FUNCTIONS:
                    return f"Not enough privileges to use table function {child.name}"
            if child.kind == "TableIdentifier":
                reason = _table_denial(child.text, scope)
                if reason:
                    return reason
    return None


def _table_denial(name: str, scope: Scope) -> str | None:
    """A table reference (`t`, `db.t`); unqualified names are in the request's current database.

    Only the writer creates databases and tables, and only with engines that keep their data in the
    server's own storage, so what a database holds is ledger data; `system` is where secrets and other
    users' queries live, and only its catalogue and statistics tables may be read.
    """
    database, dot, table = name.partition(".")
    if not dot:
        database, table = scope.current_database, name
    if database == "system" and table not in ANALYST_SYSTEM_TABLES:
        return f"Not enough privileges to read system.{table}"
    return None
