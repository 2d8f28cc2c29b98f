"""`gpuledger dev two-engines`: the live Slurm and a Kubernetes control plane with Kueue feeding one ledger, for a
person (what tests/integration/test_two_engines_live.py runs; stack/two_engines.py says what runs).

It starts, in `--state-dir`: the local stack (`gpuledger up`, its broker, ClickHouse and pipeline; no simulator),
the live Slurm (`slurm/`), the control plane (`kube/`) with the Job controller and KWOK, the simulated exporters and
the producers of both clusters; prints how to submit work to each; and stops everything on Ctrl-C (or after
`--duration` seconds), `gpuledger down` included.

With `--scenarios` it also submits the test's work itself (stack/two_engines_scenarios.py: a gang on each engine,
alice on both, a preemption and a requeue on each, a reclaim on each, a correction), with the scenarios' directory,
projects and a rate card of 1 $ a GPU-second loaded, waits until the ledger holds every job, and prints each job's
GPU-seconds as the engine ran them (sacct -D, the pod's status) beside the ledger's, then `report chargeback --by
cluster`. It exits 1 when a job's seconds differ (after stopping everything).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from stack.kube.cli import dev_app

if TYPE_CHECKING:
    from stack.two_engines import TwoEngines

STATE_DIR = typer.Option(..., "--state-dir", help="Directory for everything: stack/, slurm/, kube/, logs/.")


def _progress(message: str) -> None:
    typer.echo(message, err=True)


@dev_app.command("two-engines")
def two_engines(
    state_dir: Path = STATE_DIR,
    slurm_cluster: str = typer.Option("live-slurm", "--slurm-cluster", help="The Slurm cluster's ledger name."),
    kube_cluster: str = typer.Option("live-kube", "--kube-cluster", help="The Kubernetes cluster's ledger name."),
    duration: float | None = typer.Option(None, "--duration", help="Stop after this many seconds (default: Ctrl-C)."),
    scenarios: bool = typer.Option(
        False, "--scenarios", help="Submit the two-engine test's work and print the ledger beside the engines' own."
    ),
) -> None:
    """Run both live engines into one ledger until Ctrl-C: `up`, the live Slurm, Kubernetes with Kueue and KWOK,
    simulated exporters, the producers of both (with --scenarios: the test's work on both, checked)."""
    from stack.components import gpuledger_argv
    from stack.kube.build import ensure_binaries
    from stack.kube.cluster import ADMIN, ClusterConfig, LocalKube
    from stack.slurm import deploy_dir
    from stack.slurm.cluster import LocalSlurm, SlurmConfig, ensure_installed
    from stack.two_engines import KUBE_NODE, Clusters, TwoEngines, environ_without_gpuledger
    from stack.two_engines_scenarios import SiteFiles

    state_dir = state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {**environ_without_gpuledger(), **{k: v for k, v in os.environ.items() if k.startswith("GPULEDGER_")},
           "GPULEDGER_STATE_DIR": str(state_dir / "stack"), "GPULEDGER_CLUSTER": slurm_cluster}  # fmt: skip
    suffix = uuid.uuid4().hex[:6]  # the scenarios' teams, projects and QOS: new names each run
    site = SiteFiles.write(state_dir / "scenarios", suffix) if scenarios else None
    if site is not None:
        env.update(site.env())
    differs = False
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    _progress("the local stack: gpuledger up (broker, ClickHouse, topics, pipeline)")
    up = subprocess.run(gpuledger_argv("up"), env=env, check=False)
    if up.returncode != 0:
        raise typer.Exit(up.returncode)
    try:
        if site is not None:
            subprocess.run(gpuledger_argv("ratecard", "load", "--card", str(site.card)), env=env, check=True)
        ensure_installed(progress=_progress)
        bins = ensure_binaries(progress=_progress)
        slurm_cfg = SlurmConfig.on_free_ports(state_dir / "slurm", hooks_dir=deploy_dir(), cluster_name=slurm_cluster)
        kube_cfg = ClusterConfig.on_free_ports(state_dir / "kube")
        with LocalSlurm(slurm_cfg, progress=_progress) as slurm, LocalKube(kube_cfg, bins, progress=_progress) as kube:
            clusters = Clusters(slurm=slurm_cluster, kube=kube_cluster)
            with TwoEngines(slurm.client, kube, bins, env, state_dir, clusters=clusters,
                            progress=_progress) as engines:  # fmt: skip
                typer.echo(
                    f"Both engines feed one ledger (clusters {slurm_cluster} and {kube_cluster}).\n"
                    f"  Slurm:      export SLURM_CONF={slurm_cfg.slurm_conf}; "
                    "sbatch --gres=gpu:h100:1 --wrap 'sleep 60'\n"
                    f"  Kubernetes: export KUBECONFIG={kube.cfg.kubeconfig(ADMIN)}; a Job with suspend: true, the "
                    f"label kueue.x-k8s.io/queue-name, spec.template.spec.nodeName: {KUBE_NODE} and an "
                    "nvidia.com/gpu limit (KWOK runs its pods; the annotation pod-complete.stage.kwok.x-k8s.io/delay "
                    "says for how long, as a Go duration: 30s)\n"
                    f"  The ledger: GPULEDGER_STATE_DIR={state_dir / 'stack'} gpuledger report chargeback --by "
                    "cluster --period YYYY-MM\n"
                    f"  Logs: {state_dir / 'logs'}, {slurm_cfg.path('logs')}, {kube.cfg.state_dir / 'logs'}\n"
                    "Ctrl-C stops everything."
                )  # fmt: skip
                if scenarios:
                    differs = not _run_scenarios(engines, suffix, state_dir / "stack")
                stop.wait(duration)
    finally:
        _progress("stopping: gpuledger down")
        subprocess.run(gpuledger_argv("down"), env=env, check=False)
    if differs:
        raise typer.Exit(1)


def _run_scenarios(engines: TwoEngines, suffix: str, stack_dir: Path, timeout: float = 180) -> bool:
    """The test's work on both engines, then each job's GPU-seconds as the engine ran it beside the ledger's (waited
    for until they agree, or `timeout`), and the chargeback by team and cluster. True when every job agrees."""
    import datetime as dt
    import time

    from base.settings import load_settings
    from sinks.db import connect
    from stack.two_engines_scenarios import (
        expected,
        job_story,
        ledger_seconds,
        run_scenarios,
        side_by_side,
        slurm_teardown,
    )

    work = run_scenarios(engines, suffix, progress=_progress)
    want = expected(engines, work)
    settings = load_settings(stack_dir)
    _progress("the ledger: waiting for every job's last minute to close")
    deadline = time.monotonic() + timeout
    while True:
        client = connect(settings.clickhouse, analyst=True)
        try:
            got = ledger_seconds(client)
            agree = all(got.get(key) == seconds for key, seconds in want.seconds.items())
            if agree or time.monotonic() > deadline:
                story = [line for key in sorted(want.seconds) if got.get(key) != want.seconds[key]
                         for line in job_story(client, *key)]  # fmt: skip
                break
        finally:
            client.close()
        time.sleep(2)
    slurm_teardown(engines.slurm, suffix, work.person)
    typer.echo("\n".join([*side_by_side(want, got), *story]))
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")
    report = engines.run_cli(engines.clusters.slurm, "report", "chargeback", "--period", period, "--by", "cluster")
    typer.echo(report.stdout)
    typer.echo("The ledger matches both engines' own accounting, job by job." if agree else
               f"The ledger differs from the engines' accounting (waited {timeout:g} s).")  # fmt: skip
    return agree


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """`gpuledger dev two-engines` (its `dev` group is registered by stack.kube.cli)."""
    return None
