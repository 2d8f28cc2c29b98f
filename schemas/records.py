"""Typed contract records: one frozen dataclass per Avro record, a `Literal` per enum.

GENERATED from the `.avsc` files by `python -m schemas.codegen`; do not edit (the unit tests fail
when this file and the schemas differ). `to_avro()` gives the dict `AvroCodec.encode` writes;
`from_avro(d)` reads a decoded dict. `RECORDS` maps each subject to its top-level class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

ReclaimKind = Literal["SUSPEND", "REQUEUE", "CANCEL", "CHECKPOINT_THEN_REQUEUE", "CHECKPOINT_THEN_CANCEL"]
"""What to do."""

AlertKind = Literal[
    "IDLE_WARNING",
    "RECLAIM_NOTICE",
    "IDLE_RESOLVED",
    "COVERAGE_GAP",
    "COVERAGE_RECOVERED",
    "UNKNOWN_DEVICE",
    "POLICY_DRIFT",
    "POLICY_DRIFT_CLEARED",
]
"""What happened."""

AppealEventType = Literal["FILED", "DECIDED", "ESCALATED", "RESUME_ASKED"]
"""The step; RESUME_ASKED (v2) is not an appeal's step: the job's user, a lead of its team or an operator asks, on
the job's page, that gpuledger resume a job it reclaimed (the reclaim worker checks who and carries it out).
"""

AppealDecision = Literal["EXEMPTION", "CREDIT", "DENIED"]
"""The decision."""

BaselineEventType = Literal["SET", "CLEARED"]
"""SET: the baseline is baseline_start_ms from now on; CLEARED: attribution is no longer required (grace mode, no
date), no baseline is in force.
"""

BaselineSource = Literal["POLICY_DATE", "STRICT_MODE", "GRACE_MODE"]
"""POLICY_DATE: the policy's attribution.baseline; STRICT_MODE: the day the applied policy first found attribution
strict; GRACE_MODE: attribution back to grace with no date (CLEARED).
"""

AttributionMode = Literal["GRACE", "STRICT"]
"""GRACE: a job without a project is charged to its user's default; STRICT: the scheduler rejects it."""

EscalationEventType = Literal["REQUESTED", "GRANTED", "DENIED", "LAPSED", "APPLIED", "REVERTED"]
"""The step: REQUESTED by the asker; GRANTED or DENIED by a decider; LAPSED undecided past the deadline; APPLIED
(raised) and REVERTED (fallen back) on the scheduler by the escalation service.
"""

EscalationEngine = Literal["SLURM", "KUEUE"]
"""Scheduler."""

ReservationEventType = Literal[
    "REQUESTED",
    "APPROVED",
    "EXTENDED",
    "RENDERED",
    "REMOVED",
    "IDLE_WARNED",
    "RELEASED",
    "EXPIRED",
]
"""The step."""

ReservationEngine = Literal["SLURM", "KUEUE"]
"""Scheduler."""

JobEventType = Literal["SUBMITTED", "STARTED", "ENDED", "PREEMPTED", "SUSPENDED", "RESUMED", "REQUEUED", "UPDATED"]
"""Lifecycle transition."""

SchedulerKind = Literal["SLURM", "KUBERNETES", "KUEUE", "VOLCANO", "SIMULATOR"]
"""Scheduler kind."""

UserSource = Literal["SCHEDULER", "STAMPED", "SELF_DECLARED", "NAMESPACE"]
"""Where `user` comes from. SCHEDULER: the scheduler's own record of the submitter (Slurm). STAMPED: the API server's
userInfo of the creating request, stamped by gpuledger's admission policy (Kubernetes; cannot be written by the
submitter). SELF_DECLARED: a label or annotation the submitter wrote. NAMESPACE: nothing named a user; the
namespace stands in.
"""

ProjectSource = Literal["EXPLICIT", "DEFAULT", "MISSING"]
"""Where the project came from."""

ProjectValidation = Literal["VALID", "UNKNOWN_PROJECT", "NOT_A_MEMBER", "NOT_CHECKED"]
"""Validation result."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReclaimAction:
    """A request to reclaim a whole job's devices, executed (or dry-run) by the reclaim executor. Key:
    cluster/job_id.
    """

    SUBJECT: ClassVar[str] = "actions.reclaim"

    action_id: str
    ts_ms: int
    cluster: str
    job_id: str
    scheduler: str
    action: ReclaimKind
    dry_run: bool = True
    reason: str
    device_uuids: tuple[str, ...] = ()
    user: str | None = None
    project: str | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "action_id": self.action_id,
            "ts_ms": self.ts_ms,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "scheduler": self.scheduler,
            "action": self.action,
            "dry_run": self.dry_run,
            "reason": self.reason,
            "device_uuids": list(self.device_uuids),
            "user": self.user,
            "project": self.project,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> ReclaimAction:
        return cls(
            action_id=d["action_id"],
            ts_ms=d["ts_ms"],
            cluster=d["cluster"],
            job_id=d["job_id"],
            scheduler=d["scheduler"],
            action=d["action"],
            dry_run=d.get("dry_run", True),
            reason=d["reason"],
            device_uuids=tuple(d.get("device_uuids", [])),
            user=d.get("user"),
            project=d.get("project"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Alert:
    """A notification for people: idle warnings, reclaim notices, resolutions, coverage gaps, policy drift on a
    scheduler. Key: cluster/job_id, cluster/node, or cluster/policy-<engine>.
    """

    SUBJECT: ClassVar[str] = "alerts"

    alert_id: str
    kind: AlertKind
    ts_ms: int
    cluster: str
    job_id: str | None = None
    node: str | None = None
    device_uuids: tuple[str, ...] = ()
    user: str | None = None
    team: str | None = None
    project: str | None = None
    idle_minutes: int | None = None
    cost_so_far: float | None = None
    action: str | None = None
    action_at_ms: int | None = None
    dry_run: bool = True
    message: str
    appeal_route: str | None = None
    emitted_ts_ms: int | None = None
    engine: str | None = None
    drift_lines: tuple[str, ...] = ()

    def to_avro(self) -> dict[str, Any]:
        return {
            "alert_id": self.alert_id,
            "kind": self.kind,
            "ts_ms": self.ts_ms,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "node": self.node,
            "device_uuids": list(self.device_uuids),
            "user": self.user,
            "team": self.team,
            "project": self.project,
            "idle_minutes": self.idle_minutes,
            "cost_so_far": self.cost_so_far,
            "action": self.action,
            "action_at_ms": self.action_at_ms,
            "dry_run": self.dry_run,
            "message": self.message,
            "appeal_route": self.appeal_route,
            "emitted_ts_ms": self.emitted_ts_ms,
            "engine": self.engine,
            "drift_lines": list(self.drift_lines),
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> Alert:
        return cls(
            alert_id=d["alert_id"],
            kind=d["kind"],
            ts_ms=d["ts_ms"],
            cluster=d["cluster"],
            job_id=d.get("job_id"),
            node=d.get("node"),
            device_uuids=tuple(d.get("device_uuids", [])),
            user=d.get("user"),
            team=d.get("team"),
            project=d.get("project"),
            idle_minutes=d.get("idle_minutes"),
            cost_so_far=d.get("cost_so_far"),
            action=d.get("action"),
            action_at_ms=d.get("action_at_ms"),
            dry_run=d.get("dry_run", True),
            message=d["message"],
            appeal_route=d.get("appeal_route"),
            emitted_ts_ms=d.get("emitted_ts_ms"),
            engine=d.get("engine"),
            drift_lines=tuple(d.get("drift_lines", [])),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AppealEvent:
    """One step of an appeal against an idle warning, a reclaim or a charge (issue 19): filed, decided, escalated.
    Every step names who and when; an appeal's first valid decision is its decision. Key: cluster/job_id.
    """

    SUBJECT: ClassVar[str] = "appeals"

    event_id: str
    event_type: AppealEventType
    appeal_id: str
    ts_ms: int
    actor: str
    cluster: str
    job_id: str
    alert_id: str | None = None
    user: str | None = None
    team: str | None = None
    project: str | None = None
    period: str | None = None
    text: str
    decision: AppealDecision | None = None
    credit_cents: int | None = None
    exemption_until_ms: int | None = None
    deadline_ms: int | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "appeal_id": self.appeal_id,
            "ts_ms": self.ts_ms,
            "actor": self.actor,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "alert_id": self.alert_id,
            "user": self.user,
            "team": self.team,
            "project": self.project,
            "period": self.period,
            "text": self.text,
            "decision": self.decision,
            "credit_cents": self.credit_cents,
            "exemption_until_ms": self.exemption_until_ms,
            "deadline_ms": self.deadline_ms,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> AppealEvent:
        return cls(
            event_id=d["event_id"],
            event_type=d["event_type"],
            appeal_id=d["appeal_id"],
            ts_ms=d["ts_ms"],
            actor=d["actor"],
            cluster=d["cluster"],
            job_id=d["job_id"],
            alert_id=d.get("alert_id"),
            user=d.get("user"),
            team=d.get("team"),
            project=d.get("project"),
            period=d.get("period"),
            text=d["text"],
            decision=d.get("decision"),
            credit_cents=d.get("credit_cents"),
            exemption_until_ms=d.get("exemption_until_ms"),
            deadline_ms=d.get("deadline_ms"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AttributionBaseline:
    """The attribution baseline (issue 38): the day from which every job had to name its project (the policy's
    attribution mode turned strict, or the date the policy states), written by `gpuledger policy apply` when the
    baseline it implies differs from the one in force. The latest event (by ts_ms, then topic order) is in force;
    a CLEARED event means none is. Key: the constant `baseline` (one organisation-wide fact, one partition).
    """

    SUBJECT: ClassVar[str] = "attribution.baseline"

    event_id: str
    event_type: BaselineEventType
    ts_ms: int
    actor: str
    baseline_start_ms: int | None = None
    source: BaselineSource
    attribution_mode: AttributionMode
    engine: str | None = None
    cluster: str
    policy_sha256: str

    def to_avro(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "ts_ms": self.ts_ms,
            "actor": self.actor,
            "baseline_start_ms": self.baseline_start_ms,
            "source": self.source,
            "attribution_mode": self.attribution_mode,
            "engine": self.engine,
            "cluster": self.cluster,
            "policy_sha256": self.policy_sha256,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> AttributionBaseline:
        return cls(
            event_id=d["event_id"],
            event_type=d["event_type"],
            ts_ms=d["ts_ms"],
            actor=d["actor"],
            baseline_start_ms=d.get("baseline_start_ms"),
            source=d["source"],
            attribution_mode=d["attribution_mode"],
            engine=d.get("engine"),
            cluster=d["cluster"],
            policy_sha256=d["policy_sha256"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AttributionCorrection:
    """An audited change of the project a job is charged to. Corrections are new events, never edits."""

    SUBJECT: ClassVar[str] = "attribution.corrections"

    correction_id: str
    ts_ms: int
    cluster: str
    job_id: str
    old_project: str | None = None
    new_project: str
    reason: str
    corrected_by: str

    def to_avro(self) -> dict[str, Any]:
        return {
            "correction_id": self.correction_id,
            "ts_ms": self.ts_ms,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "old_project": self.old_project,
            "new_project": self.new_project,
            "reason": self.reason,
            "corrected_by": self.corrected_by,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> AttributionCorrection:
        return cls(
            correction_id=d["correction_id"],
            ts_ms=d["ts_ms"],
            cluster=d["cluster"],
            job_id=d["job_id"],
            old_project=d.get("old_project"),
            new_project=d["new_project"],
            reason=d["reason"],
            corrected_by=d["corrected_by"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """A record that could not be decoded or validated, with the reason. Topic: <source topic>.dlq; the same reason
    is also in the Kafka headers.
    """

    SUBJECT: ClassVar[str] = "deadletter"

    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None = None
    value: bytes | None = None
    error_class: str
    error_message: str
    schema_fingerprint: str | None = None
    ts_ms: int
    source_subject: str | None = None
    source_timestamp_ms: int | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "key": self.key,
            "value": self.value,
            "error_class": self.error_class,
            "error_message": self.error_message,
            "schema_fingerprint": self.schema_fingerprint,
            "ts_ms": self.ts_ms,
            "source_subject": self.source_subject,
            "source_timestamp_ms": self.source_timestamp_ms,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> DeadLetter:
        return cls(
            source_topic=d["source_topic"],
            source_partition=d["source_partition"],
            source_offset=d["source_offset"],
            key=d.get("key"),
            value=d.get("value"),
            error_class=d["error_class"],
            error_message=d["error_message"],
            schema_fingerprint=d.get("schema_fingerprint"),
            ts_ms=d["ts_ms"],
            source_subject=d.get("source_subject"),
            source_timestamp_ms=d.get("source_timestamp_ms"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EscalationEvent:
    """One step of an escalation (issue 41): a request to raise a job's priority for a while, decided, applied on the
    scheduler and reverted when it expires. Every step names who and when; the first valid decision is the
    decision. Key: cluster/job_id.
    """

    SUBJECT: ClassVar[str] = "escalations"

    event_id: str
    event_type: EscalationEventType
    escalation_id: str
    ts_ms: int
    actor: str
    cluster: str
    job_id: str
    user: str | None = None
    team: str | None = None
    gpus: int
    tier: str
    hours: int
    text: str
    until_ms: int | None = None
    deadline_ms: int | None = None
    engine: EscalationEngine | None = None
    engine_ref: str | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "escalation_id": self.escalation_id,
            "ts_ms": self.ts_ms,
            "actor": self.actor,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "user": self.user,
            "team": self.team,
            "gpus": self.gpus,
            "tier": self.tier,
            "hours": self.hours,
            "text": self.text,
            "until_ms": self.until_ms,
            "deadline_ms": self.deadline_ms,
            "engine": self.engine,
            "engine_ref": self.engine_ref,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> EscalationEvent:
        return cls(
            event_id=d["event_id"],
            event_type=d["event_type"],
            escalation_id=d["escalation_id"],
            ts_ms=d["ts_ms"],
            actor=d["actor"],
            cluster=d["cluster"],
            job_id=d["job_id"],
            user=d.get("user"),
            team=d.get("team"),
            gpus=d["gpus"],
            tier=d["tier"],
            hours=d["hours"],
            text=d["text"],
            until_ms=d.get("until_ms"),
            deadline_ms=d.get("deadline_ms"),
            engine=d.get("engine"),
            engine_ref=d.get("engine_ref"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InventoryDevice:
    """One device a node is expected to report."""

    uuid: str | None = None
    index: int
    model: str
    generation: str
    mig_profile: str | None = None
    mig_instance_id: int | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "model": self.model,
            "generation": self.generation,
            "mig_profile": self.mig_profile,
            "mig_instance_id": self.mig_instance_id,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> InventoryDevice:
        return cls(
            uuid=d.get("uuid"),
            index=d["index"],
            model=d["model"],
            generation=d["generation"],
            mig_profile=d.get("mig_profile"),
            mig_instance_id=d.get("mig_instance_id"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInventory:
    """The devices a node is expected to have. Compacted topic: the latest record per node wins; deleted=true retires
    the node.
    """

    SUBJECT: ClassVar[str] = "inventory.devices"

    cluster: str
    node: str
    ts_ms: int
    source: str
    devices: tuple[InventoryDevice, ...]
    deleted: bool = False

    def to_avro(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "ts_ms": self.ts_ms,
            "source": self.source,
            "devices": [x.to_avro() for x in self.devices],
            "deleted": self.deleted,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> NodeInventory:
        return cls(
            cluster=d["cluster"],
            node=d["node"],
            ts_ms=d["ts_ms"],
            source=d["source"],
            devices=tuple(InventoryDevice.from_avro(x) for x in d["devices"]),
            deleted=d.get("deleted", False),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyChange:
    """One setting the apply changed."""

    object: str
    setting: str
    before: str | None = None
    after: str | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "object": self.object,
            "setting": self.setting,
            "before": self.before,
            "after": self.after,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> PolicyChange:
        return cls(
            object=d["object"],
            setting=d["setting"],
            before=d.get("before"),
            after=d.get("after"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyApplied:
    """One `gpuledger policy apply` (issue 41 item 1): who applied the policy to which engine, when, and each setting
    it changed with its value before and after. Written after the engine took the changes; an apply that changed
    nothing is recorded too (it checked). Key: cluster/engine.
    """

    SUBJECT: ClassVar[str] = "policy.applied"

    apply_id: str
    ts_ms: int
    cluster: str
    engine: str
    actor: str
    actor_source: str
    policy_sha256: str
    changes: tuple[PolicyChange, ...]
    still_differs: tuple[str, ...] = ()

    def to_avro(self) -> dict[str, Any]:
        return {
            "apply_id": self.apply_id,
            "ts_ms": self.ts_ms,
            "cluster": self.cluster,
            "engine": self.engine,
            "actor": self.actor,
            "actor_source": self.actor_source,
            "policy_sha256": self.policy_sha256,
            "changes": [x.to_avro() for x in self.changes],
            "still_differs": list(self.still_differs),
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> PolicyApplied:
        return cls(
            apply_id=d["apply_id"],
            ts_ms=d["ts_ms"],
            cluster=d["cluster"],
            engine=d["engine"],
            actor=d["actor"],
            actor_source=d["actor_source"],
            policy_sha256=d["policy_sha256"],
            changes=tuple(PolicyChange.from_avro(x) for x in d["changes"]),
            still_differs=tuple(d.get("still_differs", [])),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDeviceMinutes:
    """Internal, between the processors' stages: the device-minutes of one job and one minute that the node stage
    sent together, for the job stage to read as one record (it takes a job's devices together anyway). Key:
    cluster/job_id, co-partitioned with sched.job-events.v1. Each item is a device-minute record exactly as
    usage.device-minutes.v1 carries it, its own framing included, so each item names its writer schema and evolves
    with usage.device-minutes. Analysts and downstream consumers read usage.device-minutes.v1, never this topic.
    """

    SUBJECT: ClassVar[str] = "processors.job-device-minutes"

    rows: tuple[bytes, ...]

    def to_avro(self) -> dict[str, Any]:
        return {
            "rows": list(self.rows),
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> JobDeviceMinutes:
        return cls(
            rows=tuple(d["rows"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ReservationEvent:
    """One step of a reservation of GPUs for a team (issue 19): requested, approved, extended, rendered onto and
    removed from the scheduler, warned idle, released, expired. Every step names who and when. Key:
    cluster/reservation_id.
    """

    SUBJECT: ClassVar[str] = "reservations"

    event_id: str
    event_type: ReservationEventType
    reservation_id: str
    ts_ms: int
    actor: str
    cluster: str
    team: str
    generation: str
    gpus: int
    nodes: tuple[str, ...] = ()
    start_ms: int
    end_ms: int
    text: str
    engine: ReservationEngine | None = None
    engine_ref: str | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "reservation_id": self.reservation_id,
            "ts_ms": self.ts_ms,
            "actor": self.actor,
            "cluster": self.cluster,
            "team": self.team,
            "generation": self.generation,
            "gpus": self.gpus,
            "nodes": list(self.nodes),
            "start_ms": self.start_ms,
            "end_ms": self.end_ms,
            "text": self.text,
            "engine": self.engine,
            "engine_ref": self.engine_ref,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> ReservationEvent:
        return cls(
            event_id=d["event_id"],
            event_type=d["event_type"],
            reservation_id=d["reservation_id"],
            ts_ms=d["ts_ms"],
            actor=d["actor"],
            cluster=d["cluster"],
            team=d["team"],
            generation=d["generation"],
            gpus=d["gpus"],
            nodes=tuple(d.get("nodes", [])),
            start_ms=d["start_ms"],
            end_ms=d["end_ms"],
            text=d["text"],
            engine=d.get("engine"),
            engine_ref=d.get("engine_ref"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentitySnapshot:
    """Who the user was at job start: never rewritten by a later reorganisation."""

    user: str
    teams: tuple[str, ...]
    groups: tuple[str, ...]
    projects: tuple[str, ...] = ()
    primary_team: str | None = None
    cost_centre: str | None = None
    snapshot_ts_ms: int

    def to_avro(self) -> dict[str, Any]:
        return {
            "user": self.user,
            "teams": list(self.teams),
            "groups": list(self.groups),
            "projects": list(self.projects),
            "primary_team": self.primary_team,
            "cost_centre": self.cost_centre,
            "snapshot_ts_ms": self.snapshot_ts_ms,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> IdentitySnapshot:
        return cls(
            user=d["user"],
            teams=tuple(d["teams"]),
            groups=tuple(d["groups"]),
            projects=tuple(d.get("projects", [])),
            primary_team=d.get("primary_team"),
            cost_centre=d.get("cost_centre"),
            snapshot_ts_ms=d["snapshot_ts_ms"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatedDevice:
    """One device held by the job on a node."""

    index: int | None = None
    uuid: str | None = None
    mig_instance_id: int | None = None
    mig_profile: str | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "mig_instance_id": self.mig_instance_id,
            "mig_profile": self.mig_profile,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> AllocatedDevice:
        return cls(
            index=d.get("index"),
            uuid=d.get("uuid"),
            mig_instance_id=d.get("mig_instance_id"),
            mig_profile=d.get("mig_profile"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAllocation:
    """The devices a job holds on one node."""

    node: str
    devices: tuple[AllocatedDevice, ...]

    def to_avro(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "devices": [x.to_avro() for x in self.devices],
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> NodeAllocation:
        return cls(
            node=d["node"],
            devices=tuple(AllocatedDevice.from_avro(x) for x in d["devices"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobEvent:
    """A scheduler job lifecycle event. Key: cluster/job_id."""

    SUBJECT: ClassVar[str] = "sched.job-events"

    event_id: str
    event_type: JobEventType
    ts_ms: int
    scheduler: SchedulerKind
    cluster: str
    job_id: str
    array_job_id: str | None = None
    array_task_id: int | None = None
    het_job_id: str | None = None
    het_job_offset: int | None = None
    job_name: str | None = None
    user: str
    user_uid: str | None = None
    user_source: UserSource | None = None
    user_claimed: str | None = None
    user_groups: tuple[str, ...] = ()
    account: str | None = None
    project: str | None = None
    project_source: ProjectSource
    project_validation: ProjectValidation
    project_claimed: str | None = None
    identity: IdentitySnapshot | None = None
    partition: str | None = None
    qos: str | None = None
    preemptible: bool = False
    interactive: bool = False
    checkpointable: bool = False
    gang_size: int = 0
    gang_id: str | None = None
    allocations: tuple[NodeAllocation, ...] = ()
    requested_devices: int = 0
    pricing_tier: str = "on-prem"
    submit_ts_ms: int | None = None
    start_ts_ms: int | None = None
    end_ts_ms: int | None = None
    exit_state: str | None = None
    exit_code: int | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "event_type": self.event_type,
            "ts_ms": self.ts_ms,
            "scheduler": self.scheduler,
            "cluster": self.cluster,
            "job_id": self.job_id,
            "array_job_id": self.array_job_id,
            "array_task_id": self.array_task_id,
            "het_job_id": self.het_job_id,
            "het_job_offset": self.het_job_offset,
            "job_name": self.job_name,
            "user": self.user,
            "user_uid": self.user_uid,
            "user_source": self.user_source,
            "user_claimed": self.user_claimed,
            "user_groups": list(self.user_groups),
            "account": self.account,
            "project": self.project,
            "project_source": self.project_source,
            "project_validation": self.project_validation,
            "project_claimed": self.project_claimed,
            "identity": None if self.identity is None else self.identity.to_avro(),
            "partition": self.partition,
            "qos": self.qos,
            "preemptible": self.preemptible,
            "interactive": self.interactive,
            "checkpointable": self.checkpointable,
            "gang_size": self.gang_size,
            "gang_id": self.gang_id,
            "allocations": [x.to_avro() for x in self.allocations],
            "requested_devices": self.requested_devices,
            "pricing_tier": self.pricing_tier,
            "submit_ts_ms": self.submit_ts_ms,
            "start_ts_ms": self.start_ts_ms,
            "end_ts_ms": self.end_ts_ms,
            "exit_state": self.exit_state,
            "exit_code": self.exit_code,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> JobEvent:
        return cls(
            event_id=d["event_id"],
            event_type=d["event_type"],
            ts_ms=d["ts_ms"],
            scheduler=d["scheduler"],
            cluster=d["cluster"],
            job_id=d["job_id"],
            array_job_id=d.get("array_job_id"),
            array_task_id=d.get("array_task_id"),
            het_job_id=d.get("het_job_id"),
            het_job_offset=d.get("het_job_offset"),
            job_name=d.get("job_name"),
            user=d["user"],
            user_uid=d.get("user_uid"),
            user_source=d.get("user_source"),
            user_claimed=d.get("user_claimed"),
            user_groups=tuple(d.get("user_groups", [])),
            account=d.get("account"),
            project=d.get("project"),
            project_source=d["project_source"],
            project_validation=d["project_validation"],
            project_claimed=d.get("project_claimed"),
            identity=None if (v := d.get("identity")) is None else IdentitySnapshot.from_avro(v),
            partition=d.get("partition"),
            qos=d.get("qos"),
            preemptible=d.get("preemptible", False),
            interactive=d.get("interactive", False),
            checkpointable=d.get("checkpointable", False),
            gang_size=d.get("gang_size", 0),
            gang_id=d.get("gang_id"),
            allocations=tuple(NodeAllocation.from_avro(x) for x in d.get("allocations", [])),
            requested_devices=d.get("requested_devices", 0),
            pricing_tier=d.get("pricing_tier", "on-prem"),
            submit_ts_ms=d.get("submit_ts_ms"),
            start_ts_ms=d.get("start_ts_ms"),
            end_ts_ms=d.get("end_ts_ms"),
            exit_state=d.get("exit_state"),
            exit_code=d.get("exit_code"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceSample:
    """Canonical metrics of one device (GPU or MIG instance) in one node scrape. An absent metric is null, never 0."""

    uuid: str
    index: int | None = None
    mig_instance_id: int | None = None
    mig_profile: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    sm_active_ratio: float | None = None
    sm_occupancy_ratio: float | None = None
    gr_engine_active_ratio: float | None = None
    tensor_active_ratio: float | None = None
    dram_active_ratio: float | None = None
    gpu_util_pct: float | None = None
    mem_copy_util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    power_w: float | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    temperature_c: float | None = None
    xid_last: int | None = None
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    hpc_job: str | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "index": self.index,
            "mig_instance_id": self.mig_instance_id,
            "mig_profile": self.mig_profile,
            "model": self.model,
            "pci_bus_id": self.pci_bus_id,
            "sm_active_ratio": self.sm_active_ratio,
            "sm_occupancy_ratio": self.sm_occupancy_ratio,
            "gr_engine_active_ratio": self.gr_engine_active_ratio,
            "tensor_active_ratio": self.tensor_active_ratio,
            "dram_active_ratio": self.dram_active_ratio,
            "gpu_util_pct": self.gpu_util_pct,
            "mem_copy_util_pct": self.mem_copy_util_pct,
            "fb_used_mib": self.fb_used_mib,
            "fb_free_mib": self.fb_free_mib,
            "power_w": self.power_w,
            "pcie_tx_bytes_per_s": self.pcie_tx_bytes_per_s,
            "pcie_rx_bytes_per_s": self.pcie_rx_bytes_per_s,
            "temperature_c": self.temperature_c,
            "xid_last": self.xid_last,
            "pod": self.pod,
            "namespace": self.namespace,
            "container": self.container,
            "hpc_job": self.hpc_job,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> DeviceSample:
        return cls(
            uuid=d["uuid"],
            index=d.get("index"),
            mig_instance_id=d.get("mig_instance_id"),
            mig_profile=d.get("mig_profile"),
            model=d.get("model"),
            pci_bus_id=d.get("pci_bus_id"),
            sm_active_ratio=d.get("sm_active_ratio"),
            sm_occupancy_ratio=d.get("sm_occupancy_ratio"),
            gr_engine_active_ratio=d.get("gr_engine_active_ratio"),
            tensor_active_ratio=d.get("tensor_active_ratio"),
            dram_active_ratio=d.get("dram_active_ratio"),
            gpu_util_pct=d.get("gpu_util_pct"),
            mem_copy_util_pct=d.get("mem_copy_util_pct"),
            fb_used_mib=d.get("fb_used_mib"),
            fb_free_mib=d.get("fb_free_mib"),
            power_w=d.get("power_w"),
            pcie_tx_bytes_per_s=d.get("pcie_tx_bytes_per_s"),
            pcie_rx_bytes_per_s=d.get("pcie_rx_bytes_per_s"),
            temperature_c=d.get("temperature_c"),
            xid_last=d.get("xid_last"),
            pod=d.get("pod"),
            namespace=d.get("namespace"),
            container=d.get("container"),
            hpc_job=d.get("hpc_job"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeScrape:
    """One scrape of one node's device telemetry: all devices the exporter reported at one instant."""

    SUBJECT: ClassVar[str] = "telemetry.device-samples"

    cluster: str
    node: str
    ts_ms: int
    source: str
    exporter_version: str | None = None
    mapping_version: str
    devices: tuple[DeviceSample, ...]

    def to_avro(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "ts_ms": self.ts_ms,
            "source": self.source,
            "exporter_version": self.exporter_version,
            "mapping_version": self.mapping_version,
            "devices": [x.to_avro() for x in self.devices],
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> NodeScrape:
        return cls(
            cluster=d["cluster"],
            node=d["node"],
            ts_ms=d["ts_ms"],
            source=d["source"],
            exporter_version=d.get("exporter_version"),
            mapping_version=d["mapping_version"],
            devices=tuple(DeviceSample.from_avro(x) for x in d["devices"]),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CoverageMinute:
    """Telemetry coverage of one node in one minute: the data-quality figure. Key: cluster/node."""

    SUBJECT: ClassVar[str] = "usage.coverage-minutes"

    cluster: str
    node: str
    minute_start_ms: int
    expected_devices: int
    reporting_devices: int
    expected_device_s: int
    reporting_device_s: int
    unexpected_devices: int = 0

    def to_avro(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "minute_start_ms": self.minute_start_ms,
            "expected_devices": self.expected_devices,
            "reporting_devices": self.reporting_devices,
            "expected_device_s": self.expected_device_s,
            "reporting_device_s": self.reporting_device_s,
            "unexpected_devices": self.unexpected_devices,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> CoverageMinute:
        return cls(
            cluster=d["cluster"],
            node=d["node"],
            minute_start_ms=d["minute_start_ms"],
            expected_devices=d["expected_devices"],
            reporting_devices=d["reporting_devices"],
            expected_device_s=d["expected_device_s"],
            reporting_device_s=d["reporting_device_s"],
            unexpected_devices=d.get("unexpected_devices", 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMinute:
    """One device's activity in one event-time minute [minute_start, minute_start+60s), attributed to the job holding
    it. Key: cluster/job_id.
    """

    SUBJECT: ClassVar[str] = "usage.device-minutes"

    cluster: str
    node: str
    device_uuid: str
    mig_instance_id: int | None = None
    mig_profile: str | None = None
    gpu_share_slices: int = 1
    gpu_share_of: int = 1
    minute_start_ms: int
    model: str | None = None
    generation: str
    job_id: str | None = None
    user: str | None = None
    project: str | None = None
    team: str | None = None
    cost_centre: str | None = None
    preemptible: bool = False
    pricing_tier: str = "on-prem"
    unallocated_s: int = 0
    allocated_s: int
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    sm_weighted_s: float
    sample_count: int
    activity_mean_ratio: float | None = None
    activity_max_ratio: float | None = None
    fb_used_mib_max: float | None = None
    power_w_mean: float | None = None
    mapping_version: str
    classifier_version: str
    job_node_rows: int | None = None

    def to_avro(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "node": self.node,
            "device_uuid": self.device_uuid,
            "mig_instance_id": self.mig_instance_id,
            "mig_profile": self.mig_profile,
            "gpu_share_slices": self.gpu_share_slices,
            "gpu_share_of": self.gpu_share_of,
            "minute_start_ms": self.minute_start_ms,
            "model": self.model,
            "generation": self.generation,
            "job_id": self.job_id,
            "user": self.user,
            "project": self.project,
            "team": self.team,
            "cost_centre": self.cost_centre,
            "preemptible": self.preemptible,
            "pricing_tier": self.pricing_tier,
            "unallocated_s": self.unallocated_s,
            "allocated_s": self.allocated_s,
            "active_s": self.active_s,
            "starved_s": self.starved_s,
            "idle_s": self.idle_s,
            "dark_s": self.dark_s,
            "sm_weighted_s": self.sm_weighted_s,
            "sample_count": self.sample_count,
            "activity_mean_ratio": self.activity_mean_ratio,
            "activity_max_ratio": self.activity_max_ratio,
            "fb_used_mib_max": self.fb_used_mib_max,
            "power_w_mean": self.power_w_mean,
            "mapping_version": self.mapping_version,
            "classifier_version": self.classifier_version,
            "job_node_rows": self.job_node_rows,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> DeviceMinute:
        return cls(
            cluster=d["cluster"],
            node=d["node"],
            device_uuid=d["device_uuid"],
            mig_instance_id=d.get("mig_instance_id"),
            mig_profile=d.get("mig_profile"),
            gpu_share_slices=d.get("gpu_share_slices", 1),
            gpu_share_of=d.get("gpu_share_of", 1),
            minute_start_ms=d["minute_start_ms"],
            model=d.get("model"),
            generation=d["generation"],
            job_id=d.get("job_id"),
            user=d.get("user"),
            project=d.get("project"),
            team=d.get("team"),
            cost_centre=d.get("cost_centre"),
            preemptible=d.get("preemptible", False),
            pricing_tier=d.get("pricing_tier", "on-prem"),
            unallocated_s=d.get("unallocated_s", 0),
            allocated_s=d["allocated_s"],
            active_s=d["active_s"],
            starved_s=d["starved_s"],
            idle_s=d["idle_s"],
            dark_s=d["dark_s"],
            sm_weighted_s=d["sm_weighted_s"],
            sample_count=d["sample_count"],
            activity_mean_ratio=d.get("activity_mean_ratio"),
            activity_max_ratio=d.get("activity_max_ratio"),
            fb_used_mib_max=d.get("fb_used_mib_max"),
            power_w_mean=d.get("power_w_mean"),
            mapping_version=d["mapping_version"],
            classifier_version=d["classifier_version"],
            job_node_rows=d.get("job_node_rows"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JobMinute:
    """One job's activity in one event-time minute, summed over all its devices. Key: cluster/job_id."""

    SUBJECT: ClassVar[str] = "usage.job-minutes"

    cluster: str
    job_id: str
    minute_start_ms: int
    device_count: int
    generation: str
    user: str | None = None
    project: str | None = None
    team: str | None = None
    cost_centre: str | None = None
    preemptible: bool = False
    pricing_tier: str = "on-prem"
    allocated_s: int
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    sm_weighted_s: float
    sample_count: int
    activity_mean_ratio: float | None = None
    activity_max_ratio: float | None = None
    fb_used_mib_max: float | None = None
    power_w_mean: float | None = None
    mapping_version: str
    classifier_version: str

    def to_avro(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "job_id": self.job_id,
            "minute_start_ms": self.minute_start_ms,
            "device_count": self.device_count,
            "generation": self.generation,
            "user": self.user,
            "project": self.project,
            "team": self.team,
            "cost_centre": self.cost_centre,
            "preemptible": self.preemptible,
            "pricing_tier": self.pricing_tier,
            "allocated_s": self.allocated_s,
            "active_s": self.active_s,
            "starved_s": self.starved_s,
            "idle_s": self.idle_s,
            "dark_s": self.dark_s,
            "sm_weighted_s": self.sm_weighted_s,
            "sample_count": self.sample_count,
            "activity_mean_ratio": self.activity_mean_ratio,
            "activity_max_ratio": self.activity_max_ratio,
            "fb_used_mib_max": self.fb_used_mib_max,
            "power_w_mean": self.power_w_mean,
            "mapping_version": self.mapping_version,
            "classifier_version": self.classifier_version,
        }

    @classmethod
    def from_avro(cls, d: Mapping[str, Any]) -> JobMinute:
        return cls(
            cluster=d["cluster"],
            job_id=d["job_id"],
            minute_start_ms=d["minute_start_ms"],
            device_count=d["device_count"],
            generation=d["generation"],
            user=d.get("user"),
            project=d.get("project"),
            team=d.get("team"),
            cost_centre=d.get("cost_centre"),
            preemptible=d.get("preemptible", False),
            pricing_tier=d.get("pricing_tier", "on-prem"),
            allocated_s=d["allocated_s"],
            active_s=d["active_s"],
            starved_s=d["starved_s"],
            idle_s=d["idle_s"],
            dark_s=d["dark_s"],
            sm_weighted_s=d["sm_weighted_s"],
            sample_count=d["sample_count"],
            activity_mean_ratio=d.get("activity_mean_ratio"),
            activity_max_ratio=d.get("activity_max_ratio"),
            fb_used_mib_max=d.get("fb_used_mib_max"),
            power_w_mean=d.get("power_w_mean"),
            mapping_version=d["mapping_version"],
            classifier_version=d["classifier_version"],
        )


ContractRecord = (
    ReclaimAction
    | Alert
    | AppealEvent
    | AttributionBaseline
    | AttributionCorrection
    | DeadLetter
    | EscalationEvent
    | NodeInventory
    | PolicyApplied
    | JobDeviceMinutes
    | ReservationEvent
    | JobEvent
    | NodeScrape
    | CoverageMinute
    | DeviceMinute
    | JobMinute
)
"""Any subject's top-level record (what `RecordPublisher.publish` takes)."""

RECORDS: dict[str, type[ContractRecord]] = {
    "actions.reclaim": ReclaimAction,
    "alerts": Alert,
    "appeals": AppealEvent,
    "attribution.baseline": AttributionBaseline,
    "attribution.corrections": AttributionCorrection,
    "deadletter": DeadLetter,
    "escalations": EscalationEvent,
    "inventory.devices": NodeInventory,
    "policy.applied": PolicyApplied,
    "processors.job-device-minutes": JobDeviceMinutes,
    "reservations": ReservationEvent,
    "sched.job-events": JobEvent,
    "telemetry.device-samples": NodeScrape,
    "usage.coverage-minutes": CoverageMinute,
    "usage.device-minutes": DeviceMinute,
    "usage.job-minutes": JobMinute,
}
