"""Building `JobEvent` records (schemas/sched.job-events.avsc) from any scheduler, plus deterministic ids.

Conventions shared by the Slurm and Kubernetes producers (the processors rely on them):
- STARTED, RESUMED and UPDATED carry `allocations` (devices held per node); other types carry none.
- STARTED, RESUMED open a holding; ENDED, PREEMPTED, SUSPENDED and REQUEUED close it.
- `event_id` is a hash of (scheduler, cluster, job, type, event time[, discriminator]): the same transition
  seen twice (a restarted poller, squeue then sacct) gets the same id, so downstream de-duplicates.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Protocol, get_args

from producers.devicemap import DeviceMap
from producers.identity import IdentitySource, snapshot
from producers.projects import Attribution, Attributor
from schemas.records import ContractRecord, IdentitySnapshot, JobEvent, JobEventType, NodeAllocation

EVENT_TYPES: tuple[str, ...] = get_args(JobEventType)  # from the contract (schemas/sched.job-events.avsc)
_FIELDS = frozenset(JobEvent.__dataclass_fields__)
WITH_ALLOCATIONS = frozenset({"STARTED", "RESUMED", "UPDATED"})
# The QOS / priority class names priced as preemptible when neither `scheduler.preemptible_qos` nor a policy says
# (producers/preemptible.py resolves which applies).
DEFAULT_PREEMPTIBLE = frozenset({"preemptible", "preempt", "scavenger", "low", "spot"})
_P = ParamSpec("_P")


class EventSink(Protocol):
    """Where events go: `streams.publish.RecordPublisher` in production, a list in tests."""

    def publish(self, topic: Any, key: bytes, record: ContractRecord | dict[str, Any]) -> None: ...


def event_id(scheduler: str, cluster: str, job_id: str, event_type: str, ts_ms: int, *extra: str) -> str:
    text = "\x1f".join((scheduler, cluster, job_id, event_type, str(ts_ms), *extra))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class HeldDevices:
    """Devices held on one node: known indices, or only a count (indices unknown)."""

    node: str
    count: int
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()  # known UUIDs (Kubernetes), aligned with indices when both are known
    mig_instance_ids: tuple[int | None, ...] = ()
    mig_profiles: tuple[str | None, ...] = ()  # e.g. 1g.10gb per device; a single entry applies to all


def allocation_records(cluster: str, held: Iterable[HeldDevices], devmap: DeviceMap | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for h in held:
        devices: list[dict[str, Any]] = []

        def mig(i: int, h: HeldDevices = h) -> tuple[int | None, str | None]:
            inst = h.mig_instance_ids[i] if i < len(h.mig_instance_ids) else None
            if len(h.mig_profiles) == 1:
                return inst, h.mig_profiles[0]
            return inst, h.mig_profiles[i] if i < len(h.mig_profiles) else None

        if h.indices:
            for i, idx in enumerate(h.indices):
                uuid = h.uuids[i] if i < len(h.uuids) else None
                if uuid is None and devmap is not None:
                    uuid = devmap.lookup(cluster, h.node, idx)
                inst, profile = mig(i)
                devices.append({"index": idx, "uuid": uuid, "mig_instance_id": inst, "mig_profile": profile})
        elif h.uuids:
            for i, u in enumerate(h.uuids):
                inst, profile = mig(i)
                devices.append({"index": None, "uuid": u, "mig_instance_id": inst, "mig_profile": profile})
        else:
            for i in range(h.count):
                inst, profile = mig(i)
                devices.append({"index": None, "uuid": None, "mig_instance_id": inst, "mig_profile": profile})
        if devices:
            out.append({"node": h.node, "devices": devices})
    return out


@dataclass(frozen=True)
class EventContext:
    """Everything a producer needs beyond the scheduler record; built once at the entry point."""

    cluster: str
    attributor: Attributor | None = None
    identity: IdentitySource | None = None
    devices: DeviceMap | None = None
    pricing_tier: str = "on-prem"
    # Slurm QOS and Kubernetes priority classes (pod PriorityClass, Kueue WorkloadPriorityClass) priced as
    # preemptible: producers/preemptible.py resolves them (override, else the policy, else these defaults).
    preemptible_qos: frozenset[str] = DEFAULT_PREEMPTIBLE
    preemptible_partitions: frozenset[str] = frozenset()
    interactive_partitions: frozenset[str] = frozenset({"interactive"})
    checkpoint_comment_key: str = "checkpoint"
    extra: Mapping[str, Any] = field(default_factory=dict)

    def attribution(self, resolved: Attribution | None) -> Attribution:
        return resolved or Attribution(None, "MISSING", "NOT_CHECKED", None)


def job_event_record(
    ctx: EventContext,
    *,
    event_type: str,
    ts_ms: int,
    scheduler: str,
    job_id: str,
    user: str,
    attribution: Attribution,
    held: Sequence[HeldDevices] = (),
    id_extra: Sequence[str] = (),
    **fields: Any,
) -> JobEvent:
    """One typed `JobEvent`. `fields` are the optional contract fields (job_name, account, ...); the
    others take the contract's defaults."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}")
    identity = None
    if event_type == "STARTED":
        registry = ctx.attributor.registry if ctx.attributor is not None else None
        identity = snapshot(
            ctx.identity, user, ts_ms, attribution.cost_centre, registry.projects_of if registry is not None else None
        )
    allocations = allocation_records(ctx.cluster, held, ctx.devices) if event_type in WITH_ALLOCATIONS else []
    gang_size = fields.pop("gang_size", None)
    unknown = sorted(set(fields) - _FIELDS)
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a JobEvent field")
    record: dict[str, Any] = {
        "event_id": event_id(scheduler, ctx.cluster, job_id, event_type, ts_ms, *id_extra),
        "event_type": event_type,
        "ts_ms": int(ts_ms),
        "scheduler": scheduler,
        "cluster": ctx.cluster,
        "job_id": job_id,
        "user": user,
        "project": attribution.project,
        "project_source": attribution.source,
        "project_validation": attribution.validation,
        "project_claimed": attribution.claimed,
        "identity": IdentitySnapshot.from_avro(identity) if identity is not None else None,
        "gang_size": int(gang_size) if gang_size is not None else sum(h.count for h in held),
        "allocations": tuple(NodeAllocation.from_avro(a) for a in allocations),
        "pricing_tier": ctx.pricing_tier,
    }
    return JobEvent(**{**record, **fields})


def _as_avro(build: Callable[_P, ContractRecord]) -> Callable[_P, dict[str, Any]]:
    def as_avro(*args: _P.args, **kwargs: _P.kwargs) -> dict[str, Any]:
        return build(*args, **kwargs).to_avro()

    return as_avro


job_event = _as_avro(job_event_record)
"""`job_event_record` as the Avro dict (the same arguments): what the pollers hand on and their tests
read (the processors' in-memory pipeline and the Kafka boundary take either)."""
