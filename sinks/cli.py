"""Commands of the sinks component: `db`, `sink`, `ratecard`, `report`, `alerts`, `chat`, `reclaim`.

Every command builds the one settings object at its entry and passes it down. Bad arguments
raise `ConfigError`, which the `gpuledger` entry point prints as one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from base.cli_common import VERBOSE_OPTION, settings_for, start_service, stop_signal
from base.errors import ConfigError, ServiceError
from base.settings import Settings

if TYPE_CHECKING:
    from sinks.data_quality import DataQuality

db_app = typer.Typer(help="The ClickHouse schema (versioned migrations, then the views).", no_args_is_help=True)
sink_app = typer.Typer(help="Kafka -> ClickHouse sinks.", no_args_is_help=True)
ratecard_app = typer.Typer(help="The rate card: finance inputs -> $/GPU-hour.", no_args_is_help=True)
report_app = typer.Typer(help="Chargeback reports from the ledger.", no_args_is_help=True)
chat_app = typer.Typer(help="Chat alerts (apprise) and a local webhook receiver.", no_args_is_help=True)
reclaim_app = typer.Typer(help="Reclaim executor (Slurm, Kueue); dry-run by default.", no_args_is_help=True)

STATE_DIR = typer.Option(None, "--state-dir", help="State directory.")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _client(settings: Settings, *, analyst: bool = False) -> Any:
    from sinks.db import connect

    return connect(settings.clickhouse, analyst=analyst)


@contextlib.contextmanager
def _warehouse_errors() -> Iterator[None]:
    """ClickHouse errors as one line (e.g. an unknown table: run `gpuledger db migrate`)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    try:
        yield
    except ClickHouseError as exc:
        text = " ".join(str(exc).split())
        start = text.find("Code: ")
        text = text[start:] if start >= 0 else text
        text = text.split(" (version ")[0]
        missing = ("UNKNOWN_TABLE", "UNKNOWN_DATABASE", "UNKNOWN_FUNCTION")
        hint = " (run `gpuledger db migrate`?)" if any(name in text for name in missing) else ""
        raise ServiceError(f"ClickHouse: {text[:400]}{hint}") from None


# -- db -------------------------------------------------------------------------------------------


@db_app.command("migrate")
def db_migrate(state_dir: Path | None = STATE_DIR) -> None:
    """Apply the migrations not applied yet, then the views folder (safe to repeat)."""
    from sinks.db import upgrade

    settings = settings_for(state_dir)
    client = _client(settings)
    with _warehouse_errors():
        done = upgrade(client, settings.clickhouse, clock_ms=_now_ms)
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
    from sinks.consumer import LedgerSink
    from sinks.writer import LedgerWriter

    settings = start_service(state_dir, verbose)
    sink_cls = _metered_sink_class(settings) if settings.metrics.enabled else LedgerSink
    sink = sink_cls(settings.kafka, settings.sinks, LedgerWriter(_client(settings)), topics=list(topic) or None)
    stop = stop_signal("sink")
    stats = sink.run(stop, max_idle_s=max_idle_s)
    typer.echo(json.dumps({"sink": dataclasses.asdict(stats)}))
    stop.leave()


def _metered_sink_class(settings: Settings) -> Any:
    """LedgerSink that reports to /metrics: records in per topic and lag (per batch, from its
    consumer), rows written per table, dead letters by topic and error class."""
    from base import metrics
    from sinks.consumer import LedgerSink

    m = metrics.component("sinks")

    class MeteredSink(LedgerSink):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            group = self._cfg.group_id
            self.loop.consumer = metrics.MeteredConsumer(self.loop.consumer, m, group, settings.metrics.lag_refresh_s)
            metrics.count_dead_letters(self.loop.publisher, m)
            metrics.start_metrics_server(settings, "sinks")

        def _write_with_retry(self, pending: list[Any]) -> Any:
            result = super()._write_with_retry(pending)
            for table, n in result.inserted.items():
                m.records_out(table, n)
            return result

        def _bulk_landed(self, rows: int) -> None:
            super()._bulk_landed(rows)
            if rows:
                m.records_out("raw_samples", rows)

    return MeteredSink


# -- rate card ------------------------------------------------------------------------------------


def _card(settings: Settings, card: Path | None) -> Any:
    from sinks.ratecard import load_card

    return load_card(card or settings.sinks.ratecard_path, settings.policy_path)


@ratecard_app.command("show")
def ratecard_show(
    card: Path | None = typer.Option(None, "--card", help="Rate card TOML (default: settings, then the shipped card)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Every rate and the arithmetic that produced it."""
    from rich.markup import escape
    from rich.table import Table

    rc = _card(settings_for(state_dir), card)
    table = Table(title=escape(f"rate card {rc.version} ({rc.currency} per GPU-hour)"), show_lines=True)
    for col in ("generation", "tier", "preemptible", "from", "rate", "arithmetic"):
        table.add_column(col, justify="right" if col == "rate" else "left")
    for r in rc.rates():
        how = "\n".join(f"{what}: {text}" for what, text in r.steps)
        cells = (r.generation, r.pricing_tier, "yes" if r.preemptible else "no", r.effective_from.isoformat(),
                 str(r.per_gpu_hour), how)  # fmt: skip
        table.add_row(*map(escape, cells))  # the card's names are text, not markup
    Console(width=max(Console().width, 160)).print(table)


@ratecard_app.command("load")
def ratecard_load(
    card: Path | None = typer.Option(None, "--card", help="Rate card TOML (default: settings, then the shipped card)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Load the rate card into ClickHouse (a new load replaces the previous card)."""
    from sinks.ratecard import RATE_CARD_COLUMNS, rate_card_rows

    settings = settings_for(state_dir)
    rc = _card(settings, card)
    rows = rate_card_rows(rc, _now_ms())
    with _warehouse_errors():
        _client(settings).insert("rate_card", rows, column_names=RATE_CARD_COLUMNS)
    typer.echo(f"rate card {rc.version}: {len(rows)} rates loaded")


# -- reports --------------------------------------------------------------------------------------


def _emit(rows: list[dict[str, Any]], fmt: str, output: Path | None, title: str, columns: tuple[str, ...]) -> None:
    from sinks import chargeback as cb

    if fmt not in cb.FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(cb.FORMATS)}, got {fmt!r}")
    if fmt == "parquet":
        if output is None:
            raise ConfigError("--format parquet needs --output FILE")
        cb.write_parquet(rows, output, columns)
        typer.echo(f"wrote {len(rows)} rows to {output}")
        return
    if fmt == "table":
        Console(width=220).print(cb.render_table(title, rows, columns))
        return
    text = cb.to_csv(rows, columns) if fmt == "csv" else cb.to_json(rows) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {len(rows)} rows to {output}")


def _with_quality(rows: list[dict[str, Any]], quality: DataQuality, fmt: str) -> list[dict[str, Any]]:
    """Rows of a machine-readable output carry the data-quality figure as dq_* columns (a table prints it as a
    line under itself instead)."""
    return rows if fmt == "table" else [{**row, **quality.columns()} for row in rows]


def _baseline_mark(client: Any, period: str) -> Any:
    """The month against the attribution baseline in force (issue 38, sinks/baseline.py)."""
    from sinks.baseline import month_mark

    return month_mark(client, period)


def _with_baseline(rows: list[dict[str, Any]], marked: Any, fmt: str) -> list[dict[str, Any]]:
    """Rows of a machine-readable output carry the month's baseline mark as columns (a table prints its line)."""
    return rows if fmt == "table" else [{**row, **marked.columns()} for row in rows]


@report_app.command("chargeback")
def report_chargeback(
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
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
        _quota_report(settings, period, policy_path, fmt, output)
        return
    if by == "cluster":
        _cluster_report(settings, period, fmt, output)
        return
    from sinks.statement_store import StatementStore, adjustments_since, month_quality

    client = _client(settings, analyst=True)
    with _warehouse_errors():
        store = StatementStore(client)
        closed = store.closes().get(period)
        report = cb.chargeback(client, period, by, closed=closed is not None)
        since = adjustments_since(store, period) if closed is not None and fmt == "table" else []
        quality = month_quality(store, period, closed is not None)
        marked = _baseline_mark(client, period)
    columns = ("line", *[c for c in cb.LINE_COLUMNS if c != "line"])
    title = f"chargeback {period} by {by}"
    if closed is not None:
        title += f" (closed {closed.close_id[:12]} by {closed.closed_by}: the frozen statements)"
    _emit(_with_baseline(_with_quality(cb.report_rows(report), quality, fmt), marked, fmt), fmt, output, title,
          columns)  # fmt: skip
    if fmt == "table":
        typer.echo(marked.text())
        typer.echo(quality.text())
        # The findings behind the figure are read from the ledger now: a frozen figure keeps its own numbers.
        with _warehouse_errors():
            unknown = cb.unidentified(client, period)
        if unknown.jobs and not quality.frozen:
            typer.echo(f"data quality: {unknown.gpu_h} GPU-h of {unknown.jobs} job(s) on devices no source identified "
                       f"(device_uuid {cb.UNIDENTIFIED_PREFIX}*: charged per device, counted dark)")
        _echo_overlaps(client, period, "data quality (the ledger now)" if quality.frozen else "data quality")
        _echo_identities(client, period, "data quality (the ledger now)" if quality.frozen else "data quality")
    if closed is not None and fmt == "table":
        rows = [{"posted_in": where, "team": a.team, "job_id": a.job_id, "project": a.project, "charge": a.charge,
                 "cause_kind": a.cause_kind, "cause_ref": a.cause_ref} for where, a in since]  # fmt: skip
        _emit(rows, fmt, None, f"adjustments to {period} since it closed",
              ("posted_in", "team", "job_id", "project", "charge", "cause_kind", "cause_ref"))  # fmt: skip


def _cluster_report(settings: Settings, period: str, fmt: str, output: Path | None) -> None:
    """`--by cluster`: a line per (team, cluster), each team's total across clusters (cluster ALL), and the
    device-seconds two clusters both claimed (charged once, sinks/reconcile.py)."""
    from sinks import reconcile
    from sinks.statement_store import StatementStore, month_quality

    client = _client(settings, analyst=True)
    with _warehouse_errors():
        store = StatementStore(client)
        closed = store.closes().get(period)
        report = reconcile.chargeback_by_cluster(client, period, closed=closed is not None)
        quality = month_quality(store, period, closed is not None)
        marked = _baseline_mark(client, period)
    title = f"chargeback {period} by cluster"
    if closed is not None:
        title += f" (closed {closed.close_id[:12]} by {closed.closed_by}: the frozen statements)"
    _emit(_with_baseline(_with_quality(reconcile.report_rows(report), quality, fmt), marked, fmt), fmt, output, title,
          reconcile.CLUSTER_COLUMNS)  # fmt: skip
    if fmt == "table":
        typer.echo(marked.text())
        typer.echo(quality.text())
        _echo_overlaps(client, period, "data quality (the ledger now)" if quality.frozen else "data quality")
        _echo_identities(client, period, "data quality (the ledger now)" if quality.frozen else "data quality")


def _echo_overlaps(client: Any, period: str, label: str = "data quality") -> None:
    """The data-quality finding under a table: devices two clusters' jobs both claimed, naming both."""
    from sinks import reconcile

    with _warehouse_errors():
        found = reconcile.overlaps(client, period)
    for overlap in found:
        typer.echo(f"{label}: {overlap.text()}")


def _echo_identities(client: Any, period: str, label: str = "data quality", team: str | None = None) -> None:
    """The data-quality finding under a table: each cluster whose jobs' users are only self-declared (no
    admission stamp seen), and how many self-declared users disagreed with the verified one (issue 38)."""
    from sinks.identities import cluster_identities

    with _warehouse_errors():
        found = cluster_identities(client, period, team)
    for cluster in found:
        note = cluster.note()
        if note is not None:
            typer.echo(f"{label}: {note}")
        if cluster.claimed_user_jobs:
            typer.echo(f"{label}: on {cluster.cluster}, {cluster.claimed_user_jobs} job(s) named a user other than "
                       "their verified submitter (charged to the submitter)")


def _quota_report(settings: Settings, period: str, policy_path: Path | None, fmt: str, output: Path | None) -> None:
    from dataclasses import asdict

    from schemas.policy import load_policy
    from sinks import chargeback as cb

    chosen = policy_path or settings.policy_path
    if chosen is None:
        raise ConfigError("--quota needs a policy: pass --policy FILE or set policy_path (GPULEDGER_POLICY_PATH)")
    policy = load_policy(chosen)
    with _warehouse_errors():
        lines = cb.quota_usage(_client(settings, analyst=True), period, {t.name: t.quota for t in policy.teams})
    _emit([asdict(line) for line in lines], fmt, output, f"quota use {period}", cb.QUOTA_COLUMNS)


@report_app.command("explain")
def report_explain(
    project: str = typer.Option(..., "--project", help="Project of the line to explain."),
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """The jobs behind a project's charge (corrections applied, original project shown), and the data-quality
    figure of those jobs."""
    from sinks import chargeback as cb
    from sinks.data_quality import data_quality

    cb.check_period(period)
    settings = settings_for(state_dir)
    client = _client(settings, analyst=True)
    with _warehouse_errors():
        rows = cb.explain(client, period, project)
        quality = data_quality(client, period, project)
    _emit(_with_quality(rows, quality, fmt), fmt, output, f"jobs behind {project} in {period}", cb.EXPLAIN_COLUMNS)
    if fmt == "table":
        # one line per identity, a name and its identifier: a name recreated with another identifier is two
        _emit(cb.explain_identities(rows), fmt, None, f"identities behind {project} in {period}",
              cb.IDENTITY_SUMMARY_COLUMNS)  # fmt: skip
        typer.echo(quality.text())


@report_app.command("journal")
def report_journal(
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
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
    from sinks import chargeback as cb
    from sinks.governance_charges import configured_charges
    from sinks.journal import JOURNAL_COLUMNS
    from sinks.statement_store import StatementStore, journal, month_quality

    cb.check_period(period)
    if fmt not in ("csv", "parquet"):
        raise ConfigError(f"--format must be csv or parquet for the journal, got {fmt!r}")
    settings = settings_for(state_dir)
    contra = contra_cost_centre or settings.cluster_cost_centre or f"CLUSTER-{settings.cluster}"
    client = _client(settings, analyst=True)
    with _warehouse_errors():
        store = StatementStore(client)
        lines = journal(store, period, lambda: configured_charges(settings, client, _now_ms()),
                        account=account, contra_cost_centre=contra, contra_account=contra_account)  # fmt: skip
        quality = month_quality(store, period, bool(lines) and lines[0].status == "closed")
    _emit(_with_quality([dataclasses.asdict(line) for line in lines], quality, fmt), fmt, output, "",
          JOURNAL_COLUMNS)  # fmt: skip


def alerts_cmd(
    limit: int = typer.Option(50, "--limit", help="Most recent N alerts."),
    kind: str | None = typer.Option(None, "--kind", help="Only this kind (e.g. IDLE_WARNING)."),
    fmt: str = typer.Option("table", "--format", help="table, csv or json."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Recent alerts from the ledger."""
    from sinks import chargeback as cb

    if fmt == "parquet":
        raise ConfigError("--format must be table, csv or json for alerts")
    settings = settings_for(state_dir)
    with _warehouse_errors():
        rows = cb.recent_alerts(_client(settings, analyst=True), limit=limit, kind=kind)
    _emit(rows, fmt, None, "recent alerts", cb.ALERT_LIST_COLUMNS)


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
    from schemas.policy import load_policy
    from schemas.topics import ALERTS, APPEALS
    from sinks.chat import ChatJournal, ChatNotifier, local_receiver_routes, recently_delivered
    from sinks.chat_appeals import appeal_notifier
    from sinks.gang import ClickHouseGangs
    from sinks.worker_agent import consume_records

    settings = start_service(state_dir)
    client = _client(settings)
    chat = settings.sinks.chat
    if local_receiver is not None:
        chat = local_receiver_routes(chat, local_receiver)
    recent = recently_delivered(client, chat.dedupe_window)
    two_phase = ChatJournal(client, _now_ms)
    notifier = ChatNotifier(chat, clock_ms=_now_ms, already_sent=recent, gangs=ClickHouseGangs(client).alert,
                            intent=two_phase.begin, in_doubt=two_phase.in_doubt(chat.dedupe_window))  # fmt: skip
    policy = None if settings.policy_path is None else load_policy(settings.policy_path)
    appeals = appeal_notifier(chat, client, settings.kafka, policy, recent, two_phase.begin)

    def journal(delivery: Any) -> None:
        logging.getLogger("gpuledger.chat").info("%s %s %s", delivery.alert_id, delivery.status, delivery.channel)
        two_phase.end(delivery)

    consume_records(
        settings,
        ALERTS,
        f"{settings.sinks.group_id}-chat",
        lambda record: journal(notifier.handle(record)),
        stop := stop_signal("chat"),
        max_idle_s,
        metrics_component="chat",
        out_label="chat",
        also={APPEALS: lambda record: journal(appeals.handle(record))},
    )
    stop.leave()


# -- reclaim --------------------------------------------------------------------------------------


def _executor(settings: Settings, execute: bool, *, recheck: bool = True) -> Any:
    """`recheck`: before acting, confirm in ClickHouse that the job is still allocated and idle (the
    actions the processors decided); a manual `reclaim exec` names its job itself and is not re-checked."""
    from sinks.gang import ClickHouseGangs
    from sinks.kube_owner import kubernetes_owner
    from sinks.reclaim import ClickHouseJobState, ClickHouseRecorder, ReclaimExecutor

    client = _client(settings)
    state = ClickHouseJobState(client)
    recorder = ClickHouseRecorder(client)
    return ReclaimExecutor(
        recorder,
        progress=recorder.outcomes_of,  # an action a kill left in doubt is resolved by the engine: exactly once
        dry_run=not execute and settings.sinks.reclaim_dry_run,
        signal=settings.sinks.reclaim_checkpoint_signal,
        grace_s=settings.sinks.reclaim_checkpoint_grace_s,
        clock_ms=_now_ms,
        job_state=state if recheck else None,
        kueue_owner=kubernetes_owner,  # a Kubernetes job is a pod: deactivate the Workload that owns it
        gang_check=ClickHouseGangs(client, state) if recheck else None,  # a gang is reclaimed once, all idle and due
    )


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
    from sinks.reclaim import plan

    settings = settings_for(state_dir)
    record = {
        "action_id": f"manual-{_now_ms()}",
        "cluster": cluster or settings.cluster,
        "job_id": job,
        "scheduler": scheduler.upper(),
        "action": action.upper(),
        "dry_run": not execute,
        "reason": reason,
    }
    plan(record)  # argument errors as one line before anything is recorded
    for o in _executor(settings, execute, recheck=False).execute(record):
        typer.echo(f"{o.step}. {o.command}: {o.status}{' - ' + o.detail if o.detail else ''}")


@reclaim_app.command("run")
def reclaim_run(
    execute: bool = typer.Option(False, "--execute", help="Really run actions the processors marked live."),
    max_idle_s: float | None = typer.Option(None, "--max-idle-s"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Consume reclaim actions and carry them out (dry-run unless --execute and the action is live). With a policy
    it also reads appeals.v1: an exemption granted on a reclaimed job resumes it (sinks/reclaim_resume.py)."""
    from schemas.policy import load_policy
    from schemas.topics import APPEALS, RECLAIM_ACTIONS
    from sinks.reclaim_resume import appeal_handler
    from sinks.worker_agent import consume_records

    settings = start_service(state_dir)
    executor = _executor(settings, execute)
    live = execute or not settings.sinks.reclaim_dry_run
    also = ({APPEALS: appeal_handler(_client(settings), settings.kafka, load_policy(settings.policy_path), live,
                                     _now_ms)} if settings.policy_path is not None else None)  # fmt: skip
    consume_records(
        settings,
        RECLAIM_ACTIONS,
        f"{settings.sinks.group_id}-reclaim",
        executor.execute,
        stop := stop_signal("reclaim"),
        max_idle_s,
        metrics_component="reclaim",
        out_label="actions",
        also=also,
    )
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

    from schemas.policy import load_policy
    from sinks.reclaim_resume import Request, job_owner, latest_reclaim, ledger_resumer, may_resume

    settings = settings_for(state_dir)
    chosen = policy_path or settings.policy_path
    if chosen is None:
        raise ConfigError("resume needs the policy (who may resume): pass --policy FILE or set policy_path")
    policy = load_policy(chosen)
    asker = by or getpass.getuser()
    where = cluster or settings.cluster
    if len(job) > 256:
        raise ConfigError("the job id is longer than 256 characters")
    with _warehouse_errors():
        client = _client(settings)
        refusal = may_resume(policy, job_owner(client, where, job), asker, job)
        if refusal is not None:
            raise ConfigError(refusal)
        status, line = ledger_resumer(client, _now_ms).resume(Request(where, job, asker, f"asked by {asker}"),
                                                              latest_reclaim(client, where, job))  # fmt: skip
    if status not in ("resumed", "already", "running"):
        raise ConfigError(line)
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
