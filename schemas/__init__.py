"""The contracts: one Avro schema (`.avsc`) per subject, the single source of truth.

Other code loads schemas by subject name; it never writes a schema of its own.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent


def subjects() -> list[str]:
    """Every subject that has a schema, sorted."""
    return sorted(p.name.removesuffix(".avsc") for p in SCHEMA_DIR.glob("*.avsc"))


@cache
def load_schema(subject: str) -> dict[str, Any]:
    """The schema of `subject` as JSON data (with docs and logical types)."""
    path = SCHEMA_DIR / f"{subject}.avsc"
    if not path.exists():
        raise KeyError(f"no schema for subject {subject!r}; known: {', '.join(subjects())}")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data
