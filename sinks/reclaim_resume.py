"""Reclaim with a way back (issue 41 item 3): a job gpuledger reclaimed runs again when its owner asks
(`gpuledger reclaim resume <job>`, the job page's button) or when an appeal grants it an exemption.

Who may ask (`may_resume`, pure, from the policy): the job's user, a lead of its team (`teams[].leads`), an
operator (`governance.operators`). An appeal's exemption is the decider's word, already judged by the appeal fold.

What is resumed is the latest reclaim gpuledger itself carried out on the job (a live, not dry-run, row of
`action_outcomes` whose step succeeded): nothing else is ever released or reactivated.
- Slurm: a reclaim requeues the job held (`scontrol requeuehold`); resume is `scontrol release <job>`, then
  `scontrol update jobid=<job> StartTime=now+2` (Slurm otherwise delays a requeued job by the credential lifetime,
  120 s by default; not `now`: the requeue revoked the job's credential at that second, and a launch credential
  made in the same second is refused, "Job credential revoked", and the job FAILS, as a resume right after a
  reclaim showed). A job held by someone else's hold is not gpuledger's to release: only the reasons a requeue-
  hold or an admin/user hold gives are released, and only for a job gpuledger reclaimed.
- Kueue: the Workload (found from the job's pod as the reclaim found it, sinks/kube_owner.py) gets
  `spec.active=true`; Kueue queues it again and admits it when its quota allows.

Every request is recorded on the table reclaims are recorded on, `action_outcomes`, as action RESUME with the
action id `resume-<the reclaim's action id>`: a repeated request for the same reclaim applies nothing twice (the
recorder's `has_run`), and the job's reclaim and its way back read together. A request that cannot be carried
out is one line saying why: no such job, ended, not reclaimed by gpuledger, not the asker's, already running.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import ConfigError
from base.settings import KafkaSettings
from schemas.governance_appeals import RESUME_ASKED
from schemas.policy import Policy
from sinks.kube_owner import Owner, kubernetes_owner
from sinks.reclaim import K8S_NAME, SLURM_JOB_ID, ClickHouseRecorder, Outcome, OutcomeRecorder, kubernetes_patch
from sinks.reclaim_doubt import scontrol_show_job

log = logging.getLogger("gpuledger.reclaim")
RESUME = "RESUME"
FINISHED_SLURM = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
                            "BOOT_FAIL", "DEADLINE"})  # fmt: skip
# The reasons squeue/scontrol give a held job; `job_requeued_in_held_state` is what `scontrol requeuehold` leaves.
HELD_REASONS = frozenset({"job_requeued_in_held_state", "JobHeldAdmin", "JobHeldUser"})


@dataclass(frozen=True, slots=True)
class JobOwner:
    """Whose job it is, as the ledger knows it."""

    user: str | None
    team: str | None


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """The latest reclaim gpuledger carried out on a job."""

    action_id: str
    scheduler: str  # SLURM, KUEUE, KUBERNETES
    action: str
    ts_ms: int


@dataclass(frozen=True, slots=True)
class Request:
    cluster: str
    job_id: str
    asker: str
    why: str  # "asked by <asker>", "appeal <id> granted an exemption"


def may_resume(policy: Policy, owner: JobOwner | None, asker: str, job_id: str) -> str | None:
    """None when `asker` may resume the job, else the one line that says who may."""
    if asker in policy.governance.operators:
        return None
    if owner is None:
        return f"no job {job_id} in the ledger (an operator may still resume a job the ledger has not seen)"
    if owner.user and asker == owner.user:
        return None
    team = next((t for t in policy.teams if owner.team in (t.name, t.account)), None)
    if team is not None and asker in team.leads:
        return None
    leads = ", ".join(team.leads) if team is not None and team.leads else "none named"
    return (f"{asker!r} may not resume job {job_id}: it is {owner.user or 'unknown'!r}'s, team {owner.team or '?'} "
            f"(its user, the team's leads ({leads}) and the operators may)")  # fmt: skip


def resume_id(reclaimed: Reclaimed) -> str:
    return f"resume-{reclaimed.action_id}"[:256]


# -- what each engine says about the job, and the steps that follow (pure) ----------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    """`argv` to run (Slurm) or `activate` (Kueue) when the job can be resumed; otherwise `status` and a line."""

    status: str  # "resume", "gone", "ended", "running"
    detail: str
    argv: tuple[tuple[str, ...], ...] = ()


RESUME_START = "StartTime=now+2"  # past the second of the requeue's credential revocation (see the module doc)


def slurm_verdict(job_id: str, job: Mapping[str, str]) -> Verdict:
    """From `scontrol show job -o` as key -> value ({} when Slurm does not know the job)."""
    state, reason = job.get("JobState", ""), job.get("Reason", "")
    if not state:
        return Verdict("gone", f"job {job_id} does not exist on Slurm (or has left its memory: MinJobAge)")
    if state in FINISHED_SLURM:
        return Verdict("ended", f"job {job_id} has ended ({state}): nothing to resume")
    if state == "PENDING" and reason in HELD_REASONS:
        return Verdict("resume", f"job {job_id} held ({reason})", (
            ("scontrol", "release", job_id), ("scontrol", "update", f"jobid={job_id}", RESUME_START)))  # fmt: skip
    return Verdict("running", f"job {job_id} is {state} ({reason or 'no reason'}), not held: nothing to resume")


def _finished(obj: Mapping[str, Any]) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or ()
    return any(isinstance(c, Mapping) and c.get("type") == "Finished" and c.get("status") == "True" for c in conds)


def kueue_verdict(job_id: str, owner: Owner | None) -> Verdict:
    """From the Workload that owns the job (None: no such pod or Workload)."""
    if owner is None:
        return Verdict("gone", f"job {job_id} does not exist on Kubernetes (no pod or Workload of that name)")
    if owner.kind != "Workload":
        return Verdict("gone", f"{owner.describe()} is not a Kueue Workload: resume is for Kueue's Workloads")
    if _finished(owner.obj):
        return Verdict("ended", f"{owner.describe()} has finished: nothing to resume")
    if owner.active:
        return Verdict("running", f"{owner.describe()} is active, not reclaimed: nothing to resume")
    return Verdict("resume", f"{owner.describe()} deactivated")


# -- carrying it out ------------------------------------------------------------------------------------------

# Slurm job id -> `scontrol show job -o` fields ({}: unknown to Slurm); raises ServiceError when Slurm cannot be
# asked, so a job slurmctld could not be asked about is never reported as gone (sinks/reclaim_doubt.py).
ShowJob = Callable[[str], dict[str, str]]
Run = Callable[[tuple[str, ...]], tuple[int, str]]  # argv -> (exit status, output)
KueueOwner = Callable[[str, str], Owner | None]
KueuePatch = Callable[[str, str, dict[str, Any]], None]


def run_argv(argv: tuple[str, ...]) -> tuple[int, str]:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]} not found on PATH"
    except subprocess.TimeoutExpired:
        return 124, "timed out after 60 s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()[:2000]


class Resumer:
    """Resumes reclaimed jobs on the engines and records each request in `action_outcomes`."""

    def __init__(self, recorder: OutcomeRecorder, *, clock_ms: Callable[[], int], show_job: ShowJob = scontrol_show_job,
                 run: Run = run_argv, kueue_owner: KueueOwner | None = None,
                 kueue_patch: KueuePatch | None = None) -> None:  # fmt: skip
        self._recorder, self._clock_ms = recorder, clock_ms
        self._show_job, self._run = show_job, run
        self._kueue_owner, self._kueue_patch = kueue_owner, kueue_patch

    def resume(self, request: Request, reclaimed: Reclaimed | None) -> tuple[str, str]:
        """(status, the one line to show): `resumed`, or why nothing was applied: `not-reclaimed` (gpuledger did not
        reclaim it), `already` (resumed for this reclaim before), `gone`, `ended`, `running` (not stopped), or
        `failed` (the engine refused; recorded)."""
        if reclaimed is None:
            return "not-reclaimed", (f"job {request.job_id} on {request.cluster} was not reclaimed by gpuledger: "
                                     "nothing to resume")  # fmt: skip
        action_id = resume_id(reclaimed)
        if self._recorder.has_run(action_id):
            return "already", (f"job {request.job_id} was resumed already after reclaim {reclaimed.action_id}: "
                               "nothing applied twice")  # fmt: skip
        scheduler = reclaimed.scheduler.upper()
        if scheduler == "SLURM":
            if not SLURM_JOB_ID.fullmatch(request.job_id):
                raise ConfigError(f"not a Slurm job id: {request.job_id!r}")
            verdict = slurm_verdict(request.job_id, self._show_job(request.job_id))
        elif scheduler in ("KUEUE", "KUBERNETES"):
            namespace, _, name = request.job_id.partition("/")
            if not (K8S_NAME.fullmatch(namespace) and K8S_NAME.fullmatch(name)):
                raise ConfigError(f"a Kubernetes job id is <namespace>/<pod or workload>, got {request.job_id!r}")
            if self._kueue_owner is None or self._kueue_patch is None:
                raise ConfigError("resuming a Kueue job needs Kubernetes credentials")
            owner = self._kueue_owner(namespace, name)
            verdict = kueue_verdict(request.job_id, owner)
        else:
            return "gone", f"job {request.job_id}: no way back for scheduler {scheduler!r}"
        if verdict.status != "resume":
            return verdict.status, verdict.detail
        def outcome(step: int, command: str, status: str, detail: str) -> Outcome:
            return Outcome(action_id=action_id, step=step, ts_ms=self._clock_ms(), cluster=request.cluster,
                           job_id=request.job_id, scheduler=reclaimed.scheduler, action=RESUME, command=command,
                           dry_run=False, status=status, detail=detail)  # fmt: skip

        self._recorder.record([outcome(0, "", "started", f"{request.why}; {verdict.detail}"[:2000])])
        done: list[Outcome] = []
        if scheduler == "SLURM":
            for i, argv in enumerate(verdict.argv, 1):
                code, out = self._run(argv)
                done.append(outcome(i, " ".join(argv), "ok" if code == 0 else "failed", out or f"exit {code}"))
                if code != 0:
                    break
        else:
            assert owner is not None and self._kueue_patch is not None
            namespace = request.job_id.partition("/")[0]
            command = f"patch Workload {namespace}/{owner.name} spec.active=true"
            try:
                self._kueue_patch(namespace, owner.name, {"spec": {"active": True}})
                done.append(outcome(1, command, "ok", f"{owner.describe()} reactivated: Kueue queues it again"))
            except Exception as exc:  # the kubernetes client raises ApiException and transport errors
                done.append(outcome(1, command, "failed", f"{type(exc).__name__}: {exc}"[:2000]))
        self._recorder.record(done)
        failed = next((o for o in done if o.status == "failed"), None)
        if failed is not None:
            return "failed", f"job {request.job_id}: {failed.command} failed: {failed.detail}"[:500]
        return "resumed", f"job {request.job_id} resumed ({request.why}): " + "; ".join(o.command for o in done)


def exemption_request(event: Mapping[str, Any], appeals: Mapping[str, Any]) -> Request | None:
    """The resume an appeals.v1 step asks for: a DECIDED EXEMPTION that the appeal fold (schemas/governance_appeals.py,
    under the policy) took as the appeal's decision; None for every other step, and for a decision the rules
    refused (a non-decider's, a second one)."""
    if event.get("event_type") != "DECIDED" or event.get("decision") != "EXEMPTION":
        return None
    appeal = appeals.get(str(event.get("appeal_id")))
    if appeal is None or appeal.decision != "EXEMPTION" or appeal.decided_ms != event.get("ts_ms"):
        return None
    return Request(appeal.subject.cluster, appeal.subject.job_id, str(appeal.decided_by),
                   f"appeal {appeal.appeal_id} granted an exemption ({appeal.decided_by})")  # fmt: skip


# -- the ledger's side (ClickHouse; bound parameters) ----------------------------------------------------------


def latest_reclaim(client: Any, cluster: str, job_id: str) -> Reclaimed | None:
    """The latest reclaim gpuledger carried out on the job: a live action (not RESUME) with a step that succeeded."""
    rows = client.query(
        "SELECT action_id, any(scheduler), any(action), max(ts_ms) FROM action_outcomes "
        "WHERE cluster = {c:String} AND job_id = {j:String} AND NOT dry_run AND action != {r:String} "
        "AND step > 0 AND status = 'ok' GROUP BY action_id ORDER BY max(ts_ms) DESC LIMIT 1",
        parameters={"c": cluster, "j": job_id, "r": RESUME},
    ).result_rows
    if not rows:
        return None
    action_id, scheduler, action, ts_ms = rows[0]
    return Reclaimed(str(action_id), str(scheduler), str(action), int(ts_ms))


def job_owner(client: Any, cluster: str, job_id: str) -> JobOwner | None:
    """The job's user and team (else its Slurm account, which the policy maps to a team) from its latest event, or
    None when the ledger has no such job."""
    rows = client.query(
        "SELECT argMax(user, ts_ms), argMax(coalesce(team, account), ts_ms), count() FROM job_events "
        "WHERE cluster = {c:String} AND job_id = {j:String}",
        parameters={"c": cluster, "j": job_id},
    ).result_rows
    if not rows or not rows[0][2]:
        return None
    user, team, _ = rows[0]
    return JobOwner(str(user) if user else None, str(team) if team else None)


# -- wiring: what `gpuledger reclaim resume` and `reclaim run`'s appeal path (sinks/cli.py) build ----------------


def ledger_resumer(client: Any, clock_ms: Callable[[], int]) -> Resumer:
    """A Resumer that records in the ledger's `action_outcomes` and reaches Kueue with the reclaim's credentials."""
    return Resumer(ClickHouseRecorder(client), clock_ms=clock_ms, kueue_owner=kubernetes_owner,
                   kueue_patch=kubernetes_patch)  # fmt: skip


def appeal_handler(client: Any, kafka: KafkaSettings, policy: Policy, execute: bool, clock_ms: Callable[[], int],
                   engine: Resumer | None = None) -> Callable[[dict[str, Any]], None]:  # fmt: skip
    """For `reclaim run`: each appeals.v1 step. A granted exemption of a reclaimed job resumes it; so does a resume
    asked on the job's page (RESUME_ASKED), once `may_resume` says the asker may: the page checked it too, but the
    topic is the page's word, so the worker that holds the engine credentials judges it again (dry-run: logged)."""
    from schemas.governance_appeals import fold
    from schemas.topics import APPEALS
    from streams.eventlog import read_events

    engine = engine or ledger_resumer(client, clock_ms)

    def handle(event: dict[str, Any]) -> None:
        request = asked_request(event)
        if request is not None:
            refusal = may_resume(policy, job_owner(client, request.cluster, request.job_id), request.asker,
                                 request.job_id)  # fmt: skip
            if refusal is not None:
                log.warning("resume asked in %s refused: %s", event.get("event_id"), refusal)
                return
        elif event.get("event_type") == "DECIDED" and event.get("decision") == "EXEMPTION":
            events, _ = read_events(kafka, APPEALS)  # the fold needs the filing too; appeals are few
            request = exemption_request(event, fold(events, policy)[0])
        if request is None:
            return
        reclaimed = latest_reclaim(client, request.cluster, request.job_id)
        if not execute:
            log.info("dry-run: would resume %s/%s (%s)", request.cluster, request.job_id, request.why)
            return
        status, line = engine.resume(request, reclaimed)
        log.info("%s: %s", status, line)

    return handle


# -- the job page's button: a RESUME_ASKED step on appeals.v1 (the web app holds no engine credentials) ----------


def resume_asked_event(cluster: str, job_id: str, asker: str, owner: JobOwner | None, now_ms: int,
                       where: str = "the job's page") -> dict[str, Any]:  # fmt: skip
    """The appeals.v1 step that asks `reclaim run` to resume the job (who may: `may_resume`, checked by both)."""
    import hashlib

    event_id = hashlib.sha256("\x1f".join((RESUME_ASKED, cluster, job_id, asker, str(now_ms))).encode()).hexdigest()
    return {
        "event_id": event_id[:32], "event_type": RESUME_ASKED, "appeal_id": f"resume-{event_id[:12]}",
        "ts_ms": now_ms, "actor": asker,
        "cluster": cluster, "job_id": job_id, "alert_id": None, "user": owner.user if owner else None,
        "team": owner.team if owner else None, "project": None, "period": None, "text": f"asked on {where}",
        "decision": None, "credit_cents": None, "exemption_until_ms": None, "deadline_ms": None,
    }  # fmt: skip


def asked_request(event: Mapping[str, Any]) -> Request | None:
    """The resume a RESUME_ASKED step asks for (None for every other step); who asked is not yet judged."""
    if event.get("event_type") != RESUME_ASKED:
        return None
    cluster, job_id, asker = (str(event.get(k) or "") for k in ("cluster", "job_id", "actor"))
    if not (cluster and job_id and asker) or max(len(cluster), len(job_id), len(asker)) > 256:
        return None
    return Request(cluster, job_id, asker, f"asked by {asker} on the job's page")
