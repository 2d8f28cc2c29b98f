"""Reclaim executor: turn a ReclaimAction into scheduler commands, run them (or, by default, only
plan them), and record every step and its outcome.

Slurm: `scontrol suspend|requeue <job>`, `scancel --signal=<SIG> --full <job>` to ask the job to
checkpoint, a grace period, then `scontrol requeue` or `scancel`. Kueue: set the Workload's
`spec.active` to false (Kueue evicts it, its pods get SIGTERM: the workload's checkpoint chance,
and it stays queued until reactivated). Commands are argv lists (no shell); job ids are checked.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuledger.errors import ConfigError

SLURM_JOB_ID = re.compile(r"^\d+(?:[_+]\d+)?$")
K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SIGNAL = re.compile(r"^(?:SIG)?[A-Z0-9]{2,8}$")
KUEUE_GROUP, KUEUE_VERSION, KUEUE_PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"
ACTIONS = ("SUSPEND", "REQUEUE", "CANCEL", "CHECKPOINT_THEN_REQUEUE", "CHECKPOINT_THEN_CANCEL")


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
        if not SLURM_JOB_ID.match(job_id):
            raise ConfigError(f"not a Slurm job id: {job_id!r}")
        if not SIGNAL.match(signal):
            raise ConfigError(f"not a signal name: {signal!r}")
        checkpoint = [Step("exec", ("scancel", f"--signal={signal}", "--full", job_id)), Step("wait", wait_s=grace_s)]
        return {
            "SUSPEND": [Step("exec", ("scontrol", "suspend", job_id))],
            "REQUEUE": [Step("exec", ("scontrol", "requeue", job_id))],
            "CANCEL": [Step("exec", ("scancel", job_id))],
            "CHECKPOINT_THEN_REQUEUE": [*checkpoint, Step("exec", ("scontrol", "requeue", job_id))],
            "CHECKPOINT_THEN_CANCEL": [*checkpoint, Step("exec", ("scancel", job_id))],
        }[kind]
    if scheduler in ("KUEUE", "KUBERNETES"):
        namespace, _, name = job_id.partition("/")
        if not (K8S_NAME.match(namespace) and K8S_NAME.match(name)):
            raise ConfigError(f"a Kueue job id is <namespace>/<workload name>, got {job_id!r}")
        return [Step("kueue-deactivate", namespace=namespace, name=name)]
    raise ConfigError(f"no reclaim executor for scheduler {scheduler!r} (SLURM, KUEUE)")


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

    def has_run(self, action_id: str) -> bool:
        result = self._client.query(
            "SELECT count() FROM action_outcomes WHERE action_id = {id:String} AND NOT dry_run",
            parameters={"id": action_id},
        )
        return int(result.result_rows[0][0]) > 0


KueuePatch = Callable[[str, str, dict[str, Any]], None]  # (namespace, name, body)


def kubernetes_patch(namespace: str, name: str, body: dict[str, Any]) -> None:
    """Patch a Kueue Workload through the kubernetes client (in-cluster or kubeconfig)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    client.CustomObjectsApi().patch_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, KUEUE_PLURAL, name, body
    )


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
        timeout_s: float = 60.0,
    ) -> None:
        self._recorder = recorder
        self._dry_run = dry_run
        self._signal = signal
        self._grace_s = grace_s
        self._clock_ms = clock_ms
        self._sleep = sleep
        self._kueue_patch = kueue_patch
        self._timeout_s = timeout_s

    def execute(self, action: dict[str, Any]) -> list[Outcome]:
        """Run (or plan) an action. It runs only when neither the executor nor the action is a dry run.

        At most once: a live run first records a `started` row (step 0) and each step's outcome as
        soon as it is known, and an action whose live run was started before (a redelivery, a
        restart) is not run again. A failed step stops the action; later steps are recorded as skipped.
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
        if dry:
            outcomes = [outcome(i, s.describe(), "planned", "dry-run: not executed") for i, s in enumerate(steps, 1)]
            self._recorder.record(outcomes)
            return outcomes
        if self._recorder.has_run(base["action_id"]):
            return [outcome(0, "", "duplicate", "already executed; not run again")]
        self._recorder.record([outcome(0, "", "started", f"{len(steps)} step(s)")])
        outcomes = []
        failed = False
        for i, step in enumerate(steps, start=1):
            if failed:
                done = outcome(i, step.describe(), "skipped", "an earlier step failed")
            else:
                status, detail = self._run(step)
                failed = status == "failed"
                done = outcome(i, step.describe(), status, detail)
            self._recorder.record([done])
            outcomes.append(done)
        return outcomes

    def _run(self, step: Step) -> tuple[str, str]:
        if step.kind == "wait":
            self._sleep(step.wait_s)
            return "ok", ""
        if step.kind == "kueue-deactivate":
            try:
                self._kueue_patch(step.namespace, step.name, {"spec": {"active": False}})
            except Exception as exc:  # the kubernetes client raises ApiException and transport errors
                return "failed", f"{type(exc).__name__}: {exc}"[:2000]
            return "ok", "Workload deactivated"
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
