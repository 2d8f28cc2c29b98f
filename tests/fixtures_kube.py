"""A real Kubernetes control plane (a pytest plugin, listed in tests/conftest.py).

kube_binaries   etcd, kube-apiserver, kubectl and the Kueue controller for the pinned versions
                (stack.kube.build): built from the Go module proxy the first time on a machine
                (about 8 minutes on 2 cores, at low priority; `GPULEDGER_KUBE_BUILD_JOBS` compiles more at
                once), found in `<user cache dir>/gpuledger/kube-<versions>/` after that. Without Go the
                fixture fails with one line saying what to install. `make test` builds first (`make kube`):
                a first build inside pytest would run past a test's 300 s timeout (`--timeout 0` lifts it).
local_kube      one control plane per session (stack.kube.cluster.LocalKube) on loopback ports
                of its own in a temporary directory: etcd, kube-apiserver (RBAC, a static token per user),
                the Kueue controller; Kueue's CRDs from its module, JobSet's and Volcano's from
                deploy/kubernetes/crds; the ClusterRoles of deploy/kubernetes/rbac bound to the users
                gpuledger-watcher, gpuledger-reclaim and gpuledger-policy. Stopped after the session
                (and with the test process, even when it is killed).
kube_ns         a fresh namespace with its `default` ServiceAccount (there is no controller-manager).

Helpers for tests: `run_pod` makes a created pod "run" (no kubelet: nodeName set at creation, status
patched), `gpu_pod` builds a GPU pod manifest; `eventually`, `workload_of` and `condition` are stack.kube.cluster's
(stack/two_engines_scenarios.py waits with them too).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stack.kube import namespace, user_binding
from stack.kube import rbac_manifests as rbac_manifests  # re-exported for the tests
from stack.kube.build import KubeBinaries, ensure_binaries
from stack.kube.cluster import ClusterConfig, LocalKube
from stack.kube.cluster import condition as condition  # re-exported for the tests
from stack.kube.cluster import eventually as eventually
from stack.kube.cluster import workload_of as workload_of

COMPONENT_ROLES = {"gpuledger-watcher": "watcher", "gpuledger-reclaim": "reclaim", "gpuledger-policy": "policy",
                   "gpuledger-policy-watch": "policy-watch", "gpuledger-escalations": "escalations"}  # fmt: skip
NODE = "gpu-node-1"


def bind_user(kube: LocalKube, user: str, cluster_role: str) -> None:
    kube.apply([user_binding(user, cluster_role, f"test-{user}")])


@pytest.fixture(scope="session")
def kube_binaries() -> KubeBinaries:
    jobs = int(os.environ.get("GPULEDGER_KUBE_BUILD_JOBS", "1"))
    return ensure_binaries(jobs=jobs)


@pytest.fixture(scope="session")
def local_kube(kube_binaries: KubeBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    cfg = ClusterConfig.on_free_ports(tmp_path_factory.mktemp("kube"))
    with LocalKube(cfg, kube_binaries) as kube:
        for user, component in COMPONENT_ROLES.items():
            kube.apply(rbac_manifests(component))
            bind_user(kube, user, f"gpuledger-{component}")
        kube.apply([{"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}])  # fmt: skip
        yield kube


def make_namespace(kube: LocalKube, prefix: str = "t") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    kube.apply(namespace(name))
    return name


@pytest.fixture
def kube_ns(local_kube: LocalKube) -> str:
    return make_namespace(local_kube)


def gpu_pod(name: str, namespace: str, gpus: int = 1, labels: dict[str, str] | None = None,
            node: str | None = None) -> dict[str, Any]:  # fmt: skip
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}  # fmt: skip
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                          "labels": labels or {}}, "spec": spec}  # fmt: skip


def run_pod(kube: LocalKube, namespace: str, name: str, phase: str = "Running") -> None:
    """Patch a pod's status as a kubelet would (it must have been created with spec.nodeName)."""
    import json
    from datetime import UTC, datetime

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    state = {"running": {"startedAt": now}} if phase == "Running" else {
        "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": now, "finishedAt": now}}  # fmt: skip
    status = {"status": {"phase": phase, "startTime": now, "containerStatuses": [
        {"name": "main", "image": "busybox", "imageID": "", "ready": phase == "Running", "restartCount": 0,
         "state": state}]}}  # fmt: skip
    kube.kubectl("-n", namespace, "patch", "pod", name, "--subresource=status", "--type=merge", "-p",
                 json.dumps(status))  # fmt: skip


def gpu_quota(kube: LocalKube, namespace: str, cluster_queue: str, gpus: int = 8) -> None:
    """A ClusterQueue of `gpus` GPUs of flavor h100 and the namespace's LocalQueue `team-a` pointing at it."""
    kube.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "h100"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cluster_queue},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
             {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "team-a", "namespace": namespace}, "spec": {"clusterQueue": cluster_queue}},
    ])  # fmt: skip


def kubeconfig(kube: LocalKube, user: str) -> Path:
    return kube.cfg.kubeconfig(user)


def get(kube: LocalKube, ns: str, kind: str, name: str) -> dict[str, Any]:
    """The object as JSON, {} when it does not exist."""
    out = kube.kubectl("-n", ns, "get", kind, name, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def kueue_story(kube: LocalKube, ns: str, log_lines: int = 40) -> str:
    """What Kueue made of a namespace's jobs: each Workload's conditions, every ClusterQueue's pending and
    admitted counts, and the tail of the controller's log."""
    lines = []
    for w in json.loads(kube.kubectl("-n", ns, "get", "workloads.kueue.x-k8s.io", "-o", "json").stdout)["items"]:
        conds = "; ".join(f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                          for c in w.get("status", {}).get("conditions", []))  # fmt: skip
        lines.append(f"workload {w['metadata']['name']}: {conds or 'no conditions'}")
    for cq in json.loads(kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", "-o", "json").stdout)["items"]:
        st = cq.get("status", {})
        lines.append(f"clusterqueue {cq['metadata']['name']}: pending {st.get('pendingWorkloads')} "
                     f"admitted {st.get('admittedWorkloads')}")  # fmt: skip
    log = kube.cfg.log("kueue")
    tail = log.read_text(errors="replace").splitlines()[-log_lines:] if log.is_file() else ["(no kueue log)"]
    return "\n".join([*lines, "kueue log:", *tail])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the Kubernetes control plane run last, in their order: on a first run `make test` builds its
    binaries in the background (`dev kube build --detach`) while the other tests run. A test that restarts part
    of the shared control plane runs after all of them: after the API server's restart, the next test waiting on
    Kueue to admit a Job (another module's) timed out twice in CI, Kueue having made no Workload for it."""
    items.sort(key=lambda item: ("kube_binaries" in getattr(item, "fixturenames", ()),
                                 item.get_closest_marker("restarts_control_plane") is not None))  # fmt: skip
