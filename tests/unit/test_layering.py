"""The dependency direction is one way, and a new upward import fails here.

Every top-level folder of the repository that holds Python sits in exactly one layer (a new folder fails
`test_every_top_level_folder_has_a_layer` until it is placed; none is exempt). Bottom to top
(docs/architecture.md, "Layers"):

0. `base/`: errors, settings, secrets on disk, output safety, logging, stop handling, metrics, the
   Kafka client factory, the commands' common options (`base.cli_common`). Imports nothing of the project above it.
1. `schemas/`: the contracts (Avro schemas, generated records and models, topics, keys, generations,
   the codec, registry sync). Data, no runtime: no module here imports a Kafka or faust client (the
   codec's Schema Registry client, `confluent_kafka.schema_registry`, is an HTTP client, not one).
2. `streams/`: the stream runtime, the one way records cross the Kafka boundary (`streams.publish`,
   `streams.consume` with its dead letters, the faust runner `streams.agents`, `streams.eventlog`,
   `streams.topics_admin`).
3. `producers/`, `processors/`, `sinks/`: the components. None imports another.
4. `web/`: the team page. It shows the ledger the sinks keep with the report code's own figures, so it sits
   above them, and reads the sinks through one module, `web.queries` (no other web module imports the sinks).
5. `stack/`: the local stack (`gpuledger up`: broker launcher, TLS material, registry, embedded ClickHouse
   server, supervisor) and the live engine harnesses (Kubernetes control plane, one-node Slurm).
6. Entry points: `gpuledger/` (the command) and every `cli` / `*_cli` / `__main__` module of any folder above.
7. Outside the product: `tests/`, `bench/`, `examples/`, `deploy/`. They may import anything; nothing imports them.

Every import counts for the direction, including those inside functions and under TYPE_CHECKING. Two graphs
must have no cycle: the modules' (the imports that run), and the plain graph of the top-level folders, where
every import counts (inside functions, under TYPE_CHECKING, of entry-point modules too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER_NAMES = ("base", "contracts", "runtime", "components", "web", "local stack", "entry points", "outside")
FOLDER_LAYERS = {
    "base": "base",
    "schemas": "contracts",
    "streams": "runtime",
    "producers": "components",
    "processors": "components",
    "sinks": "components",
    "web": "web",
    "stack": "local stack",
    "gpuledger": "entry points",
    "tests": "outside",
    "bench": "outside",
    "examples": "outside",
    "deploy": "outside",
}
PACKAGES = tuple(folder for folder, layer in FOLDER_LAYERS.items() if layer != "outside")  # the product
COMPONENT_LAYER = LAYER_NAMES.index("components")
OUTSIDE_LAYER = LAYER_NAMES.index("outside")
# A folder that may import another only through one of its modules: (importer folder, imported folder) -> module.
ONLY_THROUGH = {("web", "sinks"): "web.queries"}
# The clients a contract module never imports (the stream runtime's), and the one part of them it may: the
# Schema Registry's HTTP client, which the codec uses to register and fetch schemas (`schemas.codec`).
RUNTIME_CLIENTS = ("confluent_kafka", "faust", "aiokafka", "mode")
CONTRACT_MAY_IMPORT = ("confluent_kafka.schema_registry",)


def top_level_folders(root: Path = ROOT) -> set[str]:
    """The repository's top-level folders that hold Python (hidden folders, such as the venv, and build
    metadata aside)."""
    return {
        path.name for path in root.iterdir()
        if path.is_dir() and not path.name.startswith(".") and not path.name.endswith(".egg-info")
        and next(path.rglob("*.py"), None) is not None
    }  # fmt: skip


def layer_of(module: str) -> int:
    parts = module.split(".")
    layer = LAYER_NAMES.index(FOLDER_LAYERS[parts[0]])
    if layer == OUTSIDE_LAYER:
        return layer
    if parts[-1] in ("cli", "__main__") or parts[-1].endswith("_cli"):
        return LAYER_NAMES.index("entry points")
    return layer


def project_modules(folders: Iterable[str] = FOLDER_LAYERS) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:` (type-only imports, never run)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def imports_of(source: str, known: Iterable[str], *, type_only: bool = True) -> Iterator[str]:
    """The project modules `source` imports (a `from package import name` names the submodule when
    there is one)."""
    known = set(known)
    tree = ast.parse(source)
    skipped = set() if type_only else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        yield from (name for name in names if name in known)


def upward_imports(modules: dict[str, Path]) -> list[str]:
    found = []
    for module, path in modules.items():
        for target in imports_of(path.read_text(encoding="utf-8"), modules):
            mine, theirs = layer_of(module), layer_of(target)
            if theirs > mine:
                found.append(f"{module} ({LAYER_NAMES[mine]}) imports {target} ({LAYER_NAMES[theirs]})")
            elif mine == theirs == COMPONENT_LAYER and module.split(".")[0] != target.split(".")[0]:
                found.append(f"{module} imports {target}: components do not import each other")
            door = ONLY_THROUGH.get((module.split(".")[0], target.split(".")[0]))
            if door is not None and module != door:
                found.append(f"{module} imports {target}: {module.split('.')[0]} reads it only through {door}")
    return found


def folder_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    """The plain import graph of the top-level folders: every import of every module, type-only included."""
    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        mine = module.split(".")[0]
        edges.setdefault(mine, set())
        for target in imports_of(path.read_text(encoding="utf-8"), modules):
            if target.split(".")[0] != mine:
                edges[mine].add(target.split(".")[0])
    return edges


def runtime_clients_imported(source: str) -> list[str]:
    """The Kafka / faust client modules (and names) `source` imports, anywhere in it, less the registry client."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.split(".")[0] in RUNTIME_CLIENTS and not any(
                name == allowed or name.startswith(f"{allowed}.") for allowed in CONTRACT_MAY_IMPORT
            ):
                found.append(name)
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_top_level_folder_has_a_layer() -> None:
    assert top_level_folders() == set(FOLDER_LAYERS)


def test_no_module_imports_a_layer_above_its_own_or_another_component() -> None:
    assert upward_imports(project_modules()) == []


def test_no_import_cycle_between_modules() -> None:
    modules = project_modules()
    edges = {
        module: set(imports_of(path.read_text(encoding="utf-8"), modules, type_only=False)) - {module}
        for module, path in modules.items()
    }
    assert cycles(edges) == []


def test_no_import_cycle_between_top_level_folders() -> None:
    edges = folder_edges(project_modules())
    assert set(edges) == set(FOLDER_LAYERS)
    assert cycles(edges) == []


def test_only_the_query_module_of_the_web_imports_the_sinks() -> None:
    modules = project_modules(["web", "sinks"])
    importers = {module for module, path in modules.items() if module.split(".")[0] == "web"
                 and any(t.split(".")[0] == "sinks" for t in imports_of(path.read_text(encoding="utf-8"), modules))}
    assert importers == {"web.queries"}


def test_no_contract_module_imports_a_kafka_or_faust_client() -> None:
    contracts = {m: p for m, p in project_modules().items() if m.split(".")[0] == "schemas"}
    assert contracts
    found = {m: runtime_clients_imported(p.read_text(encoding="utf-8")) for m, p in contracts.items()}
    assert {m: names for m, names in found.items() if names} == {}


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from confluent_kafka import KafkaError, TopicPartition", ["confluent_kafka.KafkaError",
                                                                    "confluent_kafka.TopicPartition"]),
        ("def f():\n    from confluent_kafka.admin import NewTopic", ["confluent_kafka.admin.NewTopic"]),
        ("import faust", ["faust"]),
        ("from faust.types import TP", ["faust.types.TP"]),
        ("from mode.threads import WorkerThread", ["mode.threads.WorkerThread"]),
        ("if TYPE_CHECKING:\n    import aiokafka", ["aiokafka"]),
        ("from confluent_kafka.schema_registry import Schema", []),
        ("from confluent_kafka.schema_registry.error import SchemaRegistryError", []),
        ("import model\nfrom modes import x\nimport httpx", []),
    ],
)
def test_the_client_check_sees_each_client_import(source: str, found: list[str]) -> None:
    assert runtime_clients_imported(source) == found


def test_every_module_sits_in_a_layer_and_the_bottom_is_small() -> None:
    modules = project_modules()
    by_layer = {name: sorted(m for m in modules if LAYER_NAMES[layer_of(m)] == name) for name in LAYER_NAMES}
    assert all(by_layer.values()), by_layer
    assert len(by_layer["base"]) <= 16, by_layer["base"]  # 15, and the commands' common options (base.cli_common)
    assert set(by_layer["outside"]) & set(project_modules(PACKAGES)) == set()


@pytest.mark.parametrize(
    ("module", "source", "complaint"),
    [
        (
            "base.settings",
            "from stack.security import x",
            "base.settings (base) imports stack.security",
        ),
        ("schemas.codec", "def f():\n    from sinks import rows", "schemas.codec (contracts) imports sinks.rows"),
        ("schemas.codec", "from streams.publish import P", "schemas.codec (contracts) imports streams.publish"),
        ("streams.publish", "import sinks.rows", "streams.publish (runtime) imports sinks.rows (components)"),
        ("sinks.rows", "from streams.publish import P", None),  # a component uses the runtime
        ("processors.cli", "from sinks.ratecard import RATES", None),  # an entry point may use any component
        ("processors.rollup", "import sinks.rows", "processors.rollup imports sinks.rows: components"),
        ("sinks.writer", "if TYPE_CHECKING:\n    from gpuledger.cli import app", "sinks.writer (components)"),
        ("web.pages", "from sinks.ratecard import RATES", "web.pages imports sinks.ratecard: web reads it only"),
        ("web.queries", "def f():\n    from sinks.ratecard import RATES", None),  # the web's one query module
        ("web.queries", "import stack.security", "web.queries (web) imports stack.security (local stack)"),
        ("stack.security", "from web.queries import Warehouse", None),  # the stack may use anything below it
        ("sinks.rows", "from tests.fixtures_cli import run", "sinks.rows (components) imports tests.fixtures_cli"),
        ("tests.fixtures_cli", "import gpuledger.cli, sinks.rows", None),  # tests may import anything
    ],
)
def test_the_checker_sees_each_kind_of_violation(
    tmp_path: Path, module: str, source: str, complaint: str | None
) -> None:
    known = {"base.settings": tmp_path / "a.py", "stack.security": tmp_path / "b.py",
             "schemas.codec": tmp_path / "c.py", "sinks.rows": tmp_path / "d.py", "sinks.ratecard": tmp_path / "e.py",
             "processors.cli": tmp_path / "f.py", "processors.rollup": tmp_path / "g.py",
             "sinks.writer": tmp_path / "h.py", "gpuledger.cli": tmp_path / "i.py",
             "streams.publish": tmp_path / "j.py", "web.pages": tmp_path / "k.py", "web.queries": tmp_path / "l.py",
             "tests.fixtures_cli": tmp_path / "m.py"}  # fmt: skip
    for path in known.values():
        path.write_text("")
    known[module].write_text(source)
    found = upward_imports(known)
    if complaint is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(complaint), found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_the_folder_graph_counts_type_only_and_entry_point_imports(tmp_path: Path) -> None:
    known = {"schemas.cli": tmp_path / "a.py", "streams.topics_admin": tmp_path / "b.py",
             "streams.publish": tmp_path / "c.py", "schemas.topics": tmp_path / "d.py"}  # fmt: skip
    known["schemas.cli"].write_text("from streams.topics_admin import plan")  # an entry point's import counts
    known["streams.topics_admin"].write_text("")
    known["streams.publish"].write_text("if TYPE_CHECKING:\n    from schemas.topics import Topic")  # so does this
    known["schemas.topics"].write_text("")
    edges = folder_edges(known)
    assert edges == {"schemas": {"streams"}, "streams": {"schemas"}}
    assert cycles(edges) == [["schemas", "streams"]]


def test_a_new_top_level_folder_is_seen(tmp_path: Path) -> None:
    (tmp_path / "tools" / "deep").mkdir(parents=True)
    (tmp_path / "tools" / "deep" / "x.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.py").write_text("")
    assert top_level_folders(tmp_path) == {"tools"}
