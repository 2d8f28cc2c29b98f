"""`policy apply --prune` on a real API server with a real Kueue (issue 41 item 1): it removes what the tool itself
created and the policy no longer names, never anything it did not create.

As the gpuledger-policy user (deploy/kubernetes/rbac/policy.yaml, now with delete on the Kueue kinds): a prune asked
under a policy that names nobody in governance.pruners is one line and changes nothing. Allowed, the apply first
installs a ValidatingAdmissionPolicy by which the API server itself refuses that user's DELETE of a Kueue object
without the managed-by label and a managedFields entry of the gpuledger-policy field manager: a ClusterQueue someone
else made, and one that only copies the label, cannot be deleted by that user even by hand. Then a team dropped from
the policy loses its ClusterQueue and LocalQueue; the other team's, and both foreign queues, stay. Names carry a
suffix: the control plane is shared by the session's tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_cli import run_gpuledger
from fixtures_kube import eventually, get, make_namespace
from test_kube_live_identity import remove_stamp

from producers.policy_engine import PRUNE_GUARD, PRUNE_GUARD_MESSAGE
from stack.kube.cluster import LocalKube

USER = "gpuledger-policy"


def policy_text(s: str, ns_a: str, ns_b: str | None, pruners: str) -> str:
    team_b = f"  - {{name: sweeps-{s}, namespaces: [{ns_b}], quota: {{hopper: 1}}}}\n" if ns_b else ""
    return f"""\
version: 1
generations: {{hopper: {{slurm_gres: h100, kueue_flavor: h100-{s}}}}}
tiers: [{{name: prod-{s}, priority: 1000}}]
kueue: {{cohort: org-{s}}}
governance: {{operators: [ops1], pruners: [{pruners}]}}
teams:
  - {{name: serve-{s}, namespaces: [{ns_a}], quota: {{hopper: 2}}}}
{team_b}"""


def queue(name: str, labels: dict[str, str] | None = None) -> dict[str, object]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
                     "flavors": [{"name": name, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]}]}]}}


@pytest.fixture
def stage(local_kube: LocalKube, tmp_path: Path) -> Iterator[tuple[str, str, str, Path]]:
    s = uuid.uuid4().hex[:6]
    ns_a, ns_b = make_namespace(local_kube, "pa"), make_namespace(local_kube, "pb")
    try:
        yield s, ns_a, ns_b, tmp_path
    finally:
        for kind in ("validatingadmissionpolicybinding", "validatingadmissionpolicy"):
            local_kube.kubectl("delete", kind, PRUNE_GUARD, "--ignore-not-found")
        for name in (f"foreign-{s}", f"forged-{s}"):
            local_kube.kubectl("delete", "clusterqueues.kueue.x-k8s.io", name, "--ignore-not-found")
        remove_stamp(local_kube, ns_a)


def test_prune_removes_what_apply_created_and_the_policy_dropped_never_anything_else(
    local_kube: LocalKube, stage: tuple[str, str, str, Path]
) -> None:
    s, ns_a, ns_b, tmp = stage
    policy = tmp / "policy.yaml"
    kubeconfig = str(local_kube.cfg.kubeconfig(USER))

    def apply(*extra: str) -> tuple[int, str, str]:
        done = run_gpuledger(["policy", "apply", "--engine", "kueue", "--policy", str(policy), "--kubeconfig",
                              kubeconfig, *extra], env=dict(os.environ), timeout=120)  # fmt: skip
        return done.returncode, done.stdout, done.stderr

    local_kube.apply([queue(f"foreign-{s}"), queue(f"forged-{s}", {"app.kubernetes.io/managed-by": USER})])

    # Not one of the policy's pruners: one line, nothing applied.
    policy.write_text(policy_text(s, ns_a, ns_b, "ops1"))
    code, out, err = apply("--prune")
    assert code == 2 and out == "", out
    assert err.strip().splitlines()[-1].endswith(
        f"'{USER}' may not prune: policy governance.pruners names who may (ops1)"), err
    assert get(local_kube, ns_a, "clusterqueues.kueue.x-k8s.io", f"serve-{s}") == {}

    # Allowed: both teams applied; the guard is installed before anything could be deleted.
    policy.write_text(policy_text(s, ns_a, ns_b, USER))
    code, out, err = apply("--prune")
    assert code == 0, err
    assert f"foreign-{s}" not in out and f"forged-{s}" not in out and f"serve-{s}" not in out.split("applied")[-1]
    for name in (f"foreign-{s}", f"forged-{s}"):  # the API server's own refusal, once the policy is in force
        eventually(lambda name=name: PRUNE_GUARD_MESSAGE in local_kube.kubectl(
            "delete", "--dry-run=server", "clusterqueues.kueue.x-k8s.io", name, user=USER, check=False).stderr,
            f"the prune guard in force for {name}", timeout=30)  # fmt: skip
        refused = local_kube.kubectl("delete", "clusterqueues.kueue.x-k8s.io", name, user=USER, check=False)
        assert refused.returncode != 0 and PRUNE_GUARD_MESSAGE in refused.stderr, refused.stderr
        assert get(local_kube, ns_a, "clusterqueues.kueue.x-k8s.io", name)

    # Team B dropped: its ClusterQueue and LocalQueue go; team A's and the foreign queues stay.
    policy.write_text(policy_text(s, ns_a, None, USER))
    code, out, err = apply("--prune")
    assert code == 0, err
    assert f"LocalQueue {ns_b}/sweeps-{s}: pruned (created by {USER}, no longer in the policy)" in out, out
    assert f"ClusterQueue sweeps-{s}: pruned (created by {USER}, no longer in the policy)" in out, out
    assert out.index(f"LocalQueue {ns_b}/sweeps-{s}") < out.index(f"ClusterQueue sweeps-{s}")  # queue first
    eventually(lambda: get(local_kube, ns_a, "clusterqueues.kueue.x-k8s.io", f"sweeps-{s}") == {}, "CQ gone",
               timeout=30)  # Kueue lifts its finalizer once no Workload uses the queue
    eventually(lambda: get(local_kube, ns_b, "localqueues.kueue.x-k8s.io", f"sweeps-{s}") == {}, "LQ gone",
               timeout=30)
    for name in (f"serve-{s}", f"foreign-{s}", f"forged-{s}"):
        assert get(local_kube, ns_a, "clusterqueues.kueue.x-k8s.io", name), name
    assert get(local_kube, ns_a, "localqueues.kueue.x-k8s.io", f"serve-{s}")
