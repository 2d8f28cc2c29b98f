"""dcgm-exporter pod labels followed continuously (issue 18): a pod that started after the watcher, whose
labels only appear in a later scrape, gets an UPDATED naming its devices when the labels are scraped again,
without waiting for the pod itself to change (the real aicr scrape, tests/fixtures/kubernetes)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from producers.jobevents import EventContext
from producers.kube import DcgmPodLabels, KubeTracker, KubeWatcher

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes"
SCRAPE = (FIX / "nvidia-aicr_h100_k8s_gpu-node-1_accelerator-metrics_bc05c6b.prom").read_text()
POD = yaml.safe_load((FIX / "kueue-issue-2213_pod_dws-pod_gke-nvidia-l4.yaml").read_text())


def running_pod() -> dict[str, Any]:
    pod = copy.deepcopy(POD)
    for k in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        pod["metadata"].pop(k)
    pod["metadata"].update(name="vllm-agg-0-vllmdecodeworker-s65j5", namespace="dynamo-workload")
    pod["spec"]["nodeName"] = "gpu-node-1"
    pod["status"] = {"phase": "Running", "startTime": "2024-05-17T14:06:45Z"}
    return pod


class Sink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.events.append(record)


def test_labels_scraped_later_name_the_devices_of_a_running_pod() -> None:
    labels = DcgmPodLabels()
    sink = Sink()
    watcher = KubeWatcher(None, KubeTracker(EventContext("aicr"), labels), sink, clock=lambda: 1_715_955_000_000)
    watcher.apply("pods", "ADDED", running_pod())
    started = sink.events[-1]
    assert started["event_type"] == "STARTED"
    assert started["allocations"][0]["devices"][0]["uuid"] is None  # not known yet
    assert watcher.apply("pods", "RECHECK", {}) == []  # nothing new scraped: nothing to say
    labels.load_scrape(SCRAPE)  # the refresher's next scrape
    (upd,) = watcher.apply("pods", "RECHECK", {})
    assert upd["event_type"] == "UPDATED" and upd["ts_ms"] == 1_715_955_000_000
    assert [d["uuid"] for d in upd["allocations"][0]["devices"]] == ["GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"]
    assert watcher.apply("pods", "RECHECK", {}) == []  # once
    assert sink.events[-1] is upd


def test_recheck_from_another_thread_goes_through_the_apply_queue() -> None:
    watcher = KubeWatcher(None, KubeTracker(EventContext("aicr"), DcgmPodLabels()), Sink(), clock=lambda: 0)
    watcher.recheck_devices()
    assert watcher._queue.get_nowait() == ("pods", "RECHECK", {})
