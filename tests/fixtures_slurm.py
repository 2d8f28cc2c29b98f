"""A live one-node Slurm (a pytest plugin, listed in tests/conftest.py).

live_slurm    one cluster per session (stack.slurm.cluster.LocalSlurm) in a temporary directory:
              munge, MariaDB, slurmdbd, slurmctld and slurmd from Debian's packages on loopback ports of
              their own; node `gpu-node-1` with `Gres=gpu:h100:2,gpu:a100:2` (GPU indices 0-1 h100, 2-3
              a100), `JobSubmitPlugins=lua` (etc/job_submit.lua accepts everything until a test writes
              another and calls `reconfigure`), `PreemptType=preempt/qos`, accounting through slurmdbd
              with `AccountingStorageEnforce=associations,limits,qos` and the GPU TRES, and the
              prolog/epilog of deploy/slurm spooling into `cfg.spool`. Yields a `SlurmClient`: `env`
              (SLURM_CONF) for Slurm's commands, `sbatch`, `submit`, `state`, `wait_for_state`,
              `gres_indices`, `reconfigure`, `cancel_all`. Stopped by pid after the session (and with the
              test process, even when it is killed), with whatever jobs outlived slurmd.
              Needs root. Missing packages are installed with apt-get (about a minute); without root the
              fixture fails with one line naming what to install.
live_slurm_noacct  a second, smaller cluster (munge, slurmctld, slurmd; no MariaDB, no slurmdbd) whose
              `AccountingStorageType=accounting_storage/none`: `sacct` exits 1 against it. Started on first use.
slurm         per test: `live_slurm` with SLURM_CONF set in this process's environment (so the product's
              own subprocesses find the cluster), every job cancelled after the test.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest

from base.errors import DependencyMissing
from stack.slurm import deploy_dir
from stack.slurm.cluster import LocalSlurm, SlurmClient, SlurmConfig, ensure_installed


@pytest.fixture(scope="session")
def live_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmClient]:
    if os.geteuid() != 0:
        raise DependencyMissing("the live Slurm fixture runs its daemons as root (SlurmUser=root): run the tests "
                                "as root, as CI does")  # fmt: skip
    ensure_installed(progress=lambda m: print(m, file=sys.stderr))
    cfg = SlurmConfig.on_free_ports(tmp_path_factory.mktemp("slurm"), hooks_dir=deploy_dir())
    started = time.monotonic()
    with LocalSlurm(cfg) as cluster:
        print(f"live Slurm up in {time.monotonic() - started:.1f} s ({cfg.state_dir})", file=sys.stderr)
        yield cluster.client


@pytest.fixture(scope="session")
def live_slurm_noacct(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmClient]:
    if os.geteuid() != 0:
        raise DependencyMissing("the live Slurm fixture runs its daemons as root: run the tests as root, as CI does")
    ensure_installed(progress=lambda m: print(m, file=sys.stderr))
    cfg = SlurmConfig.on_free_ports(tmp_path_factory.mktemp("slurm-noacct"), cluster_name="noacct", accounting=False)
    with LocalSlurm(cfg) as cluster:
        yield cluster.client


@pytest.fixture
def slurm(live_slurm: SlurmClient, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmClient]:
    for key, value in live_slurm.cfg.env.items():
        monkeypatch.setenv(key, value)
    yield live_slurm
    live_slurm.cancel_all()
