"""Pure mapping from contract records (the typed records of `schemas.records`) to warehouse rows, per topic.

No IO here. Each `TableSpec` says which table a topic fills, the record type it reads, its columns,
and, where the table feeds a daily rollup, the key that identifies a row so the writer can drop rows
already stored. The mappings read attributes, so mypy checks every field name and type against the
generated classes (and so against the `.avsc`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas import topics
from schemas.records import (
    Alert,
    AppealEvent,
    AttributionBaseline,
    AttributionCorrection,
    ContractRecord,
    CoverageMinute,
    DeviceMinute,
    EscalationEvent,
    JobEvent,
    JobMinute,
    NodeScrape,
    PolicyApplied,
    ReclaimAction,
    ReservationEvent,
)
from schemas.topics import Topic

Row = list[Any]


@dataclass(frozen=True, slots=True)
class TableSpec:
    table: str
    columns: tuple[str, ...]
    record_type: type[ContractRecord]
    to_rows: Callable[[Any], list[Row]]  # takes a `record_type`
    # Columns that identify a row. Set for tables feeding a rollup: the writer inserts only keys
    # not yet stored, so a replay never reaches the materialized view twice.
    dedupe_key: tuple[str, ...] = ()
    # Column holding the event time in ms, used to bound the "already stored?" look-up.
    time_column: str = ""

    def rows(self, record: ContractRecord | Mapping[str, Any]) -> list[Row]:
        """The rows of one record: a typed one, or a decoded dict (read as `record_type`)."""
        typed = self.record_type.from_avro(record) if isinstance(record, Mapping) else record
        return self.to_rows(typed)


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _mig(value: Any) -> int:
    return -1 if value is None else int(value)


DEVICE_MINUTE_COLUMNS = (
    "cluster", "node", "device_uuid", "mig_instance_id", "mig_profile", "gpu_share_slices", "gpu_share_of",
    "minute_start_ms", "model", "generation", "job_id",
    "user", "project", "team", "cost_centre", "preemptible", "pricing_tier", "unallocated_s", "allocated_s",
    "active_s", "starved_s", "idle_s", "dark_s", "sm_weighted_s", "sample_count", "activity_mean_ratio",
    "activity_max_ratio", "fb_used_mib_max", "power_w_mean", "mapping_version", "classifier_version",
)  # fmt: skip


def device_minute_rows(r: DeviceMinute) -> list[Row]:
    return [[
        r.cluster, r.node, r.device_uuid, _mig(r.mig_instance_id), _s(r.mig_profile), r.gpu_share_slices,
        r.gpu_share_of, r.minute_start_ms, _s(r.model), r.generation,
        _s(r.job_id), _s(r.user), _s(r.project), _s(r.team), _s(r.cost_centre), bool(r.preemptible),
        r.pricing_tier, r.unallocated_s, r.allocated_s, r.active_s, r.starved_s, r.idle_s, r.dark_s,
        float(r.sm_weighted_s), r.sample_count, r.activity_mean_ratio, r.activity_max_ratio, r.fb_used_mib_max,
        r.power_w_mean, r.mapping_version, r.classifier_version,
    ]]  # fmt: skip


JOB_MINUTE_COLUMNS = (
    "cluster", "job_id", "minute_start_ms", "device_count", "generation", "user", "project", "team",
    "cost_centre", "preemptible", "pricing_tier", "allocated_s", "active_s", "starved_s", "idle_s", "dark_s",
    "sm_weighted_s", "sample_count", "activity_mean_ratio", "activity_max_ratio", "fb_used_mib_max",
    "power_w_mean", "mapping_version", "classifier_version",
)  # fmt: skip


def job_minute_rows(r: JobMinute) -> list[Row]:
    return [[
        r.cluster, r.job_id, r.minute_start_ms, r.device_count, r.generation, _s(r.user), _s(r.project),
        _s(r.team), _s(r.cost_centre), bool(r.preemptible), r.pricing_tier, r.allocated_s, r.active_s, r.starved_s,
        r.idle_s, r.dark_s, float(r.sm_weighted_s), r.sample_count, r.activity_mean_ratio, r.activity_max_ratio,
        r.fb_used_mib_max, r.power_w_mean, r.mapping_version, r.classifier_version,
    ]]  # fmt: skip


COVERAGE_COLUMNS = (
    "cluster", "node", "minute_start_ms", "expected_devices", "reporting_devices", "expected_device_s",
    "reporting_device_s", "unexpected_devices",
)  # fmt: skip


def coverage_rows(r: CoverageMinute) -> list[Row]:
    return [[
        r.cluster, r.node, r.minute_start_ms, r.expected_devices, r.reporting_devices, r.expected_device_s,
        r.reporting_device_s, r.unexpected_devices,
    ]]  # fmt: skip


RAW_SAMPLE_COLUMNS = (
    "cluster", "node", "ts_ms", "source", "exporter_version", "mapping_version", "device_uuid", "device_index",
    "mig_instance_id", "mig_profile", "model", "sm_active_ratio", "sm_occupancy_ratio", "gr_engine_active_ratio",
    "tensor_active_ratio", "dram_active_ratio", "gpu_util_pct", "mem_copy_util_pct", "fb_used_mib", "fb_free_mib",
    "power_w", "temperature_c", "xid_last", "pod", "namespace", "container", "hpc_job",
)  # fmt: skip


def raw_sample_rows(r: NodeScrape) -> list[Row]:
    head = [r.cluster, r.node, r.ts_ms, r.source, _s(r.exporter_version), r.mapping_version]
    return [[
        *head, d.uuid, d.index, _mig(d.mig_instance_id), _s(d.mig_profile), _s(d.model), d.sm_active_ratio,
        d.sm_occupancy_ratio, d.gr_engine_active_ratio, d.tensor_active_ratio, d.dram_active_ratio, d.gpu_util_pct,
        d.mem_copy_util_pct, d.fb_used_mib, d.fb_free_mib, d.power_w, d.temperature_c, d.xid_last, _s(d.pod),
        _s(d.namespace), _s(d.container), _s(d.hpc_job),
    ] for d in r.devices]  # fmt: skip


JOB_EVENT_COLUMNS = (
    "event_id", "event_type", "ts_ms", "scheduler", "cluster", "job_id", "array_job_id", "array_task_id",
    "het_job_id", "het_job_offset", "job_name", "user", "user_uid", "user_source", "user_claimed", "user_groups",
    "account", "project", "project_source", "project_validation", "project_claimed", "team", "cost_centre",
    "partition", "qos", "preemptible", "interactive", "checkpointable", "gang_size", "gang_id", "allocations",
    "requested_devices", "pricing_tier", "submit_ts_ms", "start_ts_ms", "end_ts_ms", "exit_state", "exit_code",
)  # fmt: skip


def job_event_rows(r: JobEvent) -> list[Row]:
    identity = r.identity
    team = None if identity is None else identity.primary_team or (identity.teams[0] if identity.teams else None)
    cost_centre = None if identity is None else identity.cost_centre
    allocations = json.dumps([a.to_avro() for a in r.allocations], sort_keys=True)
    return [[
        r.event_id, r.event_type, r.ts_ms, r.scheduler, r.cluster, r.job_id, r.array_job_id, r.array_task_id,
        r.het_job_id, r.het_job_offset, r.job_name, r.user, r.user_uid, r.user_source, r.user_claimed,
        list(r.user_groups), r.account, r.project, r.project_source, r.project_validation, r.project_claimed, team,
        cost_centre, r.partition, r.qos, r.preemptible, r.interactive, r.checkpointable, r.gang_size, r.gang_id,
        allocations, r.requested_devices, r.pricing_tier, r.submit_ts_ms, r.start_ts_ms, r.end_ts_ms, r.exit_state,
        r.exit_code,
    ]]  # fmt: skip


IDENTITY_COLUMNS = ("cluster", "job_id", "user", "teams", "groups", "cost_centre", "snapshot_ts_ms")


def identity_rows(r: JobEvent) -> list[Row]:
    identity = r.identity
    if identity is None:
        return []
    return [[
        r.cluster, r.job_id, identity.user, list(identity.teams), list(identity.groups), identity.cost_centre,
        identity.snapshot_ts_ms,
    ]]  # fmt: skip


CORRECTION_COLUMNS = (
    "correction_id", "ts_ms", "cluster", "job_id", "old_project", "new_project", "reason", "corrected_by",
)  # fmt: skip


def correction_rows(r: AttributionCorrection) -> list[Row]:
    return [[r.correction_id, r.ts_ms, r.cluster, r.job_id, r.old_project, r.new_project, r.reason, r.corrected_by]]


ALERT_COLUMNS = (
    "alert_id", "kind", "ts_ms", "cluster", "job_id", "node", "device_uuids", "user", "team", "project",
    "idle_minutes", "cost_so_far", "action", "action_at_ms", "dry_run", "message", "appeal_route", "emitted_ts_ms",
    "engine", "drift_lines",
)  # fmt: skip


def alert_rows(r: Alert) -> list[Row]:
    return [[
        r.alert_id, r.kind, r.ts_ms, r.cluster, r.job_id, r.node, list(r.device_uuids), r.user, r.team, r.project,
        r.idle_minutes, r.cost_so_far, r.action, r.action_at_ms, r.dry_run, r.message, r.appeal_route,
        r.emitted_ts_ms, r.engine, list(r.drift_lines),
    ]]  # fmt: skip


ACTION_COLUMNS = (
    "action_id", "ts_ms", "cluster", "job_id", "scheduler", "action", "dry_run", "reason", "device_uuids", "user",
    "project",
)  # fmt: skip


def action_rows(r: ReclaimAction) -> list[Row]:
    return [[
        r.action_id, r.ts_ms, r.cluster, r.job_id, r.scheduler, r.action, r.dry_run, r.reason, list(r.device_uuids),
        r.user, r.project,
    ]]  # fmt: skip


APPEAL_COLUMNS = (
    "event_id", "event_type", "appeal_id", "ts_ms", "actor", "cluster", "job_id", "alert_id", "user", "team",
    "project", "period", "text", "decision", "credit_cents", "exemption_until_ms", "deadline_ms",
)  # fmt: skip


def appeal_rows(r: AppealEvent) -> list[Row]:
    return [[
        r.event_id, r.event_type, r.appeal_id, r.ts_ms, r.actor, r.cluster, r.job_id, r.alert_id, r.user, r.team,
        r.project, r.period, r.text, r.decision, r.credit_cents, r.exemption_until_ms, r.deadline_ms,
    ]]  # fmt: skip


RESERVATION_COLUMNS = (
    "event_id", "event_type", "reservation_id", "ts_ms", "actor", "cluster", "team", "generation", "gpus", "nodes",
    "start_ms", "end_ms", "text", "engine", "engine_ref",
)  # fmt: skip


def reservation_rows(r: ReservationEvent) -> list[Row]:
    return [[
        r.event_id, r.event_type, r.reservation_id, r.ts_ms, r.actor, r.cluster, r.team, r.generation, r.gpus,
        list(r.nodes), r.start_ms, r.end_ms, r.text, r.engine, r.engine_ref,
    ]]  # fmt: skip


BASELINE_COLUMNS = (
    "event_id", "event_type", "ts_ms", "actor", "baseline_start_ms", "source", "attribution_mode", "engine", "cluster",
    "policy_sha256",
)  # fmt: skip


def baseline_rows(r: AttributionBaseline) -> list[Row]:
    return [[
        r.event_id, r.event_type, r.ts_ms, r.actor, r.baseline_start_ms, r.source, r.attribution_mode, r.engine,
        r.cluster, r.policy_sha256,
    ]]  # fmt: skip


POLICY_APPLIED_COLUMNS = (
    "apply_id", "ts_ms", "cluster", "engine", "actor", "actor_source", "policy_sha256", "change_objects",
    "change_settings", "change_before", "change_after", "still_differs",
)  # fmt: skip


def policy_applied_rows(r: PolicyApplied) -> list[Row]:
    return [[
        r.apply_id, r.ts_ms, r.cluster, r.engine, r.actor, r.actor_source, r.policy_sha256,
        [c.object for c in r.changes], [c.setting for c in r.changes], [c.before for c in r.changes],
        [c.after for c in r.changes], list(r.still_differs),
    ]]  # fmt: skip


ESCALATION_COLUMNS = (
    "event_id", "event_type", "escalation_id", "ts_ms", "actor", "cluster", "job_id", "user", "team", "gpus", "tier",
    "hours", "text", "until_ms", "deadline_ms", "engine", "engine_ref",
)  # fmt: skip


def escalation_rows(r: EscalationEvent) -> list[Row]:
    return [[
        r.event_id, r.event_type, r.escalation_id, r.ts_ms, r.actor, r.cluster, r.job_id, r.user, r.team, r.gpus,
        r.tier, r.hours, r.text, r.until_ms, r.deadline_ms, r.engine, r.engine_ref,
    ]]  # fmt: skip


DEVICE_MINUTES = TableSpec(
    "device_minutes",
    DEVICE_MINUTE_COLUMNS,
    DeviceMinute,
    device_minute_rows,
    # job_id too: a device shared within a minute (one job ends, the next starts) has a row per job.
    ("cluster", "node", "device_uuid", "mig_instance_id", "minute_start_ms", "job_id"),
    "minute_start_ms",
)
COVERAGE_MINUTES = TableSpec(
    "coverage_minutes",
    COVERAGE_COLUMNS,
    CoverageMinute,
    coverage_rows,
    ("cluster", "node", "minute_start_ms"),
    "minute_start_ms",
)

# topic name -> the tables its records fill (ReplacingMergeTree everywhere; dedupe_key where a rollup reads).
SINKS: dict[str, tuple[TableSpec, ...]] = {
    topics.DEVICE_MINUTES.name: (DEVICE_MINUTES,),
    topics.JOB_MINUTES.name: (TableSpec("job_minutes", JOB_MINUTE_COLUMNS, JobMinute, job_minute_rows),),
    topics.COVERAGE_MINUTES.name: (COVERAGE_MINUTES,),
    topics.DEVICE_SAMPLES.name: (TableSpec("raw_samples", RAW_SAMPLE_COLUMNS, NodeScrape, raw_sample_rows),),
    topics.JOB_EVENTS.name: (
        TableSpec("job_events", JOB_EVENT_COLUMNS, JobEvent, job_event_rows),
        TableSpec("identity_snapshots", IDENTITY_COLUMNS, JobEvent, identity_rows),
    ),
    topics.CORRECTIONS.name: (
        TableSpec("attribution_corrections", CORRECTION_COLUMNS, AttributionCorrection, correction_rows),
    ),
    topics.ALERTS.name: (TableSpec("alerts", ALERT_COLUMNS, Alert, alert_rows),),
    topics.RECLAIM_ACTIONS.name: (TableSpec("actions", ACTION_COLUMNS, ReclaimAction, action_rows),),
    topics.APPEALS.name: (TableSpec("appeal_events", APPEAL_COLUMNS, AppealEvent, appeal_rows),),
    topics.RESERVATIONS.name: (
        TableSpec("reservation_events", RESERVATION_COLUMNS, ReservationEvent, reservation_rows),
    ),
    topics.ATTRIBUTION_BASELINE.name: (
        TableSpec("attribution_baseline_events", BASELINE_COLUMNS, AttributionBaseline, baseline_rows),
    ),
    topics.POLICY_APPLIED.name: (
        TableSpec("policy_applies", POLICY_APPLIED_COLUMNS, PolicyApplied, policy_applied_rows),
    ),
    topics.ESCALATIONS.name: (TableSpec("escalation_events", ESCALATION_COLUMNS, EscalationEvent, escalation_rows),),
}

TOPICS_BY_NAME: dict[str, Topic] = {t.name: t for t in topics.CATALOGUE}
DEFAULT_TOPICS = tuple(SINKS)
