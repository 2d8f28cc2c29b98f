"""What the telemetry commands run (`producers/telemetry_cli.py`): a scrape read from a file, URL or stdin, the
simulator run or its expected ledger, the dcgm-exporter scraper over its targets, nvidia-smi's output and the
inventory published, each publisher counted on /metrics when metrics are on.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from base.errors import ConfigError, ServiceError
from base.settings import Settings


def read_source(source: str, timeout_s: float) -> str:
    """A file, a http(s) URL (scraped) or - (stdin), as text."""
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


def telemetry_publisher(settings: Settings) -> Any:
    """The publisher of every telemetry command here: the project's producer with `kafka.telemetry`'s compression
    and linger (base.settings.TelemetryProducerSettings: zstd, 20 ms by default)."""
    from streams.publish import RecordPublisher

    return RecordPublisher(settings.kafka, telemetry=True)


def metered(publisher: Any, settings: Settings, component: str) -> Any:
    """Count records out per topic and serve them on this process's /metrics (base/metrics.py)."""
    if not settings.metrics.enabled:
        return publisher
    from base import metrics

    counted = metrics.CountingPublisher(publisher, metrics.component(component), settings.kafka.topic_prefix)
    metrics.start_metrics_server(settings, component)
    return counted


def scrape(source: str, *, timeout_s: float, exporter_version: str | None, cluster: str) -> tuple[Any, str, Any]:
    """`inspect dcgm`: one dcgm-exporter scrape normalized; (the normalized scrape, its node, the record)."""
    from producers.dcgm import normalize_text, scrape_record

    norm = normalize_text(read_source(source, timeout_s), exporter_version=exporter_version)
    node = norm.hostname or "unknown"
    record = scrape_record(
        cluster=cluster,
        node=node,
        ts_ms=int(time.time() * 1000),
        normalized=norm,
        exporter_version=exporter_version,
    )
    return norm, node, record


# -- the simulator --------------------------------------------------------------------------------


def parse_start(text: str | None, realtime: bool) -> int:
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


def sim_config(settings: Settings, *, seed: int, nodes: int, duration: int, start: str | None, realtime: bool,
               cluster: str | None, kube_nodes: int = 0) -> Any:  # fmt: skip
    from producers.simulator import SimConfig

    return SimConfig(
        seed=seed,
        nodes=nodes,
        duration_s=duration,
        start_ms=parse_start(start, realtime),
        cluster=cluster or settings.cluster,
        kube_nodes=kube_nodes,
    )


def simulate(settings: Settings, cfg: Any, *, realtime: bool, backfill: int, ledger: Path | None,
             say: Callable[[str], None], clusters: int = 1) -> Any:  # fmt: skip
    """`simulate run`: the simulated clusters' inventory, job events and device samples published, the expected
    ledger written beside it (`ledger`, default <state-dir>/simulator/expected-ledger.json); with `backfill`, a
    restart on the same state dir continues the run; with `clusters` > 1, every record also goes out as the
    copies of producers/simulator/fleet.py (each copy's ledger is the one written). `say`: progress lines. The
    run's counters."""
    import multiprocessing

    from producers.simulator import run, write_ledger

    resume_s, on_flushed = 0, None
    if backfill:
        # A restart on the same state dir continues the run instead of publishing the history again.
        from producers.simulator import position

        where = settings.state_dir / "simulator" / "position.json"
        plan = position.restart(position.load(where), cfg, int(time.time() * 1000), backfill)
        cfg, resume_s, backfill = plan.cfg, plan.resume_s, plan.backfill_s
        say(f"simulator: {plan.why}")

        def on_flushed(through_ms: int, cfg: Any = cfg) -> None:
            position.save(where, position.position_of(cfg, through_ms))

    path = ledger or settings.state_dir / "simulator" / "expected-ledger.json"
    # The ledger of a long run takes a while: write it beside the publishing, not before it, and in a process of
    # its own: a thread would hold the interpreter for seconds at a time and real-time publishing would fall behind.
    # Forked before the Kafka client starts its threads.
    writer = multiprocessing.get_context("fork").Process(target=write_ledger, args=(cfg, path), name="expected-ledger",
                                                         daemon=True)  # fmt: skip
    writer.start()
    say(
        f"simulator: {cfg.cluster} ({cfg.nodes} nodes)"
        + (f" and {cfg.cluster}-k8s ({cfg.kube_nodes} Kubernetes nodes)" if cfg.kube_nodes else "")
        + f", {cfg.duration_s} s from "
        f"{datetime.fromtimestamp(cfg.start_ms / 1000, UTC).isoformat()}, expected ledger {path}"
    )
    publisher = telemetry_publisher(settings)
    if clusters > 1:
        from producers.simulator.fleet import FleetPublisher

        if cfg.kube_nodes:
            raise ConfigError("--clusters copies one Slurm-like cluster: give it without --kube-nodes")
        publisher = FleetPublisher(publisher, cfg.cluster, clusters)
        say(f"simulator: every record sent as {clusters} clusters ({cfg.cluster}, {cfg.cluster}-c1 ... "
            f"{cfg.cluster}-c{clusters - 1}): {clusters * cfg.nodes * cfg.gpus_per_node:,} GPUs")  # fmt: skip
    publisher = metered(publisher, settings, "simulator")
    stats = run(
        cfg,
        publisher,
        realtime=realtime,
        backfill_s=backfill,
        resume_s=resume_s,
        on_flushed=on_flushed,
        progress=lambda t, s: say(f"  t={t}s {sum(s.records.values())} records") if not realtime else None,
    )
    writer.join()
    if writer.exitcode:
        raise ServiceError(f"simulator: the expected ledger was not written (its process exited {writer.exitcode})")
    return stats


# -- dcgm-exporter and nvidia-smi -----------------------------------------------------------------


def targets_from(
    targets_file: Path | None,
    target: list[str],
    settings: Settings,
    inventory: str | None = None,
    inventory_kind: str = "static",
    url_template: str = "http://{node}:9400/metrics",
) -> list[Any]:
    """The scrape targets: an inventory's GPU nodes, a targets file, `--target URL[=node]`s, else the settings'."""
    from producers.scraper import Target, parse_targets

    out = []
    if inventory is not None:
        from producers.inventory import inventory_records

        recs = inventory_records(inventory_kind, read_source(inventory, 10.0), settings.cluster, 0)
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


def scrape_dcgm(settings: Settings, targets: list[Any], *, interval_s: float, timeout_s: float,
                duration_s: float | None) -> tuple[Any, dict[str, int]]:  # fmt: skip
    """`dcgm run`: the targets scraped every `interval_s` into device samples (for `duration_s`, else until
    stopped); (the scraper's counters, the metrics no mapping knew and how often)."""
    import asyncio

    from producers.scraper import DcgmScraper

    if not targets:
        raise ConfigError("no dcgm targets: give --targets FILE, --target URL, or dcgm.targets in settings")
    publisher = metered(telemetry_publisher(settings), settings, "dcgm")
    scraper = DcgmScraper(targets, publisher, settings.cluster, interval_s=interval_s, timeout_s=timeout_s)
    try:
        stats = asyncio.run(scraper.run(duration_s))
    finally:
        publisher.flush()
    return stats, dict(scraper.normalizer.unknown_counts)


def publish_nvsmi(settings: Settings, node: str, *, source: str | None, fields: str | None) -> int:
    """`nvsmi run`: `nvidia-smi --query-gpu ... --format=csv -l 1` (or its captured output, `source`) published as
    device samples of `node`; how many records."""
    import shutil
    import subprocess

    from producers.nvsmi import COMMAND, NvsmiReader
    from schemas.topics import DEVICE_SAMPLES, node_key

    publisher = telemetry_publisher(settings)
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
    return count


# -- inventory ------------------------------------------------------------------------------------


def inventory(kind: str, source: str, cluster: str) -> list[Any]:
    """The inventory records (topic, key, record) a source yields."""
    from producers.inventory import inventory_records

    text = read_source(source, 10.0)
    return inventory_records(kind, text, cluster, int(time.time() * 1000))


def publish_inventory(settings: Settings, recs: list[Any]) -> None:
    publisher = telemetry_publisher(settings)
    for topic, key, rec in recs:
        publisher.publish(topic, key, rec)
    publisher.flush()
