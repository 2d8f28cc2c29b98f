"""Reclaim executor: turn a ReclaimAction into scheduler commands, run them (or, by default, only
plan them), and record every step and its outcome.

Before acting, and before logging what a dry run would do, the executor re-checks in ClickHouse that
the job is still allocated (no closing event after its last start) and that its latest job-minute is
idle (`recheck`, pure, over a `JobNow` read by `ClickHouseJobState`). The action was decided minutes
earlier from a stream: the job may have ended, or woken up, since. If not, the action is skipped
with the reason recorded, logged and counted (`gpuledger_reclaim_skipped_total{reason}`).

Slurm: `scontrol requeuehold <job>`, `scancel --signal=<SIG> --full <job>` to ask the job to checkpoint, a grace
period, then `scontrol requeuehold` or `scancel`. Requeued held, not plain requeued: a plain requeue starts the job
again by itself once its credential lifetime has passed, to idle again; held, it waits for its way back (`gpuledger
reclaim resume`, an appeal's exemption: sinks/reclaim_resume.py, `scontrol release`). Never `scontrol suspend`: a
suspended Slurm job keeps its GPUs (Slurm only stops its processes; the devices stay allocated and no other job
gets them, as the live-Slurm tests show), so it reclaims nothing: SUSPEND for a Slurm job is refused. Kueue: set
the Workload's `spec.active` to false (Kueue evicts it, its pods get SIGTERM: the workload's checkpoint chance, and
it stays queued until reactivated); a JobSet no Workload owns gets `spec.suspend=true`, a Volcano Job an AbortJob
Command (`sinks/kube_owner.py`). Commands are argv lists (no shell); job ids are checked.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import Counter as PromCounter

from base.errors import ConfigError
from base.kube import load_credentials
from sinks import reclaim_doubt as doubt
from sinks.kube_owner import Owner, abort_command, kubernetes_owner_create, kubernetes_owner_patch
from sinks.reclaim_doubt import scontrol_show_job

log = logging.getLogger(__name__)
SKIPPED = PromCounter(
    "gpuledger_reclaim_skipped", "Reclaim actions not carried out: the re-check found the job ended or busy.",
    ["reason"],
)  # fmt: skip

SLURM_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SIGNAL = re.compile(r"^(?:SIG)?[A-Z0-9]{2,8}$")
# v1beta2: the version Kueue (0.17) stores; once quota is reserved it refuses a patch converted from v1beta1
KUEUE_GROUP, KUEUE_VERSION, KUEUE_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
KUEUE_READ_POLLS, KUEUE_READ_EVERY_S = 6, 0.5  # reading Kueue's condition back: at most 3 s
ACTIONS = ("SUSPEND", "REQUEUE", "CANCEL", "CHECKPOINT_THEN_REQUEUE", "CHECKPOINT_THEN_CANCEL")
SLURM_SUSPEND_KEEPS_GPUS = (
    "SUSPEND does not reclaim a Slurm job: `scontrol suspend` stops its processes but the job keeps its GPUs "
    "allocated; use CHECKPOINT_THEN_REQUEUE, REQUEUE or CANCEL"
)


@dataclass(frozen=True, slots=True)
class Step:
    kind: str  # "exec" (argv), "wait" (seconds), "kueue-deactivate" (namespace/name)
    argv: tuple[str, ...] = ()
    wait_s: float = 0.0
    namespace: str = ""
    name: str = ""

    def describe(self) -> str:
        if self.kind == "exec":
            return " ".join(self.argv)
        if self.kind == "wait":
            return f"wait {self.wait_s:g}s for the checkpoint"
        return f"patch Workload {self.namespace}/{self.name} spec.active=false"


@dataclass(frozen=True, slots=True)
class Outcome:
    action_id: str
    step: int
    ts_ms: int
    cluster: str
    job_id: str
    scheduler: str
    action: str
    command: str
    dry_run: bool
    status: str  # planned, ok, failed, skipped
    detail: str


OUTCOME_COLUMNS = (
    "action_id", "step", "ts_ms", "cluster", "job_id", "scheduler", "action", "command", "dry_run", "status",
    "detail",
)  # fmt: skip


def plan(action: dict[str, Any], *, signal: str = "USR1", grace_s: float = 120.0) -> list[Step]:
    """The steps for one action (pure)."""
    kind = str(action.get("action"))
    if kind not in ACTIONS:
        raise ConfigError(f"unknown reclaim action {kind!r}; expected one of {', '.join(ACTIONS)}")
    scheduler = str(action.get("scheduler", "")).upper()
    job_id = str(action.get("job_id", ""))
    if scheduler == "SLURM":
        if not SLURM_JOB_ID.fullmatch(job_id):
            raise ConfigError(f"not a Slurm job id: {job_id!r}")
        if not SIGNAL.fullmatch(signal):
            raise ConfigError(f"not a signal name: {signal!r}")
        if kind == "SUSPEND":
            raise ConfigError(SLURM_SUSPEND_KEEPS_GPUS)
        checkpoint = [Step("exec", ("scancel", f"--signal={signal}", "--full", job_id)), Step("wait", wait_s=grace_s)]
        return {
            "REQUEUE": [Step("exec", ("scontrol", "requeuehold", job_id))],
            "CANCEL": [Step("exec", ("scancel", job_id))],
            "CHECKPOINT_THEN_REQUEUE": [*checkpoint, Step("exec", ("scontrol", "requeuehold", job_id))],
            "CHECKPOINT_THEN_CANCEL": [*checkpoint, Step("exec", ("scancel", job_id))],
        }[kind]
    if scheduler in ("KUEUE", "KUBERNETES"):
        namespace, _, name = job_id.partition("/")
        if not (K8S_NAME.fullmatch(namespace) and K8S_NAME.fullmatch(name)):
            raise ConfigError(f"a Kueue job id is <namespace>/<workload name>, got {job_id!r}")
        return [Step("kueue-deactivate", namespace=namespace, name=name)]
    raise ConfigError(f"no reclaim executor for scheduler {scheduler!r} (SLURM, KUEUE)")


# ------------------------------------------------------------------------------------------------
# The re-check before acting

OPENING_EVENTS = ("STARTED", "RESUMED")
CLOSING_EVENTS = ("ENDED", "PREEMPTED", "SUSPENDED", "REQUEUED")


@dataclass(frozen=True, slots=True)
class JobNow:
    """What the warehouse says about a job when the executor is about to act (epoch milliseconds)."""

    last_open_ms: int | None  # latest STARTED/RESUMED event
    last_close_ms: int | None  # latest ENDED/PREEMPTED/SUSPENDED/REQUEUED event
    last_minute_ms: int | None = None  # start of the job's latest job-minute
    last_minute: tuple[int, int, int] | None = None  # its (active_s, starved_s, idle_s)


@dataclass(frozen=True, slots=True)
class Recheck:
    ok: bool
    reason: str  # "ok", "not-allocated", "ended", "no-minutes", "busy", "dark", "check-failed"
    detail: str


def recheck(now: JobNow) -> Recheck:
    """Whether the job is still allocated and idle (pure). A closing event at or after the last opening
    one means it no longer holds its devices; the latest job-minute must be idle: busy means it woke up,
    dark (no telemetry) is not evidence of idleness."""
    if now.last_open_ms is None:
        return Recheck(False, "not-allocated", "no start of this job in the warehouse")
    if now.last_close_ms is not None and now.last_close_ms >= now.last_open_ms:
        return Recheck(False, "ended", f"the job released its devices at {now.last_close_ms} (ms)")
    if now.last_minute is None or now.last_minute_ms is None:
        return Recheck(False, "no-minutes", "no job-minutes of this job in the warehouse")
    active, starved, idle = now.last_minute
    if active > 0 or starved > 0:
        return Recheck(False, "busy", f"busy in its latest minute ({now.last_minute_ms}): {active + starved} s")
    if idle == 0:
        return Recheck(False, "dark", f"no telemetry in its latest minute ({now.last_minute_ms})")
    return Recheck(True, "ok", f"allocated and idle in its latest minute ({now.last_minute_ms})")


JobState = Callable[[str, str], JobNow]  # (cluster, job_id) -> JobNow
Progress = Callable[[str], Sequence["Outcome"]]  # action_id -> its live outcomes recorded so far
SlurmShow = Callable[[str], dict[str, str]]  # Slurm job id -> `scontrol show job -o` fields ({}: unknown job)
GangCheck = Callable[[Mapping[str, Any]], Recheck]  # the action -> may its job's whole gang be reclaimed


class ClickHouseJobState:
    """Reads `JobNow` from `job_events` and `job_minutes` (bound parameters)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __call__(self, cluster: str, job_id: str) -> JobNow:
        params = {"cluster": cluster, "job": job_id, "opening": list(OPENING_EVENTS), "closing": list(CLOSING_EVENTS)}
        events = self._client.query(
            "SELECT maxIf(ts_ms, event_type IN {opening:Array(String)}), "
            "countIf(event_type IN {opening:Array(String)}), "
            "maxIf(ts_ms, event_type IN {closing:Array(String)}), "
            "countIf(event_type IN {closing:Array(String)}) "
            "FROM job_events FINAL WHERE cluster = {cluster:String} AND job_id = {job:String}",
            parameters=params,
        ).result_rows
        last_open, opens, last_close, closes = events[0] if events else (0, 0, 0, 0)
        minutes = self._client.query(
            "SELECT minute_start_ms, active_s, starved_s, idle_s FROM job_minutes FINAL "
            "WHERE cluster = {cluster:String} AND job_id = {job:String} ORDER BY minute_start_ms DESC LIMIT 1",
            parameters=params,
        ).result_rows
        minute = minutes[0] if minutes else None
        return JobNow(
            last_open_ms=int(last_open) if opens else None,
            last_close_ms=int(last_close) if closes else None,
            last_minute_ms=int(minute[0]) if minute else None,
            last_minute=(int(minute[1]), int(minute[2]), int(minute[3])) if minute else None,
        )


class OutcomeRecorder(Protocol):
    def record(self, outcomes: Sequence[Outcome]) -> None: ...

    def has_run(self, action_id: str) -> bool:
        """True when a live (not dry-run) execution of this action was started before."""
        ...


class ClickHouseRecorder:
    """Writes outcomes to the `action_outcomes` table (ReplacingMergeTree on action_id, step)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def record(self, outcomes: Sequence[Outcome]) -> None:
        if outcomes:
            rows = [[getattr(o, c) for c in OUTCOME_COLUMNS] for o in outcomes]
            self._client.insert("action_outcomes", rows, column_names=list(OUTCOME_COLUMNS))

    def outcomes_of(self, action_id: str) -> list[Outcome]:
        """The action's live (not dry-run) outcomes, one per step (the latest), by step."""
        rows = self._client.query(
            "SELECT action_id, step, ts_ms, cluster, job_id, scheduler, action, command, dry_run, status, detail "
            "FROM action_outcomes FINAL WHERE action_id = {id:String} AND NOT dry_run ORDER BY step LIMIT 100",
            parameters={"id": action_id},
        ).result_rows
        return [Outcome(*row) for row in rows]

    def has_run(self, action_id: str) -> bool:
        result = self._client.query(
            "SELECT count() FROM action_outcomes WHERE action_id = {id:String} AND NOT dry_run",
            parameters={"id": action_id},
        )
        return int(result.result_rows[0][0]) > 0


KueuePatch = Callable[[str, str, dict[str, Any]], None]  # (namespace, name, body)
KueueRead = Callable[[str, str], dict[str, Any]]  # (namespace, name) -> the Workload
KueueOwner = Callable[[str, str], Owner | None]  # (namespace, job name) -> the Workload, JobSet or Volcano Job
OwnerPatch = Callable[[Owner, dict[str, Any]], None]  # patch a non-Workload owner (a JobSet)
OwnerCreate = Callable[[dict[str, Any]], bool]  # create an object (a Volcano Command); False: it exists already


def _custom_objects() -> Any:
    from kubernetes import client

    load_credentials()
    return client.CustomObjectsApi()


def kubernetes_patch(namespace: str, name: str, body: dict[str, Any]) -> None:
    """Patch a Kueue Workload through the kubernetes client (in-cluster or kubeconfig)."""
    _custom_objects().patch_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, KUEUE_PLURAL, name, body)


def kubernetes_read(namespace: str, name: str) -> dict[str, Any]:
    """Read a Kueue Workload through the kubernetes client (in-cluster or kubeconfig)."""
    got = _custom_objects().get_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, KUEUE_PLURAL, name)
    return dict(got)


def kueue_eviction(workload: dict[str, Any]) -> str | None:
    """Kueue's answer to a deactivation, from the Workload (pure): its Evicted condition, when true, as
    `Evicted/<reason>: <message>` (reason `Deactivated`); None while Kueue has not evicted it."""
    for c in (workload.get("status") or {}).get("conditions") or ():
        if isinstance(c, dict) and c.get("type") == "Evicted" and c.get("status") == "True":
            return f"Evicted/{c.get('reason')}: {c.get('message', '')}"[:500]
    return None


def abort_volcano_job(owner: Owner, create: Callable[[dict[str, Any]], bool]) -> tuple[str, str]:
    """Create the Job's AbortJob Command; its name is fixed per Job, so an existing one (a repeated reclaim
    before Volcano's controller consumed it) means the gang is already being stopped."""
    try:
        command = abort_command(owner)
        created = create(command)
    except Exception as exc:  # the kubernetes client raises ApiException and transport errors
        return "failed", f"{owner.describe()}: {type(exc).__name__}: {exc}"[:2000]
    name = f"{command['metadata']['namespace']}/{command['metadata']['name']}"
    if not created:
        return "skipped", f"{owner.describe()}: AbortJob Command {name} exists: the gang is reclaimed as one"
    return "ok", f"{owner.describe()} suspended: AbortJob Command {name} created"


class ReclaimExecutor:
    def __init__(
        self,
        recorder: OutcomeRecorder,
        *,
        dry_run: bool = True,
        signal: str = "USR1",
        grace_s: float = 120.0,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        sleep: Callable[[float], None] = time.sleep,
        kueue_patch: KueuePatch = kubernetes_patch,
        kueue_read: KueueRead | None = kubernetes_read,
        timeout_s: float = 60.0,
        job_state: JobState | None = None,
        progress: Progress | None = None,
        slurm_show: SlurmShow = scontrol_show_job,
        kueue_owner: KueueOwner | None = None,
        gang_check: GangCheck | None = None,
        owner_patch: OwnerPatch = kubernetes_owner_patch,
        owner_create: OwnerCreate = kubernetes_owner_create,
    ) -> None:
        self._recorder = recorder
        # (namespace, job name) -> the Workload owning the pod (sinks/kube_owner.py); None: the job id names
        # the Workload itself
        self._kueue_owner = kueue_owner
        # the action -> whether its job's whole gang may be reclaimed now (sinks/gang.py); asked only after the
        # job's own re-check passed
        self._gang_check = gang_check
        self._owner_patch = owner_patch
        self._owner_create = owner_create
        self._job_state = job_state  # None: no re-check (a manual `reclaim exec`)
        # an action's live outcomes so far (`ClickHouseRecorder.outcomes_of`): one started and not finished is in
        # doubt and resolved by the engine (sinks/reclaim_doubt.py); None: not run again (at most once)
        self._progress = progress
        self._slurm_show = slurm_show  # the job as slurmctld has it now ({}: unknown), for an action in doubt
        self.skipped: Counter[str] = Counter()  # by re-check reason
        self._dry_run = dry_run
        self._signal = signal
        self._grace_s = grace_s
        self._clock_ms = clock_ms
        self._sleep = sleep
        self._kueue_patch = kueue_patch
        self._kueue_read = kueue_read  # None: Kueue's condition is not read back after the patch
        self._timeout_s = timeout_s

    def execute(self, action: dict[str, Any]) -> list[Outcome]:
        """Run (or plan) an action. It runs only when neither the executor nor the action is a dry run.

        A live run first records a `started` row (step 0) and each step's outcome as soon as it is known. An
        action started before (a redelivery, a restart): with `progress`, exactly once: finished, it is not run
        again; in doubt (a kill cut it between a step and its outcome), the engine is asked and the step is
        recorded as done or carried out now, then the rest (`_resume`). Without: at most once, not run again. A
        failed step stops the action; later steps are recorded as skipped.
        """
        dry = self._dry_run or bool(action.get("dry_run", True))
        base: dict[str, Any] = {
            "action_id": str(action.get("action_id", "")),
            "cluster": str(action.get("cluster", "")),
            "job_id": str(action.get("job_id", "")),
            "scheduler": str(action.get("scheduler", "")),
            "action": str(action.get("action", "")),
            "dry_run": dry,
        }

        def outcome(step: int, command: str, status: str, detail: str) -> Outcome:
            return Outcome(step=step, ts_ms=self._clock_ms(), command=command, status=status, detail=detail, **base)

        try:
            steps = plan(action, signal=self._signal, grace_s=self._grace_s)
        except ConfigError as exc:
            outcomes = [outcome(0, "", "failed", str(exc))]
            self._recorder.record(outcomes)
            return outcomes
        if not dry and self._progress is not None:  # before the re-check: its skip row must not replace `started`
            before = self._progress(base["action_id"])
            if before:
                return self._resume(steps, before, outcome, base["job_id"])
        verdict = self._recheck(base["cluster"], base["job_id"], action)
        if not verdict.ok:
            outcomes = [outcome(0, "", "skipped", f"re-check: {verdict.reason}: {verdict.detail}")]
            self._recorder.record(outcomes)
            return outcomes
        if dry:
            log.info("reclaim %s of %s/%s would act (dry-run): %s", base["action"], base["cluster"], base["job_id"],
                     verdict.detail)  # fmt: skip
            outcomes = [outcome(i, s.describe(), "planned", "dry-run: not executed") for i, s in enumerate(steps, 1)]
            self._recorder.record(outcomes)
            return outcomes
        if self._progress is None and self._recorder.has_run(base["action_id"]):
            return [outcome(0, "", "duplicate", "already executed; not run again")]
        self._recorder.record([outcome(0, "", "started", f"{len(steps)} step(s){self._baseline(steps, base)}")])
        return self._steps(steps, 1, outcome, [], failed=False)

    def _steps(self, steps: Sequence[Step], first: int, outcome: Callable[[int, str, str, str], Outcome],
               outcomes: list[Outcome], *, failed: bool) -> list[Outcome]:  # fmt: skip
        """Run steps `first`.. in order, recording each outcome as soon as it is known."""
        for i, step in enumerate(steps[first - 1 :], start=first):
            if failed:
                done = outcome(i, step.describe(), "skipped", "an earlier step failed")
            else:
                status, detail = self._run(step)
                failed = status == "failed"
                done = outcome(i, step.describe(), status, detail)
            self._recorder.record([done])
            outcomes.append(done)
        return outcomes

    def _baseline(self, steps: Sequence[Step], base: Mapping[str, Any]) -> str:
        """For a Slurm requeue: `; restarts=N`, the job's restart count before it (what an action in doubt is
        judged by); '' otherwise, or when slurmctld cannot say (then the held state alone judges it)."""
        if self._progress is None or not any(s.kind == "exec" and doubt.effect(s.argv) == "requeue" for s in steps):
            return ""
        try:
            kept = doubt.baseline(self._slurm_show(str(base["job_id"])))
        except Exception as exc:  # the probe raises ServiceError; the action goes ahead without a baseline
            log.warning("reclaim of %s: restart count not read: %s", base["job_id"], exc)
            return ""
        return f"; {kept}" if kept else ""

    def _resume(self, steps: Sequence[Step], before: Sequence[Outcome],
                outcome: Callable[[int, str, str, str], Outcome], job_id: str) -> list[Outcome]:  # fmt: skip
        """An action a previous life started: finished (each step's outcome there, or a failure, or no `started`
        row: a skip or a failed plan), it is a duplicate; in doubt, the engine resolves the first step without an
        outcome (sinks/reclaim_doubt.py), then the rest run."""
        started = next((o for o in before if o.step == 0 and o.status == "started"), None)
        done = {o.step: o for o in before if o.step >= 1}
        missing = [i for i in range(1, len(steps) + 1) if i not in done]
        if started is None or not missing or any(o.status == "failed" for o in done.values()):
            return [outcome(0, "", "duplicate", "already executed; not run again")]
        first = missing[0]
        step = steps[first - 1]
        try:
            status, detail = self._in_doubt(step, job_id, started.detail)
        except Exception as exc:  # the engine could not be asked: do not act blind, say so
            status, detail = "failed", f"in doubt after a restart; the engine could not be asked: {exc}"[:2000]
        log.warning("reclaim %s step %d (%s) was in doubt after a restart: %s %s", started.action_id, first,
                    step.describe(), status, detail)  # fmt: skip
        resolved = outcome(first, step.describe(), status, detail)
        self._recorder.record([resolved])
        return self._steps(steps, first + 1, outcome, [resolved], failed=status == "failed")

    def _in_doubt(self, step: Step, job_id: str, started_detail: str) -> tuple[str, str]:
        """(status, detail) of a step in doubt: done already as the engine shows it, or carried out now."""
        prefix = "in doubt after a restart: "
        if step.kind == "exec":
            fields = {} if doubt.effect(step.argv) == "signal" else self._slurm_show(job_id)
            verdict = doubt.slurm_in_doubt(step.argv, fields, doubt.baseline_restarts(started_detail))
            if not verdict.run:
                return verdict.status, prefix + verdict.detail
            status, detail = self._run(step)
            return status, f"{prefix}{verdict.detail}: run now{': ' + detail if detail else ''}"
        if step.kind == "kueue-deactivate":
            if self._kueue_owner is None and self._kueue_read is not None:
                workload = self._kueue_read(step.namespace, step.name)
                if (workload.get("spec") or {}).get("active") is False:
                    return "ok", f"{prefix}Workload {step.namespace}/{step.name} has spec.active=false: already done"
            status, detail = self._deactivate(step.namespace, step.name)
            # `_deactivate` skips only an owner found stopped (inactive, or its AbortJob Command there): done
            return ("ok" if status == "skipped" else status), f"{prefix}{detail}"
        status, detail = self._run(step)
        return status, f"{prefix}run again{': ' + detail if detail else ''}"

    def _recheck(self, cluster: str, job_id: str, action: Mapping[str, Any]) -> Recheck:
        if self._job_state is None:
            return Recheck(True, "ok", "not re-checked")
        try:
            verdict = recheck(self._job_state(cluster, job_id))
            if verdict.ok and self._gang_check is not None:
                verdict = self._gang_check(action)
        except Exception as exc:  # the warehouse is unreachable or refused: do not act blind
            verdict = Recheck(False, "check-failed", f"{type(exc).__name__}: {exc}"[:500])
        if not verdict.ok:
            self.skipped[verdict.reason] += 1
            SKIPPED.labels(verdict.reason).inc()
            log.warning("reclaim of %s/%s skipped: %s (%s)", cluster, job_id, verdict.reason, verdict.detail)
        return verdict

    def _kueue_outcome(self, namespace: str, name: str) -> str:
        """Kueue's condition after the deactivation, read back for the outcome: a few reads, at most
        `KUEUE_READ_POLLS * KUEUE_READ_EVERY_S` seconds, so the executor is not held for long."""
        if self._kueue_read is None:
            return "Kueue's condition not read"
        for poll in range(KUEUE_READ_POLLS):
            try:
                evicted = kueue_eviction(self._kueue_read(namespace, name))
            except Exception as exc:  # the patch was applied: a failed read does not fail the step
                return f"Kueue's condition not read: {type(exc).__name__}: {exc}"[:1000]
            if evicted is not None:
                return f"Kueue: {evicted}"
            if poll < KUEUE_READ_POLLS - 1:
                self._sleep(KUEUE_READ_EVERY_S)
        return f"Kueue has not evicted it within {KUEUE_READ_POLLS * KUEUE_READ_EVERY_S:g} s"

    def _deactivate(self, namespace: str, job: str) -> tuple[str, str]:
        """Deactivate the Workload of the job: the one owning its pod when an owner resolver is set. A
        Workload already inactive is not patched again: a gang (every pod of one Workload) is reclaimed once,
        whichever of its pods' actions comes first."""
        name, what = job, "Workload"
        if self._kueue_owner is not None:
            try:
                owner = self._kueue_owner(namespace, job)
            except Exception as exc:  # the kubernetes client raises ApiException and transport errors
                return "failed", f"finding the Workload of {namespace}/{job}: {type(exc).__name__}: {exc}"[:2000]
            if owner is None:
                return "failed", f"no Kueue Workload owns {namespace}/{job}"
            if not owner.active:
                return "skipped", f"{owner.describe()} already stopped: the gang is reclaimed as one"
            if owner.kind == "VolcanoJob":  # a Volcano Job no Kueue Workload owns: an AbortJob Command
                return abort_volcano_job(owner, self._owner_create)
            if owner.kind != "Workload":  # a JobSet no Kueue Workload owns: suspend it
                try:
                    self._owner_patch(owner, owner.stop_body)
                except Exception as exc:  # the kubernetes client raises ApiException and transport errors
                    return "failed", f"{type(exc).__name__}: {exc}"[:2000]
                return "ok", f"{owner.describe()} suspended"
            name, what = owner.name, owner.describe()
        try:
            self._kueue_patch(namespace, name, {"spec": {"active": False}})
        except Exception as exc:  # the kubernetes client raises ApiException and transport errors
            return "failed", f"{type(exc).__name__}: {exc}"[:2000]
        return "ok", f"{what} deactivated; {self._kueue_outcome(namespace, name)}"

    def _run(self, step: Step) -> tuple[str, str]:
        if step.kind == "wait":
            self._sleep(step.wait_s)
            return "ok", ""
        if step.kind == "kueue-deactivate":
            return self._deactivate(step.namespace, step.name)
        try:
            proc = subprocess.run(list(step.argv), capture_output=True, text=True, timeout=self._timeout_s, check=False)
        except FileNotFoundError:
            return "failed", f"{step.argv[0]} not found on PATH"
        except subprocess.TimeoutExpired:
            return "failed", f"timed out after {self._timeout_s:g}s"
        output = (proc.stdout + proc.stderr).strip()[:2000]
        if proc.returncode != 0:
            return "failed", f"exit {proc.returncode}: {output}"
        return "ok", output
