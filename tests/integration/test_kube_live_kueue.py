"""Kueue for real: a team's Job over its ClusterQueue's GPU quota stays suspended with Kueue's own reason while
one within quota is admitted; the reclaim executor (sinks/reclaim.py, as the gpuledger-reclaim user and with
its ClusterRole only) deactivates the admitted Workload, Kueue evicts it and suspends its Job, the waiting Job
is admitted in its place, and a retried action does not patch twice. The outcome store stays an in-memory
recorder (ClickHouse is not what is tested here)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from fixtures_kube import condition, eventually, get, gpu_quota, workload_of
from kubernetes import config as kube_config
from unit.test_reclaim import Recorder

from sinks.reclaim import ReclaimExecutor, kubernetes_patch
from stack.kube.cluster import LocalKube

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def gpu_job(name: str, ns: str, gpus: int, queue: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: queue, "gpuledger.io/project": "atlas"}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}},
    }  # fmt: skip


@pytest.fixture
def team(local_kube: LocalKube, kube_ns: str) -> str:
    """A ClusterQueue with 8 GPUs of flavor h100 and the namespace's LocalQueue `team-a` pointing at it."""
    cq = f"cq-{uuid.uuid4().hex[:8]}"
    gpu_quota(local_kube, kube_ns, cq)
    return kube_ns






def test_a_job_over_quota_waits_with_kueues_reason_while_one_within_is_admitted(local_kube: LocalKube,
                                                                                team: str) -> None:  # fmt: skip
    ns = team
    local_kube.apply([gpu_job("small", ns, 4, "team-a")])
    eventually(lambda: get(local_kube, ns, "job", "small").get("spec", {}).get("suspend") is False,
               "the 4-GPU Job admitted (unsuspended)")  # fmt: skip
    local_kube.apply([gpu_job("big", ns, 8, "team-a")])
    pending = eventually(
        lambda: (wl := workload_of(local_kube, ns, "big")) and condition(wl, "QuotaReserved").get("message") and wl,
        "the 8-GPU Workload evaluated",
    )
    reserved = condition(pending, "QuotaReserved")
    assert reserved["status"] == "False" and reserved["reason"] == "Pending"
    assert "insufficient unused quota for nvidia.com/gpu in flavor h100, 4 more needed" in reserved["message"]
    time.sleep(1)
    assert get(local_kube, ns, "job", "big")["spec"]["suspend"] is True


def test_reclaim_deactivates_the_workload_kueue_evicts_it_and_a_retry_does_not_act_twice(
    local_kube: LocalKube, team: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Patched at the version Kueue stores (v1beta2: the v1beta1 patch is refused, 422, once quota is
    reserved), with Kueue's Evicted(Deactivated) read back into the outcome."""
    ns = team
    local_kube.apply([gpu_job("idle", ns, 4, "team-a"), gpu_job("waiting", ns, 8, "team-a")])
    eventually(lambda: get(local_kube, ns, "job", "idle").get("spec", {}).get("suspend") is False, "idle admitted")
    wl = workload_of(local_kube, ns, "idle")["metadata"]["name"]
    monkeypatch.setattr(kube_config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                        str(local_kube.cfg.kubeconfig("gpuledger-reclaim")))  # fmt: skip
    patches: list[tuple[str, str, dict[str, Any]]] = []

    def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        patches.append((namespace, name, body))
        kubernetes_patch(namespace, name, body)  # the real client, as gpuledger-reclaim

    recorder = Recorder()
    executor = ReclaimExecutor(recorder, dry_run=False, kueue_patch=patch)
    action = {"action_id": "a-1", "cluster": "local", "job_id": f"{ns}/{wl}", "scheduler": "KUEUE",
              "action": "SUSPEND", "dry_run": False}  # fmt: skip
    outcomes = executor.execute(action)
    assert [(o.step, o.status) for o in outcomes] == [(1, "ok")], outcomes
    assert outcomes[0].detail.startswith("Workload deactivated; Kueue: Evicted/Deactivated"), outcomes
    evicted = eventually(lambda: (w := get(local_kube, ns, "workloads.kueue.x-k8s.io", wl))
                         and condition(w, "Evicted").get("status") == "True" and w, "Kueue evicted the Workload")
    assert condition(evicted, "Evicted")["reason"] == "Deactivated"
    assert evicted["spec"]["active"] is False
    eventually(lambda: get(local_kube, ns, "job", "idle")["spec"]["suspend"] is True, "Kueue suspended its Job")
    eventually(lambda: get(local_kube, ns, "job", "waiting")["spec"]["suspend"] is False,
               "the waiting Job admitted in the freed quota")  # fmt: skip

    again = executor.execute(action)
    assert [(o.step, o.status) for o in again] == [(0, "duplicate")]
    assert len(patches) == 1


def test_a_higher_workload_priority_class_preempts_a_lower_one(local_kube: LocalKube, kube_ns: str) -> None:
    """A ClusterQueue that preempts lower priorities: an 8-GPU Job of priority `low` runs; an 8-GPU Job of the
    WorkloadPriorityClass `high` arrives; Kueue evicts the first (reason Preempted), suspends its Job and
    admits the second."""
    ns, cq, suffix = kube_ns, f"cq-{kube_ns}", kube_ns[-8:]
    local_kube.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
         "metadata": {"name": f"low-{suffix}"}, "value": 10},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
         "metadata": {"name": f"high-{suffix}"}, "value": 1000},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "h100"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "team-a", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ])  # fmt: skip
    low, high = gpu_job("low", ns, 8, "team-a"), gpu_job("high", ns, 8, "team-a")
    low["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"low-{suffix}"
    high["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = f"high-{suffix}"
    local_kube.apply([low])
    eventually(lambda: get(local_kube, ns, "job", "low").get("spec", {}).get("suspend") is False, "low admitted")
    local_kube.apply([high])
    evicted = eventually(lambda: (w := workload_of(local_kube, ns, "low"))
                         and condition(w, "Evicted").get("status") == "True" and w, "the low Workload evicted")
    assert condition(evicted, "Evicted")["reason"] == "Preempted"
    assert condition(evicted, "Preempted").get("reason") == "InClusterQueue"
    eventually(lambda: get(local_kube, ns, "job", "low")["spec"]["suspend"] is True, "the low Job suspended")
    eventually(lambda: get(local_kube, ns, "job", "high")["spec"]["suspend"] is False, "the high Job admitted")
    assert workload_of(local_kube, ns, "high")["spec"]["priority"] == 1000
