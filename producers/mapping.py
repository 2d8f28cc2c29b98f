"""Versioned metric mappings: exporter fields to the canonical DeviceSample fields, as data.

Each mapping version is a CSV under `producers/mappings/` (derived from dcgm-exporter's counter
catalogues, one per span of exporter releases whose meaning of a field is the same), listed in
`mappings/index.csv` with the exporter releases it reads. The parser here is pure: it reports the
file and line of a bad row. The version string of the mapping that produced a sample is stamped on
every record (`mapping_version`).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

from base.errors import ParseError

NOT_CARRIED = "-"
# Units a rule can declare; `auto_ratio` reads values above 1 as percent (old catalogues said "(in %)").
UNITS_RATIO = frozenset({"ratio", "auto_ratio"})


@dataclass(frozen=True, slots=True)
class FieldRule:
    """How one exporter field becomes one canonical field."""

    field: str
    canonical: str | None  # None: known to this version but not carried by the contract
    unit: str
    scale: float
    priority: int  # when two fields fill one canonical field, the lower priority number wins
    type: str
    help: str


@dataclass(frozen=True, slots=True)
class MetricMapping:
    version: str
    source: str
    rules: dict[str, FieldRule]
    description: str = ""
    exporter_from: tuple[int, ...] = (0,)
    exporter_until: tuple[int, ...] | None = None

    def rule(self, name: str) -> FieldRule | None:
        return self.rules.get(name)

    def covers(self, exporter: tuple[int, ...]) -> bool:
        return exporter >= self.exporter_from and (self.exporter_until is None or exporter < self.exporter_until)

    @property
    def canonical_fields(self) -> frozenset[str]:
        return frozenset(r.canonical for r in self.rules.values() if r.canonical)


def _rows(text: str, origin: str) -> list[tuple[int, dict[str, str]]]:
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")]
    if not lines:
        raise ParseError(f"{origin}: no header row")
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in lines)))
    out: list[tuple[int, dict[str, str]]] = []
    for (lineno, _), row in zip(lines[1:], reader, strict=True):
        if None in row or any(v is None for v in row.values()):
            raise ParseError(f"{origin}:{lineno}: expected {len(reader.fieldnames or [])} columns")
        out.append((lineno, {k: v.strip() for k, v in row.items()}))
    return out


def parse_mapping_csv(
    text: str, version: str, source: str = "dcgm-exporter", origin: str = "<mapping>"
) -> MetricMapping:
    """Parse one mapping CSV (columns field, canonical, unit, scale, priority, type, help)."""
    rules: dict[str, FieldRule] = {}
    for lineno, row in _rows(text, origin):
        try:
            name = row["field"]
            canonical = row["canonical"]
            scale = float(row["scale"])
            priority = int(row["priority"])
        except (KeyError, ValueError) as exc:
            raise ParseError(f"{origin}:{lineno}: bad mapping row {row!r}: {exc}") from exc
        if not name:
            raise ParseError(f"{origin}:{lineno}: empty field name")
        if name in rules:
            raise ParseError(f"{origin}:{lineno}: field {name} mapped twice")
        rules[name] = FieldRule(
            field=name,
            canonical=None if canonical in ("", NOT_CARRIED) else canonical,
            unit=row.get("unit", ""),
            scale=scale,
            priority=priority,
            type=row.get("type", ""),
            help=row.get("help", ""),
        )
    return MetricMapping(version=version, source=source, rules=rules)


def parse_version(text: str) -> tuple[int, ...]:
    """`4.7.1` -> (4, 7, 1). A dcgm-exporter tag names DCGM then the exporter: `4.4.2-4.7.1` and the image
    tag `3.3.5-3.4.0-ubuntu22.04` read as the exporter part, (4, 7, 1) and (3, 4, 0)."""
    tokens = [t.lstrip("v") for t in text.strip().split("-")]
    numeric = [t for t in tokens if t[:1].isdigit()]
    if not numeric:
        raise ParseError(f"not an exporter version: {text!r}")
    numbers: list[int] = []
    for piece in numeric[-1].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


@dataclass(frozen=True, slots=True)
class MappingCatalogue:
    """Every mapping version, and which one reads which exporter release."""

    mappings: dict[str, MetricMapping] = field(default_factory=dict)

    def get(self, version: str) -> MetricMapping:
        try:
            return self.mappings[version]
        except KeyError:
            raise ParseError(
                f"unknown mapping version {version!r}; known: {', '.join(sorted(self.mappings))}"
            ) from None

    def for_exporter(self, exporter_version: str, source: str = "dcgm-exporter") -> MetricMapping:
        v = parse_version(exporter_version)
        for m in self.mappings.values():
            if m.source == source and m.covers(v):
                return m
        raise ParseError(f"no {source} mapping covers exporter version {exporter_version!r}")

    def detect(self, metric_names: set[str], label_names: set[str]) -> MetricMapping:
        """Choose a mapping from what a scrape contains, when the exporter version is not configured."""
        if any(n.startswith("dcgm_") for n in metric_names) and not any(n.startswith("DCGM_") for n in metric_names):
            return self.get("dcgm-v1")
        if "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" in metric_names or "DCGM_FI_DEV_PCIE_RX_THROUGHPUT" in metric_names:
            return self.get("dcgm-v2")
        if "hostname" in label_names and "Hostname" not in label_names:
            return self.get("dcgm-v4")
        return self.get("dcgm-v3")


def _version_or_none(text: str) -> tuple[int, ...] | None:
    return parse_version(text) if text.strip() else None


def parse_index(text: str, read_file: dict[str, str], origin: str = "index.csv") -> MappingCatalogue:
    mappings: dict[str, MetricMapping] = {}
    for lineno, row in _rows(text, origin):
        try:
            version, fname, source = row["mapping_version"], row["file"], row["source"]
            body = read_file[fname]
        except KeyError as exc:
            raise ParseError(f"{origin}:{lineno}: bad index row {row!r}: missing {exc}") from exc
        m = parse_mapping_csv(body, version, source, origin=fname)
        mappings[version] = MetricMapping(
            version=version,
            source=source,
            rules=m.rules,
            description=row.get("description", ""),
            exporter_from=_version_or_none(row.get("exporter_from", "")) or (0,),
            exporter_until=_version_or_none(row.get("exporter_until", "")),
        )
    return MappingCatalogue(mappings)


@cache
def load_mappings() -> MappingCatalogue:
    """The mappings shipped with the package (read once per process)."""
    pkg = resources.files("producers") / "mappings"
    files = {p.name: p.read_text(encoding="utf-8") for p in pkg.iterdir() if p.name.endswith(".csv")}
    return parse_index(files["index.csv"], files)
