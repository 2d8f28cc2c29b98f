"""The processing core is pure: no Kafka client, no faust, no ClickHouse client, no clock reads."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = ["attribution", "windows", "classify", "rollup", "idle", "coverage", "stages", "pipeline", "testing"]
FORBIDDEN_IMPORTS = ("faust", "confluent_kafka", "clickhouse_connect", "aiokafka", "mode")
ROOT = Path(__file__).resolve().parents[2] / "processors"


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_no_io_library(module: str) -> None:
    tree = ast.parse((ROOT / f"{module}.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_IMPORTS, f"processors/{module}.py imports {name}"
            assert name.split(".")[0] not in ("time", "os"), f"processors/{module}.py imports {name}"
            assert name != "processors.runtime", f"processors/{module}.py imports the runtime"
        # datetime may format a given instant, never read the clock.
        if isinstance(node, ast.Attribute):
            assert node.attr not in ("now", "utcnow", "today"), f"processors/{module}.py reads the clock"


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_cleanly_without_io_libraries(module: str) -> None:
    import importlib
    import sys

    before = set(sys.modules)
    importlib.import_module(f"processors.{module}")
    loaded = {m.split(".")[0] for m in set(sys.modules) - before}
    assert not loaded & {"faust", "confluent_kafka", "clickhouse_connect"}
