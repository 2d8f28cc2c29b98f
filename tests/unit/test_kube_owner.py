"""The Workload that owns a pod (sinks/kube_owner.py), on objects a real cluster produced: Kueue's pod
integration (tests/fixtures/kubernetes, from kueue issue 2213: the Workload `pod-dws-pod-4e884` owns pod
`dws-pod` by ownerReference and job-uid label), and a Job/JobSet chain."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from sinks.kube_owner import Owner, find_jobset, find_owning_workload

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes"


def load(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((FIX / name).read_text(encoding="utf-8")))


def no_owner(namespace: str, ref: Any) -> None:
    raise AssertionError(f"read {ref} though the Workload was one level up")


def test_kueue_pod_integration_workload_owns_its_pod() -> None:
    pod = load("kueue-issue-2213_pod_dws-pod_gke-nvidia-l4.yaml")
    wl = load("kueue-issue-2213_workload_pod-dws-pod-4e884_v1beta1.yaml")
    other = {"metadata": {"name": "dws-pod", "namespace": "kueue-dws", "uid": "x"}, "spec": {"active": True}}
    got = find_owning_workload(pod, [other, wl], no_owner)
    assert isinstance(got, Owner) and got.name == "pod-dws-pod-4e884" and got.path == ("Pod dws-pod",)
    assert got.active  # spec.active: true in the capture


def meta(kind: str, name: str, uid: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    api = {"Pod": "v1", "Job": "batch/v1", "JobSet": "jobset.x-k8s.io/v1alpha2"}[kind]
    m: dict[str, Any] = {"name": name, "namespace": "ml", "uid": uid}
    if owner:
        m["ownerReferences"] = [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                 "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}]  # fmt: skip
    return {"apiVersion": api, "kind": kind, "metadata": m}


def test_climbs_pod_job_jobset_and_stops_when_nothing_owns_it() -> None:
    jobset = meta("JobSet", "js", "u-js")
    job = meta("Job", "js-w-0", "u-job", jobset)
    pod = meta("Pod", "js-w-0-0", "u-pod", job)
    wl = {"metadata": {"name": "jobset-js-1", "namespace": "ml", "ownerReferences": [
        {"kind": "JobSet", "name": "js", "uid": "u-js"}]}, "spec": {"active": False}}  # fmt: skip
    reads: list[str] = []

    def read(namespace: str, ref: Any) -> Any:
        reads.append(ref["name"])
        return {"js-w-0": job, "js": jobset}.get(ref["name"])

    got = find_owning_workload(pod, [wl], read)
    assert got is not None and got.path == ("Pod js-w-0-0", "Job js-w-0", "JobSet js") and not got.active
    assert reads == ["js-w-0"]
    assert find_owning_workload(meta("Pod", "alone", "u-alone"), [wl], read) is None


def test_a_jobset_without_a_workload_is_found_to_be_suspended() -> None:
    jobset = {**meta("JobSet", "js", "u-js"), "spec": {"suspend": False}}
    job = meta("Job", "js-w-0", "u-job", jobset)
    pod = meta("Pod", "js-w-0-0", "u-pod", job)

    def read(namespace: str, ref: Any) -> Any:
        return {"js-w-0": job, "js": jobset}.get(ref["name"])

    assert find_owning_workload(pod, [], read) is None
    got = find_jobset(pod, read)
    assert got is not None and (got.kind, got.name, got.active) == ("JobSet", "js", True)
    assert got.stop_body == {"spec": {"suspend": True}}
    assert got.path == ("Pod js-w-0-0", "Job js-w-0", "JobSet js")
    assert find_jobset(job, lambda ns, ref: None) is None  # an owner that cannot be read: nothing
