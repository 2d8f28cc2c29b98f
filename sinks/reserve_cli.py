"""`gpuledger reserve create|list|extend|release|approve|reconcile|run` (issue 19): reservations with expiry, as
events on reservations.v1.

    gpuledger reserve create --team T --gpus 8 --generation hopper [--nodes N1,N2] [--start now|ISO] --hours 48
                             --reason TEXT [--by USER]
    gpuledger reserve list [--state live|all]
    gpuledger reserve extend ID --hours 12       gpuledger reserve release ID      gpuledger reserve approve ID
    gpuledger reserve reconcile [--engine slurm] [--engine kueue]   one pass of the service
    gpuledger reserve run [--every-s 30] [--engine ...]             the service, until SIGTERM

As for appeals, each command reads the topic whole, folds it under the policy
(`schemas/governance_reservations.py`) and publishes only a step the rules allow (a refusal is one line, exit 2,
no event). The service puts approved reservations onto Slurm and Kueue and takes them off when they end, even if
nobody acts (`sinks/reservations.py`); with ClickHouse reachable it also warns and releases idle ones per policy.
"""

from __future__ import annotations

import getpass
import logging
from pathlib import Path
from typing import Any

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for, start_service
from base.errors import ConfigError
from base.settings import Settings
from schemas.governance_reservations import list_row, request_steps, step_event, step_key
from schemas.topics import RESERVATIONS
from sinks.appeal_cli import BY_OPTION, POLICY_OPTION, _iso, _policy
from sinks.present import emit as _emit
from sinks.warehouse import client as _client
from sinks.warehouse import now_ms as _now_ms
from streams import workflow

reserve_app = typer.Typer(help="Reservations of GPUs for a team, with expiry (onto Slurm and Kueue).",
                          no_args_is_help=True)  # fmt: skip
ENGINE_OPTION = typer.Option(None, "--engine",
                             help="slurm and/or kueue (repeatable; default: sinks.reservations.engines).")  # fmt: skip
KUBECONFIG_OPTION = typer.Option(None, "--kubeconfig", help="With kueue: the kubeconfig (default: sinks.reservations."
                                 "kubeconfig, else in-cluster, else ~/.kube/config).")  # fmt: skip
LIST_COLUMNS = ("reservation_id", "state", "team", "generation", "gpus", "start", "end", "requested_by",
                "approved_by", "on", "nodes", "reason")  # fmt: skip
EVERY_OPTION = typer.Option(None, "--every-s", help="Seconds between passes (default: sinks.reservations.every_s).")
log = logging.getLogger("gpuledger.reservations")


def _reservations(settings: Settings, policy: Any) -> dict[str, Any]:
    from schemas.governance_reservations import fold
    from streams.eventlog import read_steps

    events = read_steps(settings.kafka, RESERVATIONS)
    return fold(events, policy)[0]


def publish_steps(settings: Settings, events: list[dict[str, Any]]) -> None:
    workflow.publish_steps(settings.kafka, RESERVATIONS, events, step_key)


@reserve_app.command("create")
def reserve_create(
    team: str = typer.Option(..., "--team", help="The team the GPUs are for (and charged to)."),
    gpus: int = typer.Option(..., "--gpus", help="How many GPUs."),
    generation: str = typer.Option(..., "--generation", help="GPU generation (policy generations)."),
    hours: float = typer.Option(..., "--hours", help="How long."),
    reason: str = typer.Option(..., "--reason", help="Why (kept in the audit trail)."),
    start: str = typer.Option("now", "--start", help="now, or an ISO time (UTC when no zone is given)."),
    nodes: str = typer.Option("", "--nodes", help="Named nodes, comma-separated (default: any)."),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster (default: settings)."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Ask for GPUs from a start for some hours: approved at once within the policy's automatic limits, else by
    an operator (`reserve approve`)."""
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    events = request_steps(_reservations(settings, policy), policy, cluster=cluster or settings.cluster, team=team,
                           generation=generation, gpus=gpus, hours=hours, start=start, nodes=nodes, reason=reason,
                           requester=by or getpass.getuser(), now_ms=_now_ms())  # fmt: skip
    publish_steps(settings, events)
    first = events[0]
    state = "approved" if len(events) > 1 else "waiting for an operator's approval (reserve approve)"
    typer.echo(f"reservation {first['reservation_id']}: {gpus} {generation} GPUs for {team}, "
               f"{_iso(first['start_ms'])} to {_iso(first['end_ms'])}, {state}")  # fmt: skip


def _step(kind: str, rid: str, by: str | None, policy_path: Path | None, state_dir: Path | None,
          **kw: Any) -> dict[str, Any]:  # fmt: skip
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    event = step_event(kind, _reservations(settings, policy), policy, rid, by or getpass.getuser(), _now_ms(), **kw)
    publish_steps(settings, [event])
    return event


@reserve_app.command("approve")
def reserve_approve(
    rid: str = typer.Argument(..., help="The reservation's id."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """An operator approves a reservation above the automatic limits."""
    _step("approve", rid, by, policy_path, state_dir)
    typer.echo(f"reservation {rid} approved")


@reserve_app.command("extend")
def reserve_extend(
    rid: str = typer.Argument(..., help="The reservation's id."),
    hours: float = typer.Option(..., "--hours", help="How many hours more."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Move a live reservation's end later (within the policy's longest duration; no overlap)."""
    event = _step("extend", rid, by, policy_path, state_dir, hours=hours)
    typer.echo(f"reservation {rid} now ends {_iso(event['end_ms'])}")


@reserve_app.command("release")
def reserve_release(
    rid: str = typer.Argument(..., help="The reservation's id."),
    reason: str = typer.Option("released", "--reason", help="Why."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """End a reservation now; the service takes it off the engines, and it is charged up to now."""
    _step("release", rid, by, policy_path, state_dir, reason=reason)
    typer.echo(f"reservation {rid} released")


@reserve_app.command("list")
def reserve_list(
    state: str = typer.Option("live", "--state", help="live (requested or approved, not ended) or all."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The reservations, by start."""
    if state not in ("live", "all"):
        raise ConfigError(f"--state must be live or all, got {state!r}")
    settings = settings_for(state_dir)
    existing = _reservations(settings, _policy(settings, policy_path))
    rows = [list_row(r) for r in sorted(existing.values(), key=lambda r: (r.start_ms, r.reservation_id))
            if state == "all" or r.live]  # fmt: skip
    _emit(rows, fmt, None, f"reservations ({state})", LIST_COLUMNS)


def _engines(settings: Settings, policy: Any, names: list[str] | None, kubeconfig: Path | None) -> list[Any]:
    """The engines named on the command line, else those of the settings (`sinks.reservations`)."""
    from sinks.reservations import KueueQuota, SlurmReservations

    service = settings.sinks.reservations
    kube = kubeconfig or service.kubeconfig
    makers = {"slurm": lambda: SlurmReservations(policy),
              "kueue": lambda: KueueQuota(policy, kubeconfig=str(kube) if kube else None)}  # fmt: skip
    return workflow.chosen_engines(names, service.engines, makers, "sinks.reservations.engines")


def reconcile_once(settings: Settings, policy: Any, engines: list[Any],
                   now_ms: int | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """One pass at `now_ms` (default: the clock; injected by a test that seeds idle minutes instead of waiting)."""
    from sinks.reservations import idle_minutes, reconcile

    existing = _reservations(settings, policy)
    now = _now_ms() if now_ms is None else now_ms
    idle = None
    rules = policy.governance.reservations
    if rules.idle_warn_minutes is not None or rules.idle_release_minutes is not None:
        try:
            idle = idle_minutes(_client(settings, analyst=True), existing.values(), now)
        except Exception as exc:  # the ledger out of reach: no idle rule this pass, the rest goes on
            log.warning("idle reservations not checked: %s", exc)
    events = reconcile(existing, policy, now, engines, idle)
    publish_steps(settings, events)
    return events


@reserve_app.command("reconcile")
def reserve_reconcile(
    engine: list[str] | None = ENGINE_OPTION,
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """One pass of the service: expire, warn or release idle, render onto and remove from the engines."""
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    for event in reconcile_once(settings, policy, _engines(settings, policy, engine, kubeconfig)):
        where = f" {event['engine']}" if event.get("engine") else ""
        typer.echo(f"{event['reservation_id']} {event['event_type'].lower()}{where}: {event['text']}")


@reserve_app.command("run")
def reserve_run(
    every_s: float | None = EVERY_OPTION,
    engine: list[str] | None = ENGINE_OPTION,
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The reservation service (`gpuledger up` runs it when sinks.reservations.engines names one): `reconcile`
    every --every-s seconds until SIGTERM. A plain loop over the topic, read whole each pass (reservations are
    few), so a restart resumes from the topic alone: what is on an engine is recorded there (RENDERED, REMOVED)
    and each engine change checks the engine first."""
    settings = start_service(state_dir)
    policy = _policy(settings, policy_path)
    engines = _engines(settings, policy, engine, kubeconfig)
    every_s = every_s if every_s is not None else settings.sinks.reservations.every_s
    workflow.run_passes("reservations", every_s, lambda: reconcile_once(settings, policy, engines),
                        lambda e: f"{e['reservation_id']} {e['event_type']} {e['text']}", log)  # fmt: skip


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    del inspect_app
    app.add_typer(reserve_app, name="reserve")
