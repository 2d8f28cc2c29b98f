"""`gpuledger appeal file|list|decide|escalate|run` (issue 19): appeals with decisions, as events on appeals.v1.

    gpuledger appeal file --alert ID --reason TEXT            against an idle warning or a reclaim notice
    gpuledger appeal file --job ID [--period YYYY-MM] --reason TEXT   against a job's charge
    gpuledger appeal list [--state open|escalated|decided|all]
    gpuledger appeal decide ID --grant credit --amount 12.34 --note TEXT
    gpuledger appeal decide ID --grant exemption --hours 24 --note TEXT
    gpuledger appeal decide ID --deny --note TEXT
    gpuledger appeal escalate                                 one pass: overdue appeals escalated
    gpuledger appeal run [--every-s 60]                       the same, until SIGTERM (the service)

The topic is the record: each command reads it whole, folds it under the policy (`schemas/governance_appeals.py`)
and publishes the new step only if the rules allow it; anything refused is one line on stderr, exit 2, and no
event. What the appeal is about is looked up in ClickHouse (`sinks/governance.py`). Who acts is `--by` (default:
the login name), as for `attribution correct`. The commands post nothing to chat: the chat worker (`chat run`,
sinks/chat_appeals.py) reads appeals.v1 and posts each decision as a reply in its warning's thread and each
escalation to the operators' channel, once.
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
from schemas.governance_appeals import iso_minute as _iso
from sinks.present import emit as _emit
from sinks.warehouse import client as _client
from sinks.warehouse import now_ms as _now_ms
from sinks.warehouse import warehouse_errors as _warehouse_errors
from streams import workflow

appeal_app = typer.Typer(help="Appeals of idle warnings, reclaims and charges, and their decisions.",
                         no_args_is_help=True)  # fmt: skip
POLICY_OPTION = typer.Option(None, "--policy", help="policy.yaml (default: settings' policy_path).")
BY_OPTION = typer.Option(None, "--by", help="Who takes the step (default: the current user).")
LIST_COLUMNS = ("appeal_id", "state", "cluster", "job_id", "alert_id", "team", "period", "filed_by", "filed_at",
                "deadline", "decision", "credit", "decided_by", "note", "reason")  # fmt: skip
log = logging.getLogger("gpuledger.appeals")


def _policy(settings: Settings, path: Path | None) -> Any:
    from schemas.policy import load_policy

    chosen = path or settings.policy_path
    if chosen is None:
        raise ConfigError("appeals need the policy (who decides, deadlines): pass --policy FILE or set policy_path")
    return load_policy(chosen)


def _appeals(settings: Settings, policy: Any) -> dict[str, Any]:
    from schemas.governance_appeals import fold
    from schemas.topics import APPEALS
    from streams.eventlog import read_steps

    events = read_steps(settings.kafka, APPEALS)
    appeals, _ = fold(events, policy)
    return appeals


def publish_step(settings: Settings, event: dict[str, Any]) -> None:
    """Validate the step as every consumer will, then publish it (keyed by its job) and wait for delivery."""
    from schemas.topics import APPEALS, job_key

    workflow.publish_steps(settings.kafka, APPEALS, [event], lambda e: job_key(e["cluster"], e["job_id"]))


@appeal_app.command("file")
def appeal_file(
    reason: str = typer.Option(..., "--reason", help="Why (kept in the audit trail)."),
    alert: str | None = typer.Option(None, "--alert", help="The alert appealed against (idle warning, reclaim)."),
    job: str | None = typer.Option(None, "--job", help="The job whose charge is appealed against."),
    cluster: str | None = typer.Option(None, "--cluster", help="With --job: its cluster (default: settings)."),
    period: str | None = typer.Option(None, "--period", help="With --job: the charge's month (default: its last)."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """File an appeal against an alert or a job's charge; prints its id."""
    from schemas.governance_appeals import file_event
    from sinks.chargeback import check_period
    from sinks.governance import alert_subject, job_subject

    if (alert is None) == (job is None):
        raise ConfigError("name what is appealed against: --alert ID or --job ID (one of them)")
    if period is not None:
        check_period(period)
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    with _warehouse_errors():
        client = _client(settings, analyst=True)
        if alert is not None:
            subject = alert_subject(client, alert)
            missing = f"no job alert {alert!r} in the ledger"
        else:
            subject = job_subject(client, cluster or settings.cluster, str(job), period)
            missing = f"no charge of job {job!r} on cluster {cluster or settings.cluster!r}" + (
                f" in {period}" if period else "")  # fmt: skip
    if subject is None:
        raise ConfigError(missing)
    event = file_event(_appeals(settings, policy), policy, subject, by or getpass.getuser(), reason, _now_ms())
    publish_step(settings, event)
    typer.echo(f"appeal {event['appeal_id']} filed: job {subject.job_id}, decide by {_iso(event['deadline_ms'])}")


@appeal_app.command("decide")
def appeal_decide(
    appeal_id: str = typer.Argument(..., help="The appeal's id (appeal list)."),
    grant: str | None = typer.Option(None, "--grant", help="credit or exemption."),
    deny: bool = typer.Option(False, "--deny", help="Deny the appeal (--note says why)."),
    amount: str | None = typer.Option(None, "--amount", help="--grant credit: the amount, e.g. 12.34."),
    hours: int | None = typer.Option(None, "--hours", help="--grant exemption: how long the job is exempt."),
    note: str = typer.Option(..., "--note", help="The decision's note (the reason of a denial)."),
    by: str | None = BY_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Decide an appeal once: a credit (a credit line on the team's statement), an exemption, or a denial."""
    from schemas.governance_appeals import decide_event, parse_amount

    if deny == (grant is not None):
        raise ConfigError("decide with --grant credit|exemption or --deny (one of them)")
    if grant is not None and grant not in ("credit", "exemption"):
        raise ConfigError(f"--grant must be credit or exemption, got {grant!r}")
    decision = "DENIED" if deny else str(grant).upper()
    if amount is not None and decision != "CREDIT":
        raise ConfigError("--amount goes with --grant credit")
    if hours is not None and decision != "EXEMPTION":
        raise ConfigError("--hours goes with --grant exemption")
    settings = settings_for(state_dir)
    policy = _policy(settings, policy_path)
    cents = parse_amount(amount, policy.governance.appeals.max_credit) if amount is not None else None
    if hours is not None and not 0 < hours <= policy.governance.appeals.max_exemption_hours:
        raise ConfigError(f"--hours must be 1..{policy.governance.appeals.max_exemption_hours} (policy)")
    event = decide_event(_appeals(settings, policy), policy, appeal_id, by or getpass.getuser(), decision, note,
                         _now_ms(), credit_cents=cents, exemption_hours=hours)  # fmt: skip
    publish_step(settings, event)
    what = f"credit {cents / 100:.2f}" if cents else decision.lower()
    typer.echo(f"appeal {appeal_id} decided: {what}")


@appeal_app.command("list")
def appeal_list(
    state: str = typer.Option("open", "--state", help="open (escalated included), escalated, decided or all."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The appeals in a state, oldest first."""
    if state not in ("open", "escalated", "decided", "all"):
        raise ConfigError(f"--state must be open, escalated, decided or all, got {state!r}")
    settings = settings_for(state_dir)
    appeals = _appeals(settings, _policy(settings, policy_path))
    wanted = {"open": ("OPEN", "ESCALATED"), "escalated": ("ESCALATED",), "decided": ("DECIDED",),
              "all": ("OPEN", "ESCALATED", "DECIDED")}[state]  # fmt: skip
    rows = [{
        "appeal_id": a.appeal_id, "state": a.state, "cluster": a.subject.cluster, "job_id": a.subject.job_id,
        "alert_id": a.subject.alert_id or "", "team": a.subject.team or "", "period": a.subject.period or "",
        "filed_by": a.filed_by, "filed_at": _iso(a.filed_ms), "deadline": _iso(a.deadline_ms),
        "decision": a.decision or "", "credit": f"{a.credit_cents / 100:.2f}" if a.credit_cents else "",
        "decided_by": a.decided_by or "", "note": a.note or "", "reason": a.reason,
    } for a in sorted(appeals.values(), key=lambda a: (a.filed_ms, a.appeal_id)) if a.state in wanted]  # fmt: skip
    _emit(rows, fmt, None, f"appeals ({state})", LIST_COLUMNS)


def escalate_once(settings: Settings, policy: Any, now_ms: int) -> list[dict[str, Any]]:
    from schemas.governance_appeals import escalations

    out = escalations(_appeals(settings, policy), now_ms)
    for event in out:
        publish_step(settings, event)  # the chat worker posts it to the operators' channel
    return out


@appeal_app.command("escalate")
def appeal_escalate(policy_path: Path | None = POLICY_OPTION, state_dir: Path | None = STATE_DIR_OPTION) -> None:
    """Escalate, once, every appeal undecided past its deadline (an ESCALATED step; the chat worker posts it to
    the operators' channel)."""
    settings = settings_for(state_dir)
    for event in escalate_once(settings, _policy(settings, policy_path), _now_ms()):
        typer.echo(f"appeal {event['appeal_id']} escalated: {event['text']}")


@appeal_app.command("run")
def appeal_run(
    every_s: float = typer.Option(60.0, "--every-s", help="Seconds between passes."),
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """The appeals service: `escalate` every --every-s seconds until SIGTERM (a plain loop over the topic, read
    whole each pass: appeals are few)."""
    settings = start_service(state_dir)
    policy = _policy(settings, policy_path)
    workflow.run_passes("appeals", every_s, lambda: escalate_once(settings, policy, _now_ms()),
                        lambda e: f"appeal {e['appeal_id']} escalated", log)  # fmt: skip


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    del inspect_app
    app.add_typer(appeal_app, name="appeal")
