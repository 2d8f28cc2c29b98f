"""Kubernetes producer: the tracker over the fixture objects, and one replayed watch stream of them through the
official client. What the real API server does (410 Gone after a compaction and the re-list, 403 on kinds the
user may not read, `kube watch --once --dry-run`) is tested on a real one: tests/integration/test_kube_live_watch.py."""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
import yaml
from fixtures_events import ListSink
from kubernetes import client

from producers.jobevents import EventContext
from producers.kube import DcgmPodLabels, KubeTracker, KubeWatcher, gpu_request
from producers.projects import Attributor, ProjectRule, registry_from_data

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes"
POD = yaml.safe_load((FIX / "kueue-issue-2213_pod_dws-pod_gke-nvidia-l4.yaml").read_text())
WORKLOAD = yaml.safe_load((FIX / "kueue-issue-2213_workload_pod-dws-pod-4e884_v1beta1.yaml").read_text())
SCRAPE = (FIX / "nvidia-aicr_h100_k8s_gpu-node-1_accelerator-metrics_bc05c6b.prom").read_text()
NODE = "gke-kueue-dws-l4-pool-7f3a"
WL_GANG = "kueue:kueue-dws/pod-dws-pod-4e884"


def _pod_lifecycle() -> list[tuple[str, dict]]:
    """The fixture pod from creation to deletion, as a watch would show it."""
    pending = copy.deepcopy(POD)
    for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        pending["metadata"].pop(k)
    pending["metadata"]["labels"]["gpuledger.io/project"] = "atlas"
    pending["metadata"]["labels"]["gpuledger.io/user"] = "alice"
    pending["status"] = {"phase": "Pending", "qosClass": "Guaranteed",
                         "conditions": [POD["status"]["conditions"][0]]}
    running = copy.deepcopy(pending)
    running["spec"]["nodeName"] = NODE
    running["status"] = {
        "phase": "Running",
        "startTime": "2024-05-17T14:06:45Z",
        "containerStatuses": [{"name": "dummy-job", "ready": True, "restartCount": 0,
                               "image": "gcr.io/k8s-staging-perf-tests/sleep:v0.0.3", "imageID": "",
                               "state": {"running": {"startedAt": "2024-05-17T14:06:50Z"}}}],
    }
    done = copy.deepcopy(running)
    done["status"]["phase"] = "Succeeded"
    done["status"]["containerStatuses"][0]["state"] = {
        "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2024-05-17T14:06:50Z",
                       "finishedAt": "2024-05-17T14:08:50Z"}}
    return [("ADDED", pending), ("MODIFIED", running), ("MODIFIED", done), ("DELETED", done)]


def _cond(ctype, reason, ts, status="True"):
    return {"type": ctype, "status": status, "reason": reason, "message": "", "lastTransitionTime": ts}


def _workload_lifecycle() -> tuple[dict, list[tuple[str, dict]]]:
    queued = copy.deepcopy(WORKLOAD)
    for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        queued["metadata"].pop(k)
    queued["metadata"].setdefault("labels", {})["gpuledger.io/project"] = "atlas"
    queued["status"] = {}
    admitted = copy.deepcopy(queued)
    admitted["status"] = copy.deepcopy(WORKLOAD["status"])  # QuotaReserved + Admitted, as captured
    preempted = copy.deepcopy(admitted)
    preempted["status"]["conditions"] = [
        _cond("Admitted", "NoReservation", "2024-05-17T14:07:30Z", "False"),
        _cond("Evicted", "Preempted", "2024-05-17T14:07:30Z"),
    ]
    readmitted = copy.deepcopy(admitted)
    readmitted["status"]["conditions"] = [
        _cond("Evicted", "Preempted", "2024-05-17T14:07:30Z", "False"),
        _cond("Admitted", "Admitted", "2024-05-17T14:08:00Z"),
    ]
    deactivated = copy.deepcopy(readmitted)
    deactivated["spec"]["active"] = False
    deactivated["status"]["conditions"] = [
        _cond("Admitted", "NoReservation", "2024-05-17T14:08:30Z", "False"),
        _cond("Evicted", "InactiveWorkload", "2024-05-17T14:08:30Z"),
    ]
    reactivated = copy.deepcopy(readmitted)
    reactivated["status"]["conditions"] = [_cond("Admitted", "Admitted", "2024-05-17T14:08:40Z")]
    finished = copy.deepcopy(reactivated)
    finished["status"]["conditions"].append(_cond("Finished", "Succeeded", "2024-05-17T14:08:55Z"))
    return queued, [("MODIFIED", admitted), ("MODIFIED", preempted), ("MODIFIED", readmitted),
                    ("MODIFIED", deactivated), ("MODIFIED", reactivated), ("MODIFIED", finished)]


def _podgroup(phase: str) -> dict:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "llm-train", "namespace": "research", "uid": "pg-1", "resourceVersion": "5",
                     "creationTimestamp": "2024-05-17T13:00:00Z", "labels": {"gpuledger.io/project": "atlas"}},
        "spec": {"minMember": 2, "queue": "gpu-queue", "minResources": {"nvidia.com/gpu": "16"}},
        "status": {"phase": phase, "conditions": [
            _cond("Scheduled", "tasks in gang are ready to be scheduled", "2024-05-17T13:01:00Z")]
            if phase != "Pending" else []},
    }


class FakeApiServer:
    """Serves list and watch for pods, Kueue workloads and Volcano podgroups on 127.0.0.1."""

    def __init__(self, lists: dict[str, list[dict]], streams: dict[str, list[tuple[str, dict]]]) -> None:
        self.lists, self.streams, self.requests = lists, streams, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urlparse(self.path)
                q = parse_qs(url.query)
                outer.requests.append((url.path, q))
                routes = {"/api/v1/pods": "pods", "/apis/kueue.x-k8s.io/v1beta1/workloads": "workloads",
                          "/apis/scheduling.volcano.sh/v1beta1/podgroups": "podgroups"}
                name = routes.get(url.path)
                if name is None or name not in outer.lists:
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(json.dumps({"kind": "Status", "code": 404}).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if q.get("watch") == ["true"]:
                    for etype, obj in outer.streams.get(name, []):
                        self.wfile.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                        self.wfile.flush()
                    return
                items = outer.lists[name]() if callable(outer.lists[name]) else outer.lists[name]
                self.wfile.write(json.dumps({"kind": "List", "metadata": {"resourceVersion": "100"},
                                             "items": items}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


REGISTRY = registry_from_data({"projects": [{"id": "atlas", "cost_centre": "CC-1"}], "defaults": {}})


def _ctx():
    return EventContext("gke", attributor=Attributor(REGISTRY, ProjectRule(mode="grace")))


def test_watch_streams_through_the_official_client():
    queued, wl_stream = _workload_lifecycle()
    lists = {"pods": [], "workloads": [queued], "podgroups": [_podgroup("Pending")]}
    streams = {"pods": _pod_lifecycle(), "workloads": wl_stream,
               "podgroups": [("MODIFIED", _podgroup("Running")), ("MODIFIED", _podgroup("Completed"))]}
    with FakeApiServer(lists, streams) as host:
        cfg = client.Configuration()
        cfg.host = host
        sink = ListSink()
        watcher = KubeWatcher(client.ApiClient(cfg), KubeTracker(_ctx()), sink, clock=lambda: 1715955000000,
                              timeout_seconds=5)
        watcher.run(rounds=1)
    assert watcher.errors == []
    by_job: dict[str, list] = {}
    for _, key, rec in sink.records:
        assert key == f"gke/{rec['job_id']}".encode()
        by_job.setdefault(rec["job_id"], []).append(rec)

    pod = by_job["kueue-dws/dws-pod"]
    assert [(r["event_type"], r["ts_ms"]) for r in pod] == [
        ("SUBMITTED", 1715954574000), ("STARTED", 1715954805000), ("ENDED", 1715954930000)]
    started = pod[1]
    assert started["scheduler"] == "KUEUE" and started["gang_id"] == WL_GANG
    assert started["allocations"] == [{"node": NODE, "devices": [{"index": None, "uuid": None,
                                                                   "mig_instance_id": None, "mig_profile": None}]}]
    assert (started["user"], started["project"], started["project_source"], started["project_validation"]) == (
        "alice", "atlas", "EXPLICIT", "VALID")
    assert started["identity"]["cost_centre"] == "CC-1" and started["partition"] == "dws-jobs"
    assert (pod[2]["exit_state"], pod[2]["exit_code"]) == ("COMPLETED", 0)

    wl = by_job["kueue-dws/pod-dws-pod-4e884"]
    assert [r["event_type"] for r in wl] == [
        "SUBMITTED", "UPDATED", "PREEMPTED", "UPDATED", "SUSPENDED", "RESUMED", "ENDED"]
    assert {r["scheduler"] for r in wl} == {"KUEUE"} and wl[1]["partition"] == "dws-cluster-queue"
    assert wl[1]["requested_devices"] == 1 and wl[2]["ts_ms"] == 1715954850000

    pg = by_job["research/llm-train"]
    assert [(r["event_type"], r["scheduler"], r["gang_id"]) for r in pg] == [
        ("SUBMITTED", "VOLCANO", "volcano:research/llm-train"), ("UPDATED", "VOLCANO", "volcano:research/llm-train"),
        ("ENDED", "VOLCANO", "volcano:research/llm-train")]
    assert pg[1]["gang_size"] == 16


def test_captured_pod_stopped_by_kueue_never_started():
    tracker = KubeTracker(EventContext("gke"))
    events = tracker.on_pod("MODIFIED", POD, 1715955000000)
    assert [(e["event_type"], e["exit_state"]) for e in events] == [("SUBMITTED", None), ("ENDED", "PREEMPTED")]
    assert events[1]["ts_ms"] == 1715954800000  # deletionTimestamp 14:06:40Z
    assert events[1]["project_source"] == "MISSING"


def test_device_uuids_from_dcgm_exporter_pod_labels():
    labels = DcgmPodLabels()
    labels.load_scrape(SCRAPE)
    pod = copy.deepcopy(_pod_lifecycle()[1][1])
    pod["metadata"].update(name="vllm-agg-0-vllmdecodeworker-s65j5", namespace="dynamo-workload", uid="u-1")
    pod["spec"]["nodeName"] = "gpu-node-1"
    tracker = KubeTracker(EventContext("aicr"), labels)
    _submitted, started = tracker.on_pod("ADDED", pod, 1)
    dev = {"index": 0, "uuid": "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "mig_instance_id": None,
           "mig_profile": None}
    assert started["allocations"] == [{"node": "gpu-node-1", "devices": [dev]}]


def test_uuids_learned_after_start_give_an_update():
    labels = DcgmPodLabels()
    pod = copy.deepcopy(_pod_lifecycle()[1][1])
    pod["metadata"].update(name="vllm-agg-0-vllmdecodeworker-s65j5", namespace="dynamo-workload")
    pod["spec"]["nodeName"] = "gpu-node-1"
    tracker = KubeTracker(EventContext("aicr"), labels)
    assert [e["event_type"] for e in tracker.on_pod("ADDED", pod, 1)] == ["SUBMITTED", "STARTED"]
    labels.load_scrape(SCRAPE)
    (upd,) = tracker.on_pod("MODIFIED", pod, 2)
    assert upd["event_type"] == "UPDATED" and upd["allocations"][0]["devices"][0]["uuid"].startswith("GPU-c452")
    assert tracker.on_pod("MODIFIED", pod, 3) == []


@pytest.mark.parametrize("resources,gpus,mig", [
    ({"limits": {"nvidia.com/gpu": "2"}}, 2, {}),
    ({"requests": {"nvidia.com/mig-1g.5gb": "1"}, "limits": {"nvidia.com/mig-1g.5gb": "1"}}, 0,
     {"nvidia.com/mig-1g.5gb": 1}),
    ({"limits": {"cpu": "1"}}, 0, {}),
])
def test_gpu_request(resources, gpus, mig):
    req = gpu_request({"containers": [{"name": "c", "resources": resources}]})
    assert (req.gpus, dict(req.mig)) == (gpus, mig)


def test_mig_pod_records_the_profile():
    pod = copy.deepcopy(_pod_lifecycle()[1][1])
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-1g.5gb": "2"}}
    _, started = KubeTracker(EventContext("c")).on_pod("ADDED", pod, 1)
    assert [(d["mig_profile"], d["index"]) for d in started["allocations"][0]["devices"]] == [
        ("1g.5gb", None), ("1g.5gb", None)]


def test_jobset_and_volcano_gangs_from_pod_metadata():
    tracker = KubeTracker(EventContext("c"))
    pod = copy.deepcopy(_pod_lifecycle()[1][1])
    pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "trainer"
    assert tracker.gang_of(pod) == "jobset:kueue-dws/trainer"
    pod["metadata"].setdefault("annotations", {})["scheduling.k8s.io/group-name"] = "pg"
    assert tracker.gang_of(pod) == "volcano:kueue-dws/pg"


def test_pods_of_a_preempted_workload_end_as_preempted():
    tracker = KubeTracker(EventContext("gke"))
    queued, stream = _workload_lifecycle()
    tracker.on_workload("ADDED", queued, 0)
    tracker.on_workload("MODIFIED", stream[0][1], 0)  # admitted
    pending, running, _, _ = (obj for _, obj in _pod_lifecycle())
    tracker.on_pod("ADDED", pending, 0)
    (started,) = tracker.on_pod("MODIFIED", running, 0)
    assert started["gang_id"] == WL_GANG and started["gang_size"] == 1
    (pre,) = tracker.on_workload("MODIFIED", stream[1][1], 0)  # evicted: Preempted
    assert pre["event_type"] == "PREEMPTED"
    (ended,) = tracker.on_pod("DELETED", running, 1715954860000)
    assert (ended["event_type"], ended["exit_state"]) == ("ENDED", "PREEMPTED")


def test_kubeflow_and_coscheduling_gangs_from_pod_labels_unless_a_workload_owns_the_job():
    tracker = KubeTracker(EventContext("c"))
    pod = copy.deepcopy(_pod_lifecycle()[1][1])
    pod["metadata"]["labels"].pop("kueue.x-k8s.io/pod-group-name", None)
    pod["metadata"]["labels"]["training.kubeflow.org/job-name"] = "bert"
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "bert",
                                           "uid": "pt-1", "controller": True}]
    assert tracker.gang_of(pod) == "kubeflow:kueue-dws/bert"
    tracker.book.workload_by_owner_uid["pt-1"] = "kueue:kueue-dws/pytorchjob-bert-1a2b3"  # Kueue admits the job
    assert tracker.gang_of(pod) == "kueue:kueue-dws/pytorchjob-bert-1a2b3"
    plain = copy.deepcopy(_pod_lifecycle()[1][1])
    plain["metadata"]["labels"].pop("kueue.x-k8s.io/pod-group-name", None)
    plain["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = "pg-7"
    assert tracker.gang_of(plain) == "coscheduling:kueue-dws/pg-7"


def test_jobset_gang_size_sums_its_running_pods():
    tracker = KubeTracker(EventContext("c"))
    sizes = []
    for i in range(3):
        pod = copy.deepcopy(_pod_lifecycle()[1][1])
        pod["metadata"].update(name=f"trainer-{i}", uid=f"u{i}")
        pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = "trainer"
        pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "4"
        sizes.append(tracker.on_pod("ADDED", pod, 0)[-1]["gang_size"])
    assert sizes == [4, 8, 12]


def _workload_deactivated_in_steps() -> tuple[dict, list[dict]]:
    """One deactivation and reactivation as a real Kueue 0.17 shows them, each change in its own update:
    `spec.active=false`; then Evicted(Deactivated); then `spec.active=true` with Requeued(Reactivated);
    then Admitted again."""
    queued, stream = _workload_lifecycle()
    admitted = stream[0][1]
    inactive = copy.deepcopy(admitted)
    inactive["spec"]["active"] = False
    evicted = copy.deepcopy(inactive)
    evicted["status"]["conditions"] = [
        _cond("Admitted", "NoReservation", "2024-05-17T14:08:31Z", "False"),
        _cond("Evicted", "Deactivated", "2024-05-17T14:08:31Z"),
        _cond("Requeued", "Deactivated", "2024-05-17T14:08:31Z", "False"),
    ]
    reactivated = copy.deepcopy(evicted)
    reactivated["spec"]["active"] = True
    reactivated["status"]["conditions"] = [
        _cond("Admitted", "NoReservation", "2024-05-17T14:08:31Z", "False"),
        _cond("Evicted", "Deactivated", "2024-05-17T14:08:40Z", "False"),
        _cond("Requeued", "Reactivated", "2024-05-17T14:08:40Z"),
    ]
    readmitted = copy.deepcopy(reactivated)
    readmitted["status"]["conditions"] = [
        _cond("Evicted", "Deactivated", "2024-05-17T14:08:40Z", "False"),
        _cond("Requeued", "Reactivated", "2024-05-17T14:08:40Z"),
        _cond("Admitted", "Admitted", "2024-05-17T14:08:41Z"),
    ]
    return queued, [admitted, inactive, evicted, reactivated, readmitted]


def _workload_events(objects: list[dict]) -> list[list[str]]:
    tracker = KubeTracker(EventContext("gke"))
    return [[e["event_type"] for e in tracker.on_workload("ADDED" if i == 0 else "MODIFIED", obj, 0)]
            for i, obj in enumerate(objects)]  # fmt: skip


def test_a_deactivation_whose_eviction_comes_later_is_one_suspended():
    queued, (admitted, inactive, evicted, _, _) = _workload_deactivated_in_steps()
    assert _workload_events([queued, admitted, inactive, evicted]) == [["SUBMITTED"], ["UPDATED"], ["SUSPENDED"], []]
    # Kueue's eviction in the same update as spec.active=false: still one
    assert _workload_events([queued, admitted, evicted]) == [["SUBMITTED"], ["UPDATED"], ["SUSPENDED"]]


def test_the_requeue_of_a_reactivation_is_no_requeued():
    queued, (admitted, inactive, evicted, reactivated, readmitted) = _workload_deactivated_in_steps()
    seen = _workload_events([queued, admitted, inactive, evicted, reactivated, readmitted])
    assert seen == [["SUBMITTED"], ["UPDATED"], ["SUSPENDED"], [], ["RESUMED"], ["UPDATED"]]
    # listed after the reactivation: its Requeued(Reactivated) is no requeue either
    assert _workload_events([readmitted]) == [["SUBMITTED", "UPDATED"]]
