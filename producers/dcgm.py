"""dcgm-exporter `/metrics` to canonical device samples: parse, map, build the record.

Pure code (no IO) shared by the scraper (`producers.scraper`), `gpuledger inspect dcgm` and the
simulator:

    parse_exposition(text) -> Exposition            # prometheus_client's parser
    ExpositionParser().parse(text) -> Exposition     # same result, label sets parsed once and cached
    Normalizer().normalize(samples, exporter_version=None) -> NormalizedScrape
    scrape_record(cluster, node, ts_ms, normalized) -> dict   # a telemetry.device-samples record

Devices are keyed by GPU UUID plus MIG instance (`GPU_I_ID`); the mapping version that read the
scrape is stamped on the record. An unknown metric is counted and logged once per process, never
fatal. Lines that are not Prometheus text (a scrape pasted into a document, a `<code>` wrapper) are
skipped and counted.

An exporter's output is untrusted input: a value outside its field's range (a ratio above 1, a
negative power, an int field past 32 bits) is dropped as missing and counted, never carried; the
unknown metric names remembered per process are capped (`MAX_UNKNOWN_METRICS`, then counted as
`UNKNOWN_OVERFLOW`), as are the names and label sets the parser caches. The scraper caps the bytes
of one scrape and parses big ones off the event loop (`producers.scraper`).
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, NamedTuple

from prometheus_client.parser import parse_labels, text_string_to_metric_families

from base.errors import ParseError
from producers.mapping import MappingCatalogue, MetricMapping, load_mappings
from producers.records import coerce_device, device_metric_fields, empty_device, node_scrape_record

log = logging.getLogger(__name__)

SOURCE = "dcgm-exporter"
MAX_UNKNOWN_METRICS = 1_000  # distinct unknown metric names remembered (and logged) per process
UNKNOWN_OVERFLOW = "<other unknown metrics>"
MAX_METRIC_NAMES = 10_000  # distinct metric names the parser remembers as valid
_INT32 = float(1 << 31)


def _value_bounds(name: str) -> tuple[float, float]:
    """The range a canonical field's value may take (its unit is in its name, STYLE.md)."""
    if name.endswith("_ratio"):
        return 0.0, 1.0
    if name.endswith("_pct"):
        return 0.0, 100.0
    if name.endswith("_c"):
        return -273.15, 1_000.0
    if name == "xid_last":
        return -_INT32, _INT32 - 1
    return 0.0, math.inf  # _mib, _w, _bytes_per_s: never negative


VALUE_BOUNDS: dict[str, tuple[float, float]] = {f: _value_bounds(f) for f in device_metric_fields()}
_UNBOUNDED = (-math.inf, math.inf)


class RawSample(NamedTuple):
    """One exposition sample: metric (family) name, its labels, its value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Exposition:
    samples: list[RawSample]
    skipped_lines: int = 0
    first_skipped: str | None = None


def _families_samples(text: str) -> list[RawSample]:
    out: list[RawSample] = []
    for family in text_string_to_metric_families(text):
        name = family.name
        for s in family.samples:
            out.append(RawSample(name, s.labels, float(s.value)))
    return out


def parse_exposition(text: str) -> Exposition:
    """Parse with prometheus_client; if the text has foreign lines, parse line by line and skip them."""
    try:
        return Exposition(_families_samples(text))
    except (ValueError, TypeError, IndexError):
        pass
    samples: list[RawSample] = []
    skipped = 0
    first: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            samples.extend(_families_samples(stripped + "\n"))
        except (ValueError, TypeError, IndexError):
            skipped += 1
            first = first or stripped[:120]
    return Exposition(samples, skipped, first)


def _has_unquoted_brace(block: str) -> bool:
    """Whether `block` has a `}` outside double quotes (a quote preceded by an odd run of backslashes is escaped)."""
    in_quotes = False
    backslashes = 0
    for c in block:
        if c == "\\":
            backslashes += 1
            continue
        if c == '"' and backslashes % 2 == 0:
            in_quotes = not in_quotes
        elif c == "}" and not in_quotes:
            return True
        backslashes = 0
    return False


class ExpositionParser:
    """prometheus_client's sample grammar, with each distinct label set parsed once.

    A node's exporter prints the same label block for every metric of a GPU, scrape after scrape;
    `prometheus_client.parser.parse_labels` is run once per distinct block and cached, which makes
    parsing ~20x cheaper than the line-by-line reference. A line the fast path cannot split sends
    the whole text to `parse_exposition` (the reference), so results never differ.
    """

    def __init__(self, max_cached_label_sets: int = 200_000) -> None:
        self._labels: dict[str, dict[str, str]] = {}
        self._max = max_cached_label_sets
        self._names: set[str] = set()

    def _labels_of(self, block: str) -> dict[str, str]:
        labels = self._labels.get(block)
        if labels is None:
            if len(self._labels) >= self._max:
                self._labels.clear()
            if "}" in block and _has_unquoted_brace(block):
                # prometheus_client's parse_labels never returns on one (`a="1"}`): a hostile line would
                # wedge the scraper. Refused here, the line goes to the reference parser, which rejects it.
                raise ValueError(f"unquoted '}}' in labels {block[:80]!r}")
            labels = parse_labels(block)
            self._labels[block] = labels
        return labels

    def parse(self, text: str) -> Exposition:
        samples: list[RawSample] = []
        append = samples.append
        labels_of = self._labels_of
        names = self._names
        try:
            for line in text.splitlines():
                if not line or line[0] == "#":
                    continue
                open_ = line.find("{")
                if open_ < 0:
                    name, _, rest = line.strip().partition(" ")
                    if not name or name[0] == "#":
                        continue
                    labels: Mapping[str, str] = {}
                else:
                    close = line.rindex("}")
                    name = line[:open_].strip()
                    labels = labels_of(line[open_ + 1 : close])
                    rest = line[close + 1 :]
                if name not in names:
                    if not name.replace(":", "_").isidentifier():
                        raise ValueError(name)
                    if len(names) >= MAX_METRIC_NAMES:
                        names.clear()
                    names.add(name)
                append(RawSample(name, labels, float(rest.split(None, 1)[0])))
        except (ValueError, IndexError):
            return parse_exposition(text)
        return Exposition(samples)


@cache
def label_attributes() -> dict[str, str]:
    """Series label -> device attribute (`mappings/labels.csv`)."""
    text = (resources.files("producers") / "mappings" / "labels.csv").read_text(encoding="utf-8")
    body = "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
    out: dict[str, str] = {}
    for row in csv.DictReader(io.StringIO(body)):
        out[row["label"]] = row["attribute"]
    return out


@dataclass(slots=True)
class NormalizedScrape:
    """The canonical devices of one scrape, with what was learnt on the way."""

    mapping_version: str
    devices: list[dict[str, Any]]
    hostname: str | None = None
    driver_version: str | None = None
    warnings: list[str] = field(default_factory=list)
    unknown_metrics: dict[str, int] = field(default_factory=dict)
    skipped_lines: int = 0
    out_of_range: int = 0  # values outside their field's range, dropped


class _Identity(NamedTuple):
    uuid: str | None
    mig_instance_id: int | None
    attrs: dict[str, str]


def _identity(labels: Mapping[str, str], attributes: dict[str, str]) -> _Identity:
    attrs: dict[str, str] = {}
    for label, value in labels.items():
        attr = attributes.get(label)
        if attr is not None and value != "" and attr not in attrs:
            attrs[attr] = value
    mig = attrs.get("mig_instance_id")
    return _Identity(attrs.get("uuid"), _label_int(mig), attrs)


def _label_int(text: str | None) -> int | None:
    """A label's small non-negative integer (GPU index, MIG instance), else None."""
    return int(text) if text is not None and len(text) <= 9 and text.isascii() and text.isdigit() else None


_DEVICE_ATTRS = ("model", "pci_bus_id", "mig_profile", "pod", "namespace", "container", "hpc_job")


class Normalizer:
    """Maps parsed samples to canonical devices. Holds per-process counters of unknown metrics."""

    def __init__(self, catalogue: MappingCatalogue | None = None) -> None:
        self.catalogue = catalogue or load_mappings()
        self.unknown_counts: Counter[str] = Counter()
        self._logged: set[str] = set()
        self._attributes = label_attributes()
        self._identity_cache: dict[int, tuple[Mapping[str, str], _Identity]] = {}

    def mapping_for(
        self, samples: Iterable[RawSample], exporter_version: str | None = None, mapping_version: str | None = None
    ) -> MetricMapping:
        if mapping_version:
            return self.catalogue.get(mapping_version)
        if exporter_version:
            return self.catalogue.for_exporter(exporter_version)
        names: set[str] = set()
        labels: set[str] = set()
        for s in samples:
            names.add(s.name)
            labels.update(s.labels)
        return self.catalogue.detect(names, labels)

    def _note_unknown(self, name: str, result: NormalizedScrape) -> None:
        if name not in self.unknown_counts and len(self.unknown_counts) >= MAX_UNKNOWN_METRICS:
            name = UNKNOWN_OVERFLOW  # a hostile exporter inventing names cannot grow this process
        self.unknown_counts[name] += 1
        result.unknown_metrics[name] = result.unknown_metrics.get(name, 0) + 1
        if name not in self._logged:
            self._logged.add(name)
            log.warning("unknown exporter metric %s (mapping %s): counted, not carried", name, result.mapping_version)

    def _ident(self, labels: Mapping[str, str]) -> _Identity:
        # Label dicts are shared between samples by ExpositionParser: cache by identity.
        hit = self._identity_cache.get(id(labels))
        if hit is not None and hit[0] is labels:
            return hit[1]
        ident = _identity(labels, self._attributes)
        if len(self._identity_cache) > 100_000:
            self._identity_cache.clear()
        self._identity_cache[id(labels)] = (labels, ident)
        return ident

    def _choose_mapping(
        self, samples: list[RawSample], exporter_version: str | None, mapping_version: str | None
    ) -> tuple[MetricMapping, str | None]:
        """The mapping for the scrape, and a warning when the exporter's version named none and the
        scrape's contents chose it (a mapping version asked for by name must exist)."""
        try:
            return self.mapping_for(samples, exporter_version, mapping_version), None
        except ParseError as exc:
            if mapping_version:
                raise
            mapping = self.mapping_for(samples)
            return mapping, f"{exc}: mapping {mapping.version} chosen from the scrape's contents"

    def normalize(
        self,
        samples: list[RawSample],
        *,
        exporter_version: str | None = None,
        mapping_version: str | None = None,
        mapping: MetricMapping | None = None,
    ) -> NormalizedScrape:
        fallback: str | None = None
        if mapping is None:
            mapping, fallback = self._choose_mapping(samples, exporter_version, mapping_version)
        result = NormalizedScrape(mapping.version, [])
        if fallback:
            result.warnings.append(fallback)
        rules = mapping.rules
        devices: dict[tuple[str, int | None], dict[str, Any]] = {}
        priority: dict[tuple[str, int | None, str], int] = {}
        hostnames: set[str] = set()
        no_uuid = 0
        auto_pct = False
        ident_cache = self._identity_cache
        last_labels: dict[tuple[str, int | None], int] = {}
        for s in samples:
            rule = rules.get(s.name)
            if rule is None:
                self._note_unknown(s.name, result)
                continue
            labels = s.labels
            lid = id(labels)
            hit = ident_cache.get(lid)
            ident = hit[1] if hit is not None and hit[0] is labels else self._ident(labels)
            if ident.uuid is None:
                no_uuid += 1
                continue
            key = (ident.uuid, ident.mig_instance_id)
            dev = devices.get(key)
            if dev is None:
                dev = empty_device(ident.uuid)
                dev["mig_instance_id"] = ident.mig_instance_id
                index = ident.attrs.get("index")
                dev["index"] = _label_int(index)
                devices[key] = dev
            if last_labels.get(key) != lid:
                # A label set not seen yet for this device: take what it tells (host, model, pod, ...).
                last_labels[key] = lid
                attrs = ident.attrs
                host = attrs.get("hostname")
                if host is not None:
                    hostnames.add(host)
                if result.driver_version is None and "driver_version" in attrs:
                    result.driver_version = attrs["driver_version"]
                for attr in _DEVICE_ATTRS:
                    if dev[attr] is None and attr in attrs:
                        dev[attr] = attrs[attr]
            canonical = rule.canonical
            if canonical is None:
                continue
            value = s.value
            if value != value or value in (math.inf, -math.inf):
                continue
            if rule.unit == "auto_ratio" and value > 1.0:
                value = value / 100.0
                auto_pct = True
            elif rule.scale != 1.0:
                value = value * rule.scale
            lo, hi = VALUE_BOUNDS.get(canonical, _UNBOUNDED)
            if not lo <= value <= hi:
                result.out_of_range += 1
                continue
            pkey = (key[0], key[1], canonical)
            held = priority.get(pkey)
            if held is not None and held <= rule.priority:
                continue
            priority[pkey] = rule.priority
            dev[canonical] = value
        _warn_about_scrape(result, no_uuid=no_uuid, auto_pct=auto_pct, hostnames=hostnames)
        result.hostname = min(hostnames) if hostnames else None
        result.devices = [
            coerce_device(d)
            for _, d in sorted(
                devices.items(),
                key=lambda kv: (
                    kv[1]["index"] if kv[1]["index"] is not None else 1 << 30,
                    kv[0][0],
                    -1 if kv[0][1] is None else kv[0][1],
                ),
            )
        ]
        return result


def _warn_about_scrape(result: NormalizedScrape, *, no_uuid: int, auto_pct: bool, hostnames: set[str]) -> None:
    """The scrape's warnings, in the order `gpuledger inspect dcgm` shows them."""
    if no_uuid:
        result.warnings.append(f"{no_uuid} samples without a UUID label skipped")
    if auto_pct:
        result.warnings.append("profiling metrics reported in percent: divided by 100")
    if result.out_of_range:
        result.warnings.append(f"{result.out_of_range} values outside their field's range dropped")
    if len(hostnames) > 1:
        result.warnings.append(f"several hostnames in one scrape: {', '.join(sorted(hostnames))}")
    if result.unknown_metrics:
        result.warnings.append(
            f"{len(result.unknown_metrics)} unknown metrics: {', '.join(sorted(result.unknown_metrics))}"
        )


def scrape_record(
    *,
    cluster: str,
    node: str,
    ts_ms: int,
    normalized: NormalizedScrape,
    exporter_version: str | None = None,
    source: str = SOURCE,
) -> dict[str, Any]:
    """The telemetry.device-samples record of one node scrape."""
    return node_scrape_record(
        cluster=cluster,
        node=node,
        ts_ms=ts_ms,
        source=source,
        exporter_version=exporter_version,
        mapping_version=normalized.mapping_version,
        devices=normalized.devices,
    )


def normalize_text(
    text: str,
    *,
    exporter_version: str | None = None,
    normalizer: Normalizer | None = None,
    parser: ExpositionParser | None = None,
) -> NormalizedScrape:
    """Parse and normalize one exposition (what `gpuledger inspect dcgm` shows)."""
    exposition = parser.parse(text) if parser else parse_exposition(text)
    if not exposition.samples:
        raise ParseError("no Prometheus samples in the scrape")
    result = (normalizer or Normalizer()).normalize(exposition.samples, exporter_version=exporter_version)
    result.skipped_lines = exposition.skipped_lines
    if exposition.skipped_lines:
        result.warnings.append(
            f"{exposition.skipped_lines} lines are not Prometheus text and were skipped "
            f"(first: {exposition.first_skipped!r})"
        )
    return result
