"""`gpuledger dev slurm up|down|status`: the tests' live one-node Slurm, for developers.

`up` installs Debian's packages when missing (as root, with apt-get), starts munge, MariaDB, slurmdbd,
slurmctld and slurmd in `--state-dir` on loopback ports of their own, prints the `SLURM_CONF` that points
Slurm's commands (and `gpuledger slurm poll`) at it, and returns; `down` stops them and their jobs.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from base.errors import ConfigError
from stack.kube.cli import dev_app

slurm_app = typer.Typer(help="A live one-node Slurm (munge, MariaDB, slurmdbd, slurmctld, slurmd).",
                        no_args_is_help=True)  # fmt: skip
dev_app.add_typer(slurm_app, name="slurm")

STATE_DIR = typer.Option(..., "--state-dir", help="Directory for the cluster's configuration, data and logs.")


def _progress(message: str) -> None:
    typer.echo(message, err=True)


@slurm_app.command("up")
def up(
    state_dir: Path = STATE_DIR,
    hooks: bool = typer.Option(True, "--hooks/--no-hooks", help="Install deploy/slurm's prolog/epilog."),
) -> None:
    """Start the cluster (installing the packages first when missing); print SLURM_CONF and the spool."""
    from stack.recorded import running
    from stack.slurm import deploy_dir
    from stack.slurm.cluster import LocalSlurm, SlurmConfig, ensure_installed

    state_dir = state_dir.resolve()
    if any(alive for _, _, alive in running(state_dir)):
        raise ConfigError(f"a Slurm already runs from {state_dir}: `gpuledger dev slurm down --state-dir "
                          f"{state_dir}` first")  # fmt: skip
    ensure_installed(progress=_progress)
    cfg = SlurmConfig.on_free_ports(state_dir, hooks_dir=deploy_dir() if hooks else None)
    slurm = LocalSlurm(cfg, owned=False, progress=_progress).start()
    _progress(f"ready in {slurm.start_s:.1f} s; export SLURM_CONF={cfg.slurm_conf}")
    typer.echo(json.dumps({"SLURM_CONF": str(cfg.slurm_conf), "cluster": cfg.cluster_name, "gres": cfg.gres,
                           "spool": str(cfg.spool), "job_submit_lua": str(cfg.job_submit_lua)}))  # fmt: skip


@slurm_app.command("down")
def down(state_dir: Path = STATE_DIR) -> None:
    """Stop the daemons `up` started in --state-dir, and their jobs (the data stays)."""
    from stack import recorded
    from stack.slurm.cluster import stop_recorded

    recorded.echo_down(stop_recorded(state_dir.resolve()))


@slurm_app.command("status")
def status(state_dir: Path = STATE_DIR) -> None:
    """The processes `up` started and whether each runs; exit 1 when one does not."""
    from stack import recorded

    recorded.echo_status(state_dir.resolve())


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """`gpuledger dev slurm` (its `dev` group is registered by stack.kube.cli)."""
    return None
