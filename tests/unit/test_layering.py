"""The dependency direction is one way, and a new upward import fails here.

Layers, bottom to top (docs/architecture.md, "Layers"):

0. `base/`: errors, settings, secrets on disk, output safety, logging, stop handling, metrics, the
   Kafka client factory, the commands' common options (`base.cli_common`). Imports nothing of the project above it.
1. `schemas/`: the contracts (Avro schemas, generated records and models, topics, keys, generations,
   the codec, registry sync). Data, no runtime: no module here imports a Kafka or faust client (the
   codec's Schema Registry client, `confluent_kafka.schema_registry`, is an HTTP client, not one).
2. `streams/`: the stream runtime, the one way records cross the Kafka boundary (`streams.publish`,
   `streams.consume` with its dead letters, the faust runner `streams.agents`, `streams.eventlog`,
   `streams.topics_admin`).
3. `producers/`, `processors/`, `sinks/`: the components. None imports another.
4. `stack/`: the local stack (`gpuledger up`: broker launcher, TLS material, registry, embedded ClickHouse
   server, supervisor) and the live engine harnesses (Kubernetes control plane, one-node Slurm).
5. Entry points: every `cli` / `*_cli` / `__main__` module, and `gpuledger/` (the command).

Every import counts for the direction, including those inside functions and under TYPE_CHECKING;
for cycles, the imports that run (not those under TYPE_CHECKING).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("base", "schemas", "streams", "producers", "processors", "sinks", "web", "stack", "gpuledger")
COMPONENTS = ("producers", "processors", "sinks")
LAYER_NAMES = ("base", "contracts", "runtime", "components", "web", "local stack", "entry points")
COMPONENT_LAYER = LAYER_NAMES.index("components")
# The clients a contract module never imports (the stream runtime's), and the one part of them it may: the
# Schema Registry's HTTP client, which the codec uses to register and fetch schemas (`schemas.codec`).
RUNTIME_CLIENTS = ("confluent_kafka", "faust", "aiokafka", "mode")
CONTRACT_MAY_IMPORT = ("confluent_kafka.schema_registry",)


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[0] == "base":
        return 0
    if parts[0] == "gpuledger" or parts[-1] in ("cli", "__main__") or parts[-1].endswith("_cli"):
        return LAYER_NAMES.index("entry points")
    if parts[0] == "stack":
        return LAYER_NAMES.index("local stack")
    if parts[0] == "web":
        return LAYER_NAMES.index("web")
    if parts[0] == "schemas":
        return 1
    if parts[0] == "streams":
        return 2
    return COMPONENT_LAYER


def project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
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
    return found


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


def test_no_module_imports_a_layer_above_its_own_or_another_component() -> None:
    assert upward_imports(project_modules()) == []


def test_no_import_cycle_between_modules() -> None:
    modules = project_modules()
    edges = {
        module: set(imports_of(path.read_text(encoding="utf-8"), modules, type_only=False)) - {module}
        for module, path in modules.items()
    }
    assert cycles(edges) == []


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
    ],
)
def test_the_checker_sees_each_kind_of_violation(
    tmp_path: Path, module: str, source: str, complaint: str | None
) -> None:
    known = {"base.settings": tmp_path / "a.py", "stack.security": tmp_path / "b.py",
             "schemas.codec": tmp_path / "c.py", "sinks.rows": tmp_path / "d.py", "sinks.ratecard": tmp_path / "e.py",
             "processors.cli": tmp_path / "f.py", "processors.rollup": tmp_path / "g.py",
             "sinks.writer": tmp_path / "h.py", "gpuledger.cli": tmp_path / "i.py",
             "streams.publish": tmp_path / "j.py"}  # fmt: skip
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
