"""Pure mapping from contract records (decoded Avro dicts) to warehouse rows, per topic.

No IO here. Each `TableSpec` says which table a topic fills, its columns, and, where the table
feeds a daily rollup, the key that identifies a row so the writer can drop rows already stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from schemas import topics
from schemas.topics import Topic

Row = list[Any]


@dataclass(frozen=True, slots=True)
class TableSpec:
    table: str
    columns: tuple[str, ...]
    rows: Callable[[dict[str, Any]], list[Row]]
    # Columns that identify a row. Set for tables feeding a rollup: the writer inserts only keys
    # not yet stored, so a replay never reaches the materialized view twice.
    dedupe_key: tuple[str, ...] = ()
    # Column holding the event time in ms, used to bound the "already stored?" look-up.
    time_column: str = ""


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _mig(value: Any) -> int:
    return -1 if value is None else int(value)


DEVICE_MINUTE_COLUMNS = (
    "cluster", "node", "device_uuid", "mig_instance_id", "minute_start_ms", "model", "generation", "job_id",
    "user", "project", "team", "cost_centre", "preemptible", "pricing_tier", "unallocated_s", "allocated_s",
    "active_s", "starved_s", "idle_s", "dark_s", "sm_weighted_s", "sample_count", "activity_mean_ratio",
    "activity_max_ratio", "fb_used_mib_max", "power_w_mean", "mapping_version", "classifier_version",
)  # fmt: skip


def device_minute_rows(r: dict[str, Any]) -> list[Row]:
    return [[
        r["cluster"], r["node"], r["device_uuid"], _mig(r.get("mig_instance_id")), r["minute_start_ms"],
        _s(r.get("model")), r["generation"], _s(r.get("job_id")), _s(r.get("user")), _s(r.get("project")),
        _s(r.get("team")), _s(r.get("cost_centre")), bool(r["preemptible"]), r["pricing_tier"],
        r["unallocated_s"], r["allocated_s"], r["active_s"], r["starved_s"], r["idle_s"], r["dark_s"],
        float(r["sm_weighted_s"]), r["sample_count"], r.get("activity_mean_ratio"), r.get("activity_max_ratio"),
        r.get("fb_used_mib_max"), r.get("power_w_mean"), r["mapping_version"], r["classifier_version"],
    ]]  # fmt: skip


JOB_MINUTE_COLUMNS = (
    "cluster", "job_id", "minute_start_ms", "device_count", "generation", "user", "project", "team",
    "cost_centre", "preemptible", "pricing_tier", "allocated_s", "active_s", "starved_s", "idle_s", "dark_s",
    "sm_weighted_s", "sample_count", "activity_mean_ratio", "activity_max_ratio", "fb_used_mib_max",
    "power_w_mean", "mapping_version", "classifier_version",
)  # fmt: skip


def job_minute_rows(r: dict[str, Any]) -> list[Row]:
    return [[
        r["cluster"], r["job_id"], r["minute_start_ms"], r["device_count"], r["generation"], _s(r.get("user")),
        _s(r.get("project")), _s(r.get("team")), _s(r.get("cost_centre")), bool(r["preemptible"]),
        r["pricing_tier"], r["allocated_s"], r["active_s"], r["starved_s"], r["idle_s"], r["dark_s"],
        float(r["sm_weighted_s"]), r["sample_count"], r.get("activity_mean_ratio"), r.get("activity_max_ratio"),
        r.get("fb_used_mib_max"), r.get("power_w_mean"), r["mapping_version"], r["classifier_version"],
    ]]  # fmt: skip


COVERAGE_COLUMNS = (
    "cluster", "node", "minute_start_ms", "expected_devices", "reporting_devices", "expected_device_s",
    "reporting_device_s", "unexpected_devices",
)  # fmt: skip


def coverage_rows(r: dict[str, Any]) -> list[Row]:
    return [[r[c] for c in COVERAGE_COLUMNS]]


RAW_SAMPLE_COLUMNS = (
    "cluster", "node", "ts_ms", "source", "exporter_version", "mapping_version", "device_uuid", "device_index",
    "mig_instance_id", "mig_profile", "model", "sm_active_ratio", "sm_occupancy_ratio", "gr_engine_active_ratio",
    "tensor_active_ratio", "dram_active_ratio", "gpu_util_pct", "mem_copy_util_pct", "fb_used_mib", "fb_free_mib",
    "power_w", "temperature_c", "xid_last", "pod", "namespace", "container", "hpc_job",
)  # fmt: skip

_SAMPLE_METRICS = RAW_SAMPLE_COLUMNS[11:23]


def raw_sample_rows(r: dict[str, Any]) -> list[Row]:
    head = [r["cluster"], r["node"], r["ts_ms"], r["source"], _s(r.get("exporter_version")), r["mapping_version"]]
    out = []
    for d in r["devices"]:
        out.append([
            *head, d["uuid"], d.get("index"), _mig(d.get("mig_instance_id")), _s(d.get("mig_profile")),
            _s(d.get("model")), *(d.get(m) for m in _SAMPLE_METRICS), _s(d.get("pod")), _s(d.get("namespace")),
            _s(d.get("container")), _s(d.get("hpc_job")),
        ])  # fmt: skip
    return out


JOB_EVENT_COLUMNS = (
    "event_id", "event_type", "ts_ms", "scheduler", "cluster", "job_id", "array_job_id", "array_task_id",
    "het_job_id", "het_job_offset", "job_name", "user", "account", "project", "project_source",
    "project_validation", "team", "cost_centre", "partition", "qos", "preemptible", "interactive",
    "checkpointable", "gang_size", "gang_id", "allocations", "requested_devices", "pricing_tier", "submit_ts_ms",
    "start_ts_ms", "end_ts_ms", "exit_state", "exit_code",
)  # fmt: skip

_PASS_THROUGH = {"team", "cost_centre", "allocations"}


def job_event_rows(r: dict[str, Any]) -> list[Row]:
    identity = r.get("identity") or {}
    team = identity.get("primary_team") or ((identity.get("teams") or [None])[0])
    derived = {
        "team": team,
        "cost_centre": identity.get("cost_centre"),
        "allocations": json.dumps(r.get("allocations") or [], sort_keys=True),
    }
    return [[derived[c] if c in _PASS_THROUGH else r.get(c) for c in JOB_EVENT_COLUMNS]]


IDENTITY_COLUMNS = ("cluster", "job_id", "user", "teams", "groups", "cost_centre", "snapshot_ts_ms")


def identity_rows(r: dict[str, Any]) -> list[Row]:
    identity = r.get("identity")
    if not identity:
        return []
    return [[
        r["cluster"], r["job_id"], identity["user"], list(identity.get("teams") or []),
        list(identity.get("groups") or []), identity.get("cost_centre"), identity["snapshot_ts_ms"],
    ]]  # fmt: skip


CORRECTION_COLUMNS = (
    "correction_id", "ts_ms", "cluster", "job_id", "old_project", "new_project", "reason", "corrected_by",
)  # fmt: skip


def correction_rows(r: dict[str, Any]) -> list[Row]:
    return [[r.get(c) for c in CORRECTION_COLUMNS]]


ALERT_COLUMNS = (
    "alert_id", "kind", "ts_ms", "cluster", "job_id", "node", "device_uuids", "user", "team", "project",
    "idle_minutes", "cost_so_far", "action", "action_at_ms", "dry_run", "message", "appeal_route", "emitted_ts_ms",
)  # fmt: skip


def alert_rows(r: dict[str, Any]) -> list[Row]:
    return [[list(r.get(c) or []) if c == "device_uuids" else r.get(c) for c in ALERT_COLUMNS]]


ACTION_COLUMNS = (
    "action_id", "ts_ms", "cluster", "job_id", "scheduler", "action", "dry_run", "reason", "device_uuids", "user",
    "project",
)  # fmt: skip


def action_rows(r: dict[str, Any]) -> list[Row]:
    return [[list(r.get(c) or []) if c == "device_uuids" else r.get(c) for c in ACTION_COLUMNS]]


DEVICE_MINUTES = TableSpec(
    "device_minutes",
    DEVICE_MINUTE_COLUMNS,
    device_minute_rows,
    # job_id too: a device shared within a minute (one job ends, the next starts) has a row per job.
    ("cluster", "node", "device_uuid", "mig_instance_id", "minute_start_ms", "job_id"),
    "minute_start_ms",
)
COVERAGE_MINUTES = TableSpec(
    "coverage_minutes",
    COVERAGE_COLUMNS,
    coverage_rows,
    ("cluster", "node", "minute_start_ms"),
    "minute_start_ms",
)

# topic name -> the tables its records fill (ReplacingMergeTree everywhere; dedupe_key where a rollup reads).
SINKS: dict[str, tuple[TableSpec, ...]] = {
    topics.DEVICE_MINUTES.name: (DEVICE_MINUTES,),
    topics.JOB_MINUTES.name: (TableSpec("job_minutes", JOB_MINUTE_COLUMNS, job_minute_rows),),
    topics.COVERAGE_MINUTES.name: (COVERAGE_MINUTES,),
    topics.DEVICE_SAMPLES.name: (TableSpec("raw_samples", RAW_SAMPLE_COLUMNS, raw_sample_rows),),
    topics.JOB_EVENTS.name: (
        TableSpec("job_events", JOB_EVENT_COLUMNS, job_event_rows),
        TableSpec("identity_snapshots", IDENTITY_COLUMNS, identity_rows),
    ),
    topics.CORRECTIONS.name: (TableSpec("attribution_corrections", CORRECTION_COLUMNS, correction_rows),),
    topics.ALERTS.name: (TableSpec("alerts", ALERT_COLUMNS, alert_rows),),
    topics.RECLAIM_ACTIONS.name: (TableSpec("actions", ACTION_COLUMNS, action_rows),),
}

TOPICS_BY_NAME: dict[str, Topic] = {t.name: t for t in topics.CATALOGUE}
DEFAULT_TOPICS = tuple(SINKS)
