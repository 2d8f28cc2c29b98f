"""Record builders shared by every telemetry and inventory source (real or simulated).

Field lists come from the `.avsc` contracts, so the builders cannot drift from the schema.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from schemas import load_schema


def _record_fields(schema: dict[str, Any]) -> tuple[str, ...]:
    return tuple(f["name"] for f in schema["fields"])


@cache
def device_sample_fields() -> tuple[str, ...]:
    """Field names of DeviceSample, in schema order."""
    devices = next(f for f in load_schema("telemetry.device-samples")["fields"] if f["name"] == "devices")
    return _record_fields(devices["type"]["items"])


@cache
def device_metric_fields() -> tuple[str, ...]:
    """The measured (nullable double/int) fields of DeviceSample, i.e. everything but identity and labels."""
    identity = {
        "uuid",
        "index",
        "mig_instance_id",
        "mig_profile",
        "model",
        "pci_bus_id",
        "pod",
        "namespace",
        "container",
        "hpc_job",
    }
    return tuple(f for f in device_sample_fields() if f not in identity)


@cache
def _int_fields() -> frozenset[str]:
    devices = next(f for f in load_schema("telemetry.device-samples")["fields"] if f["name"] == "devices")
    out = set()
    for f in devices["type"]["items"]["fields"]:
        t = f["type"]
        if t == "int" or (isinstance(t, list) and "int" in t):
            out.add(f["name"])
    return frozenset(out)


def empty_device(uuid: str) -> dict[str, Any]:
    """A DeviceSample with every field null but the UUID (absent metrics are null, never 0)."""
    d: dict[str, Any] = dict.fromkeys(device_sample_fields())
    d["uuid"] = uuid
    return d


def coerce_device(device: dict[str, Any]) -> dict[str, Any]:
    """Make int-typed fields ints (exporters print `0` or `0.000000` alike)."""
    for name in _int_fields():
        v = device.get(name)
        if v is not None and not isinstance(v, int):
            device[name] = int(v)
    return device


def node_scrape_record(
    *,
    cluster: str,
    node: str,
    ts_ms: int,
    source: str,
    mapping_version: str,
    devices: list[dict[str, Any]],
    exporter_version: str | None = None,
) -> dict[str, Any]:
    """One `telemetry.device-samples` record (NodeScrape)."""
    return {
        "cluster": cluster,
        "node": node,
        "ts_ms": int(ts_ms),
        "source": source,
        "exporter_version": exporter_version,
        "mapping_version": mapping_version,
        "devices": devices,
    }


def inventory_device(
    *,
    index: int,
    model: str,
    generation: str,
    uuid: str | None = None,
    mig_profile: str | None = None,
    mig_instance_id: int | None = None,
) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": int(index),
        "model": model,
        "generation": generation,
        "mig_profile": mig_profile,
        "mig_instance_id": mig_instance_id,
    }


def node_inventory_record(
    *, cluster: str, node: str, ts_ms: int, source: str, devices: list[dict[str, Any]], deleted: bool = False
) -> dict[str, Any]:
    """One `inventory.devices` record (NodeInventory)."""
    return {
        "cluster": cluster,
        "node": node,
        "ts_ms": int(ts_ms),
        "source": source,
        "devices": devices,
        "deleted": deleted,
    }
