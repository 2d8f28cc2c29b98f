"""GPU generation from a model name, by a data table (`generations.csv`), not by code branches.

The one classifier: producers stamp it on inventory records, and the processors fall back to it for a
device the inventory does not describe. It lives beside the contracts, at the bottom of the
dependency order, so both can import it.
"""

from __future__ import annotations

import csv
import io
from functools import cache, lru_cache
from importlib import resources

from base.errors import ParseError

UNKNOWN = "unknown"
_SEPARATORS = "-_/,()"


def parse_generation_table(text: str, origin: str = "generations.csv") -> dict[str, str]:
    table: dict[str, str] = {}
    body = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")]
    reader = csv.reader(io.StringIO("\n".join(line for _, line in body)))
    header = next(reader, None)
    if header != ["token", "generation"]:
        raise ParseError(f"{origin}: header must be token,generation, got {header}")
    for (lineno, _), row in zip(body[1:], reader, strict=True):
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise ParseError(f"{origin}:{lineno}: expected token,generation, got {row}")
        table[row[0].strip().upper()] = row[1].strip()
    return table


@cache
def generation_table() -> dict[str, str]:
    text = (resources.files("schemas") / "generations.csv").read_text(encoding="utf-8")
    return parse_generation_table(text)


def model_tokens(model: str) -> list[str]:
    text = model.upper()
    for sep in _SEPARATORS:
        text = text.replace(sep, " ")
    tokens = text.split()
    # "RTX 6000" / "RTX PRO 6000" are one product name: also try adjacent tokens joined.
    joined = ["".join(tokens[i : i + n]) for n in (2, 3) for i in range(len(tokens) - n + 1)]
    return tokens + joined


def generation_of(model: str | None, table: dict[str, str] | None = None) -> str:
    """`NVIDIA H100 80GB HBM3` -> hopper; `GRID A100-40C` (vGPU) -> ampere; `h100` (gres) -> hopper."""
    if not model:
        return UNKNOWN
    if table is None:
        return _catalogue_generation(model)
    return _generation_in(model, table)


@lru_cache(maxsize=4096)  # a fleet has a few models; asked once per device-minute (bounded: models are untrusted)
def _catalogue_generation(model: str) -> str:
    return _generation_in(model, generation_table())


def _generation_in(model: str, table: dict[str, str]) -> str:
    for token in model_tokens(model):
        gen = table.get(token)
        if gen is not None:
            return gen
    return UNKNOWN
