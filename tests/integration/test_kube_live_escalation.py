"""Escalation on the real API server and Kueue (issue 41 item 5): an escalation granted on a live engine raises the
job, and it falls back when it expires.

Two Jobs wait behind a third that holds the ClusterQueue's 4 GPUs, both at the tier `std-*` (a WorkloadPriorityClass
of value 10, the label kueue.x-k8s.io/priority-class). The later one is asked for, granted, and raised by one pass of
the escalation service (sinks/escalations.reconcile, as the gpuledger-escalations user of deploy/kubernetes/rbac/
escalations.yaml): its Job's label becomes the escalation tier and Kueue itself moves the Workload's priority to
1000. When the quota frees, Kueue admits the raised job ahead of the one queued before it. A second pass applies
nothing twice; a pass past the grant's end (its clock moved, not waited for) puts the label back and Kueue's
priority for the Workload falls back to 10. The steps are held in memory here; the broker and the commands'
side: tests/integration/test_slurm_live_escalation.py.

Then the service as `gpuledger up`, compose and the Deployment run it (issue 41): `escalate run` as a process,
configured only by its settings (sinks.escalations: engine kueue, the gpuledger-escalations kubeconfig, a pass a
second), reading and writing escalations.v1 on the broker. A request past its deadline is LAPSED by its first pass;
a grant whose hour ends ~12 s from now raises the job (APPLIED, Kueue priority 1000) and, with nobody acting, the
job falls back when the grant ends (REVERTED, priority 10); the process stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import GPULEDGER
from fixtures_kube import condition, eventually, get, gpu_quota, workload_of
from kubernetes import config as kube_config
from test_kube_live_kueue import gpu_job

from base.settings import KafkaSettings
from schemas.governance_appeals import HOUR_MS
from schemas.governance_escalations import Job, ask_event, decide_event, fold, step_key
from schemas.policy import parse_policy
from schemas.topics import ESCALATIONS
from sinks.escalations import PRIORITY_LABEL, KueuePriority, reconcile
from sinks.kube_owner import KubeOwnerReader
from stack.kube.cluster import LocalKube
from streams.eventlog import read_events
from streams.publish import RecordPublisher


def test_an_escalation_granted_on_kueue_raises_the_job_and_it_falls_back_when_it_expires(
    local_kube: LocalKube, kube_ns: str, kafka_bootstrap: str, tmp_path: Path
) -> None:
    ns, s = kube_ns, uuid.uuid4().hex[:6]
    prod, std = f"prod-{s}", f"std-{s}"
    policy_text = f"""\
version: 1
generations: {{hopper: {{slurm_gres: h100, kueue_flavor: h100}}}}
tiers: [{{name: {prod}, priority: 1000}}, {{name: {std}, priority: 10}}]
governance: {{operators: [ops1], escalations: {{tier: {prod}, deciders: [boss], max_hours: 8}}}}
teams: [{{name: vision, namespaces: [{ns}], members: [alice]}}]
"""
    policy = parse_policy(policy_text)
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

    # The service as a component runs it: `escalate run`, configured by its settings alone, on the broker.
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policy_text, encoding="utf-8")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"e{uuid.uuid4().hex[:8]}.")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # held: a dropped client ends its requests
    for fut in admin.create_topics([NewTopic(kafka.topic(n), 1, 1) for n in (ESCALATIONS.name, ESCALATIONS.dlq)]
                                   ).values():  # fmt: skip
        fut.result(30)
    pub = RecordPublisher(kafka)

    def publish(*events: dict[str, Any]) -> None:
        for event in events:
            pub.publish(ESCALATIONS, step_key(event), event)
        pub.flush()

    def kinds(of: str) -> list[str]:
        return [e["event_type"] for e in read_events(kafka, ESCALATIONS)[0] if e["escalation_id"] == of]

    now = int(time.time() * 1000)
    ahead = Job("local", f"{ns}/ahead", "alice", "vision", 4)
    stale = ask_event({}, policy, ahead, "alice", 1, "x", now - 25 * HOUR_MS)
    publish(stale)  # undecided past its 24 h deadline: the first pass lapses it
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
           "GPULEDGER_CONFIG": str(tmp_path / "none.toml"), "GPULEDGER_STATE_DIR": str(tmp_path / "state"),
           "GPULEDGER_CLUSTER": "local", "GPULEDGER_POLICY_PATH": str(policy_file),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
           "GPULEDGER_SINKS__ESCALATIONS__ENGINES": '["kueue"]', "GPULEDGER_SINKS__ESCALATIONS__KUBECONFIG": cfg,
           "GPULEDGER_SINKS__ESCALATIONS__EVERY_S": "1"}  # fmt: skip
    service = subprocess.Popen([*GPULEDGER, "escalate", "run"], env=env, text=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)  # fmt: skip
    try:
        eventually(lambda: kinds(stale["escalation_id"]) == ["REQUESTED", "LAPSED"], "the first pass lapsed it",
                   timeout=120)  # fmt: skip
        # A grant of an hour decided an hour less 12 s ago: it ends 12 s from now.
        start = int(time.time() * 1000) - HOUR_MS + 12_000
        again = ask_event({}, policy, Job("local", job_id, "alice", "vision", 4), "alice", 1, "again", start - 1)
        grant = decide_event(fold([again], policy)[0], policy, again["escalation_id"], "boss", True, "ok", start)
        publish(again, grant)
        eventually(lambda: get(local_kube, ns, "job", "urgent")["metadata"]["labels"][PRIORITY_LABEL] == prod
                   and workload_of(local_kube, ns, "urgent")["spec"]["priority"] == 1000,
                   "the service raised urgent", timeout=60)  # fmt: skip
        eventually(lambda: kinds(again["escalation_id"])[-1] == "REVERTED"
                   and workload_of(local_kube, ns, "urgent")["spec"]["priority"] == 10,
                   "the grant ended: urgent fell back, nobody acting", timeout=90)  # fmt: skip
        assert kinds(again["escalation_id"]) == ["REQUESTED", "GRANTED", "APPLIED", "REVERTED"]
        assert get(local_kube, ns, "job", "urgent")["metadata"]["labels"][PRIORITY_LABEL] == std
    finally:
        service.send_signal(signal.SIGTERM)
        _, err = service.communicate(timeout=60)
    assert service.returncode == 0, err[-2000:]
