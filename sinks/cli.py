"""Commands of the sinks component: `db`, `sink`, `ratecard`, `report`, `alerts`, `chat`, `reclaim`.

Every command builds the one settings object at its entry and passes it down. Bad arguments
raise `ConfigError`, which the `gpuledger` entry point prints as one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from gpuledger.errors import ConfigError, ServiceError
from gpuledger.settings import Settings

db_app = typer.Typer(help="The ClickHouse schema (versioned migrations).", no_args_is_help=True)
sink_app = typer.Typer(help="Kafka -> ClickHouse sinks.", no_args_is_help=True)
ratecard_app = typer.Typer(help="The rate card: finance inputs -> $/GPU-hour.", no_args_is_help=True)
report_app = typer.Typer(help="Chargeback reports from the ledger.", no_args_is_help=True)
chat_app = typer.Typer(help="Chat alerts (apprise) and a local webhook receiver.", no_args_is_help=True)
reclaim_app = typer.Typer(help="Reclaim executor (Slurm, Kueue); dry-run by default.", no_args_is_help=True)

STATE_DIR = typer.Option(None, "--state-dir", help="State directory.")


def _settings(state_dir: Path | None) -> Settings:
    from gpuledger.cli import load_settings

    return load_settings(state_dir)


def _logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


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


def _stop_flag() -> Any:
    stopping = {"flag": False}

    def handler(signum: int, frame: Any) -> None:
        stopping["flag"] = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return lambda: stopping["flag"]


# -- db -------------------------------------------------------------------------------------------


@db_app.command("migrate")
def db_migrate(state_dir: Path | None = STATE_DIR) -> None:
    """Apply the migrations not applied yet (safe to repeat)."""
    from sinks.db import migrate

    settings = _settings(state_dir)
    client = _client(settings)
    with _warehouse_errors():
        results = migrate(client, settings.clickhouse, clock_ms=_now_ms)
    for r in results:
        typer.echo(f"{r.version:03d}_{r.name}: {r.status}{' (' + r.detail + ')' if r.detail else ''}")


# -- sink -----------------------------------------------------------------------------------------


@sink_app.command("run")
def sink_run(
    topic: list[str] = typer.Option([], "--topic", help="Catalogue topic to sink (repeatable; default: all)."),
    max_idle_s: float | None = typer.Option(None, "--max-idle-s", help="Exit after this long without records."),
    state_dir: Path | None = STATE_DIR,
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Consume the ledger topics into ClickHouse until SIGTERM (idempotent; commits after insert)."""
    from sinks.consumer import LedgerSink
    from sinks.writer import LedgerWriter

    _logging(verbose)
    settings = _settings(state_dir)
    sink_cls = _metered_sink_class(settings) if settings.metrics.enabled else LedgerSink
    sink = sink_cls(settings.kafka, settings.sinks, LedgerWriter(_client(settings)), topics=list(topic) or None)
    stats = sink.run(_stop_flag(), max_idle_s=max_idle_s)
    typer.echo(json.dumps({"sink": dataclasses.asdict(stats)}))


def _metered_sink_class(settings: Settings) -> Any:
    """LedgerSink that reports to /metrics: records in per topic and lag (per batch, from its
    consumer), rows written per table, dead letters by topic and error class."""
    from gpuledger import metrics
    from sinks.consumer import LedgerSink

    m = metrics.component("sinks")

    class MeteredSink(LedgerSink):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            group = self._cfg.group_id
            self._consumer = metrics.MeteredConsumer(self._consumer, m, group, settings.metrics.lag_refresh_s)  # type: ignore[assignment]
            metrics.count_dead_letters(self._publisher, m)
            metrics.start_metrics_server(settings, "sinks")

        def _write_with_retry(self, pending: list[Any]) -> Any:
            result = super()._write_with_retry(pending)
            for table, n in result.inserted.items():
                m.records_out(table, n)
            return result

    return MeteredSink


# -- rate card ------------------------------------------------------------------------------------


def _card(settings: Settings, card: Path | None) -> Any:
    from sinks.ratecard import load_card

    return load_card(card or settings.sinks.ratecard_path)


@ratecard_app.command("show")
def ratecard_show(
    card: Path | None = typer.Option(None, "--card", help="Rate card TOML (default: settings, then the shipped card)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Every rate and the arithmetic that produced it."""
    from rich.table import Table

    rc = _card(_settings(state_dir), card)
    table = Table(title=f"rate card {rc.version} ({rc.currency} per GPU-hour)", show_lines=True)
    for col in ("generation", "tier", "preemptible", "from", "rate", "arithmetic"):
        table.add_column(col, justify="right" if col == "rate" else "left")
    for r in rc.rates():
        how = "\n".join(f"{what}: {text}" for what, text in r.steps)
        table.add_row(r.generation, r.pricing_tier, "yes" if r.preemptible else "no", r.effective_from.isoformat(),
                      str(r.per_gpu_hour), how)  # fmt: skip
    Console(width=max(Console().width, 160)).print(table)


@ratecard_app.command("load")
def ratecard_load(
    card: Path | None = typer.Option(None, "--card", help="Rate card TOML (default: settings, then the shipped card)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Load the rate card into ClickHouse (a new load replaces the previous card)."""
    from sinks.ratecard import RATE_CARD_COLUMNS, rate_card_rows

    settings = _settings(state_dir)
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
        cb.write_parquet(rows, output)
        typer.echo(f"wrote {len(rows)} rows to {output}")
        return
    if fmt == "table":
        Console(width=220).print(cb.render_table(title, rows, columns))
        return
    text = cb.to_csv(rows) if fmt == "csv" else cb.to_json(rows) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        typer.echo(f"wrote {len(rows)} rows to {output}")


@report_app.command("chargeback")
def report_chargeback(
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
    by: str = typer.Option("team", "--by", help="team, project, user or cost-centre."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to a file (required for parquet)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Charged on allocation; utilisation, idle/starved/dark time and coverage beside it."""
    from sinks import chargeback as cb

    cb.check_period(period)
    cb.check_by(by)
    settings = _settings(state_dir)
    with _warehouse_errors():
        report = cb.chargeback(_client(settings, analyst=True), period, by)
    columns = ("line", *[c for c in cb.LINE_COLUMNS if c != "line"])
    _emit(cb.report_rows(report), fmt, output, f"chargeback {period} by {by}", columns)


@report_app.command("explain")
def report_explain(
    project: str = typer.Option(..., "--project", help="Project of the line to explain."),
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or parquet."),
    output: Path | None = typer.Option(None, "--output", "-o"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """The jobs behind a project's charge (corrections applied, original project shown)."""
    from sinks import chargeback as cb

    cb.check_period(period)
    settings = _settings(state_dir)
    with _warehouse_errors():
        rows = cb.explain(_client(settings, analyst=True), period, project)
    _emit(rows, fmt, output, f"jobs behind {project} in {period}", cb.EXPLAIN_COLUMNS)


@report_app.command("journal")
def report_journal(
    period: str = typer.Option(..., "--period", help="Month, YYYY-MM."),
    output: Path | None = typer.Option(None, "--output", "-o", help="CSV file (default: stdout)."),
    account: str = typer.Option("GPU-CHARGEBACK", "--account", help="Ledger account of the debit lines."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Finance export: one journal line per cost centre for the period (CSV)."""
    from sinks import chargeback as cb

    cb.check_period(period)
    settings = _settings(state_dir)
    with _warehouse_errors():
        rows = cb.journal(_client(settings, analyst=True), period, account=account)
    _emit(rows, "csv", output, "", cb.JOURNAL_COLUMNS)


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
    settings = _settings(state_dir)
    with _warehouse_errors():
        rows = cb.recent_alerts(_client(settings, analyst=True), limit=limit, kind=kind)
    _emit(rows, fmt, None, "recent alerts", cb.ALERT_LIST_COLUMNS)


# -- chat -----------------------------------------------------------------------------------------


@chat_app.command("receiver")
def chat_receiver(
    port: int = typer.Option(8765, "--port", help="Loopback port (0 = any free)."),
    out: Path | None = typer.Option(None, "--out", help="Append what arrives here, as JSON lines."),
) -> None:
    """A local webhook endpoint on 127.0.0.1 that stores what it gets (tests and demos)."""
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
    """Consume the alerts topic and post each alert to its routed channel."""
    from pydantic import SecretStr

    from gpuledger.settings import ChatRoute
    from schemas.topics import ALERTS
    from sinks.chat import ChatNotifier
    from sinks.streams import consume_records

    _logging()
    settings = _settings(state_dir)
    client = _client(settings)
    recent = client.query(
        "SELECT alert_id FROM chat_deliveries FINAL WHERE status IN ('sent', 'dry-run') "
        "ORDER BY ts_ms DESC LIMIT {n:UInt32}",
        parameters={"n": settings.sinks.chat.dedupe_window},
    ).result_rows
    chat = settings.sinks.chat
    if local_receiver is not None and chat.default is None and not chat.users and not chat.teams:
        # Local-receiver mode (demos, tests): everything goes to the loopback webhook.
        chat = chat.model_copy(
            update={"default": ChatRoute(url=SecretStr(f"json://127.0.0.1:{local_receiver}/"), channel="#gpu-idle")}
        )
    notifier = ChatNotifier(chat, clock_ms=_now_ms, already_sent=[r[0] for r in reversed(recent)])

    def handle(record: dict[str, Any]) -> None:
        delivery = notifier.handle(record)
        logging.getLogger("gpuledger.chat").info("%s %s %s", delivery.alert_id, delivery.status, delivery.channel)
        if delivery.status in ("sent", "dry-run", "failed", "rate-limited", "no-route"):
            client.insert(
                "chat_deliveries",
                [[delivery.alert_id, _now_ms(), delivery.status, delivery.channel, delivery.destination]],
                column_names=["alert_id", "ts_ms", "status", "channel", "destination"],
            )

    consume_records(
        settings,
        ALERTS,
        f"{settings.sinks.group_id}-chat",
        handle,
        _stop_flag(),
        max_idle_s,
        metrics_component="chat",
        out_label="chat",
    )


# -- reclaim --------------------------------------------------------------------------------------


def _executor(settings: Settings, execute: bool) -> Any:
    from sinks.reclaim import ClickHouseRecorder, ReclaimExecutor

    return ReclaimExecutor(
        ClickHouseRecorder(_client(settings)),
        dry_run=not execute and settings.sinks.reclaim_dry_run,
        signal=settings.sinks.reclaim_checkpoint_signal,
        grace_s=settings.sinks.reclaim_checkpoint_grace_s,
        clock_ms=_now_ms,
    )


@reclaim_app.command("exec")
def reclaim_exec(
    scheduler: str = typer.Option(..., "--scheduler", help="SLURM or KUEUE."),
    job: str = typer.Option(..., "--job", help="Slurm job id, or <namespace>/<workload> for Kueue."),
    action: str = typer.Option(..., "--action", help="SUSPEND, REQUEUE, CANCEL, CHECKPOINT_THEN_REQUEUE, ..."),
    cluster: str = typer.Option("", "--cluster"),
    reason: str = typer.Option("manual", "--reason"),
    execute: bool = typer.Option(False, "--execute", help="Really run it (default: dry-run, plan only)."),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Plan (or with --execute run) one reclaim action and record each step's outcome."""
    from sinks.reclaim import plan

    settings = _settings(state_dir)
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
    for o in _executor(settings, execute).execute(record):
        typer.echo(f"{o.step}. {o.command}: {o.status}{' - ' + o.detail if o.detail else ''}")


@reclaim_app.command("run")
def reclaim_run(
    execute: bool = typer.Option(False, "--execute", help="Really run actions the processors marked live."),
    max_idle_s: float | None = typer.Option(None, "--max-idle-s"),
    state_dir: Path | None = STATE_DIR,
) -> None:
    """Consume reclaim actions and carry them out (dry-run unless --execute and the action is live)."""
    from schemas.topics import RECLAIM_ACTIONS
    from sinks.streams import consume_records

    _logging()
    settings = _settings(state_dir)
    executor = _executor(settings, execute)
    consume_records(
        settings,
        RECLAIM_ACTIONS,
        f"{settings.sinks.group_id}-reclaim",
        executor.execute,
        _stop_flag(),
        max_idle_s,
        metrics_component="reclaim",
        out_label="actions",
    )


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add this component's commands to the `gpuledger` command."""
    app.add_typer(db_app, name="db")
    app.add_typer(sink_app, name="sink")
    app.add_typer(ratecard_app, name="ratecard")
    app.add_typer(report_app, name="report")
    app.add_typer(chat_app, name="chat")
    app.add_typer(reclaim_app, name="reclaim")
    app.command("alerts")(alerts_cmd)
