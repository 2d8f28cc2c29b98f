"""The Workload that owns a pod (sinks/kube_owner.py), on objects a real cluster produced: Kueue's pod
integration (tests/fixtures/kubernetes, from kueue issue 2213: the Workload `pod-dws-pod-4e884` owns pod
`dws-pod` by ownerReference and job-uid label), and a Job/JobSet chain; a Volcano Job above its pods and the
AbortJob Command that stops it, checked against Volcano's own Command CRD (deploy/kubernetes/crds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from sinks.kube_owner import (
    Owner,
    abort_command,
    command_name,
    find_gang_object,
    find_jobset,
    find_owning_workload,
    find_volcano_job,
)
from sinks.reclaim import ReclaimExecutor

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


# -- Volcano: pod -> Volcano Job, stopped by an AbortJob Command ---------------------------------------------

COMMAND_CRD = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "crds" / (
    "volcano-v1.15.1_bus.volcano.sh_commands.yaml")  # fmt: skip


def vcjob(phase: str | None = None) -> dict[str, Any]:
    job: dict[str, Any] = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "uid": "0f1e2d3c-aaaa-bbbb-cccc-1234"},
    }
    if phase:
        job["status"] = {"state": {"phase": phase}}
    return job


def vc_pod(job: dict[str, Any]) -> dict[str, Any]:
    pod = meta("Pod", "train-worker-0", "u-pod", job)
    pod["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "train-podgroup"}
    return pod


def test_a_volcano_gang_climbs_to_its_job_and_not_to_a_batch_job() -> None:
    job = vcjob("Running")
    pod = vc_pod(job)
    got = find_volcano_job(pod, lambda ns, ref: job if ref["uid"] == job["metadata"]["uid"] else None)
    assert got is not None and (got.kind, got.name, got.active) == ("VolcanoJob", "train", True)
    assert got.path == ("Pod train-worker-0", "Job train")
    assert got.describe() == "Volcano Job ml/train (owner of Pod train-worker-0 -> Job train)"
    assert find_gang_object(pod, lambda ns, ref: job) == got
    assert find_jobset(pod, lambda ns, ref: job) is None
    batch = meta("Job", "train", "u-batch")  # a batch/v1 Job of the same name is no Volcano Job
    assert find_volcano_job(meta("Pod", "p", "u-p", batch), lambda ns, ref: batch) is None
    assert find_volcano_job(pod, lambda ns, ref: None) is None  # unreadable owner: nothing


PHASES = [(None, True), ("Pending", True), ("Running", True), ("Restarting", True), ("Aborting", False),
          ("Aborted", False), ("Completed", False), ("Terminated", False), ("Failed", False)]  # fmt: skip


@pytest.mark.parametrize(("phase", "active"), PHASES)
def test_a_volcano_job_is_stopped_once_its_phase_says_its_pods_are_going(phase: str | None, active: bool) -> None:
    assert Owner(vcjob(phase), ("Pod p", "Job train"), "VolcanoJob").active is active


def test_the_abort_command_targets_the_job_and_satisfies_the_real_crd() -> None:
    owner = Owner(vcjob("Running"), ("Pod p", "Job train"), "VolcanoJob")
    cmd = abort_command(owner)
    target = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train",
              "uid": "0f1e2d3c-aaaa-bbbb-cccc-1234", "controller": True}  # fmt: skip
    assert (cmd["apiVersion"], cmd["kind"], cmd["action"], cmd["target"]) == (
        "bus.volcano.sh/v1alpha1",
        "Command",
        "AbortJob",
        target,
    )
    assert cmd["metadata"]["name"] == "train-abortjob-0f1e2d3c" and cmd["metadata"]["namespace"] == "ml"
    assert cmd["metadata"]["ownerReferences"] == [target]  # goes with the Job; no blockOwnerDeletion
    assert abort_command(owner) == cmd  # deterministic: a repeated reclaim names the same Command
    crd = yaml.safe_load(COMMAND_CRD.read_text(encoding="utf-8"))
    assert (crd["spec"]["group"], crd["spec"]["names"]["kind"]) == ("bus.volcano.sh", "Command")
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1" and v["served"]]
    schema = version["schema"]["openAPIV3Schema"]
    jsonschema.Draft7Validator(schema).validate(cmd)
    unknown = set(cmd) - set(schema["properties"])
    assert not unknown, unknown  # the API server would prune these
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate({**cmd, "target": {"kind": "Job", "name": "train"}})
    with pytest.raises(ValueError, match="not JobSet"):
        abort_command(Owner(meta("JobSet", "js", "u"), ("Pod p",), "JobSet"))
    with pytest.raises(ValueError, match="no name or uid"):
        abort_command(Owner({"metadata": {"name": "train"}}, ("Pod p",), "VolcanoJob"))


def test_command_names_stay_valid_for_long_job_names() -> None:
    name = command_name("j" * 300, "abcdef12-3456")
    assert len(name) == 253 and name.endswith("-abortjob-abcdef12")
    assert command_name("train", "u1") != command_name("train", "u2")  # a re-created Job gets another


def test_a_workload_owning_the_volcano_job_wins() -> None:
    job = vcjob("Running")
    pod = vc_pod(job)
    wl = {"metadata": {"name": "vcjob-train-1", "namespace": "ml", "ownerReferences": [
        {"kind": "Job", "name": "train", "uid": job["metadata"]["uid"]}]}, "spec": {"active": True}}  # fmt: skip
    got = find_owning_workload(pod, [wl], no_owner)
    assert got is not None and (got.kind, got.name) == ("Workload", "vcjob-train-1")
    assert got.path == ("Pod train-worker-0", "Job train")


class Outcomes:
    def __init__(self) -> None:
        self.rows: list[Any] = []

    def record(self, outcomes: Any) -> None:
        self.rows.extend(outcomes)

    def has_run(self, action_id: str) -> bool:
        return False


def test_the_executor_creates_one_command_and_patches_nothing() -> None:
    job = vcjob("Running")
    created: list[dict[str, Any]] = []

    def create(body: dict[str, Any]) -> bool:
        created.append(body)
        return len(created) == 1  # the second create meets AlreadyExists

    def patch(*args: Any) -> None:
        raise AssertionError(f"patched {args}")

    run = ReclaimExecutor(Outcomes(), dry_run=False, kueue_read=None, kueue_patch=patch, owner_patch=patch,
                          owner_create=create,
                          kueue_owner=lambda ns, name: Owner(job, ("Pod p", "Job train"), "VolcanoJob"))  # fmt: skip
    act = {"action_id": "a1", "cluster": "c", "job_id": "ml/p", "scheduler": "KUEUE", "action": "SUSPEND",
           "dry_run": False}  # fmt: skip
    first = run.execute(act)
    assert [(o.step, o.status, o.detail) for o in first] == [(1, "ok", (
        "Volcano Job ml/train (owner of Pod p -> Job train) suspended: AbortJob Command ml/train-abortjob-0f1e2d3c "
        "created"))]  # fmt: skip
    second = run.execute({**act, "action_id": "a2"})
    assert [(o.step, o.status) for o in second] == [(1, "skipped")]
    assert second[0].detail.endswith("AbortJob Command ml/train-abortjob-0f1e2d3c exists: the gang is reclaimed as one")
    assert [c["action"] for c in created] == ["AbortJob", "AbortJob"] and created[0] == created[1]
    job["status"] = {"state": {"phase": "Aborted"}}  # Volcano consumed the Command and aborted the Job
    third = run.execute({**act, "action_id": "a3"})
    assert [(o.step, o.status) for o in third] == [(1, "skipped")] and "already stopped" in third[0].detail
    assert len(created) == 2
