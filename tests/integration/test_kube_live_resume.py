"""Reclaim with a way back on the real API server and Kueue (issue 41 item 3): a Kueue job reclaimed (its Workload
deactivated, as the gpuledger-reclaim user), appealed and exempted (the appeals.v1 steps the `appeal` commands
write, folded under the policy) is reactivated with the same user's rights and Kueue admits it again once its
quota is free: it runs again. Asked a second time, nothing is patched twice; a Workload that was never stopped is
not touched. The outcome store is in memory here (ClickHouse's side: tests/integration/test_slurm_live_resume.py)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from fixtures_kube import condition, eventually, get, gpu_quota, workload_of
from kubernetes import config as kube_config
from test_kube_live_kueue import gpu_job
from unit.test_reclaim import Recorder

from schemas.governance_appeals import Subject, decide_event, file_event, fold
from schemas.policy import parse_policy
from sinks.kube_owner import KubeOwnerReader, owning_workload
from sinks.reclaim import ReclaimExecutor, kubernetes_patch
from sinks.reclaim_resume import Reclaimed, Request, Resumer, exemption_request
from stack.kube.cluster import LocalKube

POLICY = parse_policy("""\
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: std, priority: 100}]
governance: {operators: [ops1], appeals: {deciders: [ops1]}}
teams: [{name: vision, members: [alice]}]
""")


def test_a_reclaimed_kueue_job_appealed_and_exempted_runs_again(
    local_kube: LocalKube, kube_ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = kube_ns
    gpu_quota(local_kube, ns, f"cq-{uuid.uuid4().hex[:8]}", gpus=4)
    local_kube.apply([gpu_job("idle", ns, 4, "team-a")])
    eventually(lambda: get(local_kube, ns, "job", "idle").get("spec", {}).get("suspend") is False, "idle admitted")
    wl = workload_of(local_kube, ns, "idle")["metadata"]["name"]

    cfg = str(local_kube.cfg.kubeconfig("gpuledger-reclaim"))  # reclaim and resume with its ClusterRole only
    monkeypatch.setattr(kube_config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", cfg)
    reader = KubeOwnerReader(kube_config.new_client_from_config(config_file=cfg))
    patches: list[dict[str, Any]] = []

    def patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        patches.append(body)
        kubernetes_patch(namespace, name, body)

    def owner(namespace: str, name: str) -> Any:
        return owning_workload(reader, namespace, name)

    recorder = Recorder()
    job_id = f"{ns}/{wl}"
    reclaim = {"action_id": "a-1", "cluster": "local", "job_id": job_id, "scheduler": "KUEUE", "action": "SUSPEND",
               "dry_run": False}  # fmt: skip
    out = ReclaimExecutor(recorder, dry_run=False, kueue_patch=patch, kueue_owner=owner).execute(reclaim)
    assert [(o.step, o.status) for o in out] == [(1, "ok")], out
    eventually(lambda: get(local_kube, ns, "job", "idle")["spec"]["suspend"] is True, "Kueue suspended the Job")
    local_kube.apply([gpu_job("other", ns, 4, "team-a")])  # the freed quota goes to another job
    eventually(lambda: get(local_kube, ns, "job", "other").get("spec", {}).get("suspend") is False, "other admitted")

    # The owner appeals; the decider grants an exemption: the appeal asks for the way back.
    now = int(time.time() * 1000)
    filed = file_event({}, POLICY, Subject("local", job_id, "al-1", "alice", "vision", None, "2026-12", now), "alice",
                       "it was loading its dataset", now)  # fmt: skip
    granted = decide_event(fold([filed], POLICY)[0], POLICY, filed["appeal_id"], "ops1", "EXEMPTION", "ok, 4 h",
                           now + 1, exemption_hours=4)  # fmt: skip
    request = exemption_request(granted, fold([filed, granted], POLICY)[0])
    assert request == Request("local", job_id, "ops1", f"appeal {filed['appeal_id']} granted an exemption (ops1)")
    resumer = Resumer(recorder, clock_ms=lambda: int(time.time() * 1000), kueue_owner=owner, kueue_patch=patch)
    reclaimed = Reclaimed("a-1", "KUEUE", "SUSPEND", now)
    status, line = resumer.resume(request, reclaimed)
    assert status == "resumed", line
    assert line == (f"job {job_id} resumed (appeal {filed['appeal_id']} granted an exemption (ops1)): patch Workload "
                    f"{ns}/{wl} spec.active=true")  # fmt: skip
    assert get(local_kube, ns, "workloads.kueue.x-k8s.io", wl)["spec"]["active"] is True
    # Queued again behind the quota another job holds; admitted once it is free: it runs again.
    time.sleep(1)
    assert get(local_kube, ns, "job", "idle")["spec"]["suspend"] is True
    other = workload_of(local_kube, ns, "other")["metadata"]["name"]  # no garbage collector here: stop its Workload
    local_kube.kubectl("-n", ns, "patch", "workloads.kueue.x-k8s.io", other, "--type=merge", "-p",
                       '{"spec": {"active": false}}')  # fmt: skip
    admitted = eventually(lambda: (w := get(local_kube, ns, "workloads.kueue.x-k8s.io", wl))
                          and condition(w, "Admitted").get("status") == "True" and w, "the Workload admitted again")
    assert admitted["spec"]["active"] is True
    eventually(lambda: get(local_kube, ns, "job", "idle")["spec"]["suspend"] is False, "Kueue unsuspended the Job")

    assert resumer.resume(request, reclaimed)[0] == "already"  # asked again: nothing patched twice
    assert resumer.resume(Request("local", job_id, "alice", "x"), Reclaimed("a-2", "KUEUE", "SUSPEND", now))[0] \
        == "running"  # a Workload that is not stopped is not touched  # fmt: skip
    assert patches == [{"spec": {"active": False}}, {"spec": {"active": True}}]
    gone = resumer.resume(Request("local", f"{ns}/no-such-job", "alice", "x"), Reclaimed("a-3", "KUEUE", "SUSPEND", 1))
    assert gone == ("gone", f"job {ns}/no-such-job does not exist on Kubernetes (no pod or Workload of that name)")
