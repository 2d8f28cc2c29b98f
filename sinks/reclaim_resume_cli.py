"""`gpuledger reclaim resume JOB` (issue 41 item 3): the way back from a reclaim, asked by the job's user, a lead
of its team or an operator (sinks/reclaim_resume.py says who and what), and the same when an appeal grants the job
an exemption (`reclaim run` reads appeals.v1: `appeal_handler`).

    gpuledger reclaim resume 4242 [--cluster C] [--by USER] [--policy FILE]
    gpuledger reclaim resume team-a/train-0-abcde      a Kubernetes job: <namespace>/<pod>, as the ledger names it

One line, exit 0, when the job is resumed or was already; one line, exit 2, when it cannot be: no such job, ended,
not reclaimed by gpuledger, not the asker's.
"""

from __future__ import annotations

import getpass
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from base.cli_common import settings_for
from base.errors import ConfigError
from base.settings import Settings
from sinks.cli import _client, _warehouse_errors

log = logging.getLogger("gpuledger.reclaim")
OK_STATUSES = ("resumed", "already", "running")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _policy(settings: Settings, path: Path | None) -> Any:
    from schemas.policy import load_policy

    chosen = path or settings.policy_path
    if chosen is None:
        raise ConfigError("resume needs the policy (who may resume): pass --policy FILE or set policy_path")
    return load_policy(chosen)


def resumer(client: Any) -> Any:
    from sinks.kube_owner import kubernetes_owner
    from sinks.reclaim import ClickHouseRecorder, kubernetes_patch
    from sinks.reclaim_resume import Resumer

    return Resumer(ClickHouseRecorder(client), clock_ms=_now_ms, kueue_owner=kubernetes_owner,
                   kueue_patch=kubernetes_patch)  # fmt: skip


def reclaim_resume(
    job: str = typer.Argument(..., help="Slurm job id, or <namespace>/<pod> for Kubernetes (as the ledger names it)."),
    cluster: str | None = typer.Option(None, "--cluster", help="The job's cluster (default: settings)."),
    by: str | None = typer.Option(None, "--by", help="Who asks (default: the current user)."),
    policy_path: Path | None = typer.Option(None, "--policy", help="policy.yaml (default: settings' policy_path)."),
    state_dir: Path | None = typer.Option(None, "--state-dir", help="State directory."),
) -> None:
    """Resume a job gpuledger reclaimed: released on Slurm, its Workload reactivated on Kueue (owner, lead, operator)"""
    from sinks.reclaim_resume import Request, job_owner, latest_reclaim, may_resume

    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    asker = by or getpass.getuser()
    where = cluster or settings.cluster
    if len(job) > 256:
        raise ConfigError("the job id is longer than 256 characters")
    with _warehouse_errors():
        client = _client(settings)
        refusal = may_resume(policy, job_owner(client, where, job), asker, job)
        if refusal is not None:
            raise ConfigError(refusal)
        status, line = resumer(client).resume(Request(where, job, asker, f"asked by {asker}"),
                                              latest_reclaim(client, where, job))  # fmt: skip
    if status not in OK_STATUSES:
        raise ConfigError(line)
    typer.echo(line)


def appeal_handler(settings: Settings, policy: Any, execute: bool) -> Callable[[dict[str, Any]], Any]:
    """For `reclaim run`: each appeals.v1 step; a granted exemption of a reclaimed job resumes it (dry-run: logged)."""
    from schemas.governance_appeals import fold
    from schemas.topics import APPEALS
    from sinks.reclaim_resume import exemption_request, latest_reclaim
    from streams.eventlog import read_events

    client = _client(settings)
    engine = resumer(client)

    def handle(event: dict[str, Any]) -> None:
        if event.get("event_type") != "DECIDED" or event.get("decision") != "EXEMPTION":
            return
        events, _ = read_events(settings.kafka, APPEALS)  # the fold needs the filing too; appeals are few
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
