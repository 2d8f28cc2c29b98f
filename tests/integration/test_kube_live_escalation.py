"""Escalation on the real API server and Kueue (issue 41 item 5): an escalation granted on a live engine raises the
job, and it falls back when it expires.

Two Jobs wait behind a third that holds the ClusterQueue's 4 GPUs, both at the tier `std-*` (a WorkloadPriorityClass
of value 10, the label kueue.x-k8s.io/priority-class). The later one is asked for, granted, and raised by one pass of
the escalation service (sinks/escalations.reconcile, as the gpuledger-escalations user of deploy/kubernetes/rbac/
escalations.yaml): its Job's label becomes the escalation tier and Kueue itself moves the Workload's priority to
1000. When the quota frees, Kueue admits the raised job ahead of the one queued before it. A second pass applies
nothing twice; a pass past the grant's end (its clock moved, not waited for) puts the label back and Kueue's
priority for the Workload falls back to 10. The steps are held in memory here; the broker and the commands'
side: tests/integration/test_slurm_live_escalation.py."""

from __future__ import annotations

import time
import uuid
from typing import Any

from fixtures_kube import condition, eventually, get, gpu_quota, workload_of
from kubernetes import config as kube_config
from test_kube_live_kueue import gpu_job

from schemas.governance_escalations import Job, ask_event, decide_event, fold
from schemas.policy import parse_policy
from sinks.escalations import PRIORITY_LABEL, KueuePriority, reconcile
from sinks.kube_owner import KubeOwnerReader
from stack.kube.cluster import LocalKube


def test_an_escalation_granted_on_kueue_raises_the_job_and_it_falls_back_when_it_expires(
    local_kube: LocalKube, kube_ns: str
) -> None:
    ns, s = kube_ns, uuid.uuid4().hex[:6]
    prod, std = f"prod-{s}", f"std-{s}"
    policy = parse_policy(f"""\
version: 1
generations: {{hopper: {{slurm_gres: h100, kueue_flavor: h100}}}}
tiers: [{{name: {prod}, priority: 1000}}, {{name: {std}, priority: 10}}]
governance: {{operators: [ops1], escalations: {{tier: {prod}, deciders: [boss], max_hours: 8}}}}
teams: [{{name: vision, namespaces: [{ns}], members: [alice]}}]
""")
    local_kube.apply([{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                       "metadata": {"name": name}, "value": value}
                      for name, value in ((prod, 1000), (std, 10))])  # fmt: skip
    gpu_quota(local_kube, ns, f"cq-{s}", gpus=4)

    def job(name: str) -> dict[str, Any]:
        body = gpu_job(name, ns, 4, "team-a")
        body["metadata"]["labels"][PRIORITY_LABEL] = std
        return body

    local_kube.apply([job("blocker")])
    eventually(lambda: get(local_kube, ns, "job", "blocker").get("spec", {}).get("suspend") is False, "blocker in")
    local_kube.apply([job("ahead")])
    time.sleep(1.1)  # a later creation second: `ahead` is first in Kueue's queue at equal priority
    local_kube.apply([job("urgent")])
    wl = eventually(lambda: workload_of(local_kube, ns, "urgent").get("spec", {}).get("priority") == 10
                    and workload_of(local_kube, ns, "urgent"), "urgent's Workload at priority 10")  # fmt: skip
    job_id = f"{ns}/{wl['metadata']['name']}"

    cfg = str(local_kube.cfg.kubeconfig("gpuledger-escalations"))  # the service's ClusterRole only
    engine = KueuePriority(KubeOwnerReader(kube_config.new_client_from_config(config_file=cfg)))
    now = int(time.time() * 1000)
    asked = ask_event({}, policy, Job("local", job_id, "alice", "vision", 4), "alice", 2, "demo at noon", now)
    eid = asked["escalation_id"]
    granted = decide_event(fold([asked], policy)[0], policy, eid, "boss", True, "ok", now + 1)
    steps = [asked, granted]

    applied = reconcile(fold(steps, policy)[0], now + 2, [engine], "local")
    assert [(e["event_type"], e["engine"], e["engine_ref"]) for e in applied] == [("APPLIED", "KUEUE", std)]
    assert applied[0]["text"] == f"raised to {prod} (was {std}): label Job {ns}/urgent {PRIORITY_LABEL}={prod}"
    steps += applied
    raised = eventually(lambda: (w := workload_of(local_kube, ns, "urgent")).get("spec", {}).get("priority") == 1000
                        and w, "Kueue raised urgent's Workload to 1000")  # fmt: skip
    assert raised["spec"]["priorityClassRef"]["name"] == prod
    assert reconcile(fold(steps, policy)[0], now + 3, [engine], "local") == []  # nothing applied twice

    # The quota frees: Kueue admits the raised job ahead of the one queued before it.
    blocker = workload_of(local_kube, ns, "blocker")["metadata"]["name"]
    local_kube.kubectl("-n", ns, "patch", "workloads.kueue.x-k8s.io", blocker, "--type=merge", "-p",
                       '{"spec": {"active": false}}')  # fmt: skip
    eventually(lambda: condition(workload_of(local_kube, ns, "urgent"), "Admitted").get("status") == "True",
               "urgent admitted")  # fmt: skip
    assert condition(workload_of(local_kube, ns, "ahead"), "Admitted").get("status") != "True"

    # Past the grant's end, the next pass puts the label back and Kueue's priority falls back.
    until = int(granted["until_ms"])
    assert reconcile(fold(steps, policy)[0], until - 1, [engine], "local") == []
    (back,) = reconcile(fold(steps, policy)[0], until, [engine], "local")
    assert (back["event_type"], back["text"]) == ("REVERTED", f"fell back to {std}: label Job {ns}/urgent "
                                                               f"{PRIORITY_LABEL}={std}")  # fmt: skip
    assert get(local_kube, ns, "job", "urgent")["metadata"]["labels"][PRIORITY_LABEL] == std
    fell = eventually(lambda: (w := workload_of(local_kube, ns, "urgent")).get("spec", {}).get("priority") == 10
                      and w, "Kueue put urgent's Workload back to 10")  # fmt: skip
    assert fell["spec"]["priorityClassRef"]["name"] == std
    assert fold([*steps, back], policy)[0][eid].state == "REVERTED"
