"""The simulation's Kubernetes cluster: its jobs as Pods and Kueue Workloads, and the job events the real
Kubernetes producer publishes for them.

`kube_config(cfg)` is the second cluster of a Slurm-like config with `kube_nodes > 0`: named `<cluster>-k8s`,
nodes `k8s-gpu-NNN`, the last one an A100 in MIG mode, one pricing tier (a Kubernetes producer has one,
`EventContext.pricing_tier`), no dead exporter or silent device. Its plan (`build_kube_plan`) reuses the
Slurm-like planner (people, kinds, activity) and then names every job as Kubernetes does:
- a multi-node training gang is a Kueue pod group: one Pod per node (`kueue.x-k8s.io/pod-group-name`) and the
  Workload of the group (gang `kueue:<ns>/<group>`);
- batch and data-starved jobs are Kueue-managed Jobs: a Workload owned by the Job, one Pod owned by the Job;
- notebooks and the poking script are plain Pods (`gpuledger.io/interactive` on notebooks);
- Pods on the MIG node ask for one slice (`nvidia.com/mig-<profile>: 1`);
- every non-MIG node runs a 4-GPU group, so 4-GPU Pods start while the watcher runs (after its first list).
Namespaces are teams; job ids are `<namespace>/<pod>` (never a Slurm-like number: one ledger keys both).

`kube_job_events(cfg)` feeds those objects, in event-time order, through `producers.kube.KubeTracker` (the
watcher's pure core) with the simulated organisation's registry and directory. Device identities come the way
they do on a node without a reachable kubelet socket: `DcgmPodLabels` reads the node's exporter scrape (labels
`namespace`/`pod`/`UUID`/`GPU_I_ID`). For most Pods that is the scrape of the second the Pod starts, so their
STARTED names their devices. The watcher also refreshes the labels as `gpuledger kube watch` does
(`--dcgm-interval`, LABEL_REFRESH_S = 30 s from its start): every exporter scraped again, then
`KubeTracker.recheck_devices`. One Pod of the plan (`SimJob.labels_s`, drawn from the seed; whole GPUs, started
while the watcher runs, off a refresh second, no other Pod starting on its node before the refresh, running past
it) is read only there, as a Pod started after the watcher's last label scrape is on a real cluster: the tracker
publishes a count-only STARTED (N devices, no UUID or index) and, at the refresh, an UPDATED naming its GPUs. The
expected ledger (producers/simulator/ledger.py) charges it N unidentified devices, allocated and dark, over
[start, labels_s) and its real GPUs from labels_s on; their samples before that belong to no job (unallocated).
The Slurm-like cluster has no such job: its records are what they were.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import cache
from typing import Any

from producers.identity import StaticDirectory
from producers.jobevents import EventContext
from producers.kube import (
    GPU_RESOURCE,
    KUEUE_POD_GROUP,
    KUEUE_QUEUE,
    MIG_PREFIX,
    PROJECT_LABEL,
    DcgmPodLabels,
    KubeTracker,
)
from producers.policy_stamp import SUBMITTER, SUBMITTER_GROUPS, SUBMITTER_UID
from producers.projects import Attributor, ProjectRule
from producers.simulator.model import (
    Person,
    SimConfig,
    SimJob,
    SimPlan,
    _build_nodes,
    _build_people,
    _faults,
    _JobMaker,
    _node_jobs,
    _training_gangs,
    plan,
)
from producers.simulator.org import (
    CI_ROBOT,
    ROBOT_NAMESPACE,
    ROBOT_PROJECT,
    ROBOT_TEAM,
    _robot_cost_centre,
    sim_directory,
    sim_registry,
)

KUBE_TIER = "on-prem"
USER_LABEL = "gpuledger.io/user"
PREEMPTIBLE_CLASS = "preemptible"
# GPU groups sharing a timeline on a whole-GPU node of 8: one of 4 (4-GPU Pods), one of 2, two of 1.
KUBE_GROUPS = [[0, 1, 2, 3], [4, 5], [6], [7]]
_POD_NAME = {"training": "train", "batch": "batch", "starved": "etl", "notebook": "jupyter", "poker": "dev"}
KUEUE_KINDS = frozenset({"training", "batch", "starved"})  # admitted by Kueue; the others are plain Pods
LABEL_REFRESH_S = 30  # the watcher's label refresh, `gpuledger kube watch --dcgm-interval` (its default)


def _as_pods(job: SimJob) -> list[SimJob]:
    """A planned job as Kubernetes names it: one Pod per node, `<namespace>/<name>` ids, a Kueue gang id."""
    ns = job.person.team
    name = f"{_POD_NAME[job.kind]}-{job.job_id}"
    if job.kind in KUEUE_KINDS:
        gang = f"kueue:{ns}/{name}" if len(job.nodes) > 1 else f"kueue:{ns}/job-{name}"
    else:
        gang = None
    pod = replace(
        job,
        gang_id=gang,
        submit_s=max(0, job.submit_s),
        pricing_tier=KUBE_TIER,
        partition=f"{ns}-queue" if gang else "",
        qos=PREEMPTIBLE_CLASS if job.preemptible else "",
    )
    if len(job.nodes) == 1:
        return [replace(pod, job_id=f"{ns}/{name}")]
    return [
        replace(pod, job_id=f"{ns}/{name}-{i}", devices=tuple(d for d in job.devices if d[0] == node))
        for i, node in enumerate(job.nodes)
    ]


def build_kube_plan(cfg: SimConfig) -> SimPlan:
    rng = random.Random(cfg.seed)  # noqa: S311 (a reproducible simulation, not cryptography)
    nodes = tuple(replace(n, pricing_tier=KUBE_TIER) for n in _build_nodes(cfg, rng))
    people = _build_people()
    maker = _JobMaker(cfg, nodes, rng)
    planned, blocked, mig = _training_gangs(cfg, nodes, people, rng, maker)
    groups = KUBE_GROUPS if cfg.gpus_per_node == 8 else None
    for node in nodes:
        planned.extend(
            _node_jobs(cfg, node, people, rng, maker, blocked.get(node.name), node.name in mig, groups=groups)
        )
    jobs = [pod for job in planned for pod in _as_pods(job)]
    jobs.sort(key=lambda j: (j.start_s, j.job_id))
    outages, silent = _faults(cfg, jobs)
    devices = {d.key: d for n in nodes for d in n.devices}
    jobs = _with_lagging_labels(cfg, jobs, devices)
    jobs = _with_submitters(cfg, jobs)
    return SimPlan(cfg, nodes, people, tuple(jobs), tuple(outages), frozenset(silent), devices)


def next_label_refresh(t: int) -> int:
    """The first label refresh of the watcher after run second `t` (it scrapes at 0, then every LABEL_REFRESH_S)."""
    return (t // LABEL_REFRESH_S + 1) * LABEL_REFRESH_S


def _with_lagging_labels(cfg: SimConfig, jobs: list[SimJob], devices: dict[tuple[str, int], Any]) -> list[SimJob]:
    """The plan with one Pod whose devices the watcher learns only at its next label refresh (`SimJob.labels_s`).

    A candidate starts while the watcher runs, on whole GPUs, outside a multi-pod gang, runs past that refresh
    (which falls inside the run), and no other Pod starts on its node between its start and the refresh (each
    Pod's start otherwise reads its node's exporter, which would show the lagging Pod's labels early). Drawn from
    its own generator of the seed, so the rest of the plan is what it was; multi-GPU Pods first."""
    starts: dict[str, list[int]] = {}
    for job in jobs:
        starts.setdefault(job.nodes[0], []).append(job.start_s)
    candidates = []
    for job in jobs:
        refresh = next_label_refresh(job.start_s)
        node = job.nodes[0]
        if (
            job.start_s > 0
            and job.start_s % LABEL_REFRESH_S != 0  # a refresh in the second it starts reads its labels at once
            and refresh < min(job.end_s, cfg.duration_s)
            and all(devices[k].mig_instance_id is None for k in job.devices)
            and (job.gang_id is None or job.gang_id.split("/", 1)[1].startswith("job-"))
            and sum(job.start_s <= s < refresh for s in starts[node]) == 1
        ):
            candidates.append(job)
    if not candidates:
        return jobs
    rng = random.Random(f"{cfg.seed}/{cfg.cluster}/labels")  # noqa: S311 (a reproducible simulation)
    wide = [j for j in candidates if len(j.devices) > 1]
    lagging = rng.choice(wide or candidates)
    return [replace(j, labels_s=next_label_refresh(j.start_s)) if j is lagging else j for j in jobs]


# ------------------------------------------------------------------------------------------------
# Who submitted: the admission stamp (producers/policy_stamp.py) as the API server writes it from userInfo

JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"  # creates the Pods of a Job
_SA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:{ns}", "system:authenticated")
ROBOT = Person(CI_ROBOT, ROBOT_TEAM, (ROBOT_PROJECT,), ROBOT_PROJECT, _robot_cost_centre())


def person_uid(user: str) -> str:
    """A person's uid as the cluster's authenticator gives it (stable for the run)."""
    return _uid("user", user)


def robot_uid(generation: int) -> str:
    """The CI robot's service account uid: a new one each time the account is deleted and recreated."""
    return _uid("serviceaccount", ROBOT_NAMESPACE, CI_ROBOT, str(generation))


def robot_recreated_s(jobs: list[SimJob] | tuple[SimJob, ...]) -> int | None:
    """The run second the CI robot's service account is deleted and recreated under the same name: the submission
    of its middle Job, so Jobs of both accounts run (None: fewer than two robot Jobs)."""
    mine = sorted(j.submit_s for j in jobs if j.person.user == CI_ROBOT)
    return mine[len(mine) // 2] if len(mine) >= 2 else None


def _owned_by_job(job: SimJob) -> bool:
    return job.gang_id is not None and job.gang_id.split("/", 1)[1].startswith("job-")


def _with_submitters(cfg: SimConfig, jobs: list[SimJob]) -> list[SimJob]:
    """The plan with who submitted each job through the stamped path:
    - the CI robot (`system:serviceaccount:platform:ci-robot`) submits every second Kueue Job of the platform team
      (in start order), its service account recreated at `robot_recreated_s`, so its uid changes mid-run;
    - one person (the first with a notebook, off a one-person team) labels their Pods `gpuledger.io/user: <another
      member of the team>`: the stamp names them, the label disagrees (`user_claimed`);
    - everyone else is stamped with their own name and uid."""
    team_jobs = [j for j in jobs if j.person.team == ROBOT_TEAM and _owned_by_job(j)]
    robot_ids = {j.job_id for j in team_jobs[::2]}
    out = [replace(j, person=ROBOT) if j.job_id in robot_ids else j for j in jobs]
    recreated = robot_recreated_s(out)
    members: dict[str, list[str]] = {}
    for p in _build_people():
        members.setdefault(p.team, []).append(p.user)
    claimer = next((j.person.user for j in out if j.kind == "notebook" and len(members[j.person.team]) > 1), None)
    result = []
    for j in out:
        if j.person.user == CI_ROBOT:
            uid = robot_uid(1 if recreated is None or j.submit_s < recreated else 2)
            result.append(replace(j, submitter_uid=uid))
            continue
        claimed = None
        if j.person.user == claimer:
            claimed = next(u for u in sorted(members[j.person.team]) if u != claimer)
        result.append(replace(j, submitter_uid=person_uid(j.person.user), claimed_user=claimed))
    return result


def _stamp(user: str, uid: str, groups: tuple[str, ...]) -> dict[str, str]:
    return {SUBMITTER: user, SUBMITTER_UID: uid, SUBMITTER_GROUPS: ",".join(groups)}


def submitter_stamp(job: SimJob) -> dict[str, str]:
    """The stamp on what the job's submitter created (a Job, or a Pod they created themselves)."""
    assert job.submitter_uid is not None
    if job.person.user == CI_ROBOT:
        return _stamp(CI_ROBOT, job.submitter_uid, tuple(g.format(ns=ROBOT_NAMESPACE) for g in _SA_GROUPS))
    return _stamp(job.person.user, job.submitter_uid, (job.person.team, "system:authenticated"))


def controller_stamp() -> dict[str, str]:
    """The stamp on a Pod the Job controller created: the controller's own identity (the producer follows the
    Pod's controller owner to the Job's stamp)."""
    return _stamp(JOB_CONTROLLER, _uid("serviceaccount", "kube-system", JOB_CONTROLLER),
                  tuple(g.format(ns="kube-system") for g in _SA_GROUPS))  # fmt: skip


class SimOwners:
    """The Jobs the plan's Kueue Jobs' Pods and Workloads point at (the producer's `OwnerSource`), by uid: what
    `ApiOwners` would GET from the API server."""

    def __init__(self, jobs: dict[str, dict[str, Any]]) -> None:
        self.jobs = jobs

    def owner(self, namespace: str, ref: Any) -> dict[str, Any] | None:
        job = self.jobs.get(str(ref.get("uid")))
        return job if job is not None and job["metadata"]["namespace"] == namespace else None


# ------------------------------------------------------------------------------------------------
# The objects the API server would send


def _iso(s: int) -> str:
    return datetime.fromtimestamp(s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _uid(*parts: str) -> str:
    h = hashlib.sha256("/".join(parts).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _resources(p: SimPlan, job: SimJob) -> dict[str, str]:
    dev = p.devices[job.devices[0]]
    if dev.mig_profile is not None:
        return {f"{MIG_PREFIX}{dev.mig_profile}": str(len(job.devices))}
    return {GPU_RESOURCE: str(len(job.devices))}


def _owner_labels(job: SimJob) -> dict[str, str]:
    # A person labels the job with a user (theirs, or the claimer someone else's); the CI robot declares none.
    labels = {} if job.person.user == CI_ROBOT else {USER_LABEL: job.claimed_user or job.person.user}
    if job.project_source == "EXPLICIT":
        labels[PROJECT_LABEL] = job.project
    return labels


class _Objects:
    """Pods and Workloads of one plan at the moments their state changes."""

    def __init__(self, p: SimPlan) -> None:
        self.plan = p
        self.base_s = p.config.start_ms // 1000

    def pod(self, job: SimJob, phase: str) -> dict[str, Any]:
        ns, name = job.job_id.split("/", 1)
        b = self.base_s
        labels = _owner_labels(job)
        if job.interactive:
            labels["gpuledger.io/interactive"] = "true"
        if job.checkpointable:
            labels["gpuledger.io/checkpointable"] = "true"
        owners: list[dict[str, str]] = []
        if job.gang_id is not None:
            labels[KUEUE_QUEUE] = job.partition
            group = job.gang_id.split("/", 1)[1]
            if group.startswith("job-"):  # a Kueue-managed Job owns the Pod (and its Workload)
                owners.append(self.job_ref(ns, group))
            else:
                labels[KUEUE_POD_GROUP] = group
        spec: dict[str, Any] = {
            "containers": [{"name": "main", "resources": {"limits": _resources(self.plan, job)}}],
        }
        if job.preemptible:
            spec["priorityClassName"] = PREEMPTIBLE_CLASS
        status: dict[str, Any] = {"phase": phase}
        if phase != "Pending":
            spec["nodeName"] = job.nodes[0]
            status["startTime"] = _iso(b + job.start_s)
        if phase == "Succeeded":
            status["containerStatuses"] = [
                {"name": "main", "state": {"terminated": {"exitCode": 0, "finishedAt": _iso(b + job.end_s)}}}
            ]
        meta = {
            "name": name,
            "namespace": ns,
            "uid": _uid(self.plan.config.cluster, job.job_id),
            "creationTimestamp": _iso(b + job.submit_s),
            "labels": labels,
            # The Job controller creates a Job's Pods (its stamp); a person creates a plain or pod-group Pod (theirs).
            "annotations": controller_stamp() if owners else submitter_stamp(job),
            "ownerReferences": owners,
        }
        return {"metadata": meta, "spec": spec, "status": status}

    def job_ref(self, ns: str, group: str) -> dict[str, Any]:
        """The ownerReference to the Kueue-managed Job of workload `group` ("job-<name>"), as the controllers
        write it."""
        return {"apiVersion": "batch/v1", "kind": "Job", "name": group[4:], "controller": True,
                "uid": _uid(self.plan.config.cluster, ns, group)}  # fmt: skip

    def owners(self) -> SimOwners:
        """Each Kueue-managed Job as its submitter created it: the stamp, the labels its template gives its Pod."""
        jobs: dict[str, dict[str, Any]] = {}
        for job in self.plan.jobs:
            if _owned_by_job(job):
                assert job.gang_id is not None
                ns, group = job.gang_id.split(":", 1)[1].split("/", 1)
                ref = self.job_ref(ns, group)
                meta = {"name": ref["name"], "namespace": ns, "uid": ref["uid"], "labels": _owner_labels(job),
                        "annotations": submitter_stamp(job), "ownerReferences": []}  # fmt: skip
                jobs[ref["uid"]] = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta}
        return SimOwners(jobs)

    def workload(self, pods: list[SimJob], stage: str) -> dict[str, Any]:
        """A gang's Workload: "created", "admitted" or "finished"."""
        first = pods[0]
        assert first.gang_id is not None
        ns, name = first.gang_id.split(":", 1)[1].split("/", 1)
        b = self.base_s
        cluster = self.plan.config.cluster
        per_pod = _resources(self.plan, first)
        owners = []
        if name.startswith("job-"):  # Kueue made it for the Job (no stamp of its own: the Job's is followed)
            owners.append(self.job_ref(ns, name))
        conditions: list[dict[str, str]] = []
        status: dict[str, Any] = {"conditions": conditions}
        if stage in ("admitted", "finished"):
            conditions.append(
                {
                    "type": "Admitted",
                    "status": "True",
                    "reason": "Admitted",
                    "lastTransitionTime": _iso(b + first.start_s),
                }
            )
            usage = {k: str(int(v) * len(pods)) for k, v in per_pod.items()}
            status["admission"] = {
                "clusterQueue": first.partition,
                "podSetAssignments": [{"name": "main", "resourceUsage": usage}],
            }
        if stage == "finished":
            conditions.append(
                {
                    "type": "Finished",
                    "status": "True",
                    "reason": "Succeeded",
                    "lastTransitionTime": _iso(b + max(p.end_s for p in pods)),
                }
            )
        meta = {
            "name": name,
            "namespace": ns,
            "uid": _uid(cluster, first.gang_id),
            "creationTimestamp": _iso(b + first.submit_s),
            "labels": _owner_labels(first),
            "ownerReferences": owners,
        }
        spec = {
            "queueName": first.partition,
            "active": True,
            "podSets": [
                {
                    "name": "main",
                    "count": len(pods),
                    "template": {"spec": {"containers": [{"name": "main", "resources": {"limits": per_pod}}]}},
                }
            ],
        }
        return {"metadata": meta, "spec": spec, "status": status}


# (second, order within the second, watch target, object)
_Change = tuple[int, int, str, str, dict[str, Any]]
ScrapeText = Callable[[str, int], str]  # (node, run second) -> that node's exporter output


def _changes(p: SimPlan) -> list[_Change]:
    objs = _Objects(p)
    out: list[_Change] = []
    gangs: dict[str, list[SimJob]] = {}
    for job in p.jobs:
        if job.gang_id is not None:
            gangs.setdefault(job.gang_id, []).append(job)
        out.append((job.submit_s, 3, "pod", "ADDED", objs.pod(job, "Pending")))
        out.append((job.start_s, 5, "pod", "MODIFIED", objs.pod(job, "Running")))
        out.append((job.end_s, 0, "pod", "MODIFIED", objs.pod(job, "Succeeded")))
    for pods in gangs.values():
        first = pods[0]
        out.append((first.submit_s, 2, "workload", "ADDED", objs.workload(pods, "created")))
        out.append((first.start_s, 4, "workload", "MODIFIED", objs.workload(pods, "admitted")))
        out.append((max(j.end_s for j in pods), 1, "workload", "MODIFIED", objs.workload(pods, "finished")))
    # The watcher's label refresh (`kube watch --dcgm-interval`): every exporter scraped again, after the second's
    # Pod and Workload changes.
    for t in range(LABEL_REFRESH_S, p.config.duration_s, LABEL_REFRESH_S):
        out.append((t, 6, "labels", "REFRESH", {}))
    out.sort(key=lambda c: (c[0], c[1]))
    return out


def kube_job_events(p: SimPlan, scrape_text: ScrapeText) -> dict[int, list[dict[str, Any]]]:
    """Run second -> the job events the Kubernetes producer publishes in it, from the watch of the plan's
    Pods and Workloads (`KubeTracker`), device UUIDs from the exporters' pod labels."""
    cfg = p.config
    labels = DcgmPodLabels()
    ctx = EventContext(
        cfg.cluster,
        attributor=Attributor(sim_registry(), ProjectRule(mode="grace")),
        identity=StaticDirectory(sim_directory()),
        pricing_tier=KUBE_TIER,
        preemptible_qos=frozenset({PREEMPTIBLE_CLASS}),
    )
    tracker = KubeTracker(ctx, labels, owners=_Objects(p).owners())
    base_s = cfg.start_ms // 1000
    out: dict[int, list[dict[str, Any]]] = {}
    scraped: set[tuple[str, int]] = set()
    lagging = {j.job_id for j in p.jobs if j.labels_s is not None}
    for t, _, target, watch_type, obj in _changes(p):
        ts_ms = (base_s + t) * 1000
        if target == "labels":  # what `kube watch`'s label follower does: scrape every exporter, then recheck
            for node in p.nodes:
                if (node.name, t) not in scraped:
                    scraped.add((node.name, t))
                    labels.load_scrape(scrape_text(node.name, t), node=node.name)
            events = tracker.recheck_devices(ts_ms)
        elif target == "pod":
            node = obj["spec"].get("nodeName")
            meta = obj["metadata"]
            lags = f"{meta['namespace']}/{meta['name']}" in lagging
            if node and obj["status"]["phase"] == "Running" and not lags and (node, t) not in scraped:
                scraped.add((node, t))
                labels.load_scrape(scrape_text(node, t), node=node)
            events = tracker.on_pod(watch_type, obj, ts_ms)
        else:
            events = tracker.on_workload(watch_type, obj, ts_ms)
        for ev in events:
            out.setdefault(ev["ts_ms"] // 1000 - base_s, []).append(ev)
    return out


@cache
def cluster_plan(cfg: SimConfig) -> SimPlan:
    """The plan of any cluster config: the Kubernetes one's, or the Slurm-like one's (`model.plan`)."""
    return build_kube_plan(cfg) if cfg.scheduler == "kube" else plan(cfg)
