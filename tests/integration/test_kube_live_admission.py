"""The admission policy `gpuledger policy render` writes, applied as is to a real API server (its own CEL
engine judges it): strict denies a GPU pod, Job or JobSet with no project or an unknown one and admits a good
one; grace admits them with a warning the client sees. Applied by the gpuledger-policy user, whose ClusterRole
(deploy/kubernetes/rbac/policy.yaml) is all it has."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_kube import gpu_pod, make_namespace

from stack.kube.cluster import LocalKube

PROJECT_LABEL = "gpuledger.io/project"
POLICY = "gpuledger-require-project"
REGISTRY = "projects:\n  - id: atlas\n  - id: borealis\ndefaults: {}\n"


def render(tmp_path: Path, mode: str) -> str:
    reg = tmp_path / "projects.yaml"
    reg.write_text(REGISTRY, encoding="utf-8")
    out = tmp_path / mode
    proc = subprocess.run(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", "policy", "render", "--registry", str(reg),
         "--mode", mode, "--out", str(out), "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return (out / "gpuledger-admission-policy.yaml").read_text(encoding="utf-8")


def job(name: str, ns: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    template = {"metadata": {"labels": labels or {}}, "spec": {"restartPolicy": "Never", "containers": [
        {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}  # fmt: skip
    meta = {"name": name, "namespace": ns, "labels": labels or {}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": {"suspend": True, "template": template}}


def jobset(name: str, ns: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    template = job("x", ns)["spec"]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": ns, "labels": labels or {}},
            "spec": {"suspend": True, "replicatedJobs": [{"name": "workers", "replicas": 2,
                                                          "template": {"spec": template}}]}}  # fmt: skip


def create(kube: LocalKube, obj: dict[str, Any], *, dry_run: bool = False) -> subprocess.CompletedProcess[str]:
    args = ["create", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return kube.kubectl(*args, input=yaml.safe_dump(obj), check=False)


def apply_policy(kube: LocalKube, text: str, ns: str, effective: str) -> None:
    """Apply as gpuledger-policy, then wait until the API server enforces it: a probe pod with no project,
    created with --dry-run=server, is denied (strict) or warned about (grace)."""
    kube.apply(text, user="gpuledger-policy")
    probe = gpu_pod("probe", ns)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = create(kube, probe, dry_run=True)
        if effective in result.stderr:
            return
        time.sleep(0.25)
    raise AssertionError(f"the policy was not enforced within 30 s: {result.stderr}")


def remove_policy(kube: LocalKube, ns: str) -> None:
    """Delete the policy (the session's other tests run without it) and wait until it no longer applies."""
    kube.kubectl("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", POLICY, "--ignore-not-found")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = create(kube, gpu_pod("probe", ns), dry_run=True)
        if result.returncode == 0 and "Warning" not in result.stderr:
            return
        time.sleep(0.25)
    raise AssertionError(f"the policy still applies 30 s after its deletion: {result.stderr}")


@pytest.fixture
def strict(local_kube: LocalKube, tmp_path: Path) -> Iterator[str]:
    ns = make_namespace(local_kube, "adm")
    apply_policy(local_kube, render(tmp_path, "strict"), ns, "denied request")
    yield ns
    remove_policy(local_kube, ns)


@pytest.fixture
def grace(local_kube: LocalKube, tmp_path: Path) -> Iterator[str]:
    ns = make_namespace(local_kube, "adm")
    apply_policy(local_kube, render(tmp_path, "grace"), ns, "Warning:")
    yield ns
    remove_policy(local_kube, ns)


def test_strict_denies_gpu_pods_jobs_and_jobsets_without_a_valid_project(local_kube: LocalKube, strict: str) -> None:
    ns = strict
    for obj in (gpu_pod("p-none", ns), job("j-none", ns), jobset("js-none", ns)):
        result = create(local_kube, obj)
        assert result.returncode != 0, f"{obj['kind']} without a project was admitted"
        assert "gpuledger: this GPU workload names no project" in result.stderr
        assert f"Add the label {PROJECT_LABEL}=<project>" in result.stderr
    for obj in (gpu_pod("p-bad", ns, labels={PROJECT_LABEL: "nowhere"}),
                job("j-bad", ns, labels={PROJECT_LABEL: "nowhere"})):  # fmt: skip
        result = create(local_kube, obj)
        assert result.returncode != 0
        assert "unknown project 'nowhere'. Use one of: atlas, borealis" in result.stderr
    listed = local_kube.kubectl("-n", ns, "get", "pods,jobs,jobsets", "-o", "name").stdout.split()
    assert listed == []


def test_strict_admits_a_good_project_and_pods_without_gpus(local_kube: LocalKube, strict: str) -> None:
    ns = strict
    good = {PROJECT_LABEL: "atlas"}
    cpu_only = gpu_pod("cpu", ns)
    cpu_only["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    for obj in (gpu_pod("p-good", ns, labels=good), job("j-good", ns, labels=good), jobset("js-good", ns, labels=good),
                cpu_only):  # fmt: skip
        result = create(local_kube, obj)
        assert result.returncode == 0, result.stderr
        assert "Warning" not in result.stderr
    listed = sorted(local_kube.kubectl("-n", ns, "get", "pods,jobs,jobsets", "-o", "name").stdout.split())
    assert listed == ["job.batch/j-good", "jobset.jobset.x-k8s.io/js-good", "pod/cpu", "pod/p-good"]


def test_grace_admits_with_a_warning_the_client_sees(local_kube: LocalKube, grace: str) -> None:
    ns = grace
    for obj in (gpu_pod("p-none", ns), job("j-none", ns), jobset("js-none", ns)):
        result = create(local_kube, obj)
        assert result.returncode == 0, result.stderr
        assert "Warning: Validation failed for ValidatingAdmissionPolicy 'gpuledger-require-project'" in result.stderr
        assert "gpuledger: this GPU workload names no project" in result.stderr
    result = create(local_kube, gpu_pod("p-good", ns, labels={PROJECT_LABEL: "borealis"}))
    assert result.returncode == 0 and "Warning" not in result.stderr
    listed = sorted(local_kube.kubectl("-n", ns, "get", "pods,jobs,jobsets", "-o", "name").stdout.split())
    assert listed == ["job.batch/j-none", "jobset.jobset.x-k8s.io/js-none", "pod/p-good", "pod/p-none"]


def test_the_policy_user_cannot_create_workloads(local_kube: LocalKube, strict: str) -> None:
    result = local_kube.kubectl("create", "-f", "-", user="gpuledger-policy", check=False,
                                input=yaml.safe_dump(gpu_pod("x", strict, labels={PROJECT_LABEL: "atlas"})))
    assert result.returncode != 0 and "Forbidden" in result.stderr
    assert 'User "gpuledger-policy" cannot create resource "pods"' in result.stderr
