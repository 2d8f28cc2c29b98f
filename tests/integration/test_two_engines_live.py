"""Both live engines into one ledger, checked against what the engines ran (issue 42 items 1 and 2).

The live Slurm (fixture `live_slurm`) and a Kubernetes control plane of this module's own with Kueue, the Job
controller and KWOK (the Kubernetes project's kubelet stand-in: it starts, completes and deletes the pods), run at
once; stack/two_engines.py puts the simulator's exporters on their devices (driven by what each engine says runs
where), and the real producers (`slurm poll`, `kube watch`, `kube podresources` against the fake kubelet's
PodResources, `dcgm run` per node) publish to the real broker; `processors run` and `sink run` put the ledger
into the embedded ClickHouse.

Real work on both: a gang on each (a 2-GPU Slurm job; a Kueue Job of two 1-GPU pods), one person (`alice`: an
interactive Slurm allocation under her uid, and the Kubernetes gang labelled as hers), a preemption on each (a QOS
preemption on Slurm, which requeues the preempted job and runs it again; a WorkloadPriorityClass preemption in
Kueue, which requeues the Workload, whose Job gets new pods), a reclaim on each (`gpuledger reclaim exec --execute`:
an idle Slurm job cancelled, an idle pod's Workload deactivated as the gpuledger-reclaim user) and a correction
(alice's Slurm job moved to another project). The expected ledger is worked from the engines' own accounting, not
from any plan: sacct's Start/End of each run (`-D`: a requeued job's every run) and its GPU count, and each pod's own
status (startTime, finishedAt or deletionTimestamp, as KWOK and the API server wrote them). Compared: each job's
GPU-seconds (`v_chargeback_jobs`), `report chargeback --by cluster` per team and cluster (and each team across
both), `--by project` (the correction), and each device-second charged once (no device-minute over 60 s, no
overlap, every second on a real GPU), to the cent (1 $ a GPU-second)."""

from __future__ import annotations

import datetime as dt
import json
import pwd
import re
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_cli import run_gpuledger
from fixtures_kube import condition, eventually, workload_of

from base.settings import ClickHouseSettings
from sinks.db import connect
from stack.broker import stop_process
from stack.components import gpuledger_argv
from stack.kube.build import KubeBinaries
from stack.kube.cluster import ClusterConfig, LocalKube
from stack.slurm.cluster import SlurmClient
from stack.two_engines import (
    KUBE_NODE,
    SACCT_FIELDS,
    Clusters,
    Run,
    TwoEngines,
    environ_without_gpuledger,
    pod_run,
    sacct_runs,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
CARD = """\
card_version = "two-engines"
currency = "USD"
hours_per_year = 8760
preemptible_discount = "0.40"
""" + "".join(f"""
[[onprem]]
generation = "{g}"
effective_from = 2020-01-01
purchase_price_usd = "31536000"
depreciation_years = 1
power_draw_w = 0
facility_usd_per_kwh = "0"
pue = "1"
shared_infra_ratio = "0"
billable_fraction = "1"
""" for g in ("hopper", "ampere"))  # 1 $ a GPU-second on both generations
QUEUE = "kueue.x-k8s.io/queue-name"
PERSON = "alice"  # one person on both clusters: a Linux account here (Slurm runs her job as her), a Kubernetes user


@dataclass
class Stack:
    engines: TwoEngines
    slurm: SlurmClient
    kube: LocalKube
    env: dict[str, str]  # every gpuledger command's settings (the cluster added per command)
    suffix: str
    namespace: str
    person: str  # one person on both clusters
    procs: dict[str, subprocess.Popen[bytes]]

    ch: ClickHouseSettings

    def cli(self, *args: str, cluster: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "GPULEDGER_CLUSTER": cluster} if cluster else self.env
        return run_gpuledger(list(args), env=env, timeout=timeout)


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr)


def person_account(user: str) -> None:
    """The person's Linux account, created when missing: the live Slurm allocates her GPUs under her uid."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True)


def directory(s: str) -> dict[str, Any]:
    return {"users": {"root": {"teams": [f"ops-{s}"], "cost_centre": "CC-1"},
                      "alice": {"teams": [f"vision-{s}"], "cost_centre": "CC-2"},
                      "bob": {"teams": [f"nlp-{s}"], "cost_centre": "CC-3"}}}  # fmt: skip


def registry(s: str) -> dict[str, Any]:
    return {"projects": [{"id": f"p-vision-{s}"}, {"id": f"p-nlp-{s}"}, {"id": f"p-ops-{s}"}]}


@pytest.fixture(scope="module")
def two_engines(live_slurm: SlurmClient, kube_binaries: KubeBinaries, kafka_bootstrap: str, clickhouse_server: Any,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # fmt: skip
    s = uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("two-engines")
    person_account(PERSON)
    live_slurm.cancel_all()  # from an idle Slurm: alice's interactive allocation must be granted at once (below)
    database = f"two_{s}"
    admin = clickhouse_server.client()
    admin.command(f"CREATE DATABASE {database}")
    (tmp / "directory.yaml").write_text(yaml.safe_dump(directory(s)))
    (tmp / "projects.yaml").write_text(yaml.safe_dump(registry(s)))
    (tmp / "card.toml").write_text(CARD)
    env = {**environ_without_gpuledger(), **live_slurm.cfg.env,
           "GPULEDGER_CONFIG": str(tmp / "none.toml"), "GPULEDGER_STATE_DIR": str(tmp / "state"),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": f"two{s}.",
           "GPULEDGER_PROCESSOR__GROUP_ID": f"two{s}.processors", "GPULEDGER_SINKS__GROUP_ID": f"two{s}.sinks",
           "GPULEDGER_CLICKHOUSE__URL": clickhouse_server.url, "GPULEDGER_CLICKHOUSE__DATABASE": database,
           "GPULEDGER_CLICKHOUSE__PASSWORD": clickhouse_server.password,
           "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": clickhouse_server.analyst_password,
           "GPULEDGER_SCHEDULER__DIRECTORY": str(tmp / "directory.yaml"),
           "GPULEDGER_SCHEDULER__REGISTRY": str(tmp / "projects.yaml"),
           "GPULEDGER_METRICS__BASE_PORT": "0"}  # fmt: skip
    progress("topics, migrations, rate card")
    for args in (["topics", "apply", "--timeout", "60"], ["db", "migrate"],
                 ["ratecard", "load", "--card", str(tmp / "card.toml")]):
        done = run_gpuledger(args, env=env, timeout=180)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    clusters = Clusters(slurm=f"slurm-{s}", kube=f"kube-{s}")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp / "logs"
    logs.mkdir()
    progress("the control plane")
    with LocalKube(ClusterConfig.on_free_ports(tmp / "kube"), kube_binaries) as kube:
        engines = TwoEngines(live_slurm, kube, kube_binaries, env, tmp, clusters=clusters, progress=progress)
        try:
            for name, args in (("processors", ["processors", "run"]), ("agents", ["processors", "agents"]),
                               ("sinks", ["sink", "run"])):  # what `up` runs: node stages, job stage, sinks
                with open(logs / f"{name}.log", "wb") as log:
                    procs[name] = subprocess.Popen(gpuledger_argv(*args), env=env, cwd=REPO, stdout=log,
                                                   stderr=subprocess.STDOUT)  # fmt: skip
            engines.start()
            ns = f"two-{s}"
            kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default",
                                                                                    "namespace": ns}}])  # fmt: skip
            ch = ClickHouseSettings(url=clickhouse_server.url, database=database, password=clickhouse_server.password,
                                    analyst_password=clickhouse_server.analyst_password)  # fmt: skip
            yield Stack(engines, live_slurm, kube, env, s, ns, PERSON, procs, ch)
        finally:
            engines.stop()
            for proc in procs.values():
                if proc.poll() is None:
                    stop_process(proc.pid, timeout=30, group=False)
            live_slurm.run("scancel", f"--user={PERSON}", check=False)
            live_slurm.cancel_all()
            # The session's Slurm as it was: the test's QOS and the person's association gone (slurm_setup).
            live_slurm.run("sacctmgr", "-i", "delete", "qos", f"low-{s}", f"high-{s}", check=False)
            live_slurm.run("sacctmgr", "-i", "delete", "user", PERSON, check=False)
            admin.command(f"DROP DATABASE IF EXISTS {database}")


# ------------------------------------------------------------------------------------------------
# Work


def kube_job(name: str, ns: str, *, pods: int, gpus: int, run_s: int, user: str, project: str, queue: str,
             priority: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A Kueue Job (suspended: Kueue admits it) whose pods KWOK runs on the fake node for `run_s` seconds."""
    labels = {QUEUE: queue, "gpuledger.io/project": project, "gpuledger.io/user": user}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    delay = f"{run_s}s"  # a Go duration: KWOK reads the annotation with time.ParseDuration
    pod = {"metadata": {"labels": {"gpuledger.io/project": project, "gpuledger.io/user": user},
                        "annotations": {"pod-create.stage.kwok.x-k8s.io/delay": "500ms",
                                        "pod-create.stage.kwok.x-k8s.io/jitter-delay": "500ms",
                                        "pod-ready.stage.kwok.x-k8s.io/delay": "1s",
                                        "pod-ready.stage.kwok.x-k8s.io/jitter-delay": "1s",
                                        "pod-complete.stage.kwok.x-k8s.io/delay": delay,
                                        "pod-complete.stage.kwok.x-k8s.io/jitter-delay": delay}},
           "spec": {"nodeName": KUBE_NODE, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": "busybox",
                                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                  "requests": {"nvidia.com/gpu": str(gpus)}}}]}}  # fmt: skip
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"suspend": True, "parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": pod}}  # fmt: skip


def kueue_setup(kube: LocalKube, ns: str, s: str) -> str:
    cq = f"cq-{s}"
    kube.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"h100-{s}"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": f"h100-{s}", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": ns},
         "spec": {"clusterQueue": cq}},
    ])  # fmt: skip
    return "gpus"


def running_pods(kube: LocalKube, ns: str) -> set[str]:
    """The Jobs (by name) that have a Running pod now."""
    pods = json.loads(kube.kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    return {p["metadata"]["labels"].get("job-name", "") for p in pods if p.get("status", {}).get("phase") == "Running"}


# ------------------------------------------------------------------------------------------------
# What the engines say they ran


def sacct(slurm: SlurmClient, jobs: list[str]) -> dict[str, list[Run]]:
    out = slurm.run("sacct", "-D", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", SACCT_FIELDS,
                    env={**slurm.env, "SLURM_TIME_FORMAT": "%s"}).stdout  # fmt: skip
    return sacct_runs(out)


def report_lines(stack: Stack, period: str, by: str) -> list[dict[str, Any]]:
    out = stack.cli("report", "chargeback", "--period", period, "--by", by, "--format", "json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def query(stack: Stack, sql: str) -> list[dict[str, Any]]:
    client = connect(stack.ch, analyst=True)
    try:
        return list(client.query(sql).named_results())
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------
# The test


def slurm_setup(slurm: SlurmClient, s: str, person: str) -> tuple[str, str]:
    """QOS low-S (preempted by high-S, requeued) and the person's association (AccountingStorageEnforce=qos)."""
    low, high = f"low-{s}", f"high-{s}"
    slurm.run("sacctmgr", "-i", "add", "qos", low)
    slurm.run("sacctmgr", "-i", "add", "qos", high, "set", "Priority=1000", f"Preempt={low}", "PreemptMode=requeue")
    for user in {"root", person}:
        slurm.run("sacctmgr", "-i", "add", "user", user, "account=research", check=False)
        slurm.run("sacctmgr", "-i", "modify", "user", user, "set", f"qos+={low},{high}")
    return low, high


def salloc(slurm: SlurmClient, *args: str) -> str:
    """An interactive allocation (`salloc --no-shell`): the job holds its GPUs until it is cancelled. With `--uid`
    nothing runs as that user on the node (slurmd's spool and munge's socket are in the session's temporary
    folders, root's alone); salloc, which has become her after the grant, cannot reach munge for its last
    node-ready question, so it is stopped once the allocation is granted (the allocation stays)."""
    proc = subprocess.Popen(["salloc", "--no-shell", "--wait-all-nodes=0", *args], env=slurm.env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stderr is not None
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            found = re.search(r"Granted job allocation (\d+)", line)
            if found:
                return found.group(1)
    finally:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    raise AssertionError(f"salloc {' '.join(args)}: no allocation: {''.join(seen)}")


def start_now(slurm: SlurmClient, job: str) -> None:
    """A requeued job waits for its BeginTime (the credential's lifetime); StartTime=now+2 lets it start at once
    (`now` would be the second its credential was revoked in: cf84fab)."""
    slurm.run("scontrol", "update", f"jobid={job}", "StartTime=now+2")


def test_two_live_engines_feed_one_ledger_that_matches_their_own_accounting(two_engines: Stack) -> None:
    st = two_engines
    s, ns, slurm, kube = st.suffix, st.namespace, st.slurm, st.kube
    clusters = st.engines.clusters
    queue = kueue_setup(kube, ns, s)
    person = st.person
    low, high = slurm_setup(slurm, s, person)
    common = ("--chdir=/tmp", "--account=research", "--output=/dev/null")

    def sbatch(*args: str, wrap: str) -> str:
        return slurm.submit(*common, *args, wrap=wrap)

    # Slurm (h100 0-1, a100 2-3): a gang of two H100; alice's interactive A100 allocation; a preemptible job
    # preempted by a high-QOS one, requeued by Slurm and run again; later an idle job reclaimed by gpuledger.
    # alice's allocation first, on the idle cluster: granted in the reply to salloc's request. Behind a pending job
    # (the gang, before its scheduling pass) it would wait for a later grant message, which salloc, become her,
    # cannot take (munge's socket is root's): slurmctld then kills it ("Communication connection failure"), as it
    # did twice in full `make test` runs where the earlier tests' fair-share usage ranked her below the gang.
    alice_s = salloc(slurm, f"--uid={person}", "--gres=gpu:a100:1", "--job-name=alice", "--account=research",
                     f"--comment=project=p-vision-{s}")  # fmt: skip
    gang = sbatch("--gres=gpu:h100:2", "--job-name=gang", f"--comment=project=p-ops-{s}", wrap="sleep 20")
    low_job = sbatch("--gres=gpu:a100:1", "--job-name=low", f"--qos={low}", "--requeue", f"--comment=project=p-ops-{s}",
                     wrap="sleep 20")  # fmt: skip
    # Kubernetes (4 H100, quota 4): alice's gang of two 1-GPU pods; bob's low-priority 2-GPU job, preempted by a
    # high-priority one and admitted again; later an idle job reclaimed by gpuledger.
    kube.apply([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": f"low-{s}"},
         "value": 10},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": f"mid-{s}"},
         "value": 100},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": f"high-{s}"},
         "value": 1000},
        kube_job("train", ns, pods=2, gpus=1, run_s=25, user=person, project=f"p-vision-{s}", queue=queue,
                 priority=f"mid-{s}"),  # above tune: the preemption takes tune
        kube_job("tune", ns, pods=1, gpus=2, run_s=20, user="bob", project=f"p-nlp-{s}", queue=queue,
                 priority=f"low-{s}"),
    ])  # fmt: skip
    for job in (gang, alice_s, low_job):
        slurm.wait_for_state(job, "RUNNING", timeout=60)
    eventually(lambda: running_pods(kube, ns) >= {"train", "tune"}, "train and tune run", timeout=60)
    time.sleep(3)

    # The preemptions (each engine requeues what it preempted).
    high_job = sbatch("--gres=gpu:a100:1", "--job-name=high", f"--qos={high}", f"--comment=project=p-ops-{s}",
                      wrap="sleep 10")  # fmt: skip
    kube.apply([kube_job("urgent", ns, pods=1, gpus=2, run_s=10, user="root", project=f"p-ops-{s}", queue=queue,
                         priority=f"high-{s}")])  # fmt: skip
    slurm.wait_for_state(high_job, "RUNNING", timeout=60)
    eventually(lambda: slurm.state(low_job) == "PENDING", "the preemptible job requeued", timeout=60)
    start_now(slurm, low_job)
    eventually(lambda: "urgent" in running_pods(kube, ns), "urgent runs", timeout=60)
    evicted = condition(workload_of(kube, ns, "tune"), "Evicted")  # Kueue's own word (once readmitted: "Previously")
    assert "Preempted to accommodate a workload" in evicted.get("message", ""), evicted

    # alice leaves her interactive allocation. The reclaims: an idle job on each engine, acted on by
    # `gpuledger reclaim exec --execute` once it has run.
    slurm.run("scancel", alice_s)
    slurm.wait_for_state(alice_s, "CANCELLED", timeout=60)
    idle_s = sbatch("--gres=gpu:a100:1", "--job-name=idle-s", "--requeue", f"--comment=project=p-ops-{s}",
                    wrap="sleep 300")  # fmt: skip
    eventually(lambda: "train" not in running_pods(kube, ns), "train finished", timeout=90)
    kube.apply([kube_job("idle-k", ns, pods=1, gpus=1, run_s=300, user="bob", project=f"p-nlp-{s}",
                         queue=queue)])  # fmt: skip
    slurm.wait_for_state(idle_s, "RUNNING", timeout=60)
    idle_pod = eventually(lambda: next((k for k, p in st.engines.devices.pods.items() if "/idle-k-" in k and
                                        (p.get("status") or {}).get("phase") == "Running"), None),
                          "the idle pod runs", timeout=60)  # fmt: skip
    time.sleep(6)
    reclaimed = st.cli("reclaim", "exec", "--scheduler", "SLURM", "--job", idle_s, "--action", "CANCEL",
                       "--execute", "--reason", "idle", cluster=clusters.slurm)  # fmt: skip
    assert reclaimed.returncode == 0, reclaimed.stdout + reclaimed.stderr
    reclaimer = {**st.env, "KUBECONFIG": str(kube.cfg.kubeconfig("gpuledger-reclaim"))}  # its ClusterRole only
    reclaimed = run_gpuledger(["reclaim", "exec", "--scheduler", "KUEUE", "--job", idle_pod, "--action", "REQUEUE",
                               "--execute", "--reason", "idle", "--cluster", clusters.kube], env=reclaimer)  # fmt: skip
    assert reclaimed.returncode == 0 and "failed" not in reclaimed.stdout, reclaimed.stdout + reclaimed.stderr
    print(reclaimed.stdout)
    slurm.wait_for_state(idle_s, "CANCELLED", timeout=60)
    eventually(lambda: idle_pod not in st.engines.devices.assigned, "the reclaimed pod gone", timeout=60)

    # Everything else to its end.
    slurm_jobs = [gang, alice_s, low_job, high_job, idle_s]
    for job in (gang, low_job, high_job):
        slurm.wait_for_state(job, "COMPLETED", timeout=120)

    def kube_done() -> bool:
        jobs = {j["metadata"]["name"]: j for j in json.loads(kube.kubectl("-n", ns, "get", "jobs", "-o",
                                                                          "json").stdout)["items"]}  # fmt: skip
        return all(any(c["type"] == "Complete" and c["status"] == "True" for c in jobs[n].get("status", {}).get(
            "conditions", [])) for n in ("train", "tune", "urgent")) and not st.engines.devices.assigned  # fmt: skip

    eventually(kube_done, "train, tune and urgent complete", timeout=150)

    # The correction: alice's Slurm job was for the NLP project.
    corrected = st.cli("attribution", "correct", alice_s, "--project", f"p-nlp-{s}", "--reason", "wrong project",
                       "--cluster", clusters.slurm, cluster=clusters.slurm)  # fmt: skip
    assert corrected.returncode == 0, corrected.stderr

    # What the engines ran: Slurm's accounting, each pod's own status.
    runs = sacct(slurm, slurm_jobs)
    assert len(runs[low_job]) == 2 and all(len(r) == 1 for j, r in runs.items() if j != low_job), runs  # requeued
    expected_s: dict[tuple[str, str], int] = {}
    for job, spans in runs.items():
        expected_s[(clusters.slurm, job)] = sum(run.gpu_seconds for run in spans)
    pods = {key: pod for key, pod in st.engines.devices.pods.items() if key.startswith(ns + "/")}
    by_job: dict[str, list[str]] = defaultdict(list)
    for key in pods:
        by_job[key.split("/", 1)[1].rsplit("-", 1)[0]].append(key)
    assert {j: len(v) for j, v in by_job.items()} == {"train": 2, "tune": 2, "urgent": 1, "idle-k": 1}, sorted(pods)
    for key, pod in pods.items():
        expected_s[(clusters.kube, key)] = pod_run(pod).gpu_seconds
    print(f"\nexpected GPU-seconds: {expected_s}")

    # The ledger: every job's GPU-seconds there, once the minutes after the last end have closed.
    def ledger() -> dict[tuple[str, str], int]:
        rows = query(st, "SELECT cluster, job_id, toInt64(sum(allocated_s)) AS s FROM v_chargeback_jobs "
                         "GROUP BY cluster, job_id")  # fmt: skip
        return {(r["cluster"], r["job_id"]): int(r["s"]) for r in rows}

    def complete() -> dict[tuple[str, str], int] | None:
        got = ledger()
        return got if all(got.get(k) == v for k, v in expected_s.items()) else None

    def story() -> str:
        """Each disagreeing job's events and device-minutes, as the warehouse holds them."""
        got = ledger()
        lines = [f"ledger {got}", f"expected {expected_s}"]
        for cluster, job in sorted(k for k in expected_s if got.get(k) != expected_s[k]):
            rows = query(st, f"SELECT event_type, ts_ms, start_ts_ms, end_ts_ms, exit_state, allocations "
                             f"FROM job_events WHERE cluster = '{cluster}' AND job_id = '{job}' ORDER BY ts_ms")
            lines += [f"{cluster} {job}: {r}" for r in rows]
            mins = query(st, f"SELECT device_uuid, minute_start_ms, allocated_s, dark_s FROM device_minutes FINAL "
                             f"WHERE cluster = '{cluster}' AND job_id = '{job}' ORDER BY device_uuid, minute_start_ms")
            lines += [f"  {r}" for r in mins]
        return "\n".join(lines)

    eventually(complete, "the ledger holds every job's GPU-seconds as the engines ran them", timeout=150, explain=story)
    # Who and what each job was, as the engines have it: Slurm's user and the job's project comment (alice's job
    # corrected to NLP), the pod's labels.
    users = dict(line.split("|")[:2] for line in slurm.run("sacct", "-X", "-n", "-P", "-j", ",".join(slurm_jobs),
                                                             "-o", "JobID,User").stdout.split())  # fmt: skip
    projects = {gang: f"p-ops-{s}", alice_s: f"p-nlp-{s}", low_job: f"p-ops-{s}", high_job: f"p-ops-{s}",
                idle_s: f"p-ops-{s}"}  # fmt: skip
    teams = {u: e["teams"][0] for u, e in directory(s)["users"].items()}
    who: dict[tuple[str, str], tuple[str, str]] = {(clusters.slurm, j): (teams[users[j]], projects[j]) for j in runs}
    for key, pod in pods.items():
        labels = pod["metadata"]["labels"]
        who[(clusters.kube, key)] = (teams[labels["gpuledger.io/user"]], labels["gpuledger.io/project"])
    assert users[alice_s] == person and who[(clusters.kube, by_job["train"][0])][0] == teams[person]

    def dollars(seconds: int) -> str:
        return str(Decimal(seconds).quantize(Decimal("0.01")))  # the card: 1 $ a GPU-second

    by_team: dict[tuple[str, str], int] = defaultdict(int)
    by_project: dict[str, int] = defaultdict(int)
    for key, gpu_s in expected_s.items():
        by_team[(who[key][0], key[0])] += gpu_s
        by_team[(who[key][0], "ALL")] += gpu_s
        by_project[who[key][1]] += gpu_s
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")
    lines = report_lines(st, period, "cluster")
    got_team = {(r["line"], r["cluster"]): r["charge"] for r in lines if r["line"] != "TOTAL"}
    assert got_team == {k: dollars(v) for k, v in by_team.items()}, lines
    total = [r["charge"] for r in lines if r["line"] == "TOTAL"]
    assert total == [dollars(sum(expected_s.values()))], lines
    lines = report_lines(st, period, "project")
    got_project = {r["line"]: r["charge"] for r in lines if r["line"] != "TOTAL"}
    assert {k: v for k, v in got_project.items() if k in by_project} == {k: dollars(v) for k, v in
                                                                         by_project.items()}, lines  # fmt: skip
    # Jobs the session's earlier Slurm tests ran are in the live Slurm's accounting, and the poller reports them:
    # their projects get lines, but not one second in this test's window.
    assert {v for k, v in got_project.items() if k not in by_project} <= {"0.00"}, lines

    # Each device-second charged once: no device-minute holds more than 60 allocated seconds, none is contested.
    crowded = query(st, "SELECT cluster, device_uuid, minute_start_ms, sum(allocated_s) AS s FROM device_minutes "
                        "FINAL GROUP BY cluster, device_uuid, minute_start_ms HAVING s > 60")  # fmt: skip
    assert crowded == []
    assert query(st, f"SELECT * FROM v_device_overlaps WHERE period = '{period}'") == []
    held = query(st, "SELECT cluster, toInt64(sum(allocated_s)) AS s FROM device_minutes FINAL WHERE job_id != '' "
                     "AND device_uuid NOT LIKE 'unidentified%' GROUP BY cluster")  # fmt: skip
    assert {r["cluster"]: r["s"] for r in held} == {c: sum(v for (k, _), v in expected_s.items() if k == c)
                                                    for c in (clusters.slurm, clusters.kube)}  # on the real GPUs
