"""The simulated Kubernetes cluster submits through the stamped path: its objects carry the admission stamp
(`gpuledger.io/submitter`, `-uid`, `-groups`) as the MutatingAdmissionPolicy writes it from userInfo, the Pods the
Job controller makes carry the controller's stamp and point at the stamped Job, one CI robot's service account is
recreated mid-run (a second uid under the same name), and one user's self-declared label disagrees with the stamp.
The job events come from the producer's own code (producers/kube.py, producers/kube_identity.py) and agree with
the expected ledger's user and uid."""

from __future__ import annotations

from typing import Any

import pytest

from producers.policy_stamp import SUBMITTER, SUBMITTER_GROUPS, SUBMITTER_UID
from producers.simulator import SimConfig, expected_ledger, simulate
from producers.simulator.kube import (
    JOB_CONTROLLER,
    USER_LABEL,
    _changes,
    _Objects,
    cluster_plan,
    robot_recreated_s,
    robot_uid,
)
from producers.simulator.model import clusters
from producers.simulator.org import CI_ROBOT, sim_directory
from schemas.topics import JOB_EVENTS

CFG = SimConfig(seed=1, nodes=1, kube_nodes=3, duration_s=1800)


@pytest.fixture(scope="module")
def kube_plan() -> Any:
    (kube,) = [c for c in clusters(CFG) if c.scheduler == "kube"]
    return cluster_plan(kube)


def test_objects_carry_the_stamp_the_admission_policy_writes(kube_plan: Any) -> None:
    objs, owners = _Objects(kube_plan), _Objects(kube_plan).owners()
    pods = [obj for _, _, target, _, obj in _changes(kube_plan) if target == "pod"]
    assert pods and owners.jobs
    for pod in pods:
        meta = pod["metadata"]
        ann = meta["annotations"]
        assert set(ann) == {SUBMITTER, SUBMITTER_UID, SUBMITTER_GROUPS} and all(ann.values())
        if meta["ownerReferences"]:  # made by the Job controller: its stamp, and the Job it was made for
            (ref,) = meta["ownerReferences"]
            assert ann[SUBMITTER] == JOB_CONTROLLER and ref["controller"] is True and ref["apiVersion"] == "batch/v1"
            job = owners.owner(meta["namespace"], ref)
            assert job is not None and job["metadata"]["annotations"][SUBMITTER] != JOB_CONTROLLER
        else:
            assert not ann[SUBMITTER].startswith("system:serviceaccount:kube-system:")
    assert objs.plan is kube_plan


def test_the_ci_robot_is_recreated_mid_run_and_one_label_disagrees(kube_plan: Any) -> None:
    robot = [j for j in kube_plan.jobs if j.person.user == CI_ROBOT]
    recreated = robot_recreated_s(kube_plan.jobs)
    assert len(robot) >= 2 and recreated is not None and 0 < recreated < CFG.duration_s
    assert {j.submitter_uid for j in robot} == {robot_uid(1), robot_uid(2)}
    assert all(j.submitter_uid == robot_uid(1 if j.submit_s < recreated else 2) for j in robot)
    owners = _Objects(kube_plan).owners()
    stamped = {j["metadata"]["annotations"][SUBMITTER_UID] for j in owners.jobs.values()
               if j["metadata"]["annotations"][SUBMITTER] == CI_ROBOT}  # fmt: skip
    assert stamped == {robot_uid(1), robot_uid(2)}
    assert all(USER_LABEL not in j["metadata"]["labels"] for j in owners.jobs.values()
               if j["metadata"]["annotations"][SUBMITTER] == CI_ROBOT)  # fmt: skip
    assert sim_directory()[CI_ROBOT].primary_team == "platform"  # the directory names the team that owns it
    claimers = {(j.person.user, j.claimed_user) for j in kube_plan.jobs if j.claimed_user}
    assert len(claimers) == 1
    ((user, claimed),) = claimers
    assert claimed != user and sim_directory()[claimed].teams == sim_directory()[user].teams


def test_the_producers_events_charge_the_stamp_as_the_expected_ledger_does() -> None:
    ledger = expected_ledger(CFG)
    started: dict[str, dict[str, Any]] = {}
    for topic, _, rec in simulate(CFG):
        if topic is JOB_EVENTS and rec["event_type"] == "STARTED" and rec["cluster"].endswith("-k8s"):
            started[rec["job_id"]] = rec
    kube_jobs = {k: v for k, v in ledger.items() if v.cluster.endswith("-k8s")}
    assert kube_jobs and set(started) == {led.job_id for led in kube_jobs.values()}
    sources, claimed, robot_uids = set(), [], set()
    for led in kube_jobs.values():
        rec = started[led.job_id]
        assert (rec["user"], rec["user_uid"]) == (led.user, led.user_uid), led.job_id
        assert rec["identity"]["primary_team"] == led.team and rec["project"] == led.project
        sources.add(rec["user_source"])
        if rec["user_claimed"]:
            claimed.append((rec["user"], rec["user_claimed"]))
        if rec["user"] == CI_ROBOT:
            robot_uids.add(rec["user_uid"])
            assert "system:serviceaccounts:platform" in rec["user_groups"]
    assert sources == {"STAMPED"}
    assert claimed and len(set(claimed)) == 1
    assert robot_uids == {robot_uid(1), robot_uid(2)}  # one name, two identities
    slurm = [led for led in ledger.values() if not led.cluster.endswith("-k8s")]
    assert slurm and all(led.user_uid is None for led in slurm)
