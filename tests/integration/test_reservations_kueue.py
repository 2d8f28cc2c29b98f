"""A reservation onto the real Kueue (fixture `local_kube`) through the CLI and the real broker (issue 19).

The policy gives team serve-<s> 1 hopper GPU (+1 borrowable): a 3-GPU Job stays suspended. A reservation of 2 GPUs
for a minute, approved at once, is put on by one pass of the service: the team's ClusterQueue's nominalQuota
becomes 1 + 2 = 3 and Kueue admits the Job, and `policy diff` reads the raise as explained by the reservation, not
drift. At the end the next pass writes EXPIRED and REMOVED and the quota is the policy's 1 again. The service runs
as gpuledger-reservations with only its shipped ClusterRole (deploy/kubernetes/rbac/reservations.yaml)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import GPULEDGER, run_gpuledger
from fixtures_kube import bind_user, eventually, get, kueue_story, make_namespace, rbac_manifests
from test_kube_live_identity import remove_stamp
from test_kube_live_policy import gpu_job, unsuspended

from base.settings import KafkaSettings
from schemas import topics
from stack.kube.cluster import LocalKube
from streams.eventlog import read_events

pytestmark = pytest.mark.integration


def policy_text(s: str, ns: str) -> str:
    return f"""\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100-{s}}}
tiers:
  - {{name: prod-{s}, priority: 1000}}
kueue: {{cohort: org-{s}}}
governance: {{operators: [ops1]}}
teams:
  - {{name: serve-{s}, namespaces: [{ns}], members: [alice], quota: {{hopper: 1}}, borrowing_limit: {{hopper: 1}}}}
"""


def nominal(kube: LocalKube, cq: str) -> str:
    obj = json.loads(kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", cq, "-o", "json").stdout)
    return str(obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"])  # 5 or "5"


def stage(kube: LocalKube, kafka_bootstrap: str, tmp_path: Path, tag: str) -> tuple[str, str, str, Path]:
    """(suffix, namespace, topic prefix, policy file) of a test: a namespace of its own, the reservations topics
    under a prefix of its own, the policy written, the reservation service's rights applied."""
    s = uuid.uuid4().hex[:6]
    ns = make_namespace(kube, tag)
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = (topics.RESERVATIONS.name, topics.RESERVATIONS.dlq)
    for fut in admin.create_topics([NewTopic(prefix + n, 1, 1) for n in names]).values():
        fut.result(timeout=30)
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(s, ns))
    kube.apply(rbac_manifests("reservations"))
    bind_user(kube, "gpuledger-reservations", "gpuledger-reservations")
    return s, ns, prefix, policy


@pytest.fixture(autouse=True)
def _stamp_removed_after(local_kube: LocalKube) -> Iterator[None]:
    """`policy apply --engine kueue` also installs the submitter stamp, cluster-wide: removed after each test
    (as test_kube_live_identity does), so the session's later tests see a cluster without it."""
    yield
    remove_stamp(local_kube, make_namespace(local_kube, "unstamp"))


def test_a_reservation_bumps_the_team_quota_while_it_lasts(local_kube: LocalKube, kafka_bootstrap: str,
                                                           tmp_path: Path) -> None:  # fmt: skip
    s, ns, prefix, policy = stage(local_kube, kafka_bootstrap, tmp_path, "rv")
    kubeconfig = str(local_kube.cfg.kubeconfig("gpuledger-policy"))
    service = str(local_kube.cfg.kubeconfig("gpuledger-reservations"))
    env = {**os.environ, "GPULEDGER_CONFIG": str(tmp_path / "none.toml"), "GPULEDGER_POLICY_PATH": str(policy),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix}  # fmt: skip

    def cli(*args: str) -> str:
        done = run_gpuledger(list(args), env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    cli("policy", "apply", "--engine", "kueue", "--kubeconfig", kubeconfig)
    cq = f"serve-{s}"
    assert nominal(local_kube, cq) == "1"
    local_kube.apply([gpu_job("big", ns, 3, cq, f"prod-{s}")])
    time.sleep(3)
    assert get(local_kube, ns, "job", "big")["spec"]["suspend"] is True  # 3 > 1 guaranteed + 1 borrowable

    out = cli("reserve", "create", "--team", cq, "--gpus", "2", "--generation", "hopper", "--hours", str(60 / 3600),
              "--reason", "a launch", "--by", "alice")  # fmt: skip
    rid = out.split()[1].rstrip(":")
    out = cli("reserve", "reconcile", "--engine", "kueue", "--kubeconfig", service)
    assert f"{rid} rendered KUEUE: ClusterQueue {cq} h100-{s} nominalQuota 3" in out
    assert nominal(local_kube, cq) == "3"
    eventually(lambda: unsuspended(local_kube, ns, "big"), "the 3-GPU Job admitted on the reserved quota",
               explain=lambda: kueue_story(local_kube, ns))  # fmt: skip
    quota = f"ClusterQueue {cq}: resourceGroups[0].flavors[h100-{s}].resources[nvidia.com/gpu].nominalQuota"
    diff = run_gpuledger(["policy", "diff", "--engine", "kueue", "--kubeconfig", kubeconfig], env, timeout=120)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    assert diff.stdout.splitlines()[0].startswith(f"{quota} is 3, policy says 1: explained by reservation {rid} (+2) "
                                                  "until "), diff.stdout  # fmt: skip
    assert diff.stdout.splitlines()[1:] == ["no drift"]

    time.sleep(62)  # past the reservation's end; nobody acts on Kueue meanwhile
    diff = run_gpuledger(["policy", "diff", "--engine", "kueue", "--kubeconfig", kubeconfig], env, timeout=120)
    assert diff.returncode == 1 and diff.stdout.splitlines() == [f"{quota} is 3, policy says 1"], diff.stdout
    out = cli("reserve", "reconcile", "--engine", "kueue", "--kubeconfig", service)
    assert f"{rid} expired" in out and f"{rid} removed KUEUE: ClusterQueue {cq} h100-{s} nominalQuota 1" in out
    assert nominal(local_kube, cq) == "1"
    assert cli("reserve", "reconcile", "--engine", "kueue", "--kubeconfig", service) == ""
    assert cli("policy", "diff", "--engine", "kueue", "--kubeconfig", kubeconfig).strip() == "no drift"


def test_the_service_holds_the_quota_alone_and_resumes_after_a_restart(local_kube: LocalKube, kafka_bootstrap: str,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """`reserve run` as `up` and the Deployment run it (engine and kubeconfig from the settings): it puts a new
    reservation on without anyone calling a pass, stops on SIGTERM, and once restarted neither renders it twice
    nor needs anyone to take it off at its end."""
    s, _, prefix, policy = stage(local_kube, kafka_bootstrap, tmp_path, "rs")
    env = {**os.environ, "GPULEDGER_CONFIG": str(tmp_path / "none.toml"), "GPULEDGER_POLICY_PATH": str(policy),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
           "GPULEDGER_STATE_DIR": str(tmp_path / "state"), "GPULEDGER_SINKS__RESERVATIONS__ENGINES": '["kueue"]',
           "GPULEDGER_SINKS__RESERVATIONS__KUBECONFIG": str(local_kube.cfg.kubeconfig("gpuledger-reservations")),
           "GPULEDGER_SINKS__RESERVATIONS__EVERY_S": "1"}  # fmt: skip
    cq = f"serve-{s}"
    done = run_gpuledger(["policy", "apply", "--engine", "kueue", "--kubeconfig",
                          str(local_kube.cfg.kubeconfig("gpuledger-policy"))], env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    def service() -> subprocess.Popen[str]:
        return subprocess.Popen([*GPULEDGER, "reserve", "run"], env=env, text=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)  # fmt: skip

    def steps(rid: str) -> list[str]:
        kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
        return [e["event_type"] for e in read_events(kafka, topics.RESERVATIONS)[0] if e["reservation_id"] == rid]

    def stop(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err[-2000:]

    first = service()
    try:
        out = run_gpuledger(["reserve", "create", "--team", cq, "--gpus", "2", "--generation", "hopper", "--hours",
                             str(40 / 3600), "--reason", "a launch", "--by", "alice"], env, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr
        rid = out.stdout.split()[1].rstrip(":")
        eventually(lambda: nominal(local_kube, cq) == "3", "the service put the reservation on", timeout=60)
    finally:
        if first.poll() is None:
            stop(first)
    again = service()
    try:
        eventually(lambda: nominal(local_kube, cq) == "1", "the quota back at the end, nobody acting", timeout=90)
        eventually(lambda: steps(rid)[-1] == "REMOVED", "REMOVED written", timeout=30)
        time.sleep(3)  # more passes: nothing more to do
        assert steps(rid) == ["REQUESTED", "APPROVED", "RENDERED", "EXPIRED", "REMOVED"]
    finally:
        stop(again)
