"""`gpuledger dev slurm up|status|down` through the real command: the cluster outlives `up` and answers
Slurm's own commands through the SLURM_CONF it prints, a second `up` on the same state dir is refused,
and `down` leaves nothing running, the daemons nor a job that was still running."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fixtures_cli import run_gpuledger

from stack.broker import pid_alive
from stack.slurm.cluster import PROCESSES, SlurmClient, SlurmConfig, processes_of


def test_dev_slurm_up_status_down(live_slurm: SlurmClient, tmp_path: Path) -> None:
    """(live_slurm: the packages are installed, and two clusters side by side keep to their own ports.)"""
    state = tmp_path / "slurm"
    env = dict(os.environ)
    env.pop("SLURM_CONF", None)
    up = run_gpuledger(["dev", "slurm", "up", "--state-dir", str(state)], env)
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        conf = state / "etc" / "slurm.conf"
        assert info["SLURM_CONF"] == str(conf) and info["gres"] == "gpu:h100:2,gpu:a100:2"
        assert "ready in" in up.stderr
        pids = json.loads((state / "pids.json").read_text())["pids"]
        assert sorted(pids) == sorted(PROCESSES) and all(pid_alive(p) for p in pids.values())

        status = run_gpuledger(["dev", "slurm", "status", "--state-dir", str(state)], env)
        assert status.returncode == 0 and status.stdout.count("running") == len(PROCESSES), status.stdout
        client = SlurmClient(SlurmConfig(state, 0, 0, 0, 0))
        sinfo = client.run("sinfo", "-h", "-o", "%N %G %t").stdout.split()
        assert sinfo == ["gpu-node-1", "gpu:h100:2,gpu:a100:2", "idle"]
        job = client.submit("--gres=gpu:a100:1")
        client.wait_for_state(job, "RUNNING")
        assert processes_of(conf)  # slurmstepd and the job's own processes

        again = run_gpuledger(["dev", "slurm", "up", "--state-dir", str(state)], env)
        assert again.returncode == 2 and "already runs" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1
    finally:
        down = run_gpuledger(["dev", "slurm", "down", "--state-dir", str(state)], env)
    assert down.returncode == 0 and down.stdout.strip() == "stopped slurmd, slurmctld, slurmdbd, mariadbd, munged"
    assert not any(pid_alive(p) for p in pids.values())
    assert processes_of(conf) == []  # nothing of the job left either
    assert not (state / "pids.json").exists()  # `status` has nothing to report: exit 1
    # the other cluster never noticed
    assert subprocess.run(["sinfo", "-h", "-o", "%t"], env=live_slurm.env, capture_output=True, text=True,
                          timeout=30, check=False).stdout.strip() in ("idle", "mix", "alloc")  # fmt: skip
