"""Least privilege, enforced by the real RBAC: each component runs as its own user (a static token) bound to
its ClusterRole from deploy/kubernetes/rbac/, and nothing more. The watcher reads and cannot write; the reclaim
executor patches a Workload (or a JobSet) and creates a Volcano Command, nothing else: no other create, no
delete, no write on pods or Jobs."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import httpx
import pytest
import yaml
from fixtures_kube import COMPONENT_ROLES, bind_user, gpu_pod, rbac_manifests

from stack.kube.cluster import LocalKube

WORKLOAD = {
    "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
    "spec": {"queueName": "none", "podSets": [{"name": "main", "count": 1, "template": {"spec": {"restartPolicy":
             "Never", "containers": [{"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}}]},
}  # fmt: skip


def as_user(kube: LocalKube, user: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return kube.kubectl(*args, user=user, input=input, check=False)


def forbidden(result: subprocess.CompletedProcess[str], user: str, verb: str, resource: str) -> bool:
    return result.returncode != 0 and f'User "{user}" cannot {verb} resource "{resource}"' in result.stderr


def api_patch(kube: LocalKube, user: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """A merge patch straight to the API (kubectl reads the object first, which a user may not be allowed)."""
    resp = httpx.patch(f"{kube.cfg.server}{path}", content=json.dumps(body), verify=False,
                       headers={"Authorization": f"Bearer {kube.cfg.tokens[user]}",
                                "Content-Type": "application/merge-patch+json"})  # fmt: skip
    return resp.status_code, resp.json().get("message", "")


def workload(name: str, ns: str) -> dict[str, Any]:
    return {**WORKLOAD, "metadata": {"name": name, "namespace": ns}}


@pytest.fixture
def objects(local_kube: LocalKube, kube_ns: str) -> str:
    local_kube.apply([gpu_pod("p", kube_ns), workload("wl", kube_ns)])
    return kube_ns


def test_every_component_role_is_deployed_and_bound(local_kube: LocalKube) -> None:
    for component in set(COMPONENT_ROLES.values()):
        kinds = [doc["kind"] for doc in rbac_manifests(component)]
        assert kinds == ["ClusterRole", "ClusterRoleBinding"]
        role = json.loads(local_kube.kubectl("get", "clusterrole", f"gpuledger-{component}", "-o", "json").stdout)
        assert role["rules"] and all("*" not in rule["verbs"] for rule in role["rules"])


def test_the_watcher_reads_but_cannot_write(local_kube: LocalKube, objects: str) -> None:
    ns, user = objects, "gpuledger-watcher"
    for resource in ("pods", "workloads.kueue.x-k8s.io", "podgroups.scheduling.volcano.sh",
                     "jobsets.jobset.x-k8s.io", "jobs.batch.volcano.sh"):  # fmt: skip
        result = as_user(local_kube, user, "get", resource, "-A", "-o", "name")
        assert result.returncode == 0, result.stderr
    assert as_user(local_kube, user, "-n", ns, "get", "pod", "p", "-o", "name").stdout.strip() == "pod/p"
    patch = ["--type=merge", "-p", '{"metadata":{"labels":{"x":"y"}}}']
    assert forbidden(as_user(local_kube, user, "-n", ns, "patch", "pod", "p", *patch), user, "patch", "pods")
    result = as_user(local_kube, user, "-n", ns, "patch", "workloads.kueue.x-k8s.io", "wl", "--type=merge",
                     "-p", '{"spec":{"active":false}}')  # fmt: skip
    assert forbidden(result, user, "patch", "workloads")
    assert forbidden(as_user(local_kube, user, "-n", ns, "delete", "pod", "p"), user, "delete", "pods")
    result = as_user(local_kube, user, "create", "-f", "-", input=yaml.safe_dump(gpu_pod("q", ns)))
    assert forbidden(result, user, "create", "pods")
    assert forbidden(as_user(local_kube, user, "get", "secrets", "-A"), user, "list", "secrets")


def test_the_reclaim_executor_patches_a_workload_and_nothing_else(local_kube: LocalKube, objects: str) -> None:
    ns, user = objects, "gpuledger-reclaim"
    result = as_user(local_kube, user, "-n", ns, "patch", "workloads.kueue.x-k8s.io", "wl", "--type=merge",
                     "-p", '{"spec":{"active":false}}')  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = json.loads(local_kube.kubectl("-n", ns, "get", "workloads.kueue.x-k8s.io", "wl", "-o", "json").stdout)
    assert got["spec"]["active"] is False
    for manifest, resource in ((workload("wl2", ns), "workloads"), (gpu_pod("q", ns), "pods")):
        result = as_user(local_kube, user, "create", "-f", "-", input=yaml.safe_dump(manifest))
        assert forbidden(result, user, "create", resource)
    label = {"metadata": {"labels": {"x": "y"}}}
    status, message = api_patch(local_kube, user, f"/api/v1/namespaces/{ns}/pods/p", label)
    assert status == 403 and f'User "{user}" cannot patch resource "pods"' in message
    status, message = api_patch(local_kube, user, f"/apis/batch/v1/namespaces/{ns}/jobs/j", label)
    assert status == 403 and f'User "{user}" cannot patch resource "jobs"' in message
    result = as_user(local_kube, user, "-n", ns, "delete", "workloads.kueue.x-k8s.io", "wl")
    assert forbidden(result, user, "delete", "workloads")
    assert forbidden(as_user(local_kube, user, "get", "pods", "-A"), user, "list", "pods")


def test_the_reclaim_executor_creates_a_volcano_command_and_nothing_more(local_kube: LocalKube, kube_ns: str) -> None:
    """Its Volcano rights: `get` on Volcano Jobs (climbing a pod's owners) and `create` on Commands (an AbortJob
    Command stops a Volcano Job); it may not read, delete or patch a Command, nor write the Job itself."""
    ns, user = kube_ns, "gpuledger-reclaim"
    local_kube.apply([{
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vj", "namespace": ns},
        "spec": {"minAvailable": 1, "tasks": [{"name": "w", "replicas": 1, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}]},
    }])  # fmt: skip
    got = as_user(local_kube, user, "-n", ns, "get", "jobs.batch.volcano.sh", "vj", "-o", "json")
    assert got.returncode == 0, got.stderr
    uid = json.loads(got.stdout)["metadata"]["uid"]
    ref = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "vj", "uid": uid}
    owners = [{**ref, "controller": True}]
    command = {"apiVersion": "bus.volcano.sh/v1alpha1", "kind": "Command", "target": ref, "action": "AbortJob",
               "metadata": {"name": "vj-abortjob", "namespace": ns, "ownerReferences": owners}}  # fmt: skip
    result = as_user(local_kube, user, "create", "-f", "-", input=yaml.safe_dump(command))
    assert result.returncode == 0, result.stderr
    assert json.loads(local_kube.kubectl("-n", ns, "get", "commands.bus.volcano.sh", "vj-abortjob", "-o",
                                         "json").stdout)["action"] == "AbortJob"  # fmt: skip
    for verb, args in (("get", ("get", "commands.bus.volcano.sh", "vj-abortjob")),
                       ("list", ("get", "commands.bus.volcano.sh")),
                       ("delete", ("delete", "commands.bus.volcano.sh", "vj-abortjob")),
                       ("delete", ("delete", "jobs.batch.volcano.sh", "vj"))):  # fmt: skip
        resource = "jobs" if "jobs.batch.volcano.sh" in args else "commands"
        assert forbidden(as_user(local_kube, user, "-n", ns, *args), user, verb, resource), (verb, args)
    label = {"metadata": {"labels": {"x": "y"}}}
    for path, resource in ((f"/apis/bus.volcano.sh/v1alpha1/namespaces/{ns}/commands/vj-abortjob", "commands"),
                           (f"/apis/batch.volcano.sh/v1alpha1/namespaces/{ns}/jobs/vj", "jobs")):  # fmt: skip
        status, message = api_patch(local_kube, user, path, label)
        assert status == 403 and f'User "{user}" cannot patch resource "{resource}"' in message, message
    other = {**command, "metadata": {"name": "vj-2", "namespace": ns}}
    result = as_user(local_kube, "gpuledger-watcher", "create", "-f", "-", input=yaml.safe_dump(other))
    assert forbidden(result, "gpuledger-watcher", "create", "commands")  # only reclaim holds the right


def test_a_user_without_a_binding_can_do_nothing(local_kube: LocalKube, objects: str) -> None:
    result = as_user(local_kube, "bob", "-n", objects, "get", "pods")
    assert forbidden(result, "bob", "list", "pods")


def test_policy_apply_writes_the_admission_policy_and_kueue_quotas_only(local_kube: LocalKube, kube_ns: str) -> None:
    user, name = "gpuledger-policy", f"rbac-{kube_ns}"
    quota = [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
             {"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "q", "namespace": kube_ns},
         "spec": {"clusterQueue": name}},
    ]  # fmt: skip
    result = local_kube.apply(quota, user=user, check=False)
    assert result.returncode == 0, result.stderr
    quota[1]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = 16
    assert local_kube.apply(quota, user=user, check=False).returncode == 0  # a change is a patch
    got = json.loads(local_kube.kubectl("get", "clusterqueue", name, "-o", "json").stdout)
    assert got["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] == 16
    # delete on the Kueue kinds is granted for `policy apply --prune`, narrowed by the API server's own prune guard to
    # what the apply created (tests/integration/test_kube_live_prune.py); no delete of anything else
    result = as_user(local_kube, user, "-n", kube_ns, "delete", "workloads.kueue.x-k8s.io", "w")
    assert forbidden(result, user, "delete", "workloads")
    result = as_user(local_kube, user, "create", "-f", "-", input=yaml.safe_dump(workload("w", kube_ns)))
    assert forbidden(result, user, "create", "workloads")
    result = as_user(local_kube, user, "create", "clusterrolebinding", "escalate", "--clusterrole=cluster-admin",
                     f"--user={user}")  # fmt: skip
    assert forbidden(result, user, "create", "clusterrolebindings")


def test_the_reservation_service_gets_and_patches_cluster_queues_only(local_kube: LocalKube, objects: str) -> None:
    """deploy/kubernetes/rbac/reservations.yaml: a reservation's quota bump is a merge patch of a ClusterQueue;
    the queues themselves, Workloads, pods and every other Kueue object are out of its reach."""
    ns, user = objects, "gpuledger-reservations"
    local_kube.apply(rbac_manifests("reservations"))
    bind_user(local_kube, user, "gpuledger-reservations")
    name = f"rsv-{ns}"
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
          "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
              {"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]}]}]}}  # fmt: skip
    local_kube.apply([cq])
    got = as_user(local_kube, user, "get", "clusterqueues.kueue.x-k8s.io", name, "-o", "json")
    assert got.returncode == 0, got.stderr
    groups = json.loads(got.stdout)["spec"]["resourceGroups"]
    groups[0]["flavors"][0]["resources"][0]["nominalQuota"] = 3
    status, message = api_patch(local_kube, user, f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{name}",
                                {"spec": {"resourceGroups": groups}})  # fmt: skip
    assert status == 200, message
    after = json.loads(local_kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", name, "-o", "json").stdout)
    assert str(after["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"]) == "3"
    other = {**cq, "metadata": {"name": f"{name}-2"}}
    result = as_user(local_kube, user, "create", "-f", "-", input=yaml.safe_dump(other))
    assert forbidden(result, user, "create", "clusterqueues")
    result = as_user(local_kube, user, "delete", "clusterqueues.kueue.x-k8s.io", name)
    assert forbidden(result, user, "delete", "clusterqueues")
    assert forbidden(as_user(local_kube, user, "get", "clusterqueues.kueue.x-k8s.io"), user, "list", "clusterqueues")
    status, message = api_patch(local_kube, user, f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads/wl",
                                {"spec": {"active": False}})  # fmt: skip
    assert status == 403 and f'User "{user}" cannot patch resource "workloads"' in message
    assert forbidden(as_user(local_kube, user, "-n", ns, "get", "pod", "p"), user, "get", "pods")
    assert forbidden(as_user(local_kube, user, "get", "localqueues.kueue.x-k8s.io", "-A"), user, "list", "localqueues")
