"""`policy apply --prune` (issue 41 item 1), the pure parts: who may prune (governance.pruners, one line naming who
may), Slurm's mark and the commands that remove only marked objects the policy dropped, Kueue's plan (only objects
with our label AND our field manager) and the API server's prune guard. Live: tests/integration/
test_slurm_live_prune.py, test_kube_live_prune.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from producers import policy_kueue
from producers import policy_slurm as ps
from producers.policy_engine import (
    FIELD_MANAGER,
    PRUNE_GUARD_MESSAGE,
    Pruned,
    prune_guard_objects,
    prune_plan,
    prune_refusal,
    slurm_prune,
)
from schemas.policy import PolicyError, parse_policy

TEXT = """
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: prod, priority: 1000}]
governance: {operators: [ops1], pruners: [root, "system:serviceaccount:gpuledger:gpuledger-policy"]}
teams: [{name: serve, namespaces: [serve], members: [root], tiers: [prod]}]
"""
POLICY = parse_policy(TEXT)


def test_only_the_policys_pruners_may_prune_and_a_refusal_says_who_may() -> None:
    assert prune_refusal(POLICY, "root") is None
    assert prune_refusal(POLICY, "system:serviceaccount:gpuledger:gpuledger-policy") is None
    assert prune_refusal(POLICY, "alice") == ("'alice' may not prune: policy governance.pruners names who may (root, "
                                              "system:serviceaccount:gpuledger:gpuledger-policy)")  # fmt: skip
    nobody = parse_policy(TEXT.replace(', pruners: [root, "system:serviceaccount:gpuledger:gpuledger-policy"]', ""))
    assert prune_refusal(nobody, "root") == (
        "'root' may not prune: policy governance.pruners names who may (nobody named)")
    with pytest.raises(PolicyError, match="is neither a user name nor system:serviceaccount"):
        parse_policy(TEXT.replace("pruners: [root,", "pruners: [\"a b\","))


def test_slurm_prunes_only_marked_objects_the_policy_no_longer_names_accounts_first() -> None:
    shows = {"qos": "prod|gpuledger-policy\nold|gpuledger-policy\nhand|\nnormal|Normal QOS default\n",
             "account": "serve|gpuledger-policy\ngone|gpuledger-policy\nroot|default root\nhand|x\n"}  # fmt: skip
    ran: list[list[str]] = []

    def run(argv: Sequence[str]) -> str:
        ran.append(list(argv))
        return shows[argv[4]] if argv[1:4] == ["-n", "-P", "show"] else ""

    commands = slurm_prune(POLICY, run)
    assert commands == [["delete", "account", "where", "name=gone"], ["delete", "qos", "where", "name=old"]]
    assert ran[0] == ["sacctmgr", "-n", "-P", "show", "qos", "format=Name,Description"]
    assert ran[1] == ["sacctmgr", "-n", "-P", "show", "account", "format=Account,Description"]
    assert ran[2:] == [["sacctmgr", "-i", *c] for c in commands]
    assert ps.marked("a|gpuledger-policy\nb|gpuledger-policy-not\n", "qos") == {"a"}  # the exact mark only


def _obj(kind: str, name: str, *, labelled: bool, manager: str, ns: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "managedFields": [{"manager": manager, "operation": "Apply"}]}
    if ns:
        meta["namespace"] = ns
    if labelled:
        meta["labels"] = dict(policy_kueue.MANAGED_BY)
    return {"kind": kind, "metadata": meta}


def test_kueue_prunes_only_what_carries_our_label_and_our_field_manager_queues_before_their_cluster_queues() -> None:
    want = policy_kueue.render_objects(POLICY)
    live = [
        *({**o, "metadata": {**o["metadata"], "managedFields": [{"manager": FIELD_MANAGER}]}} for o in want),
        _obj("ClusterQueue", "dropped", labelled=True, manager=FIELD_MANAGER),
        _obj("LocalQueue", "dropped", labelled=True, manager=FIELD_MANAGER, ns="old"),
        _obj("ClusterQueue", "forged", labelled=True, manager="kubectl"),  # the label copied by someone else
        _obj("ClusterQueue", "foreign", labelled=False, manager=FIELD_MANAGER),  # ours once, the label taken off
    ]
    assert prune_plan(want, live) == [Pruned(("LocalQueue", "old", "dropped")), Pruned(("ClusterQueue", "", "dropped"))]
    assert str(prune_plan(want, live)[1]) == (
        f"ClusterQueue dropped: pruned (created by {FIELD_MANAGER}, no longer in the policy)")


def test_each_removed_object_is_a_change_of_the_applys_record() -> None:
    from producers.policy_audit import change

    assert change(Pruned(("ClusterQueue", "", "dropped"))) == {"object": "ClusterQueue dropped", "setting": "",
                                                               "before": "present", "after": None}  # fmt: skip
    assert change(Pruned(("qos", "", "old")))["object"] == "qos old"


def test_the_prune_guard_is_the_api_servers_check_for_the_appliers_deletes() -> None:
    vap, binding = prune_guard_objects('system:serviceaccount:gpuledger:gpuledger-policy')
    spec = vap["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["DELETE"]
    assert set(spec["matchConstraints"]["resourceRules"][0]["resources"]) == {
        "clusterqueues", "localqueues", "resourceflavors", "cohorts", "workloadpriorityclasses"}
    assert spec["matchConditions"][0]["expression"] == (
        'request.userInfo.username == "system:serviceaccount:gpuledger:gpuledger-policy"')
    rule = spec["validations"][0]
    assert rule["message"] == PRUNE_GUARD_MESSAGE and "oldObject.metadata.managedFields.exists" in rule["expression"]
    assert '"app.kubernetes.io/managed-by" in oldObject.metadata.labels' in rule["expression"]
    assert binding["spec"] == {"policyName": vap["metadata"]["name"], "validationActions": ["Deny"],
                               "matchResources": {"namespaceSelector": {}, "objectSelector": {}}}  # fmt: skip
    # a quote in a name cannot end the CEL string early
    assert prune_guard_objects('a"b')[0]["spec"]["matchConditions"][0]["expression"].endswith('== "a\\"b"')
