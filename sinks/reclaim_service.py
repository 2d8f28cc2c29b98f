"""The reclaim commands' wiring (`gpuledger reclaim exec|run|resume`): the executor with its ClickHouse
collaborators (sinks/reclaim.py), the consumer of reclaim actions, and a resume asked on the command line
(sinks/reclaim_resume.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from base.errors import ConfigError
from base.settings import Settings
from sinks.warehouse import client, now_ms, warehouse_errors

RESUMED = ("resumed", "already", "running")


def executor(settings: Settings, execute: bool, *, recheck: bool = True) -> Any:
    """`recheck`: before acting, confirm in ClickHouse that the job is still allocated and idle (the
    actions the processors decided); a manual `reclaim exec` names its job itself and is not re-checked."""
    from sinks.gang import ClickHouseGangs
    from sinks.kube_owner import kubernetes_owner
    from sinks.reclaim import ClickHouseJobState, ClickHouseRecorder, ReclaimExecutor

    db = client(settings)
    state = ClickHouseJobState(db)
    recorder = ClickHouseRecorder(db)
    return ReclaimExecutor(
        recorder,
        progress=recorder.outcomes_of,  # an action a kill left in doubt is resolved by the engine: exactly once
        dry_run=not execute and settings.sinks.reclaim_dry_run,
        signal=settings.sinks.reclaim_checkpoint_signal,
        grace_s=settings.sinks.reclaim_checkpoint_grace_s,
        clock_ms=now_ms,
        job_state=state if recheck else None,
        kueue_owner=kubernetes_owner,  # a Kubernetes job is a pod: deactivate the Workload that owns it
        gang_check=ClickHouseGangs(db, state) if recheck else None,  # a gang is reclaimed once, all idle and due
    )


def exec_one(settings: Settings, *, scheduler: str, job: str, action: str, cluster: str, reason: str,
             execute: bool) -> list[Any]:  # fmt: skip
    """`reclaim exec`: plan (or with `execute` run) one reclaim action; each step's outcome, recorded."""
    from sinks.reclaim import plan

    record = {
        "action_id": f"manual-{now_ms()}",
        "cluster": cluster or settings.cluster,
        "job_id": job,
        "scheduler": scheduler.upper(),
        "action": action.upper(),
        "dry_run": not execute,
        "reason": reason,
    }
    plan(record)  # argument errors as one line before anything is recorded
    return list(executor(settings, execute, recheck=False).execute(record))


def run_reclaim(settings: Settings, execute: bool, stop: Any, max_idle_s: float | None) -> None:
    """`reclaim run`: consume reclaim actions and carry them out (dry-run unless `execute` or the settings make
    them live). With a policy it also reads appeals.v1: an exemption granted on a reclaimed job resumes it."""
    from schemas.policy import load_policy
    from schemas.topics import APPEALS, RECLAIM_ACTIONS
    from sinks.reclaim_resume import appeal_handler
    from sinks.worker_agent import consume_records

    run = executor(settings, execute)
    live = execute or not settings.sinks.reclaim_dry_run
    also = ({APPEALS: appeal_handler(client(settings), settings.kafka, load_policy(settings.policy_path), live,
                                     now_ms)} if settings.policy_path is not None else None)  # fmt: skip
    consume_records(
        settings,
        RECLAIM_ACTIONS,
        f"{settings.sinks.group_id}-reclaim",
        run.execute,
        stop,
        max_idle_s,
        metrics_component="reclaim",
        out_label="actions",
        also=also,
    )


def resume(settings: Settings, job: str, *, cluster: str | None, asker: str, policy_path: Path | None) -> str:
    """`reclaim resume`: the line that says the job is resumed, was already, or runs; a ConfigError with the line
    that says why it cannot be (no such job, ended, not reclaimed by gpuledger, not the asker's)."""
    from schemas.policy import load_policy
    from sinks.reclaim_resume import Request, job_owner, latest_reclaim, ledger_resumer, may_resume

    chosen = policy_path or settings.policy_path
    if chosen is None:
        raise ConfigError("resume needs the policy (who may resume): pass --policy FILE or set policy_path")
    policy = load_policy(chosen)
    where = cluster or settings.cluster
    if len(job) > 256:
        raise ConfigError("the job id is longer than 256 characters")
    with warehouse_errors():
        db = client(settings)
        refusal = may_resume(policy, job_owner(db, where, job), asker, job)
        if refusal is not None:
            raise ConfigError(refusal)
        status, line = ledger_resumer(db, now_ms).resume(Request(where, job, asker, f"asked by {asker}"),
                                                          latest_reclaim(db, where, job))  # fmt: skip
    if status not in RESUMED:
        raise ConfigError(line)
    return line
