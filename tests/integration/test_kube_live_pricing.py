"""The policy's tiers set the price on Kubernetes with a real Kueue (issue 38 item 3; fixture `local_kube`).

`gpuledger policy apply --engine kueue` renders the tiers as WorkloadPriorityClasses (prod-S, sweep-S; sweep-S the
preemptible tier at 40% off). A Job of each tier (label `kueue.x-k8s.io/priority-class`) is admitted by Kueue,
whose Workload then names the WorkloadPriorityClass; the control plane has no Job controller, kubelet or scheduler,
so each Job's pod is created as the Job controller would (owned by the Job, on gpu-node-1) and its status patched
as a kubelet would. The real producer (`gpuledger kube watch`, a separate process configured only with
`policy_path`) reads the Workloads and the pods: the sweep's pod is preemptible through its Workload's class, the
production pod is not, though neither pod names a priority class of its own. Those events, with per-second
samples of the node's four H100 (the pods' devices are unidentified: the node's only model prices them), go
through the processors' pipeline into the embedded ClickHouse, and `report chargeback --by project` charges the
sweep at the policy's discount and production at full rate, to the cent, against the seconds in the pods' own
status (startedAt to finishedAt) and the card's numbers (tests/integration/test_slurm_live_pricing.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fixtures_cli import run_gpuledger
from fixtures_kube import NODE, eventually, get, make_namespace, run_pod, workload_of
from test_chargeback_ledger import cli_env
from test_kube_live_identity import remove_stamp
from test_slurm_live_pricing import CARD, H100, cents, rate_micro, through_the_ledger

from base.settings import ClickHouseSettings
from stack.kube.cluster import LocalKube

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
UUIDS = [f"GPU-{i:08d}-cafe-4000-8000-000000000000" for i in range(4)]


@pytest.fixture(autouse=True)
def _stamp_removed_after(local_kube: LocalKube) -> Iterator[None]:
    """`policy apply --engine kueue` also installs the submitter stamp, cluster-wide: removed after each test
    (as test_kube_live_identity does), so the session's later tests see a cluster without it."""
    yield
    remove_stamp(local_kube, make_namespace(local_kube, "unstamp"))


def policy_text(s: str, ns_a: str, ns_b: str) -> str:
    return f"""\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100-{s}, fleet_gpus: 4}}
tiers:
  - {{name: prod-{s}, priority: 1000, preempts: [sweep-{s}]}}
  - {{name: sweep-{s}, priority: 10}}
preemptible: {{tier: sweep-{s}, discount: "0.40"}}
kueue: {{cohort: org-{s}}}
teams:
  - {{name: serve-{s}, namespaces: [{ns_a}], quota: {{hopper: 2}}}}
  - {{name: sweeps-{s}, namespaces: [{ns_b}], quota: {{hopper: 2}}}}
"""


def gpu_job(name: str, ns: str, queue: str, priority: str, project: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: queue, PRIORITY_LABEL: priority,
                                                               "gpuledger.io/project": project}},
        "spec": {"suspend": True, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}},
    }  # fmt: skip


def job_pod(kube: LocalKube, ns: str, job: str, project: str) -> str:
    """The pod the Job controller would make: owned by the Job, its template's labels, bound to gpu-node-1."""
    owner = get(kube, ns, "job", job)
    name = f"{job}-pod"
    meta = {"name": name, "namespace": ns, "labels": {"job-name": job, "gpuledger.io/project": project},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job,
                                 "uid": owner["metadata"]["uid"], "controller": True}]}  # fmt: skip
    spec = {"nodeName": NODE, "restartPolicy": "Never", "containers": [
        {"name": "main", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}  # fmt: skip
    kube.apply([{"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}])
    return name


def test_the_workload_priority_class_sets_the_price(
    local_kube: LocalKube, kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    s = uuid.uuid4().hex[:6]
    ns_a, ns_b = make_namespace(local_kube, "pra"), make_namespace(local_kube, "prb")
    cluster = f"kube-{s}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(s, ns_a, ns_b))
    card = tmp_path / "card.toml"
    card.write_text(CARD)
    server = clickhouse_server
    ch = ClickHouseSettings(url=server.url, database=clickhouse_database, password=server.password,
                            analyst_password=server.analyst_password)  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}, **cli_env(ch),
           "GPULEDGER_CLUSTER": cluster, "GPULEDGER_POLICY_PATH": str(policy),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_STATE_DIR": str(tmp_path / "state")}
    policy_cfg = local_kube.cfg.kubeconfig("gpuledger-policy")
    applied = run_gpuledger(["policy", "apply", "--engine", "kueue", "--kubeconfig", str(policy_cfg)], env=env,
                            timeout=120)  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    diff = run_gpuledger(["policy", "diff", "--engine", "kueue", "--no-reservations", "--kubeconfig",
                          str(policy_cfg)], env=env, timeout=120)  # fmt: skip
    assert (diff.returncode, diff.stdout.strip()) == (0, "no drift"), diff.stdout + diff.stderr

    out_path = tmp_path / "events.jsonl"
    watcher_cfg = local_kube.cfg.kubeconfig("gpuledger-watcher")
    argv = [sys.executable, "-c", "from gpuledger.cli import main; main()", "kube", "watch", "--dry-run",
            "--kubeconfig", str(watcher_cfg), "--timeout", "5"]  # fmt: skip
    with open(out_path, "wb") as out, open(tmp_path / "watch.err", "wb") as err:
        watcher = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=err)

    def events() -> list[dict[str, Any]]:
        return [json.loads(line) for line in out_path.read_text().splitlines() if line.startswith("{")]

    def pod_event(ns: str, pod: str, kind: str) -> dict[str, Any] | None:
        return next((e for e in events() if e["job_id"] == f"{ns}/{pod}" and e["event_type"] == kind), None)

    jobs = {"sweep": (ns_b, f"sweeps-{s}", f"sweep-{s}", "p-sweep"), "serve": (ns_a, f"serve-{s}", f"prod-{s}",
                                                                            "p-serve")}  # fmt: skip
    pods: dict[str, str] = {}
    status: dict[str, dict[str, Any]] = {}
    running: dict[str, str] = {}
    try:
        for job, (ns, queue, tier, project) in jobs.items():
            local_kube.apply([gpu_job(job, ns, queue, tier, project)])
        for job, (ns, _, tier, project) in jobs.items():
            eventually(lambda ns=ns, job=job: get(local_kube, ns, "job", job)["spec"].get("suspend") is False,
                       f"{job} admitted by Kueue")  # fmt: skip
            wl = workload_of(local_kube, ns, job)
            wpc = wl["spec"].get("priorityClassRef") or {"name": wl["spec"].get("priorityClassName")}
            assert wpc["name"] == tier, wl["spec"]  # Kueue's own record of the tier
            pods[job] = job_pod(local_kube, ns, job, project)
            run_pod(local_kube, ns, pods[job])
            running[job] = get(local_kube, ns, "pod", pods[job])["status"]["startTime"]
        for job, (ns, *_rest) in jobs.items():
            eventually(lambda ns=ns, job=job: pod_event(ns, pods[job], "STARTED"), f"{job}'s pod STARTED", timeout=60)
        time.sleep(6)  # some seconds held
        for job, (ns, *_rest) in jobs.items():
            run_pod(local_kube, ns, pods[job], phase="Succeeded")
        for job, (ns, *_rest) in jobs.items():
            eventually(lambda ns=ns, job=job: pod_event(ns, pods[job], "ENDED"), f"{job}'s pod ENDED", timeout=60)
            status[job] = get(local_kube, ns, "pod", pods[job])["status"]
    finally:
        watcher.send_signal(signal.SIGTERM)
        try:
            watcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()

    mine = [e for e in events() if e["job_id"] in {f"{jobs[j][0]}/{p}" for j, p in pods.items()}]
    flags = {(e["job_id"].split("/")[1], e["event_type"], e["qos"], e["preemptible"]) for e in mine}
    kinds = ("SUBMITTED", "STARTED", "ENDED")
    assert flags == {(pods["sweep"], t, f"sweep-{s}", True) for t in kinds} | {
        (pods["serve"], t, f"prod-{s}", False) for t in kinds}, flags
    # The Workloads' own events (scheduler KUEUE) carry the tier too.
    for job, (ns, _, tier, _) in jobs.items():
        wl_name = workload_of(local_kube, ns, job)["metadata"]["name"]
        own = [e for e in events() if e["job_id"] == f"{ns}/{wl_name}" and e["scheduler"] == "KUEUE"]
        assert own and {(e["qos"], e["preemptible"]) for e in own} == {(tier, job == "sweep")}, own

    def epoch_s(stamp: str) -> int:
        return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())

    # Seconds held, from the pods' own status: the Running startTime to the terminated state's finishedAt.
    held_s = {}
    for job, (ns, *_rest) in jobs.items():
        started, ended = pod_event(ns, pods[job], "STARTED"), pod_event(ns, pods[job], "ENDED")
        assert started and ended
        finished = status[job]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
        assert (started["ts_ms"], ended["ts_ms"]) == (epoch_s(running[job]) * 1000, epoch_s(finished) * 1000)
        held_s[job] = epoch_s(finished) - epoch_s(running[job])
        assert held_s[job] >= 6

    devices = [{"uuid": u, "index": i, "model": H100, "generation": "hopper", "mig_profile": None,
                "mig_instance_id": None} for i, u in enumerate(UUIDS)]  # fmt: skip
    result = through_the_ledger(ch, cluster, mine, devices, node=NODE)
    by_pod = {j: sum(r["allocated_s"] for r in result.device_minutes if r["job_id"] == f"{jobs[j][0]}/{pods[j]}")
              for j in jobs}  # fmt: skip
    assert by_pod == held_s

    loaded = run_gpuledger(["ratecard", "load", "--card", str(card)], env=env)
    assert loaded.returncode == 0 and "rates loaded" in loaded.stdout, loaded.stderr
    full, pre = rate_micro("31536000", 1, 8760), rate_micro("31536000", 1, 8760, "0.40")
    first = min(e["ts_ms"] for e in mine)
    period = dt.datetime.fromtimestamp(first / 1000, dt.UTC).strftime("%Y-%m")
    report = run_gpuledger(["report", "chargeback", "--period", period, "--by", "project", "--format", "json"],
                           env=env)  # fmt: skip
    assert report.returncode == 0, report.stderr
    lines = {r["line"]: r for r in json.loads(report.stdout)}
    expected = {"p-sweep": cents(held_s["sweep"], pre), "p-serve": cents(held_s["serve"], full)}
    assert {k: lines[k]["charge"] for k in expected} == expected, lines
    assert Decimal(expected["p-sweep"]) == Decimal(held_s["sweep"]) * Decimal("0.60")
    assert Decimal(expected["p-serve"]) == Decimal(held_s["serve"])
    print(f"\nsweep pod: {held_s['sweep']} s -> {expected['p-sweep']}; serve pod: {held_s['serve']} s -> "
          f"{expected['p-serve']}")
