"""Who is charged on Kubernetes (producers/kube_identity.py): the stamp, the owner chain for controller-made
objects, the self-declared label and the namespace, bounds on the stamp; the admission objects that stamp and
lock it (producers/policy_stamp.py), and the job events carrying the identity fields. The API server's own
admission of these objects is tests/integration/test_kube_live_identity.py."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from producers import policy_stamp
from producers.jobevents import EventContext
from producers.kube import KubeTracker
from producers.kube_identity import (
    MAX_GROUPS,
    MAX_NAME,
    ApiStampTrust,
    IdentityResolver,
    created_ms,
    is_controller,
    owner_path,
    parse_stamp,
)

JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"


def stamped(user: str, uid: str = "u-1", groups: str = "system:authenticated") -> dict[str, str]:
    return {policy_stamp.SUBMITTER: user, policy_stamp.SUBMITTER_UID: uid, policy_stamp.SUBMITTER_GROUPS: groups}


def obj(name: str, *, ann: dict[str, str] | None = None, labels: dict[str, str] | None = None,
        owner: dict[str, Any] | None = None, uid: str | None = None,
        created: str = "2026-12-01T10:00:00Z") -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": "ns1", "uid": uid or f"uid-{name}",
                            "annotations": ann or {}, "labels": labels or {}, "creationTimestamp": created}  # fmt: skip
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta}


def ref(target: Mapping[str, Any], kind: str = "Job", api: str = "batch/v1", controller: bool = True) -> dict[str, Any]:
    m = target["metadata"]
    return {"apiVersion": api, "kind": kind, "name": m["name"], "uid": m["uid"], "controller": controller}


class Owners:
    def __init__(self, *objs: Mapping[str, Any]) -> None:
        self.by_uid = {o["metadata"]["uid"]: o for o in objs}
        self.asked: list[str] = []

    def owner(self, namespace: str, r: Mapping[str, Any]) -> Mapping[str, Any] | None:
        self.asked.append(str(r["uid"]))
        return self.by_uid.get(str(r["uid"]))


def test_a_stamp_wins_over_the_label_and_the_label_that_disagrees_is_the_claim() -> None:
    job = obj("j", ann=stamped("alice", "uid-a", "dev,system:authenticated"), labels={"gpuledger.io/user": "bob"})
    who = IdentityResolver().resolve(job)
    assert (who.user, who.source, who.uid, who.claimed, who.groups) == (
        "alice", "STAMPED", "uid-a", "bob", ("dev", "system:authenticated"))
    agrees = IdentityResolver().resolve(obj("j", ann=stamped("alice"), labels={"gpuledger.io/user": "alice"}))
    assert agrees.claimed is None and agrees.source == "STAMPED"


def test_without_a_stamp_the_label_then_the_namespace() -> None:
    assert IdentityResolver().resolve(obj("p", labels={"kueue.x-k8s.io/user": "carol"})).fields() == {
        "user_uid": None, "user_source": "SELF_DECLARED", "user_claimed": None, "user_groups": ()}
    who = IdentityResolver().resolve(obj("p"))
    assert (who.user, who.source) == ("ns1", "NAMESPACE")


def test_a_controller_made_pod_is_charged_to_its_owners_stamp() -> None:
    cron = obj("c", ann=stamped("dave", "uid-d"))
    job = obj("j", ann=stamped("system:serviceaccount:kube-system:cronjob-controller"),
              owner=ref(cron, "CronJob"))  # fmt: skip
    pod = obj("p", ann=stamped(JOB_CONTROLLER), owner=ref(job), labels={"gpuledger.io/user": "eve"})
    owners = Owners(cron, job)
    who = IdentityResolver(owners).resolve(pod)
    assert (who.user, who.uid, who.source, who.claimed) == ("dave", "uid-d", "STAMPED", "eve")
    assert owners.asked == ["uid-j", "uid-c"]
    # An unstamped pod (made before the policy) with a stamped owner: the owner's stamp.
    assert IdentityResolver(Owners(job, cron)).resolve(obj("q", owner=ref(job))).user == "dave"


def test_a_persons_own_stamp_is_never_passed_over_for_an_owner_they_point_at() -> None:
    victim = obj("j", ann=stamped("bob", "uid-b"))
    forged = obj("p", ann=stamped("mallory", "uid-m"), owner=ref(victim))
    owners = Owners(victim)
    assert IdentityResolver(owners).resolve(forged).user == "mallory"
    assert owners.asked == []


def test_a_controller_stamp_with_no_owner_found_falls_back_to_the_label_and_namespace() -> None:
    gone = {"apiVersion": "batch/v1", "kind": "Job", "name": "gone", "uid": "x", "controller": True}
    pod = obj("p", ann=stamped(JOB_CONTROLLER), owner=gone)
    assert IdentityResolver(Owners()).resolve(pod).source == "NAMESPACE"
    assert IdentityResolver().resolve(pod).source == "NAMESPACE"  # no owner source at all
    # Not a controller ref (controller: false): the controller's own stamp is the charge.
    job = obj("j", ann=stamped("alice"))
    loose = obj("p", ann=stamped(JOB_CONTROLLER), owner=ref(job, controller=False))
    assert IdentityResolver(Owners(job)).resolve(loose).user == JOB_CONTROLLER


def test_the_chain_is_bounded() -> None:
    loop_a: dict[str, Any] = obj("a", ann=stamped(JOB_CONTROLLER))
    loop_b = obj("b", ann=stamped(JOB_CONTROLLER), owner=ref(loop_a))
    loop_a["metadata"]["ownerReferences"] = [ref(loop_b)]
    owners = Owners(loop_a, loop_b)
    assert IdentityResolver(owners).resolve(loop_a).source == "NAMESPACE"
    assert len(owners.asked) == 5


@pytest.mark.parametrize("user,controller", [
    (JOB_CONTROLLER, True), ("system:kube-controller-manager", True),
    ("system:serviceaccount:kueue-system:kueue-controller-manager", True),
    ("system:serviceaccount:team-a:ci-robot", False), ("alice", False), ("oidc:system:x", False),
])  # fmt: skip
def test_which_identities_are_controllers(user: str, controller: bool) -> None:
    assert is_controller(user) is controller


@pytest.mark.parametrize("ann,what", [
    (stamped("x" * (MAX_NAME + 1)), "submitter"),
    (stamped("alice", uid="u" * (MAX_NAME + 1)), "uid"),
    (stamped("alice", groups=",".join(f"g{i}" for i in range(MAX_GROUPS + 1))), "groups"),
    (stamped("alice", groups="g," + "y" * (MAX_NAME + 1)), "a group"),
    (stamped("alice", groups="z" * 100_000), "characters"),
])  # fmt: skip
def test_an_oversized_stamp_is_absent_counted_and_logged(ann: dict[str, str], what: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    resolver = IdentityResolver()
    with caplog.at_level(logging.WARNING):
        who = resolver.resolve(obj("p", ann=ann, labels={"gpuledger.io/user": "bob"}))
    assert (who.user, who.source) == ("bob", "SELF_DECLARED")
    assert resolver.oversized == 1 and what in caplog.text
    assert parse_stamp(obj("p", ann=stamped("alice", groups=""))) is not None


def test_exactly_at_the_bounds_is_kept() -> None:
    groups = ",".join(f"g{i}" for i in range(MAX_GROUPS))
    stamp = parse_stamp(obj("p", ann=stamped("a" * MAX_NAME, groups=groups)))
    assert stamp is not None and len(stamp.groups) == MAX_GROUPS and len(stamp.user) == MAX_NAME


def test_owner_paths_only_for_the_kinds_followed() -> None:
    assert owner_path("ns", {"apiVersion": "batch/v1", "kind": "Job", "name": "j"}) == ("batch", "v1", "jobs", "j")
    assert owner_path("ns", {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "t"})[2] == "pytorchjobs"
    assert owner_path("ns", {"apiVersion": "v1", "kind": "Node", "name": "n"}) is None
    assert owner_path("ns", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "name": "r"}) is None


class Trust:
    def __init__(self, since: str | None) -> None:
        self.since = created_ms({"metadata": {"creationTimestamp": since}}) if since else None

    def since_ms(self) -> int | None:
        return self.since


def test_stamps_count_only_where_the_policy_was_in_force_when_the_object_was_made() -> None:
    job = obj("j", ann=stamped("alice"), labels={"gpuledger.io/user": "bob"}, created="2026-12-01T10:00:00Z")
    assert IdentityResolver(trust=Trust("2026-12-01T09:00:00Z")).resolve(job).source == "STAMPED"
    assert IdentityResolver(trust=Trust("2026-12-01T10:00:00Z")).resolve(job).source == "STAMPED"  # same second
    before = IdentityResolver(trust=Trust("2026-12-01T10:00:01Z"))
    assert (before.resolve(job).user, before.untrusted) == ("bob", 1)  # written before any policy stamped
    absent = IdentityResolver(trust=Trust(None))
    assert absent.resolve(obj("p", ann=stamped("alice"))).source == "NAMESPACE" and absent.untrusted == 1
    # An owner made before the policy: its stamp is not taken either.
    old_job = obj("j", ann=stamped("alice"), created="2026-01-01T00:00:00Z")
    pod = obj("p", ann=stamped(JOB_CONTROLLER), owner=ref(old_job))
    assert IdentityResolver(Owners(old_job), Trust("2026-06-01T00:00:00Z")).resolve(pod).source == "NAMESPACE"


def test_the_api_trust_is_read_again_only_after_its_refresh() -> None:
    now = [0.0]
    trust = ApiStampTrust(None, refresh_s=60, clock=lambda: now[0])
    reads: list[int | None] = []

    def read(last: int | None) -> int | None:
        reads.append(last)
        return 5

    trust._read = read  # type: ignore[method-assign]
    assert [trust.since_ms(), trust.since_ms()] == [5, 5] and reads == [None]
    now[0] = 61.0
    assert trust.since_ms() == 5 and reads == [None, 5]


# -- the events ----------------------------------------------------------------------------------


def gpu_pod(meta: dict[str, Any]) -> dict[str, Any]:
    meta = {**meta, "creationTimestamp": "2026-12-01T10:00:00Z"}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}  # fmt: skip


def test_pod_and_workload_events_carry_the_identity_fields() -> None:
    job = obj("train", ann=stamped("alice", "uid-a", "ml,system:authenticated"))
    tracker = KubeTracker(EventContext("c1"), owners=Owners(job))
    pod = gpu_pod(obj("train-x", ann=stamped(JOB_CONTROLLER), owner=ref(job),
                      labels={"gpuledger.io/user": "bob"})["metadata"])  # fmt: skip
    (ev,) = tracker.on_pod("ADDED", pod, 1_000)
    assert (ev["user"], ev["user_uid"], ev["user_source"], ev["user_claimed"], ev["user_groups"]) == (
        "alice", "uid-a", "STAMPED", "bob", ["ml", "system:authenticated"])
    wl = {"metadata": {"name": "job-train-1", "namespace": "ns1", "uid": "w1", "creationTimestamp":
                       "2026-12-01T10:00:00Z", "ownerReferences": [ref(job)]},
          "spec": {"queueName": "q", "podSets": [{"name": "main", "count": 1, "template": pod}]}}  # fmt: skip
    (gang,) = tracker.on_workload("ADDED", wl, 1_000)
    assert (gang["user"], gang["user_source"], gang["user_uid"]) == ("alice", "STAMPED", "uid-a")
    plain = KubeTracker(EventContext("c1")).on_pod("ADDED", gpu_pod({"name": "p", "namespace": "ns2"}), 1_000)
    assert (plain[0]["user"], plain[0]["user_source"], plain[0]["user_groups"]) == ("ns2", "NAMESPACE", [])


# -- the admission objects -------------------------------------------------------------------------


def test_the_admission_objects_stamp_on_create_and_lock_on_update() -> None:
    objs = policy_stamp.render_objects()
    assert [o["kind"] for o in objs] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                                         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]  # fmt: skip
    assert {o["apiVersion"] for o in objs} == {"admissionregistration.k8s.io/v1"}
    mutating, _, validating, vbinding = objs
    assert mutating["spec"]["failurePolicy"] == "Fail"
    rules = mutating["spec"]["matchConstraints"]["resourceRules"]
    assert {op for r in rules for op in r["operations"]} == {"CREATE"}
    resources = {(r["apiGroups"][0], res) for r in rules for res in r["resources"]}
    assert {("", "pods"), ("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"), ("batch.volcano.sh", "jobs"),
            ("kubeflow.org", "pytorchjobs")} <= resources  # fmt: skip
    expression = mutating["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert all(k in expression for k in policy_stamp.STAMP_KEYS) and "request.userInfo.username" in expression
    assert {op for r in validating["spec"]["matchConstraints"]["resourceRules"] for op in r["operations"]} == {
        "UPDATE"}
    assert vbinding["spec"]["validationActions"] == ["Deny"]
    assert "cannot be changed" in validating["spec"]["validations"][0]["message"]


def test_render_writes_the_stamp_beside_the_kueue_objects(tmp_path: Any) -> None:
    import os
    from pathlib import Path

    import yaml
    from fixtures_cli import run_gpuledger

    policy = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"
    done = run_gpuledger(["policy", "render", "--engine", "kueue", "--out", str(tmp_path), "--policy", str(policy)],
                         env=dict(os.environ), timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert list(yaml.safe_load_all((tmp_path / "submitter-stamp.yaml").read_text())) == policy_stamp.render_objects()
