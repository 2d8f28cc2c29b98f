"""A MIG instance's share of its GPU, from its profile: the fair unit a slice is priced in.

A profile names its compute slices first (`1g.10gb`: 1 slice, 10 GB; `3g.40gb`: 3 slices); a GPU has a
fixed number of them in MIG mode (7 for A100/H100/H200/B200, 4 for A30; `mig_slices.csv`, by model
token as `generations.csv`). The share is slices / the GPU's slices, as a `Fraction`, kept unreduced
in `MigShare` (a 7g on an H100 is 7/7) so what was derived stays visible.

    mig_share("1g.10gb", "NVIDIA H100 80GB HBM3")  -> 1/7
    mig_share("2g.12gb+me", "NVIDIA A30")          -> 2/4

A profile that does not parse, a slice count the GPU does not offer, or a model with no known slice count
raises `UnknownMigProfile`: the caller decides (the rollup leaves such a slice unpriced rather than guess).
Pure: the catalogue is read once from package data.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from importlib import resources

from base.errors import ParseError
from schemas.generations import model_tokens

# `1g.10gb`, `MIG 1g.10gb`, `1g.6gb+me`, `1g.5gb+me+gfx`; Kubernetes' `nvidia.com/mig-1g.10gb` resource
# form, `mig-1g.10gb`, too. Compute-instance profiles (`1c.3g.20gb`) share one GPU instance: not a share.
_PROFILE = re.compile(r"(?:mig[ -])?(\d+)g\.(\d+)gb((?:\+[a-z]+)*)", re.IGNORECASE)
# Slice counts NVIDIA offers as GPU instances, by the GPU's total (7: 1g 2g 3g 4g 7g; 4: 1g 2g 4g).
_OFFERED = {7: frozenset({1, 2, 3, 4, 7}), 4: frozenset({1, 2, 4})}


class UnknownMigProfile(ParseError):
    """A MIG profile whose share of its GPU cannot be derived (the message says why)."""


@dataclass(frozen=True, slots=True)
class MigShare:
    slices: int  # compute slices the instance holds
    of: int  # compute slices of the whole GPU

    @property
    def fraction(self) -> Fraction:
        return Fraction(self.slices, self.of)


def parse_slice_table(text: str, origin: str = "mig_slices.csv") -> dict[str, int]:
    table: dict[str, int] = {}
    body = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")]
    reader = csv.reader(io.StringIO("\n".join(line for _, line in body)))
    header = next(reader, None)
    if header != ["token", "compute_slices"]:
        raise ParseError(f"{origin}: header must be token,compute_slices, got {header}")
    for (lineno, _), row in zip(body[1:], reader, strict=True):
        if len(row) != 2 or not row[0].strip() or not row[1].strip().isdigit() or int(row[1]) not in _OFFERED:
            raise ParseError(f"{origin}:{lineno}: expected token,compute_slices with slices one of "
                             f"{sorted(_OFFERED)}, got {row}")  # fmt: skip
        table[row[0].strip().upper()] = int(row[1])
    return table


@cache
def slice_table() -> dict[str, int]:
    return parse_slice_table((resources.files("schemas") / "mig_slices.csv").read_text(encoding="utf-8"))


def gpu_slices(model: str | None, table: dict[str, int] | None = None) -> int | None:
    """Compute slices of the whole GPU `model` in MIG mode; None when the model has no known count."""
    if not model:
        return None
    table = slice_table() if table is None else table
    for token in model_tokens(model):
        if token in table:
            return table[token]
    return None


def mig_share(profile: str, model: str | None, table: dict[str, int] | None = None) -> MigShare:
    """The share of its GPU that a MIG instance of `profile` on a `model` GPU holds; `UnknownMigProfile`
    when it cannot be derived."""
    match = _PROFILE.fullmatch(profile.strip())
    if match is None:
        raise UnknownMigProfile(f"MIG profile {profile!r} is not of the form <slices>g.<memory>gb")
    slices = int(match.group(1))
    total = gpu_slices(model, table)
    if total is None:
        raise UnknownMigProfile(f"MIG profile {profile!r}: GPU model {model!r} has no known MIG slice count "
                                "(schemas/mig_slices.csv)")  # fmt: skip
    if slices not in _OFFERED[total]:
        offered = ", ".join(f"{n}g" for n in sorted(_OFFERED[total]))
        raise UnknownMigProfile(f"MIG profile {profile!r}: a {total}-slice GPU ({model}) offers {offered} instances, "
                                f"not {slices}g")  # fmt: skip
    return MigShare(slices, total)
