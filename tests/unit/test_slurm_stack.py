"""The live Slurm's configuration and install story (stack/slurm/cluster.py), without daemons."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.errors import DependencyMissing
from stack.slurm import cluster
from stack.slurm.cluster import SlurmConfig, gres_conf_text, slurm_conf_text


def conf(tmp_path: Path, **kw: object) -> SlurmConfig:
    return SlurmConfig(tmp_path, 6817, 6818, 6819, 3306, **kw)  # type: ignore[arg-type]


def test_slurm_conf_has_what_the_tests_rely_on(tmp_path: Path) -> None:
    cfg = conf(tmp_path, hooks_dir=tmp_path / "hooks")
    text = slurm_conf_text(cfg).splitlines()
    for line in ("JobSubmitPlugins=lua", "PreemptType=preempt/qos", "PreemptMode=REQUEUE", "GresTypes=gpu",
                 "AccountingStorageType=accounting_storage/slurmdbd", "SlurmctldPort=6817", "SlurmdPort=6818",
                 "AccountingStorageEnforce=associations,limits,qos", "AccountingStoragePort=6819",
                 "AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:a100", f"Prolog={tmp_path}/etc/prolog",
                 f"AuthInfo=socket={cfg.munge_socket}", f"AccountingStoragePass={cfg.munge_socket}",
                 f"SlurmdSpoolDir={cfg.slurmd_spool}"):  # fmt: skip
        assert line in text, line
    assert any(x.startswith("NodeName=gpu-node-1 ") and "Gres=gpu:h100:2,gpu:a100:2" in x for x in text)


def test_sockets_stay_within_the_unix_path_limit_whatever_the_state_dir() -> None:
    short = conf(Path("/srv/gl"))
    assert short.sockets_dir == Path("/srv/gl") and short.munge_socket == Path("/srv/gl/munge/munge.socket")
    long_dir = Path("/tmp/pytest-of-root/pytest-255/popen-gw3/test_dev_slurm_up_status_down0/slurm")
    long = conf(long_dir)
    assert long.sockets_dir != long_dir and long.sockets_dir == conf(long_dir).sockets_dir  # stable per state dir
    assert conf(long_dir / "other").sockets_dir != long.sockets_dir
    # slurmstepd's socket for the largest job and step ids, MariaDB's and munge's: each under sun_path's 108 bytes
    step = long.slurmd_spool / "gpu-node-1_4294967295.4294967291"
    assert all(len(str(p)) < cluster.UNIX_PATH_MAX for p in (step, long.mysql_socket, long.munge_socket))
    assert len(str(long_dir / "slurmd" / step.name)) >= cluster.UNIX_PATH_MAX  # what the state dir would have given


def test_without_accounting_or_gpu_tres(tmp_path: Path) -> None:
    off = slurm_conf_text(conf(tmp_path, accounting=False))
    assert "AccountingStorageType=accounting_storage/none" in off and "slurmdbd" not in off
    assert "Prolog=" not in off
    assert "AccountingStorageTRES" not in slurm_conf_text(conf(tmp_path, gpu_tres=False))


def test_gres_conf_numbers_the_gpus_in_order(tmp_path: Path) -> None:
    lines = gres_conf_text(conf(tmp_path, gpus=(("h100", 2), ("a100", 1)))).splitlines()
    assert lines == ["AutoDetect=off", f"NodeName=gpu-node-1 Name=gpu Type=h100 File={tmp_path}/dev/nvidia[0-1]",
                     f"NodeName=gpu-node-1 Name=gpu Type=a100 File={tmp_path}/dev/nvidia2"]  # fmt: skip


def test_missing_packages_without_root_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "find_binary", lambda name: None if name in ("slurmdbd", "munged") else "/x")
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 1000)
    assert cluster.missing_packages() == ["munge", "slurmdbd"]
    with pytest.raises(DependencyMissing) as err:
        cluster.ensure_installed()
    message = str(err.value)
    assert "\n" not in message and "munge, slurmdbd" in message
    assert "apt-get install -y slurm-wlm slurmdbd munge mariadb-server slurm-client" in message


def test_nothing_to_install_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster, "find_binary", lambda name: "/usr/bin/" + name)

    def no_apt(*a: object, **k: object) -> None:
        raise AssertionError("apt-get ran")

    monkeypatch.setattr(cluster.subprocess, "run", no_apt)
    cluster.ensure_installed()
