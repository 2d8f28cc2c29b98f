"""Kubernetes job events: Pods requesting NVIDIA GPUs (whole or MIG), Kueue Workloads, Volcano PodGroups.

Pure core: `KubeTracker.on_pod / on_workload / on_podgroup(watch_type, obj, now_ms) -> events`, over plain
dicts as the API server sends them (the tracker handles the watch; `GangBook` keeps the gangs'
bookkeeping, `KubeEventBuilder` builds the events). The adapter `KubeWatcher` runs list+watch with the
official kubernetes client and feeds the tracker.

Model:
- a Pod that holds GPUs is a job (`job_id = namespace/pod`): SUBMITTED when created, STARTED when it runs on
  a node (devices from `PodDeviceSource`: kubelet PodResources where reachable, else dcgm-exporter's pod
  labels), UPDATED when device UUIDs become known later, ENDED when it finishes or is deleted
  (exit_state PREEMPTED when it was evicted/preempted).
- a gang is the pods of one Kueue Workload, Volcano PodGroup, JobSet, Kubeflow training job (PyTorchJob, MPIJob,
  ...) or coscheduling PodGroup: `gang_id` names it (`kueue:ns/workload`, `volcano:ns/podgroup`, `jobset:ns/name`,
  `kubeflow:ns/job`, `coscheduling:ns/podgroup`; a Kueue Workload owning the job wins over the last two);
  `gang_size` is the gang's device total.
- Kueue Workloads and Volcano PodGroups are jobs of their own kind (scheduler KUEUE/VOLCANO) carrying the
  gang's queue-level life: admission (UPDATED), eviction by preemption (PREEMPTED), deactivation via
  `spec.active=false` (SUSPENDED, then RESUMED), other evictions/requeues (REQUEUED), finish (ENDED).
  They hold no devices themselves: the pods do.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Protocol

from base.errors import ContractError, ParseError
from base.untrusted import parses_untrusted
from producers.devicemap import iter_dcgm_labels
from producers.jobevents import EventContext, EventSink, HeldDevices, job_event
from producers.kube_identity import USER_KEYS as USER_KEYS  # re-exported: the self-declared user keys
from producers.kube_identity import IdentityResolver, OwnerSource, StampTrust
from producers.projects import Attribution
from producers.slurm import MAX_JOB_GPUS, MAX_NODE_GPUS
from schemas.topics import JOB_EVENTS, job_key

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
PROJECT_LABEL = "gpuledger.io/project"
VOLCANO_GROUP = "scheduling.k8s.io/group-name"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
KUEUE_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
KUBEFLOW_JOB = "training.kubeflow.org/job-name"  # the pods of a PyTorchJob, MPIJob, TFJob (training and MPI operators)
COSCHEDULING_GROUP = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins' coscheduling PodGroup
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"
WORKLOAD_PRIORITY_SOURCE = "kueue.x-k8s.io/workloadpriorityclass"  # v1beta1 spec.priorityClassSource
PREEMPT_REASONS = frozenset(
    {"Preempted", "PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI", "Evicted",
     "TerminationByKubelet", "StoppedByKueue", "InactiveWorkload"}
)


def parse_time(value: Any) -> int | None:
    """RFC 3339 (`2024-05-17T14:02:54Z`) -> epoch ms."""
    if not value:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    text = str(value).replace("Z", "+00:00")
    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        return None


def _quantity(value: Any) -> int:
    """A device count from a resource quantity; 0 when not a plain integer. Objects are written by users:
    a count over `MAX_JOB_GPUS` is a `ParseError`, never a loop over it."""
    text = str(value).strip()
    if not (0 < len(text) <= 12 and text.isascii() and text.isdigit()):
        return 0
    n = int(text)
    if n > MAX_JOB_GPUS:
        raise ParseError(f"device count {n} is over {MAX_JOB_GPUS}")
    return n


@dataclass(frozen=True, slots=True)
class GpuRequest:
    gpus: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)  # e.g. {"nvidia.com/mig-1g.5gb": 2}

    @property
    def devices(self) -> int:
        return self.gpus + sum(self.mig.values())


def gpu_request(pod_spec: Mapping[str, Any]) -> GpuRequest:
    """GPUs a pod spec asks for: sum over containers (limits, else requests), max with init containers."""

    def of(containers: Iterable[Mapping[str, Any]]) -> list[dict[str, int]]:
        out = []
        for c in containers or ():
            res = c.get("resources") or {}
            merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            out.append({k: _quantity(v) for k, v in merged.items() if k == GPU_RESOURCE or k.startswith(MIG_PREFIX)})
        return out

    total: dict[str, int] = {}
    for c in of(pod_spec.get("containers") or ()):
        for k, v in c.items():
            total[k] = total.get(k, 0) + v
    for c in of(pod_spec.get("initContainers") or ()):
        for k, v in c.items():
            total[k] = max(total.get(k, 0), v)
    mig = {k: v for k, v in total.items() if k.startswith(MIG_PREFIX) and v}
    return GpuRequest(total.get(GPU_RESOURCE, 0), mig)


# ------------------------------------------------------------------------------------------------
# Device UUIDs of a pod


@dataclass(frozen=True, slots=True)
class PodDevice:
    uuid: str
    index: int | None = None
    mig_instance_id: int | None = None
    mig_profile: str | None = None


class PodDeviceSource(Protocol):
    def pod_devices(self, node: str, namespace: str, pod: str) -> list[PodDevice] | None: ...


class DcgmPodLabels:
    """Pod -> devices from dcgm-exporter series labels (`pod`, `namespace`, `UUID`, `gpu`, `GPU_I_ID`).

    dcgm-exporter itself asks the kubelet PodResources API, so its labels are the fallback where the
    kubelet socket is not reachable from this process. Feed it scrapes as they arrive.
    """

    def __init__(self) -> None:
        self._by_pod: dict[tuple[str, str, str], dict[tuple[str, int | None], PodDevice]] = {}
        self._lock = threading.Lock()  # scrapes are loaded by a refresher thread while the watch reads

    def load_scrape(self, text: str, node: str | None = None) -> None:
        with self._lock:
            self._load(text, node)

    def _load(self, text: str, node: str | None) -> None:
        for labels in iter_dcgm_labels(text):
            pod, ns, uuid = labels.get("pod"), labels.get("namespace"), labels.get("UUID")
            host = node or labels.get("Hostname") or labels.get("hostname")
            if not (pod and ns and uuid and host):
                continue
            gpu = labels.get("gpu", "")
            mig = labels.get("GPU_I_ID", "")
            dev = PodDevice(uuid, int(gpu) if gpu.isdigit() else None, int(mig) if mig.isdigit() else None,
                            labels.get("GPU_I_PROFILE") or None)
            self._by_pod.setdefault((host, ns, pod), {})[(uuid, dev.mig_instance_id)] = dev

    def pod_devices(self, node: str, namespace: str, pod: str) -> list[PodDevice] | None:
        with self._lock:
            devs = dict(self._by_pod.get((node, namespace, pod)) or {})
        return sorted(devs.values(), key=lambda d: (d.index or 0, d.mig_instance_id or 0)) if devs else None


class ChainedPodDevices:
    """Ask each source in turn (PodResources first, dcgm labels after)."""

    def __init__(self, *sources: PodDeviceSource) -> None:
        self.sources = sources

    def pod_devices(self, node: str, namespace: str, pod: str) -> list[PodDevice] | None:
        for s in self.sources:
            got = s.pod_devices(node, namespace, pod)
            if got:
                return got
        return None


# ------------------------------------------------------------------------------------------------
# The tracker (pure)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _key(obj: Mapping[str, Any]) -> str:
    m = _meta(obj)
    return f"{m.get('namespace', 'default')}/{m.get('name')}"


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or () if isinstance(c, Mapping)}


@dataclass
class _PodState:
    submitted: bool = False
    started_ms: int | None = None
    uuids_known: bool = False
    ended: bool = False
    last: Mapping[str, Any] | None = None  # last object seen, to close the pod if it vanishes


@dataclass
class _GangState:
    kind: str
    submitted: bool = False
    admitted_at: str | None = None
    seen_conditions: set[tuple[str, str]] = field(default_factory=set)  # (type, lastTransitionTime)
    inactive: bool = False
    ended: bool = False
    devices: int = 0
    queue: str | None = None
    evicted: str | None = None  # exit state for the gang's pods while it is evicted (PREEMPTED, REQUEUED)
    priority_class: str | None = None  # a Kueue Workload's WorkloadPriorityClass (what the policy's tiers render)


class GangBook:
    """Bookkeeping of gangs: each Kueue Workload's and Volcano PodGroup's state, which owners (jobs,
    pods) belong to which workload, and the devices each gang's running pods hold."""

    def __init__(self) -> None:
        self.gangs: dict[str, _GangState] = {}
        self.workload_by_owner_uid: dict[str, str] = {}  # owner (job/pod) uid -> gang id
        self.gang_pods: dict[str, dict[str, int]] = {}  # gang id -> running pod -> devices

    def gang_of(self, pod: Mapping[str, Any]) -> str | None:
        m = _meta(pod)
        ns = m.get("namespace", "default")
        labels, ann = m.get("labels") or {}, m.get("annotations") or {}
        if ann.get(VOLCANO_GROUP):
            return f"volcano:{ns}/{ann[VOLCANO_GROUP]}"
        if labels.get(KUEUE_POD_GROUP):
            return f"kueue:{ns}/{labels[KUEUE_POD_GROUP]}"
        if labels.get(JOBSET_LABEL):
            return f"jobset:{ns}/{labels[JOBSET_LABEL]}"
        for uid in [m.get("uid"), *(o.get("uid") for o in m.get("ownerReferences") or ())]:
            if uid and uid in self.workload_by_owner_uid:
                return self.workload_by_owner_uid[uid]
        if labels.get(KUBEFLOW_JOB):
            return f"kubeflow:{ns}/{labels[KUBEFLOW_JOB]}"
        if labels.get(COSCHEDULING_GROUP):
            return f"coscheduling:{ns}/{labels[COSCHEDULING_GROUP]}"
        return None

    def state(self, gang: str | None) -> _GangState | None:
        return self.gangs.get(gang) if gang else None

    def open(self, gang: str, kind: str) -> _GangState:
        return self.gangs.setdefault(gang, _GangState(kind))

    def forget(self, gang: str) -> None:
        self.gangs.pop(gang, None)

    def claim_owners(self, gang: str, workload: Mapping[str, Any]) -> None:
        """The workload's owners (and Kueue's job uid label) point their pods at the gang."""
        m = _meta(workload)
        for o in m.get("ownerReferences") or ():
            if o.get("uid"):
                self.workload_by_owner_uid[o["uid"]] = gang
        if (m.get("labels") or {}).get(KUEUE_JOB_UID):
            self.workload_by_owner_uid[m["labels"][KUEUE_JOB_UID]] = gang

    def pod_running(self, gang: str, pod_key: str, devices: int) -> None:
        self.gang_pods.setdefault(gang, {})[pod_key] = devices

    def pod_gone(self, gang: str, pod_key: str) -> None:
        self.gang_pods.get(gang, {}).pop(pod_key, None)

    def size(self, gang: str | None, requested: int) -> int:
        """The gang's device total: its workload's, its running pods', or this pod's request, whichever is largest."""
        gang_state = self.state(gang)
        return max(
            gang_state.devices if gang_state else 0,
            sum(self.gang_pods.get(gang or "", {}).values()),
            requested,
        )


class KubeEventBuilder:
    """Turns pods and gang objects into job events: who (the verified submitter, else the self-declared user,
    else the namespace: producers/kube_identity.py; project attribution), which scheduler, and the gang a pod
    belongs to."""

    def __init__(self, ctx: EventContext, book: GangBook, project_label: str,
                 identity: IdentityResolver | None = None) -> None:  # fmt: skip
        self.ctx = ctx
        self.book = book
        self.project_label = project_label
        self.identity = identity or IdentityResolver()

    def _attribution(self, user: str, obj: Mapping[str, Any]) -> Attribution:
        labels = _meta(obj).get("labels") or {}
        if self.ctx.attributor is None:
            explicit = labels.get(self.project_label)
            return Attribution(explicit, "EXPLICIT" if explicit else "MISSING", "NOT_CHECKED")
        teams: frozenset[str] = frozenset()
        if self.ctx.identity is not None:
            entry = self.ctx.identity.lookup(user)
            teams = frozenset(entry.teams) if entry else frozenset()
        return self.ctx.attributor.resolve(user, labels.get(self.project_label), teams)

    @staticmethod
    def _scheduler(pod: Mapping[str, Any]) -> str:
        m = _meta(pod)
        if (pod.get("spec") or {}).get("schedulerName") == "volcano" or (m.get("annotations") or {}).get(VOLCANO_GROUP):
            return "VOLCANO"
        labels = m.get("labels") or {}
        if labels.get(KUEUE_QUEUE) or labels.get("kueue.x-k8s.io/managed") == "true":
            return "KUEUE"
        return "KUBERNETES"

    def pod_event(self, pod: Mapping[str, Any], etype: str, ts: int, req: GpuRequest, held: list[HeldDevices],
                  **fields: Any) -> dict[str, Any]:
        m = _meta(pod)
        spec = pod.get("spec") or {}
        who = self.identity.resolve(pod)
        user = who.user
        gang = self.book.gang_of(pod)
        gang_state = self.book.state(gang)
        labels = m.get("labels") or {}
        return job_event(
            self.ctx,
            event_type=etype,
            ts_ms=ts,
            scheduler=self._scheduler(pod),
            job_id=_key(pod),
            user=user,
            attribution=self._attribution(user, pod),
            held=held,
            job_name=m.get("name"),
            account=m.get("namespace"),
            partition=labels.get(KUEUE_QUEUE) or (gang_state.queue if gang_state else None),
            qos=spec.get("priorityClassName") or (gang_state.priority_class if gang_state else None),
            preemptible=self._preemptible(spec, gang_state),
            interactive=labels.get("gpuledger.io/interactive") == "true",
            checkpointable=labels.get("gpuledger.io/checkpointable") == "true",
            gang_id=gang,
            gang_size=self.book.size(gang, req.devices),
            requested_devices=req.devices,
            submit_ts_ms=parse_time(m.get("creationTimestamp")),
            **who.fields(),
            **fields,
        )

    def _preemptible(self, spec: Mapping[str, Any], gang_state: _GangState | None) -> bool:
        """Priced as preemptible: the pod's PriorityClass, or its Kueue Workload's WorkloadPriorityClass, is one the
        pricing names (producers/preemptible.py: the policy's preemptible tier), or the pod's priority is
        negative. The Workload's class is Kueue's own record of the tier, whatever labels the pod carries."""
        names = self.ctx.preemptible_qos
        if (spec.get("priorityClassName") or "") in names:
            return True
        if gang_state is not None and gang_state.priority_class in names:
            return True
        priority = spec.get("priority")
        return isinstance(priority, int) and priority < 0

    def gang_event(self, obj: Mapping[str, Any], kind: str, scheduler: str, etype: str, ts: int,
                   gs: _GangState, **fields: Any) -> dict[str, Any]:
        who = self.identity.resolve(obj)
        user = who.user
        return job_event(
            self.ctx,
            event_type=etype,
            ts_ms=ts,
            scheduler=scheduler,
            job_id=_key(obj),
            user=user,
            attribution=self._attribution(user, obj),
            job_name=_meta(obj).get("name"),
            account=_meta(obj).get("namespace"),
            partition=gs.queue,
            qos=gs.priority_class,
            preemptible=gs.priority_class in self.ctx.preemptible_qos,
            gang_id=f"{kind}:{_key(obj)}",
            gang_size=gs.devices,
            requested_devices=gs.devices,
            submit_ts_ms=parse_time(_meta(obj).get("creationTimestamp")),
            id_extra=(kind,),
            **who.fields(),
            **fields,
        )


def held_devices(
    pod: Mapping[str, Any], req: GpuRequest, pod_devices: PodDeviceSource | None
) -> tuple[list[HeldDevices], bool]:
    """The devices a scheduled pod holds, and whether their identities (UUIDs) are known: from the
    device source where it knows the pod, else counted from the request (MIG profiles from resource names)."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        return [], False
    if req.devices > MAX_NODE_GPUS:
        raise ParseError(f"pod {_key(pod)[:120]} asks for {req.devices} devices on one node (max {MAX_NODE_GPUS})")
    m = _meta(pod)
    devs = pod_devices.pod_devices(node, m.get("namespace", "default"), m.get("name", "")) if (
        pod_devices) else None
    if devs:
        indices = tuple(d.index for d in devs if d.index is not None)
        if len(indices) != len(devs):
            indices = ()
        return [HeldDevices(node, len(devs), indices, tuple(d.uuid for d in devs),
                            tuple(d.mig_instance_id for d in devs), tuple(d.mig_profile for d in devs))], True
    profiles: tuple[str | None, ...] = ()
    if req.mig:  # whole GPUs first, then each MIG slice with its profile from the resource name
        profiles = (None,) * req.gpus + tuple(
            k[len(MIG_PREFIX):] for k, n in sorted(req.mig.items()) for _ in range(n))
    return [HeldDevices(node, req.devices, mig_profiles=profiles)], False


def pod_end(pod: Mapping[str, Any], now_ms: int) -> int:
    status = pod.get("status") or {}
    ends = [
        parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for cs in status.get("containerStatuses") or ()
    ]
    known = [e for e in ends if e]
    if known:
        return max(known)
    return parse_time(_meta(pod).get("deletionTimestamp")) or now_ms


def pod_exit(pod: Mapping[str, Any], watch_type: str) -> tuple[str, int | None]:
    status = pod.get("status") or {}
    codes = [
        ((cs.get("state") or {}).get("terminated") or {}).get("exitCode")
        for cs in status.get("containerStatuses") or ()
    ]
    code = next((c for c in codes if c), codes[0] if codes else None)
    reasons = {status.get("reason")} | {c.get("reason") for c in _conditions(pod).values()
                                       if c.get("type") in ("DisruptionTarget", "TerminationTarget")
                                       and c.get("status") == "True"}
    if reasons & PREEMPT_REASONS:
        return "PREEMPTED", code
    phase = status.get("phase")
    if phase == "Succeeded":
        return "COMPLETED", code
    if phase == "Failed":
        return "FAILED", code
    return "CANCELLED" if watch_type == "DELETED" else "UNKNOWN", code


def workload_priority_class(spec: Mapping[str, Any]) -> str | None:
    """The WorkloadPriorityClass of a Kueue Workload: v1beta1 `priorityClassName` where `priorityClassSource` is
    kueue.x-k8s.io/workloadpriorityclass, v1beta2 `priorityClassRef` of kind WorkloadPriorityClass. None for a pod
    PriorityClass (the pods carry that one themselves) or none."""
    ref = spec.get("priorityClassRef")
    if isinstance(ref, Mapping):
        if ref.get("group") == "kueue.x-k8s.io" and ref.get("kind") == "WorkloadPriorityClass":
            name = ref.get("name")
            return name[:253] if isinstance(name, str) and name else None
        return None
    name = spec.get("priorityClassName")
    if spec.get("priorityClassSource") == WORKLOAD_PRIORITY_SOURCE and isinstance(name, str) and name:
        return name[:253]  # an object name is at most 253 characters
    return None


def workload_devices(spec: Mapping[str, Any], admission: Mapping[str, Any]) -> int:
    """A Kueue Workload's devices: what its admission assigned, else what its pod sets request."""
    requested = sum(
        gpu_request((ps.get("template") or {}).get("spec") or {}).devices * (_quantity(ps.get("count") or 1) or 1)
        for ps in spec.get("podSets") or ()
    )
    assigned = sum(
        _quantity((a.get("resourceUsage") or {}).get(GPU_RESOURCE, 0))
        + sum(_quantity(v) for k, v in (a.get("resourceUsage") or {}).items() if k.startswith(MIG_PREFIX))
        for a in admission.get("podSetAssignments") or ()
    )
    return assigned or requested


Emit = Callable[..., None]


def podgroup_transitions(pg: Mapping[str, Any], gs: _GangState, watch_type: str, now_ms: int, emit: Emit) -> None:
    """A Volcano PodGroup's life from its phase: UPDATED once running (at its Scheduled condition), ENDED
    when completed or deleted."""
    phase = (pg.get("status") or {}).get("phase")
    if phase == "Running" and gs.admitted_at is None:
        sched = _conditions(pg).get("Scheduled") or {}
        gs.admitted_at = str(sched.get("lastTransitionTime") or now_ms)
        emit("UPDATED", parse_time(sched.get("lastTransitionTime")) or now_ms)
    if phase in ("Completed",) or watch_type == "DELETED":
        emit("ENDED", now_ms, end_ts_ms=now_ms, exit_state="COMPLETED" if phase == "Completed" else "CANCELLED")
        gs.ended = True


def workload_transitions(
    wl: Mapping[str, Any], gs: _GangState, watch_type: str, now_ms: int, emit: Emit
) -> None:
    """The queue-level life of a Kueue Workload from its conditions, each transition emitted once
    (a condition is new when its lastTransitionTime has not been seen).

    One deactivation is one SUSPENDED and one reactivation one RESUMED, whether Kueue's conditions come
    in the same update as `spec.active` or in later ones: Evicted(Deactivated) after `spec.active=false`
    was seen adds nothing, and Requeued(Reactivated) is never a REQUEUED."""
    spec = wl.get("spec") or {}
    conds = _conditions(wl)

    def new(ctype: str) -> Mapping[str, Any] | None:
        c = conds.get(ctype)
        if not c or c.get("status") != "True":
            return None
        mark = (ctype, str(c.get("lastTransitionTime")))
        if mark in gs.seen_conditions:
            return None
        gs.seen_conditions.add(mark)
        return c

    evicted = new("Evicted")
    if evicted is not None:
        ts = parse_time(evicted.get("lastTransitionTime")) or now_ms
        reason = evicted.get("reason")
        if reason == "Preempted":
            gs.evicted = "PREEMPTED"
            emit("PREEMPTED", ts)
        elif reason in ("InactiveWorkload", "Deactivated") or spec.get("active") is False:
            gs.evicted = "SUSPENDED"
            if not gs.inactive:  # else `spec.active=false`, seen in an earlier update, was the SUSPENDED
                gs.inactive = True
                emit("SUSPENDED", ts)
        else:
            gs.evicted = "REQUEUED"
            emit("REQUEUED", ts)
    if spec.get("active") is False and not gs.inactive:
        gs.inactive = True
        emit("SUSPENDED", now_ms)
    requeued = new("Requeued")
    # Requeued(Reactivated) follows `spec.active=true`: the reactivation is RESUMED, not a requeue
    if requeued is not None and evicted is None and requeued.get("reason") not in (None, "Admitted", "Reactivated"):
        emit("REQUEUED", parse_time(requeued.get("lastTransitionTime")) or now_ms)
    admitted = new("Admitted")
    if admitted is not None:
        gs.evicted = None
        ts = parse_time(admitted.get("lastTransitionTime")) or now_ms
        if gs.inactive and spec.get("active", True) is not False:
            gs.inactive = False
            emit("RESUMED", ts)
        else:
            emit("UPDATED", ts)
    elif gs.inactive and spec.get("active", True) is not False and evicted is None:
        gs.inactive = False
        emit("RESUMED", now_ms)
    finished = new("Finished")
    if finished is not None or watch_type == "DELETED":
        ts = (parse_time(finished.get("lastTransitionTime")) if finished else None) or now_ms
        reason = (finished or {}).get("reason")
        state = "COMPLETED" if reason in ("Succeeded", "JobFinished", None) and finished else (
            "FAILED" if finished else "CANCELLED")
        emit("ENDED", ts, end_ts_ms=ts, exit_state=state)
        gs.ended = True


class KubeTracker:
    """The watch handling: each watched object (`on_pod`, `on_workload`, `on_podgroup`) turned into the
    job events it implies, once each. Gang bookkeeping is `GangBook`; building events is `KubeEventBuilder`."""

    def __init__(
        self,
        ctx: EventContext,
        pod_devices: PodDeviceSource | None = None,
        *,
        project_label: str = PROJECT_LABEL,
        owners: OwnerSource | None = None,
        trust: StampTrust | None = None,
    ) -> None:
        self.ctx = ctx
        self.pod_devices = pod_devices
        self.pods: dict[str, _PodState] = {}
        self.book = GangBook()
        # owners: where a controller-made object's submitter is read; trust: whether the stamp's policy is in force
        self.identity = IdentityResolver(owners, trust)
        self.events = KubeEventBuilder(ctx, self.book, project_label, self.identity)

    def gang_of(self, pod: Mapping[str, Any]) -> str | None:
        return self.book.gang_of(pod)

    # -- pods ------------------------------------------------------------------------------------

    @parses_untrusted("pod")
    def on_pod(self, watch_type: str, pod: Mapping[str, Any], now_ms: int) -> list[dict[str, Any]]:
        spec = pod.get("spec") or {}
        req = gpu_request(spec)
        key = _key(pod)
        if not req.devices:
            return []
        st = self.pods.setdefault(key, _PodState())
        st.last = pod
        if st.ended:
            if watch_type == "DELETED":
                self.pods.pop(key, None)
            return []
        status = pod.get("status") or {}
        phase = status.get("phase")
        m = _meta(pod)
        event = self.events.pod_event
        out: list[dict[str, Any]] = []
        if not st.submitted:
            st.submitted = True
            created = parse_time(m.get("creationTimestamp")) or now_ms
            out.append(event(pod, "SUBMITTED", created, req, []))
        running = phase == "Running" or (phase in ("Succeeded", "Failed") and status.get("startTime"))
        held, known = held_devices(pod, req, self.pod_devices)
        gang = self.book.gang_of(pod)
        if running and spec.get("nodeName") and st.started_ms is None:
            st.started_ms = parse_time(status.get("startTime")) or now_ms
            st.uuids_known = known
            if gang is not None:
                self.book.pod_running(gang, key, req.devices)
            out.append(event(pod, "STARTED", st.started_ms, req, held, start_ts_ms=st.started_ms))
        elif st.started_ms is not None and known and not st.uuids_known and phase == "Running":
            st.uuids_known = True
            out.append(event(pod, "UPDATED", now_ms, req, held, start_ts_ms=st.started_ms))
        finished = phase in ("Succeeded", "Failed") or watch_type == "DELETED"
        if finished:
            end = pod_end(pod, now_ms)
            exit_state, exit_code = pod_exit(pod, watch_type)
            gang_state = self.book.state(gang)
            if gang_state is not None and gang_state.evicted and exit_state in ("CANCELLED", "FAILED", "UNKNOWN"):
                exit_state = gang_state.evicted  # Kueue evicted the gang: its pods were deleted for it
            out.append(event(pod, "ENDED", end, req, [], start_ts_ms=st.started_ms, end_ts_ms=end,
                             exit_state=exit_state, exit_code=exit_code))
            st.ended = True
            if gang is not None:
                self.book.pod_gone(gang, key)
            if watch_type == "DELETED":
                self.pods.pop(key, None)
        return out

    def recheck_devices(self, now_ms: int) -> list[dict[str, Any]]:
        """Ask the device source again for every running pod whose devices are not known yet (after the
        dcgm-exporter labels were scraped again): an UPDATED naming them for each pod they are now known
        for. A pod started after the watcher learns its devices without waiting for its next change."""
        out: list[dict[str, Any]] = []
        for st in list(self.pods.values()):
            if st.started_ms is not None and not st.uuids_known and not st.ended and st.last is not None:
                out.extend(self.on_pod("MODIFIED", st.last, now_ms))
        return out

    def on_pod_relist(self, present: set[str], now_ms: int) -> list[dict[str, Any]]:
        """After a watch gap (410 Gone, reconnect) and a fresh list: pods we track that are gone were
        deleted during the gap; close them now (their DELETED event was never seen)."""
        out: list[dict[str, Any]] = []
        for key, st in list(self.pods.items()):
            if key not in present and not st.ended and st.last is not None:
                out.extend(self.on_pod("DELETED", st.last, now_ms))
        return out

    # -- Kueue workloads -------------------------------------------------------------------------

    @parses_untrusted("Kueue Workload")
    def on_workload(self, watch_type: str, wl: Mapping[str, Any], now_ms: int) -> list[dict[str, Any]]:
        gang = f"kueue:{_key(wl)}"
        gs = self.book.open(gang, "kueue")
        self.book.claim_owners(gang, wl)
        spec, status = wl.get("spec") or {}, wl.get("status") or {}
        admission = status.get("admission") or {}
        gs.devices = workload_devices(spec, admission)
        gs.queue = admission.get("clusterQueue") or spec.get("queueName")
        gs.priority_class = workload_priority_class(spec)
        return self._gang_events(
            watch_type, wl, now_ms, gang, gs, ("kueue", "KUEUE"), partial(workload_transitions, wl, gs, watch_type)
        )

    # -- Volcano PodGroups -----------------------------------------------------------------------

    @parses_untrusted("Volcano PodGroup")
    def on_podgroup(self, watch_type: str, pg: Mapping[str, Any], now_ms: int) -> list[dict[str, Any]]:
        gang = f"volcano:{_key(pg)}"
        gs = self.book.open(gang, "volcano")
        spec = pg.get("spec") or {}
        min_res = spec.get("minResources") or {}
        gs.devices = _quantity(min_res.get(GPU_RESOURCE, 0)) + sum(
            _quantity(v) for k, v in min_res.items() if k.startswith(MIG_PREFIX))
        gs.queue = spec.get("queue")
        return self._gang_events(
            watch_type, pg, now_ms, gang, gs, ("volcano", "VOLCANO"), partial(podgroup_transitions, pg, gs, watch_type)
        )

    def _gang_events(
        self,
        watch_type: str,
        obj: Mapping[str, Any],
        now_ms: int,
        gang: str,
        gs: _GangState,
        kind: tuple[str, str],
        transitions: Callable[[int, Emit], None],
    ) -> list[dict[str, Any]]:
        """A gang object's events once its devices and queue are read (Workload, PodGroup): none without
        devices or once ended; SUBMITTED the first time; then its `transitions(now_ms, emit)`. The gang
        of a deleted object is forgotten."""
        out: list[dict[str, Any]] = []
        if gs.devices and not gs.ended:

            def emit(etype: str, ts: int, **fields: Any) -> None:
                out.append(self.events.gang_event(obj, *kind, etype, ts, gs, **fields))

            if not gs.submitted:
                gs.submitted = True
                emit("SUBMITTED", parse_time(_meta(obj).get("creationTimestamp")) or now_ms)
            transitions(now_ms, emit)
        if watch_type == "DELETED":
            self.book.forget(gang)
        return out


# ------------------------------------------------------------------------------------------------
# Adapter: list+watch with the official client


@dataclass(frozen=True)
class WatchTarget:
    name: str  # pods, workloads, podgroups
    group: str | None = None
    version: str = "v1"
    plural: str = "pods"


WATCH_BACKOFF_S = (0.5, 5.0)  # first and longest wait before watching again after an error


def _watch_errors() -> tuple[type[BaseException], ...]:
    """What a list or watch raises when refused (ApiException) or when the API server cannot be reached
    or drops the connection (urllib3's HTTPError: MaxRetryError, ProtocolError; ConnectionError)."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    return ApiException, urllib3.exceptions.HTTPError, ConnectionError


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status is not None:
        return f"{status} {getattr(exc, 'reason', '')}".strip()
    return f"{type(exc).__name__}: {exc}"[:300]


WATCH_TARGETS = (
    WatchTarget("workloads", "kueue.x-k8s.io", "v1beta1", "workloads"),
    WatchTarget("podgroups", "scheduling.volcano.sh", "v1beta1", "podgroups"),
    WatchTarget("pods"),
)


class KubeWatcher:
    """Watches the targets in threads, applies events in one thread (order per target kept), publishes."""

    def __init__(
        self,
        api_client: Any,
        tracker: KubeTracker,
        sink: EventSink,
        *,
        clock: Callable[[], int],
        targets: Iterable[WatchTarget] = WATCH_TARGETS,
        timeout_seconds: int = 300,
    ) -> None:
        self.api_client = api_client
        self.tracker = tracker
        self.sink = sink
        self.clock = clock
        self.targets = tuple(targets)
        self.timeout_seconds = timeout_seconds
        self._queue: queue.Queue[tuple[str, str, dict[str, Any]] | None] = queue.Queue()
        self._stop = threading.Event()
        self.errors: list[str] = []
        self.rejected = 0  # watch objects refused (see `apply`)

    def _list_fn(self, target: WatchTarget) -> Callable[..., Any]:
        from kubernetes import client

        # Wrappers typed `-> Any` so the watch hands back raw dicts (the client's pydantic models reject
        # objects that are valid on the wire but omit fields the models require).
        if target.group is None:
            core = client.CoreV1Api(self.api_client)

            def list_pods(**kw: Any) -> Any:
                return core.list_pod_for_all_namespaces(**kw)

            return list_pods
        custom = client.CustomObjectsApi(self.api_client)

        def list_custom(**kw: Any) -> Any:
            return custom.list_cluster_custom_object(str(target.group), target.version, target.plural, **kw)

        return list_custom

    def _list(self, target: WatchTarget) -> tuple[list[dict[str, Any]], str | None] | None:
        """The initial list (informer style): current objects and the resourceVersion to watch from."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self._list_fn(target)(_preload_content=False)
        except ApiException as exc:
            if exc.status in (403, 404):  # CRD not installed (no Kueue / no Volcano) or not allowed
                self.errors.append(f"{target.name}: not served ({exc.status})")
                return None
            raise
        data = json.loads(resp.data)
        return list(data.get("items") or []), (data.get("metadata") or {}).get("resourceVersion")

    def _watch(self, target: WatchTarget, rv: str | None, rounds: int | None) -> None:
        """Watch from `rv`. A refused watch (ApiException) or a broken connection (the API server down or
        restarting: urllib3's MaxRetryError, ProtocolError, ConnectionError) is recorded in `errors`, and
        the watch lists again after a bounded backoff (`WATCH_BACKOFF_S`, doubling while it fails)."""
        from kubernetes import watch

        fn = self._list_fn(target)
        done = 0  # watch calls (and failed lists) so far, for `rounds`
        backoff = WATCH_BACKOFF_S[0]
        relist = False
        while not self._stop.is_set():
            if relist:
                try:
                    rv = self._relist(target)
                    relist, backoff = False, WATCH_BACKOFF_S[0]
                except _watch_errors() as exc:
                    self.errors.append(f"{target.name}: relist {_describe(exc)}")
                    done += 1
                    if rounds is not None and done >= rounds:
                        return
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, WATCH_BACKOFF_S[1])
                    continue
            if rounds is not None and done >= rounds:
                return
            done += 1
            w = watch.Watch()
            try:
                kwargs: dict[str, Any] = {"timeout_seconds": self.timeout_seconds, "allow_watch_bookmarks": True}
                if rv:
                    kwargs["resource_version"] = rv
                for ev in w.stream(fn, **kwargs):
                    backoff = WATCH_BACKOFF_S[0]
                    if self._stop.is_set():
                        w.stop()
                        break
                    obj = ev["raw_object"] if "raw_object" in ev else ev["object"]
                    if ev["type"] == "BOOKMARK":
                        rv = _meta(obj).get("resourceVersion") or rv
                        continue
                    if ev["type"] == "ERROR":  # 410 Gone: the watch window was lost; list again
                        relist = True
                        break
                    rv = _meta(obj).get("resourceVersion") or rv
                    self._queue.put((target.name, ev["type"], obj))
            except _watch_errors() as exc:  # refused, or the API server unreachable: back off, list again
                self.errors.append(f"{target.name}: {_describe(exc)}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, WATCH_BACKOFF_S[1])
                relist = True

    def _relist(self, target: WatchTarget) -> str | None:
        """List again after a gap: current objects as ADDED, then a RELIST marker naming them. A failed
        list (refused, or the API server unreachable) raises: the watch backs off and lists again."""
        listed = self._list(target)
        if listed is None:
            return None
        items, rv = listed
        for obj in items:
            self._queue.put((target.name, "ADDED", obj))
        self._queue.put((target.name, "RELIST", {"keys": [_key(o) for o in items]}))
        return rv

    def apply(self, target: str, watch_type: str, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Track one watch event and publish what it implies. An object that does not parse, or whose
        event the contract refuses, is logged and counted (`rejected`), and the watch goes on."""
        now = self.clock()
        try:
            if watch_type == "RELIST":
                events = self.tracker.on_pod_relist(set(obj["keys"]), now) if target == "pods" else []
            elif watch_type == "RECHECK":
                events = self.tracker.recheck_devices(now)
            elif target == "pods":
                events = self.tracker.on_pod(watch_type, obj, now)
            elif target == "workloads":
                events = self.tracker.on_workload(watch_type, obj, now)
            else:
                events = self.tracker.on_podgroup(watch_type, obj, now)
            for e in events:
                self.sink.publish(JOB_EVENTS, job_key(e["cluster"], e["job_id"]), e)
        except (ParseError, ContractError) as exc:
            self.rejected += 1
            log.warning("kube %s %s: object refused: %s", target, watch_type, exc)
            return []
        return events

    def run(self, rounds: int | None = None) -> list[dict[str, Any]]:
        """List every target (gangs before pods), then watch until stopped (or for `rounds` watch calls
        per target, for tests). Returns the events applied."""
        applied: list[dict[str, Any]] = []
        threads = []
        for target in self.targets:
            listed = self._list(target)
            if listed is None:
                continue
            items, rv = listed
            for obj in items:
                applied.extend(self.apply(target.name, "ADDED", obj))
            threads.append(threading.Thread(target=self._watch, args=(target, rv, rounds), daemon=True))
        for t in threads:
            t.start()

        def drain() -> None:
            while True:
                try:
                    item = self._queue.get(timeout=0.05)
                except queue.Empty:
                    return
                if item is not None:
                    applied.extend(self.apply(*item))

        while any(t.is_alive() for t in threads) and not self._stop.is_set():
            drain()
        drain()
        return applied

    def recheck_devices(self) -> None:
        """From any thread: have the apply thread ask the device source again for pods of unknown devices."""
        self._queue.put(("pods", "RECHECK", {}))

    def stop(self) -> None:
        self._stop.set()
