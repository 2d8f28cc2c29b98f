"""policy.yaml on a real Kubernetes API server with a real Kueue (fixture `local_kube`): `gpuledger policy
apply --engine kueue` creates every object (the server's own validation and Kueue's CRD rules judge them),
`policy diff` is empty after it and shows a hand edit of a ClusterQueue's nominalQuota as drift (exit 1);
in the policy's cohort a production Job reclaims its team's lent quota from a preemptible sweep that
borrowed it (Kueue evicts the sweep, reason Preempted), and a team over its own quota stays suspended with
Kueue's own message. The CLI runs as the gpuledger-policy user, whose only rights are the shipped
ClusterRole (deploy/kubernetes/rbac/policy.yaml). Names carry a suffix: the control plane is shared by
the session's tests."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_cli import run_gpuledger
from fixtures_kube import condition, eventually, get, make_namespace, workload_of
from fixtures_policy_watch import INTERVAL_S, Watch, kinds
from test_kube_live_identity import remove_stamp

from stack.kube.cluster import LocalKube

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
DIFF = ["--no-reservations"]  # no broker here: reservations and diff, tests/integration/test_reservations_kueue.py


def policy_text(s: str, ns_a: str, ns_b: str) -> str:
    return f"""\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100-{s}, fleet_gpus: 3}}
tiers:
  - {{name: prod-{s}, priority: 1000, preempts: [sweep-{s}]}}
  - {{name: sweep-{s}, priority: 10}}
preemptible: {{tier: sweep-{s}, discount: "0.40"}}
kueue: {{cohort: org-{s}}}
teams:
  - {{name: serve-{s}, namespaces: [{ns_a}], quota: {{hopper: 2}}}}
  - {{name: sweeps-{s}, namespaces: [{ns_b}], quota: {{hopper: 1}}, borrowing_limit: {{hopper: 2}}}}
"""


def gpu_job(name: str, ns: str, gpus: int, queue: str, priority: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: queue, PRIORITY_LABEL: priority}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}},
    }  # fmt: skip


def unsuspended(kube: LocalKube, ns: str, job: str) -> bool:
    return get(kube, ns, "job", job).get("spec", {}).get("suspend") is False


@pytest.fixture
def applied(local_kube: LocalKube, tmp_path: Path) -> Iterator[tuple[str, str, str, list[str]]]:
    """The policy applied through the CLI: (suffix, team A's namespace, team B's, the CLI's base args). Apply
    also installs the submitter stamp, cluster-wide: removed after, as test_kube_live_identity does (the
    session's later tests expect a cluster without it)."""
    s = uuid.uuid4().hex[:6]
    ns_a, ns_b = make_namespace(local_kube, "pa"), make_namespace(local_kube, "pb")
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(s, ns_a, ns_b))
    # As the gpuledger-policy user, with only the ClusterRole shipped in deploy/kubernetes/rbac/policy.yaml.
    kubeconfig = local_kube.cfg.kubeconfig("gpuledger-policy")
    args = ["--engine", "kueue", "--policy", str(policy), "--kubeconfig", str(kubeconfig)]
    try:
        done = run_gpuledger(["policy", "apply", *args], env=dict(os.environ), timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith("applied: 8 Kueue objects"), done.stdout
        yield s, ns_a, ns_b, args
    finally:
        remove_stamp(local_kube, ns_a)


def test_diff_is_empty_after_apply_and_shows_a_hand_edit(local_kube: LocalKube,
                                                         applied: tuple[str, str, str, list[str]],
                                                         kafka_bootstrap: str, tmp_path: Path) -> None:  # fmt: skip
    """Also the policy watch (issue 41 item 1), as the gpuledger-policy-watch user (deploy/kubernetes/rbac/
    policy-watch.yaml: get only): clean, then one drift alert with the diff's exact line within one interval of the
    quota edit, cleared once `policy apply` has run."""
    s, _, _, args = applied
    clean = run_gpuledger(["policy", "diff", *DIFF, *args], env=dict(os.environ), timeout=120)
    assert (clean.returncode, clean.stdout.strip()) == (0, "no drift"), clean.stderr
    policy, kubeconfig = args[args.index("--policy") + 1], local_kube.cfg.kubeconfig("gpuledger-policy-watch")
    watch = Watch(kafka_bootstrap, tmp_path, ["--engine", "kueue", "--policy", policy],
                  env={**os.environ, "GPULEDGER_POLICY_WATCH__KUBECONFIG": str(kubeconfig)})  # fmt: skip
    try:
        watch.wait("the first pass: clean", lambda a: kinds(a) == ["POLICY_DRIFT_CLEARED"])
        patch = [{"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": 5}]
        local_kube.kubectl("patch", "clusterqueues.kueue.x-k8s.io", f"serve-{s}", "--type=json", "-p",
                           json.dumps(patch))  # fmt: skip
        took = watch.wait("the quota drift alerted", lambda a: kinds(a)[1:] == ["POLICY_DRIFT"])
        assert took < INTERVAL_S + 5  # within one interval (plus the pass itself)
        drifted = run_gpuledger(["policy", "diff", *DIFF, *args], env=dict(os.environ), timeout=120)
        assert drifted.returncode == 1, drifted.stderr
        assert drifted.stdout.strip().splitlines() == watch.alerts()[1]["drift_lines"] == [
            f"ClusterQueue serve-{s}: resourceGroups[0].flavors[h100-{s}].resources[nvidia.com/gpu].nominalQuota is "
            "5, policy says 2"
        ]
        again = run_gpuledger(["policy", "apply", *args], env=watch.env, timeout=120)
        assert again.returncode == 0, again.stderr
        final = run_gpuledger(["policy", "diff", *DIFF, *args], env=dict(os.environ), timeout=120)
        assert (final.returncode, final.stdout.strip()) == (0, "no drift")
        # The apply is recorded: who (the user the API server authenticated), the quota before and after.
        (record,) = watch.applies()
        who = ("kueue", "gpuledger-policy", "kubernetes")
        assert (record["engine"], record["actor"], record["actor_source"]) == who
        assert [(c["object"], c["before"], c["after"]) for c in record["changes"]] == [
            (f"ClusterQueue serve-{s}", "5", "2")] and record["still_differs"] == []  # fmt: skip
        then = ["POLICY_DRIFT", "POLICY_DRIFT_CLEARED"]
        cleared = watch.wait("the drift cleared", lambda a: kinds(a)[1:] == then)
        alerts = watch.alerts()
        assert alerts[2]["alert_id"] == alerts[1]["alert_id"].replace("policy-drift/", "policy-drift-cleared/")
        print(f"policy watch (kueue, interval {INTERVAL_S} s): quota drift alerted {took:.1f} s after the edit, "
              f"cleared {cleared:.1f} s after apply")
    finally:
        watch.stop()


def test_production_reclaims_from_a_preemptible_borrower_and_over_quota_waits(
    local_kube: LocalKube, applied: tuple[str, str, str, list[str]]
) -> None:
    s, ns_a, ns_b, _ = applied
    # The sweep team's 3-GPU sweep fits only by borrowing 2 of the serving team's idle GPUs.
    local_kube.apply([gpu_job("sweep", ns_b, 3, f"sweeps-{s}", f"sweep-{s}")])
    eventually(lambda: unsuspended(local_kube, ns_b, "sweep"), "the sweep admitted on borrowed quota")
    # Production wants its guaranteed 2 back: Kueue preempts the borrowing sweep.
    local_kube.apply([gpu_job("serve", ns_a, 2, f"serve-{s}", f"prod-{s}")])
    eventually(lambda: unsuspended(local_kube, ns_a, "serve"), "the production Job admitted")
    evicted = eventually(lambda: (w := workload_of(local_kube, ns_b, "sweep"))
                         and condition(w, "Evicted").get("status") == "True" and w, "the sweep evicted")  # fmt: skip
    assert condition(evicted, "Evicted")["reason"] == "Preempted"
    eventually(lambda: get(local_kube, ns_b, "job", "sweep")["spec"]["suspend"] is True, "the sweep's Job suspended")
    # Over its own quota (2 held, borrowing 0): a third GPU waits with Kueue's own reason.
    local_kube.apply([gpu_job("more", ns_a, 1, f"serve-{s}", f"prod-{s}")])
    pending = eventually(
        lambda: (wl := workload_of(local_kube, ns_a, "more")) and condition(wl, "QuotaReserved").get("message") and wl,
        "the over-quota Workload evaluated",
    )
    reserved = condition(pending, "QuotaReserved")
    assert reserved["status"] == "False" and reserved["reason"] == "Pending"
    assert f"insufficient unused quota for nvidia.com/gpu in flavor h100-{s}" in reserved["message"], reserved
    time.sleep(1)
    assert get(local_kube, ns_a, "job", "more")["spec"]["suspend"] is True
