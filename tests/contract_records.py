"""Contract records shared by unit and integration tests (a STARTED job event, an identity)."""

from __future__ import annotations

from typing import Any


def job_event(event_type: str, ts: int, **kw: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "event_id": f"e-{event_type}-{ts}", "event_type": event_type, "ts_ms": ts, "scheduler": "SLURM",
        "cluster": "c1", "job_id": "4242", "array_job_id": None, "array_task_id": None, "het_job_id": None,
        "het_job_offset": None, "job_name": "train", "user": "alice", "account": "vision", "project": "p-vision",
        "project_source": "EXPLICIT", "project_validation": "VALID", "identity": None, "partition": "gpu",
        "qos": None, "preemptible": False, "interactive": False, "checkpointable": True, "gang_size": 2,
        "gang_id": None,
        "allocations": [{"node": "n1", "devices": [{"index": 0, "uuid": "GPU-a", "mig_instance_id": None,
                                                    "mig_profile": None}]}],
        "requested_devices": 2, "pricing_tier": "on-prem", "submit_ts_ms": None, "start_ts_ms": ts,
        "end_ts_ms": None, "exit_state": None, "exit_code": None,
    }  # fmt: skip
    record.update(kw)
    return record


IDENTITY = {
    "user": "alice", "teams": ["vision", "infra"], "groups": ["gpu-users"], "cost_centre": "CC-100",
    "snapshot_ts_ms": 1_000, "projects": ["p-vision"], "primary_team": "vision",
}  # fmt: skip
