"""The local Slurm of the tests and of developers (munge, MariaDB, slurmdbd, slurmctld, slurmd).

`cluster.LocalSlurm` runs Debian's packages on loopback in a directory of its own; `cluster.SlurmClient`
runs Slurm's commands against it; `cli` is `gpuledger dev slurm`.
"""

from __future__ import annotations

from pathlib import Path

from base.errors import ConfigError


def deploy_dir() -> Path:
    """`deploy/slurm` of this checkout: the prolog/epilog hooks the cluster installs."""
    here = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
    if not (here / "gpuledger_hook.py").is_file():
        raise ConfigError(f"the Slurm hooks are not at {here}; run gpuledger from a checkout of the project")
    return here
