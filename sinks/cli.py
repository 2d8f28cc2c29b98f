"""Commands of the sinks component: `db`, `sink`, `ratecard`, `report`, `alerts`, `chat`, `reclaim`.

Each command parses its arguments, builds the one settings object and calls one function of the component: the
warehouse (`sinks/warehouse.py`), the reports (`sinks/reports.py`), the sink, chat and reclaim services
(`sinks/sink_service.py`, `sinks/chat_service.py`, `sinks/reclaim_service.py`); `sinks/present.py` prints.
Bad arguments raise `ConfigError`, which the `gpuledger` entry point prints as one line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import typer

from base.cli_common import VERBOSE_OPTION, settings_for, start_service, stop_signal
from base.errors import ConfigError
from sinks import present, reports, warehouse

db_app = typer.Typer(help="The ClickHouse schema (versioned migrations, then the views).", no_args_is_help=True)
sink_app = typer.Typer(help="Kafka -> ClickHouse sinks.", no_args_is_help=True)
ratecard_app = typer.Typer(help="The rate card: finance inputs -> $/GPU-hour.", no_args_is_help=True)
report_app = typer.Typer(help="Chargeback reports from the ledger.", no_args_is_help=True)
chat_app = typer.Typer(help="Chat alerts (apprise) and a local webhook receiver.", no_args_is_help=True)
reclaim_app = typer.Typer(help="Reclaim executor (Slurm, Kueue); dry-run by default.", no_args_is_help=True)

STATE_DIR = typer.Option(None, "--state-dir", help="State directory.")
CARD_OPTION = typer.Option(None, "--card", help="Rate card TOML (default: settings, then the shipped card).")
PERIOD_OPTION = typer.Option(..., "--period", help="Month, YYYY-MM.")


# -- db -------------------------------------------------------------------------------------------


@db_app.command("migrate")
def db_migrate(state_dir: Path | None = STATE_DIR) -> None:
    """Apply the migrations not applied yet, then the views folder (safe to repeat)."""
    done = warehouse.migrate(settings_for(state_dir))
    for r in done.migrations:
        typer.echo(f"{r.version:03d}_{r.name}: {r.status}{' (' + r.detail + ')' if r.detail else ''}")
    for v in done.views:
        if v.status != "unchanged":
            typer.echo(f"view {v.name}: {v.status}")
    unchanged = sum(v.status == "unchanged" for v in done.views)
    typer.echo(f"views: {len(done.views) - unchanged} changed, {unchanged} unchanged (sinks/views)")


# -- sink -----------------------------------------------------------------------------------------


@sink_app.command("run")
def sink_run(
    topic: list[str] = typer.Option([], "--topic", help="Catalogue topic to sink (repeatable; default: all)."),
    max_idle_s: float | None = typer.Option(None, "--max-idle-s", help="Exit after this long without records."),
    state_dir: Path | None = STATE_DIR,
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Consume the ledger topics into ClickHouse until SIGTERM (idempotent; commits after insert)."""
    from sinks.sink_service import run_sink

    settings = start_service(state_dir, verbose)
    stats = run_sink(settings, list(topic) or None, stop := stop_signal("sink"), max_idle_s)
    typer.echo(json.dumps({"sink": dataclasses.asdict(stats)}))
    stop.leave()


# -- rate card ------------------------------------------------------------------------------------


@ratecard_app.command("show")
def ratecard_show(card: Path | None = CARD_OPTION, state_dir: Path | None = STATE_DIR) -> None:
    """Every rate and the arithmetic that produced it."""
    present.rate_card_table(warehouse.rate_card(settings_for(state_dir), card))


@ratecard_app.command("load")
def ratecard_load(card: Path | None = CARD_OPTION, state_dir: Path | None = STATE_DIR) -> None:
    """Load the rate card into ClickHouse (a new load replaces the previous card)."""
    rc, loaded = warehouse.load_rate_card(settings_for(state_dir), card)
    typer.echo(f"rate card {rc.version}: {loaded} rates loaded")


# -- reports --------------------------------------------------------------------------------------


@report_app.command("chargeback")
def report_chargeback(
    period: str = PERIOD_OPTION,
    by: str = typer.Option("team", "--by", help="team, project, user, cost-centre, tier (on-prem, "
                           "cloud-on-demand, cloud-spot) or cluster (per team and cluster, and the team's total)."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to a file (required for parquet)."),
    quota: bool = typer.Option(False, "--quota", help="Per team and generation: allocated GPU-hours beside the "
                               "policy's guaranteed quota (quota_gpu_h, quota_used_pct)."),
    policy_path: Path | None = typer.Option(None, "--policy", help="With --quota: policy.yaml (default: "
                                            "settings' policy_path)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Charged on allocation; utilisation, idle/starved/dark time, coverage and the on-prem / cloud split beside
    it, and the month's data-quality figure (with --quota: use beside each team's guaranteed quota per
    generation)."""
    from sinks import chargeback as cb

    cb.check_period(period)
    cb.check_by(by, cb.REPORT_BY)
    settings = settings_for(state_dir)
    if quota:
        report = reports.quota(settings, period, policy_path)
    elif by == "cluster":
        report = reports.chargeback_by_cluster(settings, period, table=fmt == "table")
    else:
        report = reports.chargeback(settings, period, by, table=fmt == "table")
    present.show(report, fmt, output)


@report_app.command("explain")
def report_explain(
    project: str = typer.Option(..., "--project", help="Project of the line to explain."),
    period: str = PERIOD_OPTION,
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """The jobs behind a project's charge (corrections applied, original project shown), and the data-quality
    figure of those jobs."""
    from sinks.chargeback import check_period

    check_period(period)
    present.show(reports.explain(settings_for(state_dir), period, project), fmt, output)


@report_app.command("seconds")
def report_seconds(
    cluster: str = typer.Option(..., "--cluster", help="Cluster of the node."),
    node: str = typer.Option(..., "--node", help="Node whose samples to show."),
    start: str = typer.Option(..., "--start", help="First second, ISO 8601 with a zone (2026-12-07T10:03:00Z)."),
    minutes: int = typer.Option(1, "--minutes", help="How many minutes from --start (1-60)."),
    device: str | None = typer.Option(None, "--device", help="One device's UUID (default: every device)."),
    from_kafka: bool = typer.Option(False, "--from-kafka", help="Every second from Kafka (within its retention)."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """A dispute's drill-down below the device-minute: the per-second samples, from the warehouse, or from Kafka
    when the warehouse keeps minutes only (clickhouse.raw_samples_kept) or --from-kafka asks."""
    report = reports.seconds(settings_for(state_dir), cluster, node, start, minutes, device, from_kafka=from_kafka)
    present.show(report, fmt, output)


@report_app.command("journal")
def report_journal(
    period: str = PERIOD_OPTION,
    fmt: str = typer.Option("csv", "--format", help="csv or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o", help="File (default: stdout; parquet needs one)."),
    account: str = typer.Option("GPU-CHARGEBACK", "--account", help="Ledger account of the cost centres' lines."),
    contra_account: str | None = typer.Option(None, "--contra-account", help="Account of the contra line "
                                              "(default: --account)."),
    contra_cost_centre: str | None = typer.Option(None, "--contra-cost-centre", help="Cost centre of the contra "
                                                  "line (default: settings' cluster_cost_centre, then "
                                                  "CLUSTER-<cluster>)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Finance export that balances: a debit per cost centre, a line per adjustment, credit or reservation
    charge with its cause, and one contra line to the cluster's cost centre; deterministic line ids. From the
    frozen statements of a closed month, else provisional (the statements as they would close now). Every
    line carries the month's data-quality figure (dq_* columns)."""
    from sinks.chargeback import check_period

    check_period(period)
    if fmt not in ("csv", "parquet"):
        raise ConfigError(f"--format must be csv or parquet for the journal, got {fmt!r}")
    report = reports.journal(settings_for(state_dir), period, account=account, contra_account=contra_account,
                             contra_cost_centre=contra_cost_centre)  # fmt: skip
    present.show(report, fmt, output)


def alerts_cmd(
    limit: int = typer.Option(50, "--limit", help="Most recent N alerts."),
    kind: str | None = typer.Option(None, "--kind", help="Only this kind (e.g. IDLE_WARNING)."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Recent alerts from the ledger."""
    if fmt == "parquet":
        raise ConfigError("--format must be table, csv or json for alerts")
    present.show(reports.alerts(settings_for(state_dir), limit, kind), fmt)


# -- chat -----------------------------------------------------------------------------------------


@chat_app.command("receiver")
def chat_receiver(
    port: int = typer.Option(8765, "--port", help="Loopback port (0 = any free)."),
    out: Path | None = typer.Option(None, "--out", help="Append what arrives here, as JSON lines."),
) -> None:
    """A local webhook endpoint on 127.0.0.1 that stores what it gets (tests and demos); a repeated
    Idempotency-Key is answered as its first post and not stored again (the last 10,000 keys)."""
    from sinks.chat import WebhookReceiver

    receiver = WebhookReceiver(port=port, out=out)
    typer.echo(f"webhook receiver on http://127.0.0.1:{receiver.port}/ (GET /received lists what arrived)")
    sys.stdout.flush()
    try:
        receiver.serve_forever()
    finally:
        receiver.stop()


@chat_app.command("run")
def chat_run(
    max_idle_s: float | None = typer.Option(None, "--max-idle-s", help="Exit after this long without alerts."),
    local_receiver: int | None = typer.Option(
        None, "--local-receiver", help="With no route configured, post to `chat receiver` on this loopback port."
    ),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Consume the alerts topic and post each alert to its routed channel; and the appeals topic: each decision
    as a reply in its warning's thread, each escalation to the operators' channel (with the policy's rules)."""
    from sinks.chat_service import run_chat

    settings = start_service(state_dir)
    run_chat(settings, local_receiver, stop := stop_signal("chat"), max_idle_s)
    stop.leave()


# -- reclaim --------------------------------------------------------------------------------------


@reclaim_app.command("exec")
def reclaim_exec(
    scheduler: str = typer.Option(..., "--scheduler", help="SLURM or KUEUE."),
    job: str = typer.Option(..., "--job", help="Slurm job id, or <namespace>/<pod or workload> for Kueue."),
    action: str = typer.Option(..., "--action", help="SUSPEND, REQUEUE, CANCEL, CHECKPOINT_THEN_REQUEUE, ..."),
    cluster: str = typer.Option("", "--cluster"),
    reason: str = typer.Option("manual", "--reason"),
    execute: bool = typer.Option(False, "--execute", help="Really run it (default: dry-run, plan only)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Plan (or with --execute run) one reclaim action and record each step's outcome."""
    from sinks.reclaim_service import exec_one

    outcomes = exec_one(settings_for(state_dir), scheduler=scheduler, job=job, action=action, cluster=cluster,
                        reason=reason, execute=execute)  # fmt: skip
    for o in outcomes:
        typer.echo(f"{o.step}. {o.command}: {o.status}{' - ' + o.detail if o.detail else ''}")


@reclaim_app.command("run")
def reclaim_run(
    execute: bool = typer.Option(False, "--execute", help="Really run actions the processors marked live."),
    max_idle_s: float | None = typer.Option(None, "--max-idle-s"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Consume reclaim actions and carry them out (dry-run unless --execute and the action is live). With a policy
    it also reads appeals.v1: an exemption granted on a reclaimed job resumes it (sinks/reclaim_resume.py)."""
    from sinks.reclaim_service import run_reclaim

    settings = start_service(state_dir)
    run_reclaim(settings, execute, stop := stop_signal("reclaim"), max_idle_s)
    stop.leave()


@reclaim_app.command("resume")
def reclaim_resume(
    job: str = typer.Argument(..., help="Slurm job id, or <namespace>/<pod> for Kubernetes (as the ledger names it)."),
    cluster: str | None = typer.Option(None, "--cluster", help="The job's cluster (default: settings)."),
    by: str | None = typer.Option(None, "--by", help="Who asks (default: the current user)."),
    policy_path: Path | None = typer.Option(None, "--policy", help="policy.yaml (default: settings' policy_path)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Resume a job gpuledger reclaimed: released on Slurm, its Workload reactivated on Kueue (owner, lead, operator).

    One line, exit 0, when the job is resumed, was already, or runs; one line, exit 2, when it cannot be: no such
    job, ended, not reclaimed by gpuledger, not the asker's (sinks/reclaim_resume.py says who and what)."""
    import getpass

    from sinks.reclaim_service import resume

    line = resume(settings_for(state_dir), job, cluster=cluster, asker=by or getpass.getuser(), policy_path=policy_path)
    typer.echo(line)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    app.add_typer(db_app, name="db")
    app.add_typer(sink_app, name="sink")
    app.add_typer(ratecard_app, name="ratecard")
    app.add_typer(report_app, name="report")
    app.add_typer(chat_app, name="chat")
    app.add_typer(reclaim_app, name="reclaim")
    app.command("alerts")(alerts_cmd)
