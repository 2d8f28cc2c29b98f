"""Telemetry commands: `inspect dcgm`, `simulate run|ledger`, `dcgm run`, `nvsmi run`, `inventory publish|show`.

Each command parses its options and calls one function of `producers/telemetry_service.py`; `register` only
wires them. The DCGM targets come from the command line, else the settings' `dcgm.targets`.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from base.cli_common import STATE_DIR_OPTION, VERBOSE_OPTION, settings_for, start_service
from base.errors import ConfigError
from producers import telemetry_service as service

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
    norm, node, record = service.scrape(source, timeout_s=timeout_s, exporter_version=exporter_version,
                                        cluster=cluster)  # fmt: skip
    if as_json:
        typer.echo(
            json.dumps({"record": record, "warnings": norm.warnings, "unknown_metrics": norm.unknown_metrics}, indent=2)
        )
        return
    from producers.present import dcgm_scrape

    dcgm_scrape(node, norm, exporter_version)


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
    clusters: int = typer.Option(
        1,
        "--clusters",
        min=1,
        max=65536,
        help="Send every record as this many clusters (<cluster>, <cluster>-c1, ...; GPU UUIDs their own): a "
        "fleet for load tests at the cost of simulating one cluster. Each copy's ledger is the expected one.",
    ),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Publish a simulated cluster's inventory, job events and device samples to Kafka."""
    settings = settings_for(state_dir)
    cfg = service.sim_config(settings, seed=seed, nodes=nodes, duration=duration, start=start, realtime=realtime,
                             cluster=cluster, kube_nodes=kube_nodes)  # fmt: skip
    if backfill and (not realtime or start is not None):
        raise ConfigError("--backfill goes with --realtime and no --start (it starts in the past itself)")
    err = Console(stderr=True)
    stats = service.simulate(settings, cfg, realtime=realtime, backfill=backfill, ledger=ledger, clusters=clusters,
                             say=lambda line: err.print(line, highlight=False))  # fmt: skip
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

    cfg = service.sim_config(settings_for(state_dir), seed=seed, nodes=nodes, duration=duration, start=start,
                             realtime=False, cluster=cluster, kube_nodes=kube_nodes)  # fmt: skip
    typer.echo(str(write_ledger(cfg, out)))


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
    settings = start_service(state_dir, verbose)
    targets = service.targets_from(targets_file, target, settings, inventory, inventory_kind, url_template)
    stats, unknown = service.scrape_dcgm(settings, targets, interval_s=interval_s, timeout_s=timeout_s,
                                         duration_s=duration_s)  # fmt: skip
    typer.echo(
        f"dcgm: {stats.ok} scrapes, {stats.failed} failed, {stats.records} records, "
        f"{stats.missed_ticks} missed ticks, unknown metrics {unknown}"
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
    count = service.publish_nvsmi(settings_for(state_dir), node, source=source, fields=fields)
    typer.echo(f"nvsmi: {count} records published for {node}")


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
    recs = service.inventory(kind, source, cluster or settings_for(state_dir).cluster)
    typer.echo(json.dumps([r for _, _, r in recs], indent=2))


@inventory_app.command("publish")
def inventory_publish(
    source: str = typer.Argument(..., help="File, http(s) URL or - for stdin."),
    kind: str = KIND_OPTION,
    cluster: str | None = typer.Option(None, "--cluster"),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Publish one inventory record per node to the compacted inventory topic."""
    settings = settings_for(state_dir)
    recs = service.inventory(kind, source, cluster or settings.cluster)
    service.publish_inventory(settings, recs)
    typer.echo(f"inventory: {len(recs)} nodes published")
