"""Kueue reclaim acts on the object that owns the idle pod, and a gang once (issue 18), on the real API server
and Kueue, as the gpuledger-reclaim user with its ClusterRole only (deploy/kubernetes/rbac/reclaim.yaml).

- A batch Job of two 2-GPU pods admitted by Kueue (its Workload owned by the Job): the idle action names a pod
  (`namespace/pod`, what the processors charge); the executor finds the Workload through the pod's
  ownerReferences (pod -> Job <- Workload), deactivates it, Kueue evicts it and suspends the Job. The second
  pod's action finds the Workload already inactive and patches nothing: the gang is reclaimed once.
- A JobSet's pod (pod -> Job -> JobSet, the Workload owned by the JobSet): two levels up.
- A pod no Workload owns: the action fails with one line, nothing patched.
- A Volcano Job's pod (pod -> Volcano Job, annotated with its PodGroup): the executor creates one `bus.volcano.sh`
  Command, action AbortJob, targeting the Job (Volcano's own CRD validates it); the gang's other pod creates no
  second one; once the Job is Aborted nothing more. A Volcano Job a Workload owns: the Workload is deactivated.
Pods are made by hand (there is no controller-manager) with the ownerReferences a Job controller sets."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fixtures_kube import NODE, eventually, get, gpu_pod, gpu_quota, run_pod
from kubernetes import config as kube_config
from unit.test_reclaim import Recorder

from sinks.kube_owner import KubeOwnerReader, owning_workload
from sinks.reclaim import ReclaimExecutor, kubernetes_patch
from stack.kube.cluster import LocalKube


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip


def owned_pod(kube: LocalKube, ns: str, name: str, owner: dict[str, Any], gpus: int = 2) -> None:
    pod = gpu_pod(name, ns, gpus, node=NODE)
    pod["metadata"]["ownerReferences"] = [owner_ref(owner)]
    kube.apply([pod])
    run_pod(kube, ns, name)


@pytest.fixture
def executor(local_kube: LocalKube, monkeypatch: pytest.MonkeyPatch) -> tuple[ReclaimExecutor, list[str]]:
    cfg = str(local_kube.cfg.kubeconfig("gpuledger-reclaim"))
    monkeypatch.setattr(kube_config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", cfg)  # kubernetes_patch's client
    reader = KubeOwnerReader(kube_config.new_client_from_config(config_file=cfg))
    patched: list[str] = []

    def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        patched.append(f"{namespace}/{name}")
        kubernetes_patch(namespace, name, body)

    def owner(namespace: str, name: str) -> Any:
        return owning_workload(reader, namespace, name)

    return ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=patch, kueue_owner=owner,
                           owner_patch=reader.patch, owner_create=reader.create), patched  # fmt: skip


def action(ns: str, pod: str) -> dict[str, Any]:
    return {"action_id": f"a-{uuid.uuid4().hex[:8]}", "cluster": "local", "job_id": f"{ns}/{pod}",
            "scheduler": "KUEUE", "action": "SUSPEND", "dry_run": False}  # fmt: skip


def test_a_jobs_gang_is_reclaimed_once_through_the_workload_owning_its_pods(
    local_kube: LocalKube, kube_ns: str, executor: tuple[ReclaimExecutor, list[str]]
) -> None:
    ns, (run, patched) = kube_ns, executor
    gpu_quota(local_kube, ns, f"cq-{ns}")
    local_kube.apply([{
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": ns, "labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
        "spec": {"suspend": True, "parallelism": 2, "completions": 2, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox",
                                                      "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}},
    }])  # fmt: skip
    job = eventually(lambda: (j := get(local_kube, ns, "job", "train")) and j["spec"].get("suspend") is False and j,
                     "Kueue admitted the Job")  # fmt: skip
    for i in range(2):
        owned_pod(local_kube, ns, f"train-{i}", job)
    items = json.loads(local_kube.kubectl("-n", ns, "get", "workloads.kueue.x-k8s.io", "-o", "json").stdout)["items"]
    [wl] = [w for w in items if any(o["uid"] == job["metadata"]["uid"] for o in w["metadata"]["ownerReferences"])]
    wl_name = wl["metadata"]["name"]
    assert wl_name not in ("train-0", "train-1")  # a Workload named after the pod would be the wrong object

    first = run.execute(action(ns, "train-0"))
    assert [(o.step, o.status) for o in first] == [(1, "ok")], first
    assert first[0].detail.startswith(f"Workload {ns}/{wl_name} (owner of Pod train-0 -> Job train) deactivated")
    assert patched == [f"{ns}/{wl_name}"]
    evicted = eventually(lambda: (w := get(local_kube, ns, "workloads.kueue.x-k8s.io", wl_name)) and any(
        c["type"] == "Evicted" and c["status"] == "True" for c in w["status"].get("conditions", [])) and w,
        "Kueue evicted the Workload")  # fmt: skip
    assert evicted["spec"]["active"] is False
    eventually(lambda: get(local_kube, ns, "job", "train")["spec"]["suspend"] is True, "Kueue suspended the Job")

    second = run.execute(action(ns, "train-1"))  # the other pod of the gang, idle too
    assert [(o.step, o.status) for o in second] == [(1, "skipped")], second
    assert "already stopped: the gang is reclaimed as one" in second[0].detail
    assert patched == [f"{ns}/{wl_name}"]


def test_a_jobset_pod_is_reclaimed_through_the_jobsets_workload(
    local_kube: LocalKube, kube_ns: str, executor: tuple[ReclaimExecutor, list[str]]
) -> None:
    ns, (run, patched) = kube_ns, executor
    local_kube.apply([{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "js", "namespace": ns},
        "spec": {"suspend": True, "replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}}}]},
    }])  # fmt: skip
    jobset = get(local_kube, ns, "jobsets.jobset.x-k8s.io", "js")
    local_kube.apply([{
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "js-workers-0", "namespace": ns, "ownerReferences": [owner_ref(jobset)]},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                        "containers": [{"name": "main", "image": "busybox"}]}}},
    }])  # fmt: skip
    job = get(local_kube, ns, "job", "js-workers-0")
    owned_pod(local_kube, ns, "js-workers-0-0", job)
    wl_name = "jobset-js-0a1b2"
    local_kube.apply([{
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": wl_name, "namespace": ns, "ownerReferences": [owner_ref(jobset)],
                     "labels": {"kueue.x-k8s.io/job-uid": jobset["metadata"]["uid"]}},
        "spec": {"queueName": "none", "podSets": [{"name": "workers", "count": 1, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}]},
    }])  # fmt: skip
    out = run.execute(action(ns, "js-workers-0-0"))
    assert [(o.step, o.status) for o in out] == [(1, "ok")], out
    assert out[0].detail.startswith(
        f"Workload {ns}/{wl_name} (owner of Pod js-workers-0-0 -> Job js-workers-0 -> JobSet js) deactivated")
    assert get(local_kube, ns, "workloads.kueue.x-k8s.io", wl_name)["spec"]["active"] is False
    assert patched == [f"{ns}/{wl_name}"]


def test_a_jobset_no_workload_owns_is_suspended(
    local_kube: LocalKube, kube_ns: str, executor: tuple[ReclaimExecutor, list[str]]
) -> None:
    """Without Kueue: the pod's JobSet gets `spec.suspend=true` (its controller then deletes the pods), once."""
    ns, (run, patched) = kube_ns, executor
    local_kube.apply([{
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "free", "namespace": ns},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}}}]},
    }])  # fmt: skip
    jobset = get(local_kube, ns, "jobsets.jobset.x-k8s.io", "free")
    assert jobset["spec"].get("suspend") is not True
    local_kube.apply([{
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "free-w-0", "namespace": ns, "ownerReferences": [owner_ref(jobset)]},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never",
                                                        "containers": [{"name": "main", "image": "busybox"}]}}},
    }])  # fmt: skip
    owned_pod(local_kube, ns, "free-w-0-0", get(local_kube, ns, "job", "free-w-0"))
    out = run.execute(action(ns, "free-w-0-0"))
    assert [(o.step, o.status, o.detail) for o in out] == [
        (1, "ok", f"JobSet {ns}/free (owner of Pod free-w-0-0 -> Job free-w-0 -> JobSet free) suspended")]
    assert get(local_kube, ns, "jobsets.jobset.x-k8s.io", "free")["spec"]["suspend"] is True
    again = run.execute(action(ns, "free-w-0-0"))
    assert [(o.step, o.status) for o in again] == [(1, "skipped")] and patched == []  # no Workload patched


def test_a_pod_no_workload_owns_is_not_reclaimed(local_kube: LocalKube, kube_ns: str,
                                                 executor: tuple[ReclaimExecutor, list[str]]) -> None:  # fmt: skip
    run, patched = executor
    local_kube.apply([gpu_pod("loner", kube_ns, 1, node=NODE)])
    out = run.execute(action(kube_ns, "loner"))
    assert [(o.step, o.status, o.detail) for o in out] == [(1, "failed", f"no Kueue Workload owns {kube_ns}/loner")]
    assert patched == []


def volcano_job(kube: LocalKube, ns: str, name: str, pods: int = 2) -> dict[str, Any]:
    """A Volcano Job as `vcctl`/a user writes it (the API server checks it against Volcano's CRD), its status
    Running as Volcano's controller would set it (none runs here), and its pods, owned by it as that controller
    makes them (annotated with the PodGroup: one gang)."""
    kube.apply([{
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": "volcano", "minAvailable": pods, "queue": "default", "tasks": [{
            "name": "worker", "replicas": pods, "template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}]},
    }])  # fmt: skip
    kube.kubectl("-n", ns, "patch", "jobs.batch.volcano.sh", name, "--subresource=status", "--type=merge", "-p",
                 json.dumps({"status": {"state": {"phase": "Running"}, "running": pods}}))  # fmt: skip
    job = get(kube, ns, "jobs.batch.volcano.sh", name)
    assert job["status"]["state"]["phase"] == "Running"
    for i in range(pods):
        pod = gpu_pod(f"{name}-worker-{i}", ns, 2, labels={"volcano.sh/job-name": name}, node=NODE)
        pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": f"{name}-{job['metadata']['uid']}"}
        pod["metadata"]["ownerReferences"] = [owner_ref(job)]
        kube.apply([pod])
        run_pod(kube, ns, pod["metadata"]["name"])
    return job


def commands(kube: LocalKube, ns: str) -> list[dict[str, Any]]:
    out = kube.kubectl("-n", ns, "get", "commands.bus.volcano.sh", "-o", "json").stdout
    return list(json.loads(out)["items"])


def test_a_volcano_gang_is_stopped_by_one_abort_job_command(
    local_kube: LocalKube, kube_ns: str, executor: tuple[ReclaimExecutor, list[str]]
) -> None:
    ns, (run, patched) = kube_ns, executor
    job = volcano_job(local_kube, ns, "vc")
    uid = job["metadata"]["uid"]
    assert commands(local_kube, ns) == []

    first = run.execute(action(ns, "vc-worker-0"))
    name = f"vc-abortjob-{uid[:8]}"
    assert [(o.step, o.status, o.detail) for o in first] == [(1, "ok", (
        f"Volcano Job {ns}/vc (owner of Pod vc-worker-0 -> Job vc) suspended: AbortJob Command {ns}/{name} created"
    ))]  # fmt: skip
    [cmd] = commands(local_kube, ns)
    assert cmd["metadata"]["name"] == name and cmd["action"] == "AbortJob"
    target = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "vc", "uid": uid}
    assert {k: cmd["target"][k] for k in target} == target
    assert [(o["kind"], o["name"], o["uid"]) for o in cmd["metadata"]["ownerReferences"]] == [("Job", "vc", uid)]

    second = run.execute(action(ns, "vc-worker-1"))  # the gang's other pod, idle too: AlreadyExists
    assert [(o.step, o.status) for o in second] == [(1, "skipped")], second
    assert second[0].detail.endswith(f"AbortJob Command {ns}/{name} exists: the gang is reclaimed as one")
    assert [c["metadata"]["uid"] for c in commands(local_kube, ns)] == [cmd["metadata"]["uid"]]

    # what Volcano's job controller does with it: delete the Command, abort the Job
    local_kube.kubectl("-n", ns, "delete", "commands.bus.volcano.sh", name)
    local_kube.kubectl("-n", ns, "patch", "jobs.batch.volcano.sh", "vc", "--subresource=status", "--type=merge",
                       "-p", json.dumps({"status": {"state": {"phase": "Aborted"}}}))  # fmt: skip
    third = run.execute(action(ns, "vc-worker-0"))
    assert [(o.step, o.status) for o in third] == [(1, "skipped")] and "already stopped" in third[0].detail
    assert commands(local_kube, ns) == [] and patched == []  # no new Command, no Workload patched


def test_a_volcano_job_a_workload_owns_is_reclaimed_through_the_workload(
    local_kube: LocalKube, kube_ns: str, executor: tuple[ReclaimExecutor, list[str]]
) -> None:
    ns, (run, patched) = kube_ns, executor
    job = volcano_job(local_kube, ns, "kq", pods=1)
    wl_name = "vcjob-kq-3c4d5"
    local_kube.apply([{
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": wl_name, "namespace": ns, "ownerReferences": [owner_ref(job)],
                     "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]}},
        "spec": {"queueName": "none", "podSets": [{"name": "worker", "count": 1, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox"}]}}}]},
    }])  # fmt: skip
    out = run.execute(action(ns, "kq-worker-0"))
    assert [(o.step, o.status) for o in out] == [(1, "ok")], out
    assert out[0].detail.startswith(f"Workload {ns}/{wl_name} (owner of Pod kq-worker-0 -> Job kq) deactivated")
    assert get(local_kube, ns, "workloads.kueue.x-k8s.io", wl_name)["spec"]["active"] is False
    assert patched == [f"{ns}/{wl_name}"] and commands(local_kube, ns) == []  # Kueue first: no Command
