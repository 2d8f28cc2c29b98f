"""Telemetry commands: `inspect dcgm`, `simulate run|ledger`, `dcgm run`, `nvsmi run`, `inventory publish|show`.

Each command is a module-level function; `register` only wires them. The DCGM targets come from the
command line, else the settings' `dcgm.targets`.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from base.cli_common import STATE_DIR_OPTION, VERBOSE_OPTION, settings_for, start_service
from base.errors import ConfigError, ServiceError
from base.settings import Settings


def _read_source(source: str, timeout_s: float) -> str:
    if source == "-":
        return sys.stdin.read()
    if source.startswith(("http://", "https://")):
        import httpx

        try:
            resp = httpx.get(source, timeout=timeout_s)
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot scrape {source}: {exc}") from exc
        return resp.text
    path = Path(source)
    if not path.exists():
        raise ConfigError(f"{source}: no such file (give a file, a http(s) URL or -)")
    return path.read_text(encoding="utf-8", errors="replace")


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


def _parse_start(text: str | None, realtime: bool) -> int:
    from producers.simulator import DEFAULT_START_MS

    if text is None:
        return int(time.time()) * 1000 if realtime else DEFAULT_START_MS
    if text == "now":
        return int(time.time()) * 1000
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ConfigError(f"--start {text!r}: expected an ISO time like 2026-03-02T11:30:00Z, or now") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * 1000


def _metered(publisher: Any, settings: Settings, component: str) -> Any:
    """Count records out per topic and serve them on this process's /metrics (base/metrics.py)."""
    if not settings.metrics.enabled:
        return publisher
    from base import metrics

    counted = metrics.CountingPublisher(publisher, metrics.component(component), settings.kafka.topic_prefix)
    metrics.start_metrics_server(settings, component)
    return counted


dcgm_app = typer.Typer(help="The dcgm-exporter producer.", no_args_is_help=True)
nvsmi_app = typer.Typer(help="nvidia-smi as a telemetry source (nodes without DCGM).", no_args_is_help=True)
inventory_app = typer.Typer(help="Expected devices per node (inventory.devices).", no_args_is_help=True)
simulate_app = typer.Typer(
    help="A simulated GPU cluster: job events, telemetry, inventory, expected ledger.", no_args_is_help=True
)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add the telemetry producers' commands to the `gpuledger` command."""
    inspect_app.command("dcgm")(inspect_dcgm)
    app.add_typer(dcgm_app, name="dcgm")
    app.add_typer(nvsmi_app, name="nvsmi")
    app.add_typer(inventory_app, name="inventory")
    app.add_typer(simulate_app, name="simulate")


def inspect_dcgm(
    source: str = typer.Argument(..., help="A /metrics scrape: file, http(s) URL, or - for stdin."),
    as_json: bool = typer.Option(False, "--json", help="Print the normalized record as JSON."),
    exporter_version: str | None = typer.Option(
        None, "--exporter-version", help="dcgm-exporter release (e.g. 3.3.7-3.5.0); detected when absent."
    ),
    cluster: str = typer.Option("inspect", "--cluster", help="Cluster name to put on the record."),
    timeout_s: float = typer.Option(5.0, "--timeout", help="Scrape timeout for URLs, seconds."),
) -> None:
    """Print the normalized samples one dcgm-exporter scrape yields (check an exporter first)."""
    from producers.dcgm import normalize_text, scrape_record
    from schemas.generations import generation_of

    text = _read_source(source, timeout_s)
    norm = normalize_text(text, exporter_version=exporter_version)
    node = norm.hostname or "unknown"
    record = scrape_record(
        cluster=cluster,
        node=node,
        ts_ms=int(time.time() * 1000),
        normalized=norm,
        exporter_version=exporter_version,
    )
    if as_json:
        typer.echo(
            json.dumps({"record": record, "warnings": norm.warnings, "unknown_metrics": norm.unknown_metrics}, indent=2)
        )
        return
    console = Console()
    # What the exporter reports (pod names, models) is text, never markup.
    table = Table(title=escape(f"{node}: {len(norm.devices)} devices, mapping {norm.mapping_version}"))
    for col in ("idx", "uuid", "MIG", "model", "gen", "activity", "util %", "fb used MiB", "power W", "owner"):
        # UUIDs are what a user matches against: fold them, never cut them.
        table.add_column(col, overflow="fold" if col in ("uuid", "owner") else "ellipsis")
    for d in norm.devices:
        act = d["sm_active_ratio"]
        if act is None:
            act = d["gr_engine_active_ratio"]
        if act is None and d["gpu_util_pct"] is not None:
            act = d["gpu_util_pct"] / 100
        mig = f"{d['mig_instance_id']} {d['mig_profile'] or ''}".strip() if d["mig_instance_id"] is not None else ""
        owner = "/".join(x for x in (d["namespace"], d["pod"]) if x) or (d["hpc_job"] or "")
        cells = (
            _fmt(d["index"]),
            d["uuid"],
            mig,
            d["model"] or "-",
            generation_of(d["model"]),
            _fmt(act, 3),
            _fmt(d["gpu_util_pct"]),
            _fmt(d["fb_used_mib"]),
            _fmt(d["power_w"], 1),
            owner,
        )
        table.add_row(*map(escape, cells))
    console.print(table)
    console.print(f"driver: {norm.driver_version or '-'}  exporter version: {exporter_version or 'not given'}")
    for w in norm.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)


def _sim_config(
    seed: int,
    nodes: int,
    duration: int,
    start: str | None,
    realtime: bool,
    cluster: str | None,
    state_dir: Path | None,
    kube_nodes: int = 0,
) -> Any:
    from producers.simulator import SimConfig

    settings = settings_for(state_dir)
    return SimConfig(
        seed=seed,
        nodes=nodes,
        duration_s=duration,
        start_ms=_parse_start(start, realtime),
        cluster=cluster or settings.cluster,
        kube_nodes=kube_nodes,
    ), settings


# Two clusters by default: the Slurm-like one and a Kubernetes one beside it (producers/simulator/kube.py).
KUBE_NODES_OPTION = typer.Option(
    3,
    "--kube-nodes",
    min=0,
    help="Nodes of the Kubernetes cluster simulated beside it, named <cluster>-k8s (0: none; else at least 3).",
)


@simulate_app.command("run")
def simulate_run(
    nodes: int = typer.Option(8, "--nodes", help="Nodes of 8 GPUs."),
    seed: int = typer.Option(1, "--seed"),
    duration: int = typer.Option(86400, "--duration", help="Seconds of cluster time."),
    realtime: bool = typer.Option(True, "--realtime/--fast", help="Pace to the wall clock, or as fast as possible."),
    start: str | None = typer.Option(
        None,
        "--start",
        help="Event time of the first second (ISO, or now). "
        "Default: now with --realtime, 2026-03-02T11:30Z with --fast.",
    ),
    ledger: Path | None = typer.Option(
        None,
        "--ledger",
        help="Write the expected ledger here (.json or .csv). Default: <state-dir>/simulator/expected-ledger.json.",
    ),
    cluster: str | None = typer.Option(None, "--cluster", help="Cluster name (default: the settings')."),
    kube_nodes: int = KUBE_NODES_OPTION,
    backfill: int = typer.Option(
        0,
        "--backfill",
        min=0,
        help="Real time only: start this many seconds in the past and publish that history at once.",
    ),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Publish a simulated cluster's inventory, job events and device samples to Kafka."""
    from producers.simulator import run, write_ledger
    from streams.publish import RecordPublisher

    cfg, settings = _sim_config(seed, nodes, duration, start, realtime, cluster, state_dir, kube_nodes)
    resume_s, on_flushed = 0, None
    if backfill:
        if not realtime or start is not None:
            raise ConfigError("--backfill goes with --realtime and no --start (it starts in the past itself)")
        # A restart on the same state dir continues the run instead of publishing the history again.
        from producers.simulator import position

        where = settings.state_dir / "simulator" / "position.json"
        plan = position.restart(position.load(where), cfg, int(time.time() * 1000), backfill)
        cfg, resume_s, backfill = plan.cfg, plan.resume_s, plan.backfill_s
        Console(stderr=True).print(f"simulator: {plan.why}", highlight=False)

        def on_flushed(through_ms: int, cfg: Any = cfg) -> None:
            position.save(where, position.position_of(cfg, through_ms))

    path = ledger or settings.state_dir / "simulator" / "expected-ledger.json"
    # The ledger of a long run takes a while: write it beside the publishing, not before it.
    import threading

    writer = threading.Thread(target=write_ledger, args=(cfg, path), name="expected-ledger", daemon=True)
    writer.start()
    err = Console(stderr=True)
    err.print(
        f"simulator: {cfg.cluster} ({cfg.nodes} nodes)"
        + (f" and {cfg.cluster}-k8s ({cfg.kube_nodes} Kubernetes nodes)" if cfg.kube_nodes else "")
        + f", {cfg.duration_s} s from "
        f"{datetime.fromtimestamp(cfg.start_ms / 1000, UTC).isoformat()}, expected ledger {path}"
    )
    publisher = _metered(RecordPublisher(settings.kafka), settings, "simulator")
    stats = run(
        cfg,
        publisher,
        realtime=realtime,
        backfill_s=backfill,
        resume_s=resume_s,
        on_flushed=on_flushed,
        progress=lambda t, s: (
            err.print(f"  t={t}s {sum(s.records.values())} records", highlight=False) if not realtime else None
        ),
    )
    writer.join()
    err.print(f"simulator: published {stats.records} in {stats.wall_s:.1f}s")


@simulate_app.command("ledger")
def simulate_ledger(
    out: Path = typer.Argument(..., help="Output file: .json or .csv."),
    nodes: int = typer.Option(8, "--nodes"),
    seed: int = typer.Option(1, "--seed"),
    duration: int = typer.Option(7200, "--duration"),
    start: str | None = typer.Option(None, "--start"),
    cluster: str | None = typer.Option(None, "--cluster"),
    kube_nodes: int = KUBE_NODES_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Write the expected ledger of a simulation without publishing anything."""
    from producers.simulator import write_ledger

    cfg, _ = _sim_config(seed, nodes, duration, start, False, cluster, state_dir, kube_nodes)
    typer.echo(str(write_ledger(cfg, out)))


def _targets_from(
    targets_file: Path | None,
    target: list[str],
    settings: Settings,
    inventory: str | None = None,
    inventory_kind: str = "static",
    url_template: str = "http://{node}:9400/metrics",
) -> list[Any]:
    from producers.scraper import Target, parse_targets

    out = []
    if inventory is not None:
        from producers.inventory import inventory_records

        recs = inventory_records(inventory_kind, _read_source(inventory, 10.0), settings.cluster, 0)
        nodes = [r["node"] for _, _, r in recs if r["devices"]]
        out.extend(parse_targets(json.dumps([{"url_template": url_template, "nodes": nodes}]), origin=inventory))
    if targets_file is not None:
        out.extend(parse_targets(targets_file.read_text(encoding="utf-8"), origin=str(targets_file)))
    for spec in target:
        url, _, node = spec.partition("=")
        out.extend(parse_targets(json.dumps([{"url": url, "node": node or None}]), origin="--target"))
    if not out:
        conf = [t if isinstance(t, str) else t.model_dump(exclude_none=True) for t in settings.dcgm.targets]
        if conf:
            out.extend(parse_targets(json.dumps(conf), origin="settings dcgm.targets"))
    return [Target(t.url, t.node, t.exporter_version) for t in out]


@dcgm_app.command("run")
def dcgm_run(
    targets_file: Path | None = typer.Option(
        None, "--targets", help="YAML: URLs, {url, node, exporter_version} maps, or {url_template, nodes}."
    ),
    target: list[str] = typer.Option([], "--target", help="URL[=node]; repeatable."),
    inventory: str | None = typer.Option(
        None, "--inventory", help="Discover targets: the GPU nodes of an inventory source (file, URL or -)."
    ),
    inventory_kind: str = typer.Option("static", "--inventory-from", help="slurm, kubernetes or static."),
    url_template: str = typer.Option(
        "http://{node}:9400/metrics", "--url-template", help="Exporter URL of an inventory node."
    ),
    interval_s: float = typer.Option(1.0, "--interval", help="Seconds between scrapes of a target."),
    timeout_s: float = typer.Option(0.8, "--timeout", help="Per-scrape timeout, seconds."),
    duration_s: float | None = typer.Option(None, "--duration", help="Stop after this many seconds."),
    state_dir: Path | None = STATE_DIR_OPTION,
    verbose: bool = VERBOSE_OPTION,
) -> None:
    """Scrape dcgm-exporter endpoints at 1 Hz and publish telemetry.device-samples records."""
    import asyncio

    from producers.scraper import DcgmScraper
    from streams.publish import RecordPublisher

    settings = start_service(state_dir, verbose)
    targets = _targets_from(targets_file, target, settings, inventory, inventory_kind, url_template)
    if not targets:
        raise ConfigError("no dcgm targets: give --targets FILE, --target URL, or dcgm.targets in settings")
    publisher = _metered(RecordPublisher(settings.kafka), settings, "dcgm")
    scraper = DcgmScraper(targets, publisher, settings.cluster, interval_s=interval_s, timeout_s=timeout_s)
    try:
        stats = asyncio.run(scraper.run(duration_s))
    finally:
        publisher.flush()
    typer.echo(
        f"dcgm: {stats.ok} scrapes, {stats.failed} failed, {stats.records} records, "
        f"{stats.missed_ticks} missed ticks, unknown metrics {dict(scraper.normalizer.unknown_counts)}"
    )


@nvsmi_app.command("run")
def nvsmi_run(
    node: str = typer.Option(..., "--node", help="Node name to publish under."),
    source: str | None = typer.Option(
        None, "--file", help="Read captured output from a file (- for stdin) instead of running nvidia-smi."
    ),
    fields: str | None = typer.Option(None, "--fields", help="Query fields, for noheader output."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Publish telemetry.device-samples records from `nvidia-smi --query-gpu ... --format=csv -l 1`."""
    import shutil
    import subprocess

    from producers.nvsmi import COMMAND, NvsmiReader
    from schemas.topics import DEVICE_SAMPLES, node_key
    from streams.publish import RecordPublisher

    settings = settings_for(state_dir)
    publisher = RecordPublisher(settings.kafka)
    reader = NvsmiReader(
        cluster=settings.cluster,
        node=node,
        fields=fields.split(",") if fields else None,
        clock_ms=lambda: time.time() * 1000,
    )
    key = node_key(settings.cluster, node)
    count = 0

    def emit(records: list[dict[str, Any]]) -> None:
        nonlocal count
        for rec in records:
            publisher.publish(DEVICE_SAMPLES, key, rec)
            count += 1

    if source is not None:
        stream = sys.stdin if source == "-" else Path(source).open(encoding="utf-8")  # noqa: SIM115
        with stream:
            for line in stream:
                emit(reader.feed(line))
    else:
        if shutil.which(COMMAND[0]) is None:
            raise ConfigError("nvidia-smi is not on PATH (give --file to read captured output)")
        with subprocess.Popen(COMMAND, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                emit(reader.feed(line))
    emit(reader.flush())
    publisher.flush()
    typer.echo(f"nvsmi: {count} records published for {node}")


def _inventory(kind: str, source: str, cluster: str) -> list[Any]:
    from producers.inventory import inventory_records

    text = _read_source(source, 10.0)
    return inventory_records(kind, text, cluster, int(time.time() * 1000))


KIND_OPTION = typer.Option(
    ...,
    "--from",
    help="slurm (scontrol show node / sinfo --json / slurmrestd), "
    "kubernetes (kubectl get nodes -o json) or static (YAML).",
)


@inventory_app.command("show")
def inventory_show(
    source: str = typer.Argument(..., help="File, http(s) URL or - for stdin."),
    kind: str = KIND_OPTION,
    cluster: str | None = typer.Option(None, "--cluster"),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Print the inventory records a source yields, as JSON."""
    recs = _inventory(kind, source, cluster or settings_for(state_dir).cluster)
    typer.echo(json.dumps([r for _, _, r in recs], indent=2))


@inventory_app.command("publish")
def inventory_publish(
    source: str = typer.Argument(..., help="File, http(s) URL or - for stdin."),
    kind: str = KIND_OPTION,
    cluster: str | None = typer.Option(None, "--cluster"),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Publish one inventory record per node to the compacted inventory topic."""
    from streams.publish import RecordPublisher

    settings = settings_for(state_dir)
    recs = _inventory(kind, source, cluster or settings.cluster)
    publisher = RecordPublisher(settings.kafka)
    for topic, key, rec in recs:
        publisher.publish(topic, key, rec)
    publisher.flush()
    typer.echo(f"inventory: {len(recs)} nodes published")
