"""`gpuledger escalate ask|decide|list|reconcile|run` (issue 41 item 5): raise a job's priority for a while, as
events on escalations.v1.

    gpuledger escalate ask JOB --hours 4 --reason TEXT [--cluster C] [--by USER]
    gpuledger escalate decide ID --grant --note TEXT        gpuledger escalate decide ID --deny --note TEXT
    gpuledger escalate list [--state open|all]
    gpuledger escalate reconcile [--engine slurm|kueue] [--kubeconfig F]   one pass of the service
    gpuledger escalate run [--every-s 30] [--engine ...]    the service until SIGTERM (`up` runs it with an engine)

As for appeals and reservations, each command reads the topic whole, folds it under the policy
(`schemas/governance_escalations.py`) and publishes only a step the rules allow (a refusal is one line, exit 2,
no event). `ask` also asks the ledger whose job it is and the engine whether it still runs. The service raises
granted jobs on the engine and lets them fall back when the grant expires (`sinks/escalations.py`).
"""

from __future__ import annotations

import getpass
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for, start_service
from base.errors import ConfigError
from base.settings import Settings
from schemas.topics import ESCALATIONS
from sinks.appeal_cli import BY_OPTION, POLICY_OPTION, _client, _emit, _iso, _policy
from sinks.warehouse import now_ms as _now_ms
from streams import workflow

escalate_app = typer.Typer(help="Raise a job's priority for a while: asked, decided, applied on the engine, "
                           "reverted when it expires.", no_args_is_help=True)  # fmt: skip
ENGINE_OPTION = typer.Option(None, "--engine", help="slurm and/or kueue (repeatable; default: "
                             "sinks.escalations.engines).")  # fmt: skip
KUBECONFIG_OPTION = typer.Option(None, "--kubeconfig", help="With kueue: the kubeconfig (default: sinks.escalations."
                                 "kubeconfig, else in-cluster, else ~/.kube/config).")  # fmt: skip
EVERY_OPTION = typer.Option(None, "--every-s", help="Seconds between passes (default: sinks.escalations.every_s).")
LIST_COLUMNS = ("escalation_id", "state", "cluster", "job_id", "user", "team", "tier", "hours", "asked_by", "asked",
                "decide_by", "decided_by", "until", "reason", "note")  # fmt: skip
log = logging.getLogger("gpuledger.escalations")


def _escalations(settings: Settings, policy: Any) -> dict[str, Any]:
    from schemas.governance_escalations import fold
    from streams.eventlog import read_steps

    events = read_steps(settings.kafka, ESCALATIONS)
    return fold(events, policy)[0]


def publish_steps(settings: Settings, events: list[dict[str, Any]]) -> None:
    """Validate every step as each consumer will, then publish them (keyed by the job) and wait for delivery."""
    from schemas.governance_escalations import step_key

    workflow.publish_steps(settings.kafka, ESCALATIONS, events, step_key)


def _engines(settings: Settings, names: list[str] | None, kubeconfig: Path | None) -> list[Any]:
    """The engines named on the command line, else those of the settings (`sinks.escalations`)."""
    from sinks.escalations import SlurmPriority, kueue_engine

    service = settings.sinks.escalations
    kube = kubeconfig or service.kubeconfig
    makers: dict[str, Callable[[], Any]] = {"slurm": SlurmPriority,
                                             "kueue": lambda: kueue_engine(str(kube) if kube else None)}  # fmt: skip
    return workflow.chosen_engines(names, service.engines, makers, "sinks.escalations.engines")


@escalate_app.command("ask")
def escalate_ask(
    job: str = typer.Argument(..., help="The job: a Slurm job id, or <namespace>/<pod or Workload> on Kubernetes."),
    hours: int = typer.Option(..., "--hours", help="For how long (at most the policy's max_hours)."),
    reason: str = typer.Option(..., "--reason", help="Why (kept in the audit trail, shown to the deciders)."),
    cluster: str | None = typer.Option(None, "--cluster", help="The job's cluster (default: settings)."),
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Ask that a job run at the policy's escalation tier for some hours; a decider grants or denies it."""
    from schemas.governance_escalations import ask_event, may_ask, rules_of
    from sinks.escalations import SlurmPriority, engine_of, kueue_engine, ledger_job

    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    rules_of(policy)
    cluster = cluster or settings.cluster
    asker = by or getpass.getuser()
    engine = engine_of(job)
    client = _client(settings, analyst=True)
    try:
        found = ledger_job(client, cluster, job)
    finally:
        client.close()
    if found is None:
        raise ConfigError(f"no job {job} on cluster {cluster} in the ledger")
    refusal = may_ask(policy, found, asker)
    if refusal:
        raise ConfigError(refusal)
    kubeconfig = kubeconfig or settings.sinks.escalations.kubeconfig
    scheduler = SlurmPriority() if engine == "SLURM" else kueue_engine(str(kubeconfig) if kubeconfig else None)
    where = scheduler.standing(job)
    if where.status != "ok":
        raise ConfigError(f"{where.detail}: nothing to raise")
    event = ask_event(_escalations(settings, policy), policy, found, asker, hours, reason, _now_ms())
    publish_steps(settings, [event])
    typer.echo(f"escalation {event['escalation_id']}: job {job} to {event['tier']} for {hours} h, decide by "
               f"{_iso(event['deadline_ms'])}")  # fmt: skip


@escalate_app.command("decide")
def escalate_decide(
    escalation_id: str = typer.Argument(..., help="The escalation's id (escalate list)."),
    grant: bool = typer.Option(False, "--grant", help="Grant it: the job is raised for the hours asked."),
    deny: bool = typer.Option(False, "--deny", help="Deny it (--note says why)."),
    note: str = typer.Option(..., "--note", help="The decision's note (kept, shown to the asker)."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """A decider grants or denies an escalation (once; within the policy's decide_within_hours)."""
    from schemas.governance_escalations import decide_event

    if grant == deny:
        raise ConfigError("decide with --grant or --deny (one of them)")
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    event = decide_event(_escalations(settings, policy), policy, escalation_id, by or getpass.getuser(), grant,
                         note, _now_ms())  # fmt: skip
    publish_steps(settings, [event])
    until = f" until {_iso(event['until_ms'])}" if event["until_ms"] else ""
    typer.echo(f"escalation {escalation_id} {event['event_type'].lower()}{until}")


@escalate_app.command("list")
def escalate_list(
    state: str = typer.Option("open", "--state", help="open (undecided or in force) or all."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The escalations, newest first."""
    from schemas.governance_escalations import list_row

    if state not in ("open", "all"):
        raise ConfigError(f"--state must be open or all, got {state!r}")
    settings = settings_for(state_dir)
    now = _now_ms()
    found = _escalations(settings, _policy(settings, policy_path))
    rows = [list_row(e) for e in sorted(found.values(), key=lambda e: (-e.asked_ms, e.escalation_id))
            if state == "all" or e.in_force(now)]  # fmt: skip
    _emit(rows, fmt, None, f"escalations ({state})", LIST_COLUMNS)


def reconcile_once(settings: Settings, policy: Any, engines: list[Any],
                   now_ms: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One pass at `now_ms` (default: the clock; a test moves it past a grant's end instead of waiting hours)."""
    from sinks.escalations import reconcile

    now = _now_ms() if now_ms is None else now_ms
    events = reconcile(_escalations(settings, policy), now, engines, settings.cluster)
    publish_steps(settings, events)
    return events


@escalate_app.command("reconcile")
def escalate_reconcile(
    engine: list[str] | None = ENGINE_OPTION,
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """One pass of the service: lapse the undecided past their deadline, raise the granted, lower the expired."""
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    for event in reconcile_once(settings, policy, _engines(settings, engine, kubeconfig)):
        typer.echo(f"{event['escalation_id']} {event['event_type'].lower()}: job {event['job_id']}: {event['text']}")


@escalate_app.command("run")
def escalate_run(
    every_s: float | None = EVERY_OPTION,
    engine: list[str] | None = ENGINE_OPTION,
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The escalation service (`gpuledger up` runs it when sinks.escalations.engines names one): `reconcile` every
    --every-s seconds until SIGTERM. The topic is read whole each pass (escalations are few), so a restart resumes
    from it alone; each engine change asks the engine first."""
    settings = start_service(state_dir)
    policy = _policy(settings, policy_path)
    engines = _engines(settings, engine, kubeconfig)
    every_s = every_s if every_s is not None else settings.sinks.escalations.every_s
    workflow.run_passes("escalations", every_s, lambda: reconcile_once(settings, policy, engines),
                        lambda e: f"{e['escalation_id']} {e['event_type']} {e['text']}", log)  # fmt: skip


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    del inspect_app
    app.add_typer(escalate_app, name="escalate")
