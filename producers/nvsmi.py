"""nvidia-smi as a telemetry source, for nodes without DCGM.

Reads the output of `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits] -l 1`: a header
row naming the fields (unless `noheader`, then the caller gives the field list), then one row per
GPU per loop. A new scrape starts when a GPU index shows up again. Values like `45 %`, `1234 MiB`,
`[N/A]` and `[Not Supported]` are read; what nvidia-smi cannot measure (SM activity, profiling
ratios, PCIe throughput) is null, never 0. Mapping version `nvsmi-v1` is stamped on each record.

    reader = NvsmiReader(cluster="c", node="n1")
    for line in lines: for record in reader.feed(line): publish(record)
    reader.flush()  # the last scrape
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any

from base.errors import ParseError
from producers.mapping import MappingCatalogue, MetricMapping, load_mappings
from producers.records import coerce_device, empty_device, node_scrape_record

SOURCE = "nvidia-smi"
MAPPING_VERSION = "nvsmi-v1"
DEFAULT_QUERY = (
    "timestamp,index,uuid,name,pci.bus_id,utilization.gpu,utilization.memory,memory.used,memory.free,"
    "memory.total,power.draw,temperature.gpu"
)
COMMAND = ["nvidia-smi", f"--query-gpu={DEFAULT_QUERY}", "--format=csv", "-l", "1"]
_MISSING = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "")


def _field_name(header: str) -> str:
    """`utilization.gpu [%]` -> `utilization.gpu`."""
    return header.split(" [", 1)[0].strip()


def _is_header(cells: list[str]) -> bool:
    """A header names query fields: lower-case words with dots and underscores (`utilization.gpu [%]`)."""
    for cell in cells:
        name = _field_name(cell)
        if not name or not name[0].isalpha() or name != name.lower():
            return False
        if not name.replace(".", "").replace("_", "").isalnum():
            return False
    return bool(cells)


def _number(text: str) -> float | None:
    text = text.strip()
    if text in _MISSING:
        return None
    token = text.split()[0]
    try:
        return float(token)
    except ValueError:
        return None


def _timestamp_ms(text: str, tz: tzinfo) -> int | None:
    text = text.strip()
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            return int(datetime.strptime(text, fmt).replace(tzinfo=tz).timestamp() * 1000)
        except ValueError:
            continue
    return None


@dataclass(slots=True)
class NvsmiReader:
    """Incremental parser of nvidia-smi CSV loop output into device-samples records."""

    cluster: str
    node: str
    fields: list[str] | None = None  # given for `noheader` output
    tz: tzinfo = UTC  # nvidia-smi prints the node's local time
    clock_ms: Any = None  # fallback when no timestamp column: callable returning epoch ms
    mapping: MetricMapping = field(default_factory=lambda: load_mappings().get(MAPPING_VERSION))
    warnings: list[str] = field(default_factory=list)
    _rows: list[dict[str, str]] = field(default_factory=list)
    _lineno: int = 0

    def feed(self, line: str) -> list[dict[str, Any]]:
        """Read one line; returns the records it completes (zero or one)."""
        self._lineno += 1
        line = line.strip()
        if not line:
            return []
        (cells,) = list(csv.reader([line], skipinitialspace=True))
        cells = [c.strip() for c in cells]
        if _is_header(cells):
            names = [_field_name(c) for c in cells]
            done = self.flush() if self.fields is not None and names != self.fields else []
            self.fields = names
            return done
        if self.fields is None:
            raise ParseError(f"nvidia-smi line {self._lineno}: data before a header; give the --query-gpu fields")
        if len(cells) != len(self.fields):
            self.warnings.append(f"line {self._lineno}: {len(cells)} values for {len(self.fields)} fields, skipped")
            return []
        row = dict(zip(self.fields, cells, strict=True))
        out: list[dict[str, Any]] = []
        key = row.get("index") or row.get("uuid")
        if any((r.get("index") or r.get("uuid")) == key for r in self._rows):
            out = self.flush()
        self._rows.append(row)
        return out

    def flush(self) -> list[dict[str, Any]]:
        rows, self._rows = self._rows, []
        if not rows:
            return []
        return [self.record(rows)]

    def record(self, rows: list[dict[str, str]]) -> dict[str, Any]:
        ts: int | None = None
        if "timestamp" in rows[0]:
            ts = _timestamp_ms(rows[0]["timestamp"], self.tz)
        if ts is None:
            if self.clock_ms is None:
                raise ParseError(f"nvidia-smi line {self._lineno}: no readable timestamp column")
            ts = int(self.clock_ms())
        devices = []
        for row in rows:
            uuid = row.get("uuid") or f"index-{row.get('index', '?')}"
            d = empty_device(uuid)
            index = row.get("index", "").strip()
            d["index"] = int(index) if index.isdigit() else None
            name = row.get("name")
            d["model"] = name if name and name not in _MISSING else None
            bus = row.get("pci.bus_id")
            d["pci_bus_id"] = bus if bus and bus not in _MISSING else None
            best: dict[str, int] = {}
            for fname, text in row.items():
                rule = self.mapping.rule(fname)
                if rule is None or rule.canonical is None:
                    continue
                value = _number(text)
                if value is None:
                    continue
                if rule.canonical in best and best[rule.canonical] <= rule.priority:
                    continue
                best[rule.canonical] = rule.priority
                d[rule.canonical] = value * rule.scale
            devices.append(coerce_device(d))
        return node_scrape_record(
            cluster=self.cluster,
            node=self.node,
            ts_ms=ts,
            source=SOURCE,
            mapping_version=self.mapping.version,
            devices=devices,
        )


def read_all(lines: Iterable[str], cluster: str, node: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    reader = NvsmiReader(cluster=cluster, node=node, **kwargs)
    for line in lines:
        yield from reader.feed(line)
    yield from reader.flush()


def catalogue() -> MappingCatalogue:
    return load_mappings()
