"""Node GPU map: resolve a device index on a node to its GPU UUID.

`DeviceMap.lookup(cluster, node, index) -> uuid | None` is the interface the scheduler producers use.
`InMemoryDeviceMap` is fed from inventory records (`inventory.devices` topic, see `apply_inventory`),
from a file (YAML/JSON `{cluster: {node: {index: uuid}}}`), or from a dcgm-exporter scrape (the
`gpu` and `UUID` labels of each series).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from base.errors import ConfigError, ParseError


class DeviceMap(Protocol):
    def lookup(self, cluster: str, node: str, index: int) -> str | None: ...

    def devices(self, cluster: str, node: str) -> Mapping[int, str]: ...


class InMemoryDeviceMap:
    def __init__(self) -> None:
        self._nodes: dict[tuple[str, str], dict[int, str]] = {}

    def set(self, cluster: str, node: str, index: int, uuid: str) -> None:
        self._nodes.setdefault((cluster, node), {})[index] = uuid

    def lookup(self, cluster: str, node: str, index: int) -> str | None:
        return self._nodes.get((cluster, node), {}).get(index)

    def devices(self, cluster: str, node: str) -> Mapping[int, str]:
        return dict(self._nodes.get((cluster, node), {}))

    def __len__(self) -> int:
        return sum(len(v) for v in self._nodes.values())

    def apply_inventory(self, record: Mapping[str, Any]) -> None:
        """Apply one `NodeInventory` record (latest wins; `deleted` retires the node)."""
        key = (str(record["cluster"]), str(record["node"]))
        if record.get("deleted"):
            self._nodes.pop(key, None)
            return
        devs: dict[int, str] = {}
        for d in record.get("devices") or ():
            if d.get("uuid") and d.get("mig_profile") is None:
                devs[int(d["index"])] = str(d["uuid"])
        self._nodes[key] = devs

    def load_data(self, data: Any, where: str = "device map") -> None:
        if not isinstance(data, Mapping):
            raise ParseError(f"{where}: expected {{cluster: {{node: {{index: uuid}}}}}}")
        for cluster, nodes in data.items():
            if not isinstance(nodes, Mapping):
                raise ParseError(f"{where}: cluster {cluster!r} must map nodes")
            for node, devs in nodes.items():
                if not isinstance(devs, Mapping):
                    raise ParseError(f"{where}: node {node!r} must map index -> uuid")
                for idx, uuid in devs.items():
                    self.set(str(cluster), str(node), int(idx), str(uuid))

    @classmethod
    def from_file(cls, path: Path) -> InMemoryDeviceMap:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read device map {path}: {exc}") from exc
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ParseError(f"{path}: {exc}") from exc
        m = cls()
        m.load_data(data, str(path))
        return m

    def load_dcgm_scrape(self, cluster: str, text: str, node: str | None = None) -> None:
        """Index -> UUID from a dcgm-exporter `/metrics` scrape (`Hostname`/`hostname` label names the node)."""
        for labels in iter_dcgm_labels(text):
            host = node or labels.get("Hostname") or labels.get("hostname")
            if host and labels.get("gpu", "").isdigit() and labels.get("UUID"):
                self.set(cluster, host, int(labels["gpu"]), labels["UUID"])


_SERIES = re.compile(r"^(?:<code>)?([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\}\s")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def iter_dcgm_labels(text: str) -> Iterable[dict[str, str]]:
    for line in text.splitlines():
        m = _SERIES.match(line.strip())
        if m:
            yield dict(_LABEL.findall(m.group(2)))


def resolve_uuids(devmap: DeviceMap | None, cluster: str, node: str, indices: Iterable[int]) -> list[str | None]:
    return [devmap.lookup(cluster, node, i) if devmap is not None else None for i in indices]
