"""Size limits over the packages (issue 16): no class over 250 lines, no function over 95.

A class or function that grows past these is doing more than one thing; split it by concern
(collaborators with names that explain themselves) rather than raising the limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("base", "schemas", "streams", "producers", "processors", "sinks", "web", "stack", "gpuledger")
MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 95


def _size(node: ast.AST) -> int:
    end = getattr(node, "end_lineno", None)
    start = getattr(node, "lineno", 0)
    return (end or start) - start + 1


def oversized() -> list[str]:
    offenders: list[str] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    kind, limit = "class", MAX_CLASS_LINES
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    kind, limit = "function", MAX_FUNCTION_LINES
                else:
                    continue
                lines = _size(node)
                if lines > limit:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    offenders.append(f"{where} {kind} {node.name}: {lines} lines (limit {limit})")
    return offenders


def test_no_class_or_function_over_the_limits() -> None:
    offenders = oversized()
    assert not offenders, "over the size limits:\n" + "\n".join(offenders)
