"""`gpuledger dev kube up|down|status`: the tests' local Kubernetes control plane, for developers.

`up` builds the binaries once per machine (about 8 minutes cold on 2 cores; `--jobs` sets how many
compile at once, at low priority), starts etcd, kube-apiserver and Kueue in `--state-dir` on loopback
ports of their own, prints the admin kubeconfig, and returns; `down` stops them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer

from base.errors import ConfigError

dev_app = typer.Typer(help="Developer tools: local services the tests use.", no_args_is_help=True)
kube_app = typer.Typer(help="A local Kubernetes control plane (etcd, kube-apiserver, Kueue).", no_args_is_help=True)
dev_app.add_typer(kube_app, name="kube")

STATE_DIR = typer.Option(..., "--state-dir", help="Directory for the cluster's data, keys, kubeconfigs, logs.")


def _progress(message: str) -> None:
    typer.echo(message, err=True)


@kube_app.command("build")
def build(
    jobs: int = typer.Option(1, "--jobs", min=1, help="Go packages compiled at once (at low priority)."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build again even when cached."),
    detach: bool = typer.Option(
        False, "--detach", help="Build in the background and return at once (`make test` runs the other tests "
        "meanwhile; the Kubernetes fixtures wait for the build)."),
) -> None:
    """Build the binaries into the user cache (nothing to do when cached); print where they are."""
    from stack.kube.build import (
        CONTROLLER_MANAGER,
        KubeBinaries,
        KubeVersions,
        build_log,
        cache_dir,
        ensure_binaries,
        ensure_controller_manager,
        ensure_kwok,
        is_built,
        kwok_stages,
    )

    if detach and not rebuild:
        root = cache_dir(KubeVersions())
        cached = KubeBinaries(root, None)
        if is_built(root) and cached.bin(CONTROLLER_MANAGER).is_file() and kwok_stages(cached).is_file():
            typer.echo(f"{root} (cached)")
            return
        log_path = build_log()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w", encoding="utf-8") as log:
            argv = [sys.executable, "-m", "gpuledger", "dev", "kube", "build", "--jobs", str(jobs)]
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        typer.echo(f"building the Kubernetes binaries in the background into {root} (log: {log_path})")
        return
    bins = ensure_binaries(jobs=jobs, rebuild=rebuild, progress=_progress)
    ensure_controller_manager(bins, jobs=jobs, progress=_progress)  # the Job controller of the identity tests
    ensure_kwok(bins, jobs=jobs, progress=_progress)  # the kubelet stand-in of the two-engine test
    took = "cached" if bins.build_s is None else f"built in {bins.build_s:.0f} s"
    typer.echo(f"{bins.root} ({took})")


@kube_app.command("up")
def up(
    state_dir: Path = STATE_DIR,
    jobs: int = typer.Option(1, "--jobs", min=1, help="Go packages compiled at once on a first build."),
    rebuild: bool = typer.Option(False, "--rebuild", help="Build the binaries again even when cached."),
) -> None:
    """Build (first time) and start the control plane; print the admin kubeconfig's path."""
    from stack.kube.build import ensure_binaries
    from stack.kube.cluster import ClusterConfig, LocalKube
    from stack.recorded import running

    state_dir = state_dir.resolve()
    if any(alive for _, _, alive in running(state_dir)):
        raise ConfigError(f"a control plane already runs from {state_dir}: `gpuledger dev kube down --state-dir "
                          f"{state_dir}` first")  # fmt: skip
    bins = ensure_binaries(jobs=jobs, rebuild=rebuild, progress=_progress)
    if bins.build_s is not None:
        _progress(f"built in {bins.build_s:.0f} s into {bins.root}")
    kube = LocalKube(ClusterConfig.on_free_ports(state_dir), bins, owned=False, progress=_progress).start()
    _progress(f"ready in {kube.start_s:.1f} s")
    typer.echo(json.dumps({"server": kube.cfg.server, "kubeconfig": str(kube.cfg.kubeconfig()),
                           "kubectl": str(bins.bin("kubectl")), "users": list(kube.cfg.users)}))  # fmt: skip


@kube_app.command("down")
def down(state_dir: Path = STATE_DIR) -> None:
    """Stop the control plane `up` started in --state-dir (its data stays)."""
    from stack import recorded
    from stack.kube.cluster import stop_recorded

    recorded.echo_down(stop_recorded(state_dir.resolve()))


@kube_app.command("status")
def status(state_dir: Path = STATE_DIR) -> None:
    """The processes `up` started and whether each runs; exit 1 when one does not."""
    from stack import recorded

    recorded.echo_status(state_dir.resolve())


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add `gpuledger dev` to the `gpuledger` command."""
    app.add_typer(dev_app, name="dev")
