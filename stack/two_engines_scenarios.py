"""The two-engine scenarios: real work on both live engines, and the ledger the engines' own accounting implies.

One implementation for tests/integration/test_two_engines_live.py (which compares the ledger with it) and
`gpuledger dev two-engines --scenarios` (which runs it for a person and prints both side by side).

The work (`run_scenarios`, on a `TwoEngines` that runs): a gang on each engine (a 2-GPU Slurm job; a Kueue Job of
two 1-GPU pods), one person on both (`alice`: an interactive Slurm allocation under her uid, and the Kubernetes
gang labelled as hers), a preemption on each (a QOS preemption on Slurm, which cancels the preempted job; a
WorkloadPriorityClass preemption in Kueue, which requeues the Workload, whose Job gets new pods), a
reclaim on each (`gpuledger reclaim exec --execute`: an idle Slurm job cancelled, an idle pod's Workload
deactivated as the gpuledger-reclaim user) and a correction (alice's Slurm job moved to another project).

What the engines ran (`expected`), never a plan: sacct's Start/End of each run (`-D`: a requeued job's every run)
and its GPU count, each pod's own status (startTime, finishedAt or deletionTimestamp, as KWOK and the API server
wrote them); who and what each job was, as the engines have it (Slurm's user and the job's project comment, the
pod's labels), with the correction applied. The rate card (`CARD`) charges 1 $ a GPU-second on both generations,
so a charge is its GPU-seconds in dollars.
"""

from __future__ import annotations

import json
import pwd
import re
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from stack.cards import one_dollar_a_second
from stack.kube import namespace
from stack.kube.cluster import LocalKube, condition, eventually, workload_of
from stack.slurm.cluster import ACCOUNT, SlurmClient
from stack.two_engines import KUBE_NODE, SACCT_FIELDS, Run, TwoEngines, pod_run, sacct_runs

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PERSON = "alice"  # one person on both clusters: a Linux account here (Slurm runs her job as her), a Kubernetes user
CARD = one_dollar_a_second("two-engines", ("hopper", "ampere"), discount="0.40")  # a charge = its GPU-seconds


def _quiet(_: str) -> None:
    return None


# ------------------------------------------------------------------------------------------------
# The site: who is who, the projects, the card


def directory(s: str) -> dict[str, Any]:
    return {
        "users": {
            "root": {"teams": [f"ops-{s}"], "cost_centre": "CC-1"},
            "alice": {"teams": [f"vision-{s}"], "cost_centre": "CC-2"},
            "bob": {"teams": [f"nlp-{s}"], "cost_centre": "CC-3"},
        }
    }


def registry(s: str) -> dict[str, Any]:
    return {"projects": [{"id": f"p-vision-{s}"}, {"id": f"p-nlp-{s}"}, {"id": f"p-ops-{s}"}]}


@dataclass(frozen=True)
class SiteFiles:
    """The scenarios' directory, project registry and rate card, written to a folder."""

    directory: Path
    registry: Path
    card: Path

    @classmethod
    def write(cls, folder: Path, s: str) -> SiteFiles:
        folder.mkdir(parents=True, exist_ok=True)
        files = cls(folder / "directory.yaml", folder / "projects.yaml", folder / "card.toml")
        files.directory.write_text(yaml.safe_dump(directory(s)), encoding="utf-8")
        files.registry.write_text(yaml.safe_dump(registry(s)), encoding="utf-8")
        files.card.write_text(CARD, encoding="utf-8")
        return files

    def env(self) -> dict[str, str]:
        """What the producers read them from."""
        return {"GPULEDGER_SCHEDULER__DIRECTORY": str(self.directory),
                "GPULEDGER_SCHEDULER__REGISTRY": str(self.registry)}  # fmt: skip


def person_account(user: str) -> None:
    """The person's Linux account, created when missing: the live Slurm allocates her GPUs under her uid."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user], check=True)


# ------------------------------------------------------------------------------------------------
# Slurm


def slurm_setup(slurm: SlurmClient, s: str, person: str) -> tuple[str, str]:
    """QOS low-S (preempted by high-S: cancelled) and the person's association (AccountingStorageEnforce=qos). Not
    requeued: `slurm poll` stamps a requeued run's end with the poll that saw the job back in the queue (the listing
    of a pending job carries no end of its last run), 1-2 s late under load, so the exact comparison failed by chance
    (3 runs of 6 by 1 GPU-second, /work/coord/s5/twoengines4.md); Kubernetes' preemption requeues (Kueue)."""
    low, high = f"low-{s}", f"high-{s}"
    slurm.run("sacctmgr", "-i", "add", "qos", low)
    slurm.run("sacctmgr", "-i", "add", "qos", high, "set", "Priority=1000", f"Preempt={low}", "PreemptMode=cancel")
    for user in {"root", person}:
        slurm.run("sacctmgr", "-i", "add", "user", user, f"account={ACCOUNT}", check=False)
        slurm.run("sacctmgr", "-i", "modify", "user", user, "set", f"qos+={low},{high}")
    return low, high


def slurm_teardown(slurm: SlurmClient, s: str, person: str) -> None:
    """The Slurm as it was before `slurm_setup`: the person's jobs, the scenarios' QOS and her association gone."""
    slurm.run("scancel", f"--user={person}", check=False)
    slurm.cancel_all()
    slurm.run("sacctmgr", "-i", "delete", "qos", f"low-{s}", f"high-{s}", check=False)
    slurm.run("sacctmgr", "-i", "delete", "user", person, check=False)


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
    raise ScenarioError(f"salloc {' '.join(args)}: no allocation: {''.join(seen)}")


def sacct(slurm: SlurmClient, jobs: list[str]) -> dict[str, list[Run]]:
    """Each job's runs as Slurm's accounting has them (`sacct -D`: a requeued job's every run)."""
    out = slurm.run("sacct", "-D", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", SACCT_FIELDS,
                    env={**slurm.env, "SLURM_TIME_FORMAT": "%s"}).stdout  # fmt: skip
    return sacct_runs(out)


# ------------------------------------------------------------------------------------------------
# Kubernetes


def kube_job(name: str, ns: str, *, pods: int, gpus: int, run_s: int, user: str, project: str, queue: str,
             priority: str | None = None) -> dict[str, Any]:  # fmt: skip
    """A Kueue Job (suspended: Kueue admits it) whose pods KWOK runs on the fake node for `run_s` seconds."""
    labels = {QUEUE_LABEL: queue, "gpuledger.io/project": project, "gpuledger.io/user": user}
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
    """The namespace, a ClusterQueue of the node's 4 GPUs (preemption within it by priority), its LocalQueue."""
    cq = f"cq-{s}"
    kube.apply([
        *namespace(ns),
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": f"h100-{s}"}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                      {"name": f"h100-{s}", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": ns},
         "spec": {"clusterQueue": cq}},
    ])  # fmt: skip
    return "gpus"


def priority_classes(s: str) -> list[dict[str, Any]]:
    return [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
             "metadata": {"name": f"{name}-{s}"}, "value": value}
            for name, value in (("low", 10), ("mid", 100), ("high", 1000))]  # fmt: skip


def running_pods(kube: LocalKube, ns: str) -> set[str]:
    """The Jobs (by name) that have a Running pod now."""
    pods = json.loads(kube.kubectl("-n", ns, "get", "pods", "-o", "json").stdout)["items"]
    return {p["metadata"]["labels"].get("job-name", "") for p in pods if p.get("status", {}).get("phase") == "Running"}


def jobs_complete(kube: LocalKube, ns: str, names: tuple[str, ...]) -> bool:
    jobs = {j["metadata"]["name"]: j for j in json.loads(kube.kubectl("-n", ns, "get", "jobs", "-o",
                                                                      "json").stdout)["items"]}  # fmt: skip
    return all(any(c["type"] == "Complete" and c["status"] == "True" for c in jobs[n].get("status", {}).get(
        "conditions", [])) for n in names)  # fmt: skip


# ------------------------------------------------------------------------------------------------
# The work


class ScenarioError(Exception):
    """An engine did not do what the scenario asked of it (the message says what, and what was seen)."""


@dataclass
class Work:
    """What `run_scenarios` submitted, by role: Slurm job ids, the Kubernetes namespace and the reclaimed pod."""

    suffix: str
    namespace: str
    person: str
    slurm: dict[str, str]  # gang, alice, low (preempted, requeued), high, idle (reclaimed) -> job id
    idle_pod: str  # namespace/pod reclaimed on Kubernetes
    evicted: dict[str, Any]  # the preempted Workload's Evicted condition, as Kueue wrote it
    notes: list[str] = field(default_factory=list)  # what gpuledger's commands answered

    @property
    def projects(self) -> dict[str, str]:
        """Each Slurm job's project, the correction applied (alice's job moved to NLP)."""
        s = self.suffix
        return {job: f"p-nlp-{s}" if role == "alice" else f"p-ops-{s}" for role, job in self.slurm.items()}


def run_scenarios(engines: TwoEngines, s: str, *, person: str = PERSON, progress: Callable[[str], None] = _quiet,
                  timeout: float = 150) -> Work:  # fmt: skip
    """Submit the scenarios' work to both engines (running: `engines.start()` done) and wait until all of it has
    ended and been corrected. The Slurm must be idle (alice's allocation is granted in the reply to salloc)."""
    slurm, kube, clusters = engines.slurm, engines.kube, engines.clusters
    ns = f"two-{s}"
    person_account(person)
    queue = kueue_setup(kube, ns, s)
    low, high = slurm_setup(slurm, s, person)
    common = ("--chdir=/tmp", f"--account={ACCOUNT}", "--output=/dev/null")

    def sbatch(*args: str, wrap: str) -> str:
        return slurm.submit(*common, *args, wrap=wrap)

    # Slurm (h100 0-1, a100 2-3): a gang of two H100; alice's interactive A100 allocation; a preemptible job
    # preempted (cancelled) by a high-QOS one; later an idle job reclaimed by gpuledger.
    # alice's allocation first, on the idle cluster: granted in the reply to salloc's request. Behind a pending job
    # (the gang, before its scheduling pass) it would wait for a later grant message, which salloc, become her,
    # cannot take (munge's socket is root's): slurmctld then kills it ("Communication connection failure"), as it
    # did twice in full `make test` runs where the earlier tests' fair-share usage ranked her below the gang.
    progress("scenarios: alice's interactive allocation, a gang and a preemptible job on Slurm; two jobs in Kueue")
    alice_s = salloc(slurm, f"--uid={person}", "--gres=gpu:a100:1", "--job-name=alice", f"--account={ACCOUNT}",
                     f"--comment=project=p-vision-{s}")  # fmt: skip
    gang = sbatch("--gres=gpu:h100:2", "--job-name=gang", f"--comment=project=p-ops-{s}", wrap="sleep 20")
    low_job = sbatch("--gres=gpu:a100:1", "--job-name=low", f"--qos={low}", "--no-requeue",
                     f"--comment=project=p-ops-{s}", wrap="sleep 20")  # fmt: skip
    # Kubernetes (4 H100, quota 4): alice's gang of two 1-GPU pods; bob's low-priority 2-GPU job, preempted by a
    # high-priority one and admitted again; later an idle job reclaimed by gpuledger.
    kube.apply([
        *priority_classes(s),
        kube_job("train", ns, pods=2, gpus=1, run_s=25, user=person, project=f"p-vision-{s}", queue=queue,
                 priority=f"mid-{s}"),  # above tune: the preemption takes tune
        kube_job("tune", ns, pods=1, gpus=2, run_s=20, user="bob", project=f"p-nlp-{s}", queue=queue,
                 priority=f"low-{s}"),
    ])  # fmt: skip
    for job in (gang, alice_s, low_job):
        slurm.wait_for_state(job, "RUNNING", timeout=60)
    eventually(lambda: running_pods(kube, ns) >= {"train", "tune"}, "train and tune run", timeout=60)
    time.sleep(3)

    progress("scenarios: the preemptions (Slurm cancels what it preempted, Kueue requeues it)")
    high_job = sbatch("--gres=gpu:a100:1", "--job-name=high", f"--qos={high}", f"--comment=project=p-ops-{s}",
                      wrap="sleep 10")  # fmt: skip
    kube.apply([kube_job("urgent", ns, pods=1, gpus=2, run_s=10, user="root", project=f"p-ops-{s}", queue=queue,
                         priority=f"high-{s}")])  # fmt: skip
    slurm.wait_for_state(high_job, "RUNNING", timeout=60)
    slurm.wait_for_state(low_job, "PREEMPTED", timeout=60)
    eventually(lambda: "urgent" in running_pods(kube, ns), "urgent runs", timeout=60)
    evicted = condition(workload_of(kube, ns, "tune"), "Evicted")  # Kueue's own word (once readmitted: "Previously")

    # alice leaves her interactive allocation. The reclaims: an idle job on each engine, acted on by
    # `gpuledger reclaim exec --execute` once it has run.
    progress("scenarios: alice leaves; an idle job on each engine, reclaimed by gpuledger reclaim exec")
    slurm.run("scancel", alice_s)
    slurm.wait_for_state(alice_s, "CANCELLED", timeout=60)
    idle_s = sbatch("--gres=gpu:a100:1", "--job-name=idle-s", "--requeue", f"--comment=project=p-ops-{s}",
                    wrap="sleep 300")  # fmt: skip
    eventually(lambda: "train" not in running_pods(kube, ns), "train finished", timeout=90)
    kube.apply([kube_job("idle-k", ns, pods=1, gpus=1, run_s=300, user="bob", project=f"p-nlp-{s}",
                         queue=queue)])  # fmt: skip
    slurm.wait_for_state(idle_s, "RUNNING", timeout=60)
    idle_pod = eventually(lambda: next((k for k, p in engines.devices.pods.items() if f"{ns}/idle-k-" in k and
                                        (p.get("status") or {}).get("phase") == "Running"), None),
                          "the idle pod runs", timeout=60)  # fmt: skip
    time.sleep(6)
    notes = [engines.run_cli(clusters.slurm, "reclaim", "exec", "--scheduler", "SLURM", "--job", idle_s, "--action",
                             "CANCEL", "--execute", "--reason", "idle").stdout]  # fmt: skip
    # As the gpuledger-reclaim user: its ClusterRole only.
    reclaimer = str(kube.cfg.kubeconfig("gpuledger-reclaim"))
    out = engines.run_cli(clusters.kube, "reclaim", "exec", "--scheduler", "KUEUE", "--job", idle_pod, "--action",
                          "REQUEUE", "--execute", "--reason", "idle", "--cluster", clusters.kube,
                          KUBECONFIG=reclaimer).stdout  # fmt: skip
    if "failed" in out:
        raise ScenarioError(f"reclaim exec of {idle_pod}: {out}")
    notes.append(out)
    slurm.wait_for_state(idle_s, "CANCELLED", timeout=60)
    eventually(lambda: idle_pod not in engines.devices.assigned, "the reclaimed pod gone", timeout=60)

    progress("scenarios: everything else to its end")
    for job in (gang, high_job):
        slurm.wait_for_state(job, "COMPLETED", timeout=120)
    eventually(lambda: jobs_complete(kube, ns, ("train", "tune", "urgent")) and not engines.devices.assigned,
               "train, tune and urgent complete", timeout=timeout)  # fmt: skip

    progress("scenarios: the correction (alice's Slurm job was for the NLP project)")
    notes.append(engines.run_cli(clusters.slurm, "attribution", "correct", alice_s, "--project", f"p-nlp-{s}",
                                 "--reason", "wrong project", "--cluster", clusters.slurm).stdout)  # fmt: skip
    roles = {"gang": gang, "alice": alice_s, "low": low_job, "high": high_job, "idle": idle_s}
    return Work(s, ns, person, roles, idle_pod, evicted, notes)


# ------------------------------------------------------------------------------------------------
# What the engines ran, and the ledger it implies


@dataclass(frozen=True)
class Expected:
    """The ledger the engines' own accounting implies: (cluster, job) -> GPU-seconds, and who and what each was."""

    seconds: dict[tuple[str, str], int]
    who: dict[tuple[str, str], tuple[str, str]]  # (cluster, job) -> (team, project)
    runs: dict[str, list[Run]]  # Slurm job -> its runs (sacct -D)
    users: dict[str, str]  # Slurm job -> its user (sacct)
    pods: dict[str, list[str]]  # Kubernetes Job name -> its pods (namespace/pod)

    def by_team(self) -> dict[tuple[str, str], int]:
        """(team, cluster) and (team, "ALL") -> GPU-seconds: `report chargeback --by cluster`'s lines."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for key, gpu_s in self.seconds.items():
            out[(self.who[key][0], key[0])] += gpu_s
            out[(self.who[key][0], "ALL")] += gpu_s
        return dict(out)

    def by_project(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for key, gpu_s in self.seconds.items():
            out[self.who[key][1]] += gpu_s
        return dict(out)

    def total(self) -> int:
        return sum(self.seconds.values())


def expected(engines: TwoEngines, work: Work) -> Expected:
    """What the engines ran (Slurm's accounting, each pod's own status), and who for."""
    clusters = engines.clusters
    jobs = list(work.slurm.values())
    runs = sacct(engines.slurm, jobs)
    seconds = {(clusters.slurm, job): sum(run.gpu_seconds for run in spans) for job, spans in runs.items()}
    pods = {key: pod for key, pod in engines.devices.pods.items() if key.startswith(work.namespace + "/")}
    by_job: dict[str, list[str]] = defaultdict(list)
    for key in sorted(pods):
        by_job[key.split("/", 1)[1].rsplit("-", 1)[0]].append(key)
    for key, pod in pods.items():
        seconds[(clusters.kube, key)] = pod_run(pod).gpu_seconds
    out = engines.slurm.run("sacct", "-X", "-n", "-P", "-j", ",".join(jobs), "-o", "JobID,User").stdout
    users = dict(line.split("|")[:2] for line in out.split())
    teams = {u: e["teams"][0] for u, e in directory(work.suffix)["users"].items()}
    who = {(clusters.slurm, j): (teams[users[j]], work.projects[j]) for j in runs}
    for key, pod in pods.items():
        labels = pod["metadata"]["labels"]
        who[(clusters.kube, key)] = (teams[labels["gpuledger.io/user"]], labels["gpuledger.io/project"])
    return Expected(seconds, who, runs, users, dict(by_job))


LEDGER_SQL = ("SELECT cluster, job_id, toInt64(sum(allocated_s)) AS s FROM v_chargeback_jobs "
              "GROUP BY cluster, job_id")  # fmt: skip


def ledger_seconds(client: Any) -> dict[tuple[str, str], int]:
    """Every job's GPU-seconds as the ledger holds them (the analysts' view), from a ClickHouse client."""
    return {(str(r["cluster"]), str(r["job_id"])): int(r["s"]) for r in client.query(LEDGER_SQL).named_results()}


def job_story(client: Any, cluster: str, job: str) -> list[str]:
    """A job's events and device-minutes as the warehouse holds them: what to read when its seconds differ."""
    where = {"cluster": cluster, "job": job}
    events = client.query(
        "SELECT event_type, ts_ms, start_ts_ms, end_ts_ms, exit_state, allocations FROM job_events "
        "WHERE cluster = {cluster:String} AND job_id = {job:String} ORDER BY ts_ms", parameters=where)  # fmt: skip
    minutes = client.query(
        "SELECT device_uuid, minute_start_ms, allocated_s, dark_s FROM device_minutes FINAL "
        "WHERE cluster = {cluster:String} AND job_id = {job:String} ORDER BY device_uuid, minute_start_ms",
        parameters=where)  # fmt: skip
    return [f"{cluster} {job}: {r}" for r in events.named_results()] + [f"  {r}" for r in minutes.named_results()]


def dollars(seconds: int) -> str:
    """The charge of `seconds` GPU-seconds on `CARD` (1 $ a GPU-second), as the reports print it."""
    return str(Decimal(seconds).quantize(Decimal("0.01")))


def side_by_side(want: Expected, got: dict[tuple[str, str], int]) -> list[str]:
    """One line a job: cluster, job, team, project, the engine's GPU-seconds, the ledger's, and whether they agree."""
    lines = [f"{'cluster':<16} {'job':<34} {'team':<14} {'project':<16} {'engine':>7} {'ledger':>7}"]
    for key in sorted(want.seconds):
        team, project = want.who[key]
        mark = "" if got.get(key) == want.seconds[key] else "  <- differs"
        lines.append(f"{key[0]:<16} {key[1]:<34} {team:<14} {project:<16} {want.seconds[key]:>7} "
                     f"{got.get(key, '-')!s:>7}{mark}")  # fmt: skip
    return lines
