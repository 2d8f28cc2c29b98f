"""The contracts: one Avro schema (`.avsc`) per subject, the single source of truth.

Other code loads schemas by subject name; it never writes a schema of its own.

Layout (versions are compatible evolutions of one subject; the topic's `.vN` is the major version):

    schemas/<subject>.avsc                 the latest version, the one every writer uses
    schemas/history/<subject>/<n>.avsc     older versions 1..k, frozen; the latest is version k+1

To evolve a subject: copy `<subject>.avsc` to `history/<subject>/<k+1>.avsc`, then edit
`<subject>.avsc` (add fields with defaults only) and run `python -m schemas.evolution`.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

from base.errors import ContractError

SCHEMA_DIR = Path(__file__).resolve().parent
HISTORY = "history"


class SchemaStore:
    """The schemas of one directory laid out as above (the package's own, or a test's)."""

    def __init__(self, root: Path = SCHEMA_DIR) -> None:
        self.root = root

    def subjects(self) -> list[str]:
        """Every subject that has a schema, sorted."""
        return sorted(p.name.removesuffix(".avsc") for p in self.root.glob("*.avsc"))

    def _read(self, path: Path) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ContractError(f"{path}: not valid JSON: {exc}") from exc
        return data

    def history_paths(self, subject: str) -> list[Path]:
        """Files of the older versions, version 1 first; the numbering must have no gaps."""
        folder = self.root / HISTORY / subject
        if not folder.is_dir():
            return []
        numbered: dict[int, Path] = {}
        for path in folder.glob("*.avsc"):
            stem = path.name.removesuffix(".avsc")
            if not stem.isdigit():
                raise ContractError(f"{path}: history files are named <version>.avsc")
            numbered[int(stem)] = path
        if sorted(numbered) != list(range(1, len(numbered) + 1)):
            raise ContractError(f"{folder}: versions must be numbered 1..n without gaps, got {sorted(numbered)}")
        return [numbered[n] for n in sorted(numbered)]

    def latest_version(self, subject: str) -> int:
        return len(self.history_paths(subject)) + 1

    def load(self, subject: str, version: int | None = None) -> dict[str, Any]:
        """Version `version` of `subject` (default: the latest) as JSON data, docs and logical types kept."""
        path = self.root / f"{subject}.avsc"
        if not path.exists():
            raise KeyError(f"no schema for subject {subject!r}; known: {', '.join(self.subjects())}")
        if version is None:
            return self._read(path)
        history = self.history_paths(subject)
        if version == len(history) + 1:
            return self._read(path)
        if not 1 <= version <= len(history):
            raise KeyError(f"subject {subject!r} has versions 1..{len(history) + 1}, not {version}")
        return self._read(history[version - 1])

    def versions(self, subject: str) -> list[dict[str, Any]]:
        """Every version of `subject`, version 1 first, the latest last."""
        return [self.load(subject, v) for v in range(1, self.latest_version(subject) + 1)]


DEFAULT_STORE = SchemaStore()


def subjects() -> list[str]:
    """Every subject that has a schema, sorted."""
    return DEFAULT_STORE.subjects()


@cache
def _load_cached(subject: str, version: int | None) -> dict[str, Any]:
    return DEFAULT_STORE.load(subject, version)


def load_schema(subject: str, version: int | None = None) -> dict[str, Any]:
    """The schema of `subject` as JSON data (with docs and logical types); the latest unless `version`.

    Each call gets its own copy: a caller that reshapes it (a decoder's plan, a test) cannot change
    what the next caller reads.
    """
    return copy.deepcopy(_load_cached(subject, version))


def latest_version(subject: str) -> int:
    """The version number of `subject`'s latest schema (1 + the number of frozen older versions)."""
    return DEFAULT_STORE.latest_version(subject)
