"""Builders of contract records (NodeScrape, JobEvent, NodeInventory, the job stage's JobDeviceMinutes) for
worked ledgers and benches.

Records carry every field of their schema, so they also encode with `schemas.codec.AvroCodec`.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

from schemas.codec import AvroCodec, avro_long
from schemas.topics import DEVICE_MINUTES

T0 = 1_772_450_400_000  # 2026-03-02T11:20:00Z, a minute boundary


def device(
    uuid: str,
    index: int,
    *,
    sm: float | None = None,
    gr: float | None = None,
    util_pct: float | None = None,
    fb_mib: float | None = 0.0,
    power_w: float | None = 100.0,
    model: str = "NVIDIA H100 80GB HBM3",
    mig: int | None = None,
) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "index": index,
        "mig_instance_id": mig,
        "mig_profile": None,
        "model": model,
        "pci_bus_id": None,
        "sm_active_ratio": sm,
        "sm_occupancy_ratio": None,
        "gr_engine_active_ratio": gr,
        "tensor_active_ratio": None,
        "dram_active_ratio": None,
        "gpu_util_pct": util_pct,
        "mem_copy_util_pct": None,
        "fb_used_mib": fb_mib,
        "fb_free_mib": None,
        "power_w": power_w,
        "pcie_tx_bytes_per_s": None,
        "pcie_rx_bytes_per_s": None,
        "temperature_c": None,
        "xid_last": None,
        "pod": None,
        "namespace": None,
        "container": None,
        "hpc_job": None,
    }


def scrape(node: str, ts_ms: int, devices: list[dict[str, Any]], cluster: str = "c1") -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": node,
        "ts_ms": ts_ms,
        "source": "simulator",
        "exporter_version": "3.4.0",
        "mapping_version": "dcgm-3.x/1",
        "devices": devices,
    }


def job_event(
    kind: str,
    job_id: str,
    ts_ms: int,
    allocations: dict[str, list[str]] | None = None,
    *,
    cluster: str = "c1",
    user: str = "ana",
    project: str | None = "proj-a",
    interactive: bool = False,
    checkpointable: bool = False,
    partition: str | None = None,
    team: str = "vision",
) -> dict[str, Any]:
    """A JobEvent; `allocations` maps node -> device UUIDs held there."""

    def held(uuid: str) -> dict[str, Any]:
        return {"index": None, "uuid": uuid, "mig_instance_id": None, "mig_profile": None}

    allocs = [{"node": node, "devices": [held(u) for u in us]} for node, us in (allocations or {}).items()]
    return {
        "event_id": f"{cluster}/{job_id}/{kind}/{ts_ms}",
        "event_type": kind,
        "ts_ms": ts_ms,
        "scheduler": "SIMULATOR",
        "cluster": cluster,
        "job_id": job_id,
        "array_job_id": None,
        "array_task_id": None,
        "het_job_id": None,
        "het_job_offset": None,
        "job_name": None,
        "user": user,
        "account": None,
        "project": project,
        "project_source": "EXPLICIT",
        "project_validation": "VALID",
        "identity": {
            "user": user,
            "teams": [team],
            "groups": [],
            "projects": [project] if project else [],
            "primary_team": team,
            "cost_centre": "cc-1",
            "snapshot_ts_ms": ts_ms,
        },
        "partition": partition,
        "qos": None,
        "preemptible": False,
        "interactive": interactive,
        "checkpointable": checkpointable,
        "gang_size": sum(len(v) for v in (allocations or {}).values()),
        "gang_id": None,
        "allocations": allocs,
        "requested_devices": sum(len(v) for v in (allocations or {}).values()),
        "pricing_tier": "on-prem",
        "submit_ts_ms": None,
        "start_ts_ms": ts_ms if kind == "STARTED" else None,
        "end_ts_ms": ts_ms if kind == "ENDED" else None,
        "exit_state": None,
        "exit_code": None,
    }


def inventory(node: str, uuids: list[str], ts_ms: int = T0, cluster: str = "c1") -> dict[str, Any]:
    return {
        "cluster": cluster,
        "node": node,
        "ts_ms": ts_ms,
        "source": "static",
        "devices": [
            {
                "uuid": u,
                "index": i,
                "model": "NVIDIA H100 80GB HBM3",
                "generation": "hopper",
                "mig_profile": None,
                "mig_instance_id": None,
            }
            for i, u in enumerate(uuids)
        ],
        "deleted": False,
    }


def poison_scrapes(header: bytes, valid_record: bytes) -> dict[str, bytes]:
    """Hostile device-sample records behind a valid single-object `header`: a 50-byte one claiming 2^60
    devices whose last string length (-25) points back at the device (the old lean decoder re-read it
    forever, filling memory), and one whose cluster name has length -5 (`valid_record`'s body after it)."""
    return {
        "memory-bomb": header + b"\x00" * 6 + avro_long(2**60) + b"\x00" * 23 + b"\x02" + avro_long(-25),
        "negative-length": header + avro_long(-5) + valid_record[11:],
    }


@cache
def _default_codec() -> AvroCodec:
    return AvroCodec()


def job_rows(rows: Iterable[dict[str, Any]], codec: AvroCodec | None = None) -> dict[str, Any]:
    """A `processors.job-device-minutes` record (the job stage's input) holding `rows`, each encoded as
    `usage.device-minutes.v1` carries it."""
    codec = codec or _default_codec()
    return {"rows": [codec.encode(DEVICE_MINUTES.subject, row) for row in rows]}
