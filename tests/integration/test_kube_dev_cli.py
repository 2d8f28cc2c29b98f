"""`gpuledger dev kube up|status|down` through the real command: the control plane outlives `up`, answers its
admin kubeconfig, refuses a second `up` on the same state dir, and `down` leaves nothing running."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stack.broker import pid_alive
from stack.kube.build import KubeBinaries


def gpuledger(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from gpuledger.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip


def test_dev_kube_up_status_down(kube_binaries: KubeBinaries, tmp_path: Path) -> None:
    state = tmp_path / "kube"
    up = gpuledger("dev", "kube", "up", "--state-dir", str(state))
    try:
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert info["kubeconfig"] == str(state / "kubeconfig-admin")
        assert "ready in" in up.stderr
        pids = json.loads((state / "pids.json").read_text())["pids"]
        assert sorted(pids) == ["etcd", "kube-apiserver", "kueue"] and all(pid_alive(p) for p in pids.values())

        status = gpuledger("dev", "kube", "status", "--state-dir", str(state))
        assert status.returncode == 0 and status.stdout.count("running") == 3, status.stdout
        version = subprocess.run([info["kubectl"], "--kubeconfig", info["kubeconfig"], "get", "--raw", "/version"],
                                 capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert json.loads(version.stdout)["gitVersion"] == "v1.37.2"

        again = gpuledger("dev", "kube", "up", "--state-dir", str(state))
        assert again.returncode == 2 and "already runs" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1
    finally:
        down = gpuledger("dev", "kube", "down", "--state-dir", str(state))
    assert down.returncode == 0 and down.stdout.strip() == "stopped kueue, kube-apiserver, etcd", down.stdout
    assert not any(pid_alive(p) for p in pids.values())
    assert gpuledger("dev", "kube", "status", "--state-dir", str(state)).returncode == 1
    assert gpuledger("dev", "kube", "down", "--state-dir", str(state)).stdout.strip() == "nothing running"
