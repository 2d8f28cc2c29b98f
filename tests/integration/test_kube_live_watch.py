"""`kube watch` against a real API server, as the gpuledger-watcher user (its ClusterRole is all it has):
pods, Kueue Workloads and Volcano PodGroups as stored by the server (built from their CRDs); a watch that
resumes after an etcd compaction gets 410 Gone and re-lists without a duplicate or a lost event; the watch
rides out an API server restart."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fixtures_kube import NODE, bind_user, gpu_pod, gpu_quota, make_namespace, run_pod
from kubernetes import config as kube_config

from producers.jobevents import EventContext
from producers.kube import WATCH_TARGETS, KubeTracker, KubeWatcher
from producers.projects import Attributor, ProjectRule, registry_from_data
from schemas.codec import AvroCodec
from stack.kube.cluster import LocalKube

PROJECT = {"gpuledger.io/project": "atlas"}
REGISTRY = registry_from_data({"projects": [{"id": "atlas", "cost_centre": "CC-1"}], "defaults": {}})
PODS = [t for t in WATCH_TARGETS if t.name == "pods"]
# Kueue admits within a second when idle; on a loaded 2-core CI machine it has taken longer than 30 s.
ADMISSION_S = 120


class ListSink:
    """Encodes every event with the contract (as the publisher would) and keeps it."""

    def __init__(self) -> None:
        self.codec = AvroCodec()
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.codec.encode(topic.subject, record)
        with self.lock:
            self.records.append(record)

    def of(self, job_id: str) -> list[str]:
        with self.lock:
            return [r["event_type"] for r in self.records if r["job_id"] == job_id]


def watcher_for(kube: LocalKube, sink: ListSink, clock: Any = None, **kw: Any) -> KubeWatcher:
    api = kube_config.new_client_from_config(config_file=str(kube.cfg.kubeconfig("gpuledger-watcher")))
    tracker = KubeTracker(EventContext("local", attributor=Attributor(REGISTRY, ProjectRule(mode="grace"))))
    return KubeWatcher(api, tracker, sink, clock=clock or (lambda: int(time.time() * 1000)), **kw)


def running_pod(kube: LocalKube, ns: str, name: str, gpus: int = 1) -> None:
    kube.apply([gpu_pod(name, ns, gpus, labels=PROJECT, node=NODE)])
    run_pod(kube, ns, name)


def wait_for(predicate: Any, what: str, timeout: float = 30, alive: Any = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"not seen within {timeout:g} s: {what}")


def test_kube_watch_command_follows_pods_workloads_and_podgroups(local_kube: LocalKube, kube_ns: str,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    ns = kube_ns
    running_pod(local_kube, ns, "train", gpus=4)
    local_kube.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
         "metadata": {"name": "wl", "namespace": ns, "labels": PROJECT},
         "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 2, "template": {"spec": {
             "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox",
                                                      "resources": {"requests": {"nvidia.com/gpu": "2"}}}]}}}]}},
        {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
         "metadata": {"name": "pg", "namespace": ns, "labels": PROJECT},
         "spec": {"minMember": 2, "queue": "default", "minResources": {"nvidia.com/gpu": "8"}}},
    ])  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", "kube", "watch", "--dry-run", "--once",
         "--timeout", "2", "--kubeconfig", str(local_kube.cfg.kubeconfig("gpuledger-watcher")),
         "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    mine = {(e["job_id"], e["event_type"], e["scheduler"]) for e in events if e["job_id"].startswith(f"{ns}/")}
    assert mine == {
        (f"{ns}/train", "SUBMITTED", "KUBERNETES"), (f"{ns}/train", "STARTED", "KUBERNETES"),
        (f"{ns}/wl", "SUBMITTED", "KUEUE"), (f"{ns}/pg", "SUBMITTED", "VOLCANO"),
    }
    started = next(e for e in events if e["job_id"] == f"{ns}/train" and e["event_type"] == "STARTED")
    assert started["project"] == "atlas" and started["allocations"][0]["node"] == NODE
    assert len(started["allocations"][0]["devices"]) == 4
    assert "not served" not in proc.stderr


def test_a_watch_resumed_after_an_etcd_compaction_relists_without_duplicate_or_loss(local_kube: LocalKube,
                                                                                      kube_ns: str) -> None:
    """The gap is made while the watcher applies its first list (its clock is the hook): pod `a` is deleted,
    pod `c` created, and etcd compacted past the list's resourceVersion. The watch from that version gets
    410 Gone; the re-list must close `a`, open `c`, and repeat nothing about `b`."""
    ns = kube_ns
    running_pod(local_kube, ns, "a")
    running_pod(local_kube, ns, "b")
    compacted: list[int] = []

    def clock() -> int:
        if not compacted:
            local_kube.kubectl("-n", ns, "delete", "pod", "a", "--grace-period=0", "--force")
            running_pod(local_kube, ns, "c")
            for i in range(3):  # the cluster moves on
                local_kube.kubectl("-n", ns, "create", "configmap", f"churn-{i}")
            compacted.append(local_kube.etcd_compact())
        return int(time.time() * 1000)

    sink = ListSink()
    watcher = watcher_for(local_kube, sink, clock, targets=PODS, timeout_seconds=3)
    watcher.run(rounds=1)
    assert compacted, "the watcher applied no listed pod"
    assert any("410" in e for e in watcher.errors), watcher.errors
    assert sink.of(f"{ns}/a") == ["SUBMITTED", "STARTED", "ENDED"]
    assert sink.of(f"{ns}/b") == ["SUBMITTED", "STARTED"]
    assert sink.of(f"{ns}/c") == ["SUBMITTED", "STARTED"]
    ended = next(r for r in sink.records if r["job_id"] == f"{ns}/a" and r["event_type"] == "ENDED")
    assert ended["exit_state"] == "CANCELLED"


@pytest.fixture(autouse=True)
def _quiet_insecure_warnings() -> None:
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)


def test_kinds_the_user_may_not_read_are_reported_and_the_rest_is_watched(local_kube: LocalKube, kube_ns: str) -> None:
    """alice may read pods only: Workloads and PodGroups answer 403, are named in the errors, and pods
    still come through."""
    local_kube.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "pods-only"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]},
    ])  # fmt: skip
    bind_user(local_kube, "alice", "pods-only")
    running_pod(local_kube, kube_ns, "solo")
    api = kube_config.new_client_from_config(config_file=str(local_kube.cfg.kubeconfig("alice")))
    sink = ListSink()
    tracker = KubeTracker(EventContext("local", attributor=Attributor(REGISTRY, ProjectRule(mode="grace"))))
    watcher = KubeWatcher(api, tracker, sink, clock=lambda: int(time.time() * 1000), timeout_seconds=1)
    watcher.run(rounds=1)
    assert sorted(watcher.errors) == ["podgroups: not served (403)", "workloads: not served (403)"]
    assert sink.of(f"{kube_ns}/solo") == ["SUBMITTED", "STARTED"]


@pytest.fixture(scope="module")
def workload_life(local_kube: LocalKube) -> tuple[list[dict[str, Any]], str, str]:
    """A Job's Workload through Kueue, followed by the watcher: admitted, deactivated (Kueue evicts it),
    reactivated (admitted again). Returns the Workload's events, its job id and its ClusterQueue."""
    ns = make_namespace(local_kube)
    cq = f"cq-{ns}"
    gpu_quota(local_kube, ns, cq)
    sink = ListSink()
    watcher = watcher_for(local_kube, sink, targets=[t for t in WATCH_TARGETS if t.name == "workloads"],
                          timeout_seconds=5)  # fmt: skip
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        local_kube.apply([{
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": ns,
                         "labels": {"kueue.x-k8s.io/queue-name": "team-a", **PROJECT}},
            "spec": {"suspend": True, "template": {"metadata": {"labels": PROJECT}, "spec": {
                "restartPolicy": "Never", "containers": [
                    {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}},
        }])  # fmt: skip

        def events() -> list[str]:
            with sink.lock:
                return [r["event_type"] for r in sink.records if r["job_id"].startswith(f"{ns}/job-train-")]

        wait_for(lambda: "UPDATED" in events(), f"the Workload admitted: {events()}", timeout=ADMISSION_S,
                 alive=thread.is_alive)  # fmt: skip
        wl = next(r["job_id"] for r in sink.records if r["job_id"].startswith(f"{ns}/job-train-")).split("/")[1]
        workload = f"workloads.v1beta2.kueue.x-k8s.io/{wl}"
        local_kube.kubectl("-n", ns, "patch", workload, "--type=merge", "-p", '{"spec":{"active":false}}')
        wait_for(lambda: "SUSPENDED" in events(), f"the Workload suspended: {events()}", alive=thread.is_alive)
        evicted = ["-n", ns, "get", workload, "-o", "jsonpath={.status.conditions[?(@.type=='Evicted')].status}"]
        wait_for(lambda: local_kube.kubectl(*evicted).stdout == "True", "Kueue evicted the Workload")
        local_kube.kubectl("-n", ns, "patch", workload, "--type=merge", "-p", '{"spec":{"active":true}}')
        wait_for(lambda: "RESUMED" in events(), f"the Workload resumed: {events()}", alive=thread.is_alive)
        suspended = ["-n", ns, "get", "job", "train", "-o", "jsonpath={.spec.suspend}"]
        wait_for(lambda: local_kube.kubectl(*suspended).stdout == "false", "Kueue admitted the Job again",
                 timeout=ADMISSION_S)  # fmt: skip
        time.sleep(2)  # what the watch still brings
    finally:
        watcher.stop()
        thread.join(timeout=15)
    with sink.lock:
        mine = [r for r in sink.records if r["job_id"] == f"{ns}/{wl}"]
    return mine, f"{ns}/{wl}", cq


def test_the_watch_follows_a_workload_through_kueue_admission_deactivation_and_reactivation(
    workload_life: tuple[list[dict[str, Any]], str, str],
) -> None:
    """Kueue's own status changes, as the watcher sees them: admitted (UPDATED), deactivated and evicted
    (SUSPENDED), reactivated and admitted again (RESUMED)."""
    records, _, cq = workload_life
    seen = [r["event_type"] for r in records]
    assert seen[0] == "SUBMITTED" and seen.count("SUBMITTED") == 1, seen
    assert seen.index("UPDATED") < seen.index("SUSPENDED") < seen.index("RESUMED"), seen
    assert seen.count("RESUMED") == 1, seen
    admitted = records[seen.index("UPDATED")]
    assert admitted["scheduler"] == "KUEUE" and admitted["partition"] == cq and admitted["requested_devices"] == 4


def test_one_deactivation_and_reactivation_is_one_suspended_and_one_resumed(
    workload_life: tuple[list[dict[str, Any]], str, str],
) -> None:
    seen = [r["event_type"] for r in workload_life[0]]
    assert seen.count("SUSPENDED") == 1, seen
    assert "REQUEUED" not in seen[seen.index("RESUMED"):], seen


def test_pods_of_a_jobset_and_a_volcano_job_come_out_as_their_gangs(local_kube: LocalKube, kube_ns: str) -> None:
    """No JobSet or Volcano controller runs here: the JobSet and the Volcano Job are stored (validated by their
    CRDs), and their pods carry the labels and annotation those controllers would set."""
    ns = kube_ns
    local_kube.apply([
        {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "llm", "namespace": ns},
         "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": {
             "restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}}]}},
        {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "vj", "namespace": ns},
         "spec": {"minAvailable": 1, "schedulerName": "volcano", "tasks": [{"name": "t", "replicas": 1, "template": {
             "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}]}},
    ])  # fmt: skip
    js_pod = gpu_pod("llm-w-0-0", ns, 2, labels={**PROJECT, "jobset.sigs.k8s.io/jobset-name": "llm"}, node=NODE)
    vc_pod = gpu_pod("vj-t-0", ns, 4, labels=PROJECT, node=NODE)
    vc_pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "vj-pg"}
    local_kube.apply([js_pod, vc_pod])
    run_pod(local_kube, ns, "llm-w-0-0")
    run_pod(local_kube, ns, "vj-t-0")
    sink = ListSink()
    watcher_for(local_kube, sink, targets=PODS, timeout_seconds=1).run(rounds=1)
    started = {r["job_id"]: r for r in sink.records if r["event_type"] == "STARTED" and r["job_id"].startswith(ns)}
    assert started[f"{ns}/llm-w-0-0"]["gang_id"] == f"jobset:{ns}/llm"
    assert started[f"{ns}/vj-t-0"]["gang_id"] == f"volcano:{ns}/vj-pg"
    assert started[f"{ns}/vj-t-0"]["scheduler"] == "VOLCANO"
    assert (started[f"{ns}/llm-w-0-0"]["gang_size"], started[f"{ns}/vj-t-0"]["gang_size"]) == (2, 4)


@pytest.mark.restarts_control_plane
def test_the_watch_rides_out_an_api_server_restart(local_kube: LocalKube, kube_ns: str) -> None:
    """Last of the session (marker restarts_control_plane), as every test that restarts part of the shared control
    plane: the harness restarts Kueue after the API server (its informers would back off and see new Jobs late),
    and a test after it should not depend on that."""
    ns = kube_ns
    sink = ListSink()
    watcher = watcher_for(local_kube, sink, targets=PODS, timeout_seconds=5)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        running_pod(local_kube, ns, "before")
        wait_for(lambda: sink.of(f"{ns}/before") == ["SUBMITTED", "STARTED"], "the first pod started")
        local_kube.restart_apiserver()
        running_pod(local_kube, ns, "after")
        local_kube.kubectl("-n", ns, "delete", "pod", "before", "--grace-period=0", "--force")
        wait_for(lambda: sink.of(f"{ns}/after") == ["SUBMITTED", "STARTED"] and len(sink.of(f"{ns}/before")) == 3,
                 f"events after the restart: {Counter((r['job_id'], r['event_type']) for r in sink.records)}, "
                 f"watcher alive: {thread.is_alive()}, errors: {watcher.errors}", alive=thread.is_alive)  # fmt: skip
        assert thread.is_alive(), watcher.errors
    finally:
        watcher.stop()
        thread.join(timeout=15)
    assert sink.of(f"{ns}/before") == ["SUBMITTED", "STARTED", "ENDED"]
    assert sink.of(f"{ns}/after") == ["SUBMITTED", "STARTED"]
