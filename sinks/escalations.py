"""Escalations onto the schedulers and off again (issue 41 item 5): a granted request runs a job at the policy's
escalation tier until it expires, then puts back what the job had. The rules are `schemas/governance_escalations.py`;
this module asks the engines and changes them.

- **Slurm** (`SlurmPriority`): the tier is the QOS `policy apply --engine slurm` made for it (`tier_qos`: the
  tier's own name): raised by `scontrol update jobid=<job> QOS=<tier's QOS>`, fallen back by the same with the QOS
  it had. Under
  priority/multifactor the QOS weight moves the job's priority at once (`scontrol show job` Priority=). The team's
  association need not list the tier: Slurm checks the association's QOS for the job's user, not for an operator,
  whose rights the service runs with (tests/integration/test_slurm_live_escalation.py moves such a job as root).
- **Kueue** (`KueuePriority`): the tier is the WorkloadPriorityClass `policy apply --engine kueue` made for it
  (`tier_priority_class`). Kueue takes a Workload's priority from its Job's label `kueue.x-k8s.io/priority-class`
  and follows a change of it (Kueue's own UpdateWorkloadPriority), so the Job's label is set, and put back (or
  removed, when it had none). Only a batch Job's Workload is escalated.
- `reconcile`: one pass of the escalation service: the pure `due`, carried out; each engine change becomes an
  APPLIED or REVERTED step. An engine that fails is logged and tried again at the next pass (no step for it).
  Before any change the engine is asked where the job stands: a job that ended is not raised; a job whose tier
  someone else changed meanwhile is left as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from base.errors import ConfigError, ServiceError
from schemas.governance_escalations import (
    Escalation,
    Job,
    applied_event,
    cents_of,
    due,
    raised_months,
    reverted_event,
)
from schemas.policy import Policy
from sinks.kube_owner import Owner, _meta
from sinks.reclaim import K8S_NAME, SLURM_JOB_ID
from sinks.reclaim_doubt import scontrol_show_job
from sinks.reclaim_resume import FINISHED_SLURM, Run, ShowJob, _finished, run_argv
from sinks.statements import Charge

log = logging.getLogger("gpuledger.escalations")
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"


@dataclass(frozen=True, slots=True)
class Standing:
    """Where a job stands on its engine: `ok` (running or waiting: can be raised), `gone` or `ended`; `current` is
    its QOS (Slurm) or priority-class label (Kueue, "" for none)."""

    status: str
    detail: str
    current: str = ""


class Engine(Protocol):
    engine: str  # SLURM or KUEUE

    def target(self, tier: str) -> str: ...
    def standing(self, job_id: str) -> Standing: ...
    def set(self, job_id: str, value: str) -> str: ...


def engine_of(job_id: str) -> str:
    """SLURM for a Slurm job id, KUEUE for <namespace>/<name>; one line for anything else."""
    if SLURM_JOB_ID.fullmatch(job_id):
        return "SLURM"
    namespace, _, name = job_id.partition("/")
    if K8S_NAME.fullmatch(namespace) and K8S_NAME.fullmatch(name):
        return "KUEUE"
    raise ConfigError(f"not a job id: {job_id[:80]!r} (a Slurm job id, or <namespace>/<pod or Workload>)")


# -- Slurm -----------------------------------------------------------------------------------------------------


def slurm_standing(job_id: str, job: Mapping[str, str]) -> Standing:
    """From `scontrol show job -o` as key -> value ({} when Slurm does not know the job)."""
    state = job.get("JobState", "")
    if not state:
        return Standing("gone", f"job {job_id} does not exist on Slurm (or has left its memory: MinJobAge)")
    if state in FINISHED_SLURM:
        return Standing("ended", f"job {job_id} has ended ({state})")
    return Standing("ok", f"job {job_id} is {state}, QOS {job.get('QOS', '?')}", job.get("QOS", ""))


class SlurmPriority:
    engine = "SLURM"

    def __init__(self, show_job: ShowJob = scontrol_show_job, run: Run = run_argv) -> None:
        self._show_job, self._run = show_job, run

    def target(self, tier: str) -> str:
        return tier  # the QOS `policy apply` makes for a tier has its name (producers/policy_slurm.tier_qos)

    def standing(self, job_id: str) -> Standing:
        return slurm_standing(job_id, self._show_job(job_id))

    def set(self, job_id: str, value: str) -> str:
        argv = ("scontrol", "update", f"jobid={job_id}", f"QOS={value}")
        code, out = self._run(argv)
        if code != 0:
            raise ServiceError(f"{' '.join(argv)}: exit {code}: {out[:300]}")
        return " ".join(argv)


# -- Kueue -----------------------------------------------------------------------------------------------------


def job_ref(owner: Owner) -> Mapping[str, Any] | None:
    """The batch Job that owns the Workload (its ownerReference), or None for any other owner."""
    for ref in _meta(owner.obj).get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("kind") == "Job" and ref.get("apiVersion") == "batch/v1":
            return ref
    return None


def kueue_standing(job_id: str, owner: Owner | None, job: Mapping[str, Any] | None) -> Standing:
    """From the Workload that owns the job (None: no such pod or Workload) and its batch Job (None: none)."""
    if owner is None:
        return Standing("gone", f"job {job_id} does not exist on Kubernetes (no pod or Workload of that name)")
    if owner.kind != "Workload":
        return Standing("gone", f"{owner.describe()} is not a Kueue Workload: escalation is for Kueue's Workloads")
    if _finished(owner.obj):
        return Standing("ended", f"{owner.describe()} has finished")
    if job is None:
        return Standing("gone", f"{owner.describe()} belongs to no batch Job: its priority follows no label")
    labels = _meta(job).get("labels") or {}
    return Standing("ok", f"{owner.describe()} of Job {_meta(job).get('name')}", str(labels.get(PRIORITY_LABEL) or ""))


class KueuePriority:
    """Reads and patches through a `sinks.kube_owner.KubeOwnerReader` (needs get/list on Workloads, get and patch
    on batch Jobs)."""

    engine = "KUEUE"

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def target(self, tier: str) -> str:
        return tier  # likewise its WorkloadPriorityClass (producers/policy_kueue.tier_priority_class)

    def _find(self, job_id: str) -> tuple[Owner | None, Mapping[str, Any] | None]:
        from sinks.kube_owner import owning_workload

        namespace, _, name = job_id.partition("/")
        owner = owning_workload(self._reader, namespace, name)
        ref = job_ref(owner) if owner is not None and owner.kind == "Workload" else None
        return owner, (self._reader.owner(namespace, ref) if ref is not None else None)

    def standing(self, job_id: str) -> Standing:
        owner, job = self._find(job_id)
        return kueue_standing(job_id, owner, job)

    def set(self, job_id: str, value: str) -> str:
        namespace = job_id.partition("/")[0]
        _, job = self._find(job_id)
        if job is None:
            raise ServiceError(f"job {job_id}: no batch Job to label")
        name = str(_meta(job).get("name"))
        body = {"metadata": {"labels": {PRIORITY_LABEL: value or None}}}  # None: the label removed
        self._reader.custom.patch_namespaced_custom_object("batch", "v1", namespace, "jobs", name, body)
        return f"label Job {namespace}/{name} {PRIORITY_LABEL}={value or '(none)'}"


def kueue_engine(kubeconfig: str | None = None) -> KueuePriority:
    from kubernetes import client

    from base.kube import load_credentials
    from sinks.kube_owner import KubeOwnerReader

    load_credentials(kubeconfig)
    return KueuePriority(KubeOwnerReader(client.ApiClient()))


# -- one pass ---------------------------------------------------------------------------------------------------


def reconcile(escalations: Mapping[str, Escalation], now_ms: int, engines: Iterable[Engine],
              cluster: str) -> list[dict[str, Any]]:  # fmt: skip
    """The steps of one pass for `cluster`'s escalations: LAPSED for the undecided past their deadline, APPLIED for
    each grant raised on its engine, REVERTED for each raise whose time is up."""
    by_engine = {e.engine: e for e in engines}
    todo = due(escalations, now_ms)
    events: list[dict[str, Any]] = [e for e in todo.lapsed if e["cluster"] == cluster]

    def engine_for(esc: Escalation) -> Engine | None:
        if esc.job.cluster != cluster:
            return None
        try:
            return by_engine.get(engine_of(esc.job.job_id))
        except ConfigError:
            return None

    for esc in todo.raise_:
        engine = engine_for(esc)
        if engine is None:
            continue
        try:
            where = engine.standing(esc.job.job_id)
            if where.status != "ok":
                log.info("escalation %s not applied: %s", esc.escalation_id, where.detail)
                continue
            target = engine.target(esc.tier)
            done = engine.set(esc.job.job_id, target) if where.current != target else f"already at {target}"
        except Exception as exc:  # an engine that fails now is tried again at the next pass
            log.warning("escalation %s not applied on %s: %s", esc.escalation_id, engine.engine, exc)
            continue
        events.append(applied_event(esc, engine.engine, where.current, now_ms,
                                    f"raised to {target} (was {where.current or 'none'}): {done}"))  # fmt: skip
    for esc in todo.lower:
        engine = by_engine.get(esc.engine or "")
        if engine is None or esc.job.cluster != cluster:
            continue
        try:
            where = engine.standing(esc.job.job_id)
            target = engine.target(esc.tier)
            if where.status != "ok":
                text = f"{where.detail}: nothing to put back"
            elif where.current != target:
                text = f"changed to {where.current or 'none'} meanwhile, not by gpuledger: left as it is"
            else:
                text = f"fell back to {esc.before or 'none'}: {engine.set(esc.job.job_id, esc.before or '')}"
        except Exception as exc:
            log.warning("escalation %s not reverted on %s: %s", esc.escalation_id, engine.engine, exc)
            continue
        events.append(reverted_event(esc, now_ms, text))
    return events


# -- the ledger's side -------------------------------------------------------------------------------------------


def ledger_job(client: Any, cluster: str, job_id: str) -> Job | None:
    """The job's user, team (else its Slurm account, which the policy maps to a team) and GPUs from its latest
    event, or None when the ledger has no such job."""
    return ledger_job_state(client, cluster, job_id)[0]


def ledger_job_state(client: Any, cluster: str, job_id: str) -> tuple[Job | None, bool]:
    """`ledger_job`, and whether the job's latest event in the ledger is its end (the job page, which holds no
    engine credentials, refuses to ask for a job the ledger saw end; the service asks the engine again)."""
    rows = client.query(
        "SELECT argMax(user, ts_ms), argMax(coalesce(team, account), ts_ms), argMax(requested_devices, ts_ms), "
        "count(), argMax(event_type, ts_ms) FROM job_events WHERE cluster = {c:String} AND job_id = {j:String}",
        parameters={"c": cluster, "j": job_id},
    ).result_rows
    if not rows or not rows[0][3]:
        return None, False
    user, team, gpus, _, last = rows[0]
    job = Job(cluster, job_id, str(user) if user else None, str(team) if team else None, max(0, int(gpus or 0)))
    return job, str(last) == "ENDED"


def escalation_charges(policy: Policy, escalations: Iterable[Escalation], now_ms: int) -> list[Charge]:
    """A line per raised escalation and month on the team's statement when the policy prices priority
    (`governance.escalations.price_per_gpu_hour`): the job's GPUs x the hours it ran raised x the price. Capacity
    held at a higher priority, so a line of the statement's reservation kind whose cause is `escalation` (the
    statements, their stored totals and the journal already carry that kind)."""
    rules = policy.governance.escalations
    if rules is None or rules.price_per_gpu_hour is None:
        return []
    out = []
    for esc in sorted(escalations, key=lambda e: e.escalation_id):
        for month, gpu_s in raised_months(esc, now_ms):
            cents = cents_of(gpu_s, rules.price_per_gpu_hour)
            if cents <= 0:
                continue
            note = (f"job {esc.job.job_id} raised to {esc.tier} for {gpu_s / 3600:.2f} GPU-h at "
                    f"{rules.price_per_gpu_hour}/GPU-h (escalation granted by {esc.decided_by})")  # fmt: skip
            out.append(Charge(kind="reservation", ref=f"{esc.escalation_id}/{month}", team=esc.job.team or "",
                              source_period=month, cents=cents, cluster=esc.job.cluster, job_id=esc.job.job_id,
                              allocated_s=gpu_s, note=note[:500], cause="escalation"))  # fmt: skip
    return out

