"""The local Kubernetes control plane's pieces that need no binaries: what it says without Go, the wrapper
modules it builds from, its files (tokens, kubeconfigs, Kueue's configuration) and command lines. The
control plane itself is exercised by tests/integration/test_kube_live_*.py."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from base.errors import DependencyMissing
from stack.kube import build, crd_files, deploy_dir
from stack.kube.build import (
    BINARIES,
    STAGING,
    KubeBinaries,
    KubeVersions,
    _build_lock,
    _ldflags,
    _wrapper,
    cache_dir,
    ensure_binaries,
    find_go,
    is_built,
)
from stack.kube.cluster import ADMIN, USERS, ClusterConfig, apiserver_argv, write_kueue_config, write_tokens


def _no_go_path(tmp_path: Path) -> str:
    """A PATH with nice (the build runs under it) but no go."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return str(bin_dir)


def test_without_go_the_build_says_in_one_line_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _no_go_path(tmp_path))
    with pytest.raises(DependencyMissing, match=r"needs Go >= 1\.26 on PATH: install it"):
        ensure_binaries(cache_root=tmp_path / "cache")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))


def test_the_command_without_go_prints_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=_no_go_path(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", "from gpuledger.cli import main; main()", "dev", "kube", "build"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Go >= 1.26" in lines[0] and "install it" in lines[0], proc.stderr


def test_an_old_go_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "go"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho go1.19.8\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(fake.parent))
    with pytest.raises(DependencyMissing, match=r"found go1\.19\.8"):
        find_go()


def test_the_kubernetes_wrapper_pins_every_staging_module(tmp_path: Path) -> None:
    v = KubeVersions()
    replaces = {f"k8s.io/{n}": v.staging for n in STAGING}
    mod = _wrapper(tmp_path, "kubernetes", {"k8s.io/kubernetes": "v1.37.2"}, replaces)
    text = (mod / "go.mod").read_text()
    assert v.staging == "v0.37.2"
    assert "require k8s.io/kubernetes v1.37.2" in text
    for name in ("api", "client-go", "kube-aggregator", "sample-controller"):
        assert f"replace k8s.io/{name} => k8s.io/{name} v0.37.2\n" in text
    assert len(STAGING) == len(set(STAGING)) == 31


def test_the_binaries_carry_a_version_kueue_accepts() -> None:
    flags = _ldflags("1.37.2")
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {pkg}.gitVersion=v1.37.2 -X {pkg}.gitMajor=1 -X {pkg}.gitMinor=37" in flags


def test_the_cache_is_per_version_and_complete_only_with_every_binary(tmp_path: Path) -> None:
    root = cache_dir(KubeVersions(), tmp_path)
    assert root == tmp_path / "kube-k1.37.2-e3.6.16-q0.17.0"
    assert cache_dir(KubeVersions(kueue="0.18.0"), tmp_path) != root
    (root / "bin").mkdir(parents=True)
    for name in ("etcd", "kube-apiserver", "kubectl"):
        (root / "bin" / name).write_text("")
    (root / ".complete").write_text("1\n")
    assert not is_built(root)
    (root / "bin" / "kueue").write_text("")
    assert is_built(root)
    found = ensure_binaries(cache_root=tmp_path)  # cached: no Go needed, nothing built
    assert found == KubeBinaries(root, None)


def test_tokens_give_admin_masters_and_the_components_nothing_but_a_name(tmp_path: Path) -> None:
    cfg = ClusterConfig(tmp_path, 1, 2, 6443, 4, 5, 6)
    tokens = write_tokens(cfg)
    lines = (tmp_path / "tokens.csv").read_text().splitlines()
    assert lines[0] == f'{tokens[ADMIN]},admin,admin,"system:masters"'
    assert lines[1:] == [f"{tokens[u]},{u},{u}" for u in USERS]
    assert len(set(tokens.values())) == len(tokens)
    assert oct((tmp_path / "tokens.csv").stat().st_mode & 0o777) == "0o600"
    kubeconfig = yaml.safe_load(cfg.kubeconfig("gpuledger-watcher").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert kubeconfig["users"][0]["user"] == {"token": tokens["gpuledger-watcher"]}
    assert write_tokens(cfg) == tokens  # a restart keeps every token


def test_the_apiserver_authorises_by_rbac_on_loopback(tmp_path: Path) -> None:
    cfg = ClusterConfig(tmp_path, 2379, 2380, 6443, 4, 5, 6)
    argv = apiserver_argv(cfg, KubeBinaries(tmp_path, None))
    opts = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert opts["--authorization-mode"] == "RBAC" and opts["--bind-address"] == "127.0.0.1"
    assert opts["--etcd-servers"] == "http://127.0.0.1:2379" and opts["--secure-port"] == "6443"
    assert opts["--token-auth-file"] == str(tmp_path / "tokens.csv")


def test_kueue_listens_on_loopback_only_and_manages_jobs_with_a_queue_name(tmp_path: Path) -> None:
    cfg = ClusterConfig(tmp_path, 1, 2, 3, 9443, 8081, 8443)
    conf = yaml.safe_load(write_kueue_config(cfg).read_text())
    assert conf["webhook"]["host"] == "127.0.0.1" and conf["webhook"]["port"] == 9443
    assert conf["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert conf["metrics"]["bindAddress"] == "127.0.0.1:8443"
    assert conf["leaderElection"]["leaderElect"] is False and conf["manageJobsWithoutQueueName"] is False
    assert "batch/job" in conf["integrations"]["frameworks"]
    assert (tmp_path / "pki" / "kueue-webhook" / "tls.crt").is_file()


def test_the_crds_are_kueues_own_then_the_copied_ones(tmp_path: Path) -> None:
    (tmp_path / "crds" / "kueue").mkdir(parents=True)
    (tmp_path / "crds" / "kueue" / "kueue.x-k8s.io_workloads.yaml").write_text("")
    names = [p.name for p in crd_files(KubeBinaries(tmp_path, None))]
    assert names == [
        "kueue.x-k8s.io_workloads.yaml", "jobset-v0.12.0_jobset.x-k8s.io_jobsets.yaml",
        "volcano-v1.15.1_batch.volcano.sh_jobs.yaml", "volcano-v1.15.1_bus.volcano.sh_commands.yaml",
        "volcano-v1.15.1_scheduling.volcano.sh_podgroups.yaml", "volcano-v1.15.1_scheduling.volcano.sh_queues.yaml",
    ]  # fmt: skip
    assert (deploy_dir() / "crds" / "PROVENANCE.md").is_file()


def test_a_second_build_waits_for_the_first_and_finds_the_binaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make test` builds in the background while the tests run; a fixture that needs the binaries meanwhile
    waits for that build instead of starting a second one (a Go that does not exist: nothing may compile)."""
    monkeypatch.setattr(build, "find_go", lambda: str(tmp_path / "no-such-go"))
    root = cache_dir(KubeVersions(), tmp_path)
    holding = threading.Event()

    def first_build() -> None:
        with _build_lock(root, lambda _: None):
            holding.set()
            time.sleep(0.5)
            (root / "bin").mkdir(parents=True)
            for name in BINARIES:
                (root / "bin" / name).write_text("")
            (root / ".complete").write_text("1\n")

    first = threading.Thread(target=first_build)
    first.start()
    assert holding.wait(10)
    said: list[str] = []
    found = ensure_binaries(cache_root=tmp_path, progress=said.append)
    first.join()
    assert found == KubeBinaries(root, None)
    assert len(said) == 1 and said[0].startswith("waiting for the Kubernetes build already running")
