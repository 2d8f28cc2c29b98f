"""The simulated cluster and its job plan: pure, deterministic from the config's seed."""

from __future__ import annotations

import random
import uuid as uuidlib
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache

from base.errors import ConfigError
from schemas.generations import generation_of

# Monday 2 March 2026, 11:30 UTC: a two-hour run covers lunch; a day-long run covers the night.
DEFAULT_START_MS = int(datetime(2026, 3, 2, 11, 30, tzinfo=UTC).timestamp() * 1000)

# model, framebuffer MiB, board power W, weight in the mix
MODELS: tuple[tuple[str, int, int, int], ...] = (
    ("NVIDIA H100 80GB HBM3", 81559, 700, 4),
    ("NVIDIA A100-SXM4-80GB", 81920, 400, 3),
    ("NVIDIA L40S", 46068, 350, 2),
    ("Tesla V100-SXM2-32GB", 32768, 300, 1),
)
TEAMS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("vision", ("vision-detect", "vision-seg"), "cc-1001"),
    ("nlp", ("llm-pretrain", "llm-eval"), "cc-1002"),
    ("speech", ("asr",), "cc-1003"),
    ("research", ("rl-agents", "diffusion"), "cc-1004"),
    ("platform", ("infra-bench",), "cc-1000"),
)
# Where a node's GPUs are priced (sinks/ratecard.py's tiers): owned, cloud on demand, cloud spot.
PRICING_TIERS = ("on-prem", "cloud-on-demand", "cloud-spot")
USERS_PER_TEAM = 4
KINDS = ("training", "batch", "notebook", "starved", "poker")
# Per group-timeline job mix (training gangs are placed first, on whole nodes).
_MIX: tuple[tuple[str, int], ...] = (("batch", 40), ("notebook", 22), ("starved", 14), ("poker", 8), ("gap", 16))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate. Times are whole seconds; `start_ms` is a whole second in epoch milliseconds."""

    seed: int = 1
    nodes: int = 8
    gpus_per_node: int = 8
    duration_s: int = 2 * 3600
    start_ms: int = DEFAULT_START_MS
    cluster: str = "sim"
    node_prefix: str = "sim-gpu-"
    # dcgm-exporter release the nodes run, and the release they are upgraded to mid-run.
    exporter_version: str = "3.3.5-3.4.0"
    upgrade_to: str | None = "4.4.2-4.7.1"
    upgrade_at_s: int | None = None  # default: half-way
    # Nodes whose exporter dies while jobs hold their GPUs (allocated but dark).
    dead_exporter_nodes: int = 1
    dead_exporter_at_s: int | None = None  # default: a third of the way
    dead_exporter_for_s: int | None = None  # default: a quarter of the run
    # Devices that never report (present in the inventory, absent from every scrape).
    silent_devices: int = 1
    training_gangs: int | None = None  # default: one gang per 4 nodes
    hpc_job_label: bool = True  # exporters label allocated devices with the job id (hpc_job)
    # The last `mig_nodes` nodes are A100s in MIG mode: jobs hold single MIG slices (uuid + GPU_I_ID).
    mig_nodes: int = 0
    # Job ids are job_id_base + 1, + 2, ...: a plan that follows another on the same cluster (a restarted
    # simulator whose plan ran out, producers/simulator/position.py) takes a fresh block, as a scheduler's
    # counter moves on, so no id names two jobs.
    job_id_base: int = 1000
    # "slurm": the Slurm-like cluster above. "kube": a Kubernetes cluster whose job events are what the
    # Kubernetes producer publishes for its pods and Kueue Workloads (producers/simulator/kube.py).
    scheduler: str = "slurm"
    # A Slurm-like config with kube_nodes > 0 also runs a Kubernetes cluster of that many nodes beside it,
    # named `<cluster>-k8s` (`kube_config` below): one stream, one expected ledger over both clusters.
    kube_nodes: int = 0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ConfigError("simulator: nodes and gpus_per_node must be at least 1")
        if self.duration_s < 60:
            raise ConfigError("simulator: duration must be at least 60 s")
        if self.start_ms % 1000:
            raise ConfigError("simulator: start must be a whole second")
        if not 0 <= self.mig_nodes <= self.nodes:
            raise ConfigError("simulator: mig_nodes must be between 0 and nodes")
        if self.scheduler not in ("slurm", "kube"):
            raise ConfigError(f"simulator: scheduler must be slurm or kube, not {self.scheduler!r}")
        if self.kube_nodes and (self.kube_nodes < 3 or self.scheduler != "slurm"):
            raise ConfigError("simulator: the Kubernetes cluster needs at least 3 nodes (a gang on two, MIG on one)")

    @property
    def upgrade_second(self) -> int | None:
        if self.upgrade_to is None:
            return None
        return self.duration_s // 2 if self.upgrade_at_s is None else self.upgrade_at_s


@dataclass(frozen=True, slots=True)
class SimDevice:
    node: str
    index: int
    uuid: str
    model: str
    generation: str
    memory_mib: int
    power_max_w: int
    pci_bus_id: str
    slot: int = -1  # position among the node's devices (== index for whole GPUs); devices are keyed (node, slot)
    mig_instance_id: int | None = None
    mig_profile: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.node, self.slot if self.slot >= 0 else self.index)


@dataclass(frozen=True, slots=True)
class SimNode:
    name: str
    position: int
    model: str
    generation: str
    pricing_tier: str
    devices: tuple[SimDevice, ...]


@dataclass(frozen=True, slots=True)
class Person:
    user: str
    team: str
    projects: tuple[str, ...]
    default_project: str
    cost_centre: str


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job of the plan. Seconds are relative to the run start; it holds its devices over [start_s, end_s)."""

    job_id: str
    kind: str
    person: Person
    project: str
    project_source: str  # EXPLICIT or DEFAULT
    start_s: int
    end_s: int
    devices: tuple[tuple[str, int], ...]  # (node, slot): the device index, or the MIG slice's position
    interactive: bool
    preemptible: bool
    checkpointable: bool
    gang_id: str | None
    partition: str
    qos: str
    pricing_tier: str
    noise: int  # per-job seed for its activity pattern
    submit_s: int
    # Kubernetes only: the run second the watcher first reads this Pod's devices from its exporter's pod labels,
    # later than its start (a label refresh after it); None: at its start (producers/simulator/kube.py)
    labels_s: int | None = None
    # Kubernetes only: the uid the admission stamp gives its submitter (`gpuledger.io/submitter-uid`: a person's, or
    # the CI robot's service account's, which changes when it is recreated), and a self-declared user label that
    # names someone else than the submitter (producers/simulator/kube.py `_with_submitters`)
    submitter_uid: str | None = None
    claimed_user: str | None = None

    @property
    def nodes(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node, _ in self.devices:
            seen.setdefault(node)
        return tuple(seen)


@dataclass(frozen=True, slots=True)
class Outage:
    """An exporter that is dead over [start_s, end_s): the node publishes nothing."""

    node: str
    start_s: int
    end_s: int


@dataclass(frozen=True, slots=True)
class SimPlan:
    config: SimConfig
    nodes: tuple[SimNode, ...]
    people: tuple[Person, ...]
    jobs: tuple[SimJob, ...]
    outages: tuple[Outage, ...]
    silent: frozenset[tuple[str, int]]
    devices: dict[tuple[str, int], SimDevice] = field(default_factory=dict)

    def node(self, name: str) -> SimNode:
        return self.nodes[int(name.rsplit("-", 1)[-1])]

    def outage_at(self, node: str, t: int) -> bool:
        return any(o.node == node and o.start_s <= t < o.end_s for o in self.outages)


def _uuid(rng: random.Random) -> str:
    return f"GPU-{uuidlib.UUID(int=rng.getrandbits(128), version=4)}"


def _cluster_uuid(cfg: SimConfig, uuid: str) -> str:
    """A second cluster draws its nodes like the first (same seed, same models), but its GPUs are its own: the
    same UUID in two clusters would be one device claimed twice."""
    if cfg.scheduler == "slurm":
        return uuid
    return f"GPU-{uuidlib.uuid5(uuidlib.UUID(uuid.removeprefix('GPU-')), cfg.cluster)}"


def _build_nodes(cfg: SimConfig, rng: random.Random) -> tuple[SimNode, ...]:
    nodes = []
    weights = [m[3] for m in MODELS]
    width = max(3, len(str(cfg.nodes - 1)))
    for i in range(cfg.nodes):
        model, mem, power, _ = rng.choices(MODELS, weights=weights)[0]
        name = f"{cfg.node_prefix}{i:0{width}d}"
        tier = rng.choices(PRICING_TIERS, weights=(6, 1, 1))[0]
        devices = tuple(
            SimDevice(
                name, g, _cluster_uuid(cfg, _uuid(rng)), model, generation_of(model), mem, power,
                f"00000000:{0x18 + 0x11 * g:02X}:00.0",
            )
            for g in range(cfg.gpus_per_node)
        )  # fmt: skip
        if i >= cfg.nodes - cfg.mig_nodes:
            model, devices = _mig_devices(cfg, name, devices)
        nodes.append(SimNode(name, i, model, generation_of(model), tier, devices))
    return tuple(nodes)


MIG_MODEL = ("NVIDIA A100-SXM4-80GB", 81920, 400)
# Ways to partition an A100 80GB: (profile, framebuffer MiB) per instance.
MIG_LAYOUTS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("3g.40gb", 40192), ("3g.40gb", 40192)),
    (("2g.20gb", 19968), ("2g.20gb", 19968), ("2g.20gb", 19968)),
    (("4g.40gb", 40192), ("2g.20gb", 19968), ("1g.10gb", 9728)),
    tuple(("1g.10gb", 9728) for _ in range(7)),
)


def _mig_devices(cfg: SimConfig, node: str, whole: tuple[SimDevice, ...]) -> tuple[str, tuple[SimDevice, ...]]:
    """The MIG slices of a node's GPUs (each keeps its parent's UUID and index; GPU_I_ID from 1)."""
    rng = random.Random(f"{cfg.seed}/mig/{node}")  # noqa: S311 (a reproducible simulation)
    model, mem, power = MIG_MODEL
    out: list[SimDevice] = []
    for parent in whole:
        layout = rng.choice(MIG_LAYOUTS)
        for gi, (profile, fb) in enumerate(layout, 1):
            out.append(
                SimDevice(
                    node,
                    parent.index,
                    parent.uuid,
                    model,
                    generation_of(model),
                    fb,
                    power * fb // mem,
                    parent.pci_bus_id,
                    slot=len(out),
                    mig_instance_id=gi,
                    mig_profile=profile,
                )
            )
    return model, tuple(out)


def _build_people() -> tuple[Person, ...]:
    people = []
    for team, projects, cc in TEAMS:
        for u in range(USERS_PER_TEAM):
            user = f"{team[:3]}{u:02d}"
            people.append(Person(user, team, projects, projects[u % len(projects)], cc))
    return tuple(people)


def _duration(kind: str, rng: random.Random) -> int:
    if kind == "batch":
        return rng.randint(5 * 60, 45 * 60)
    if kind == "notebook":
        return rng.randint(60 * 60, 4 * 3600)
    if kind == "starved":
        return rng.randint(20 * 60, 90 * 60)
    if kind == "poker":
        return rng.randint(30 * 60, 3 * 3600)
    return rng.randint(30, 15 * 60)  # gap: unallocated


def _groups(n: int, rng: random.Random) -> list[list[int]]:
    """Split a node's GPUs into groups that share a timeline (1-, 2- and 4-GPU jobs)."""
    out: list[list[int]] = []
    i = 0
    while i < n:
        size = rng.choice((1, 1, 1, 2, 2, 4))
        size = min(size, n - i)
        out.append(list(range(i, i + size)))
        i += size
    return out


class _JobMaker:
    """Numbers jobs from 1001 and draws each one's project, flags and submit time from the plan's rng."""

    def __init__(self, cfg: SimConfig, nodes: tuple[SimNode, ...], rng: random.Random) -> None:
        self._cfg = cfg
        self._nodes = nodes
        self._rng = rng
        self._counter = cfg.job_id_base

    def make(
        self, kind: str, person: Person, start: int, end: int, devs: tuple[tuple[str, int], ...], gang: bool
    ) -> SimJob:
        rng = self._rng
        self._counter += 1
        job_id = str(self._counter)
        tier = self._nodes[int(devs[0][0].rsplit("-", 1)[-1])].pricing_tier
        explicit = rng.random() < 0.85
        project = rng.choice(person.projects) if explicit else person.default_project
        interactive = kind == "notebook"
        preemptible = tier == "cloud-spot" or (kind == "batch" and rng.random() < 0.3)
        return SimJob(
            job_id=job_id,
            kind=kind,
            person=person,
            project=project,
            project_source="EXPLICIT" if explicit else "DEFAULT",
            start_s=start,
            end_s=end,
            devices=devs,
            interactive=interactive,
            preemptible=preemptible,
            checkpointable=kind in ("training", "batch") and rng.random() < 0.8,
            gang_id=f"{self._cfg.cluster}/{job_id}" if gang else None,
            partition="interactive" if interactive else "gpu",
            qos="preempt" if preemptible else "normal",
            pricing_tier=tier,
            noise=rng.getrandbits(32),
            submit_s=start - rng.randint(0, 300),
        )


def _training_gangs(
    cfg: SimConfig, nodes: tuple[SimNode, ...], people: tuple[Person, ...], rng: random.Random, maker: _JobMaker
) -> tuple[list[SimJob], dict[str, tuple[int, int]], set[str]]:
    """Multi-node training gangs on whole nodes (never MIG ones): the jobs, each node's blocked
    `(start, end)`, and the MIG nodes."""
    D = cfg.duration_s
    jobs: list[SimJob] = []
    n_gangs = cfg.training_gangs if cfg.training_gangs is not None else max(1, cfg.nodes // 4)
    blocked: dict[str, tuple[int, int]] = {}
    free_nodes = [n.name for n in nodes]
    rng.shuffle(free_nodes)
    mig = {n.name for n in nodes if n.devices and n.devices[0].mig_instance_id is not None}
    free_nodes = [n for n in free_nodes if n not in mig]  # gangs run on whole GPUs
    for _ in range(n_gangs):
        size = min(len(free_nodes), rng.choice((2, 2, 3, 4)))
        if size < 1 or (size == 1 and cfg.nodes > 1):
            break
        chosen = sorted(free_nodes[:size])
        free_nodes = free_nodes[size:]
        start = rng.randint(0, max(0, D // 5))
        end = min(D, start + max(60, int(D * rng.uniform(0.5, 0.8))))
        devs = tuple((n, g) for n in chosen for g in range(cfg.gpus_per_node))
        jobs.append(maker.make("training", rng.choice(people), start, end, devs, gang=len(chosen) > 1))
        for n in chosen:
            blocked[n] = (start, end)
    return jobs, blocked, mig


def _node_jobs(
    cfg: SimConfig,
    node: SimNode,
    people: tuple[Person, ...],
    rng: random.Random,
    maker: _JobMaker,
    blocked: tuple[int, int] | None,
    is_mig: bool,
    groups: list[list[int]] | None = None,
) -> list[SimJob]:
    """One node's per-GPU-group jobs, one after another, around a gang that blocks the node. `groups`: the
    GPU groups sharing a timeline (default: drawn from rng)."""
    D = cfg.duration_s
    jobs: list[SimJob] = []
    if is_mig:
        groups = [[d.slot] for d in node.devices]
    elif groups is None:
        groups = _groups(cfg.gpus_per_node, rng)
    for group in groups:
        t = rng.randint(0, 120)
        while t < D - 60:
            b = blocked
            if b is not None and b[0] <= t < b[1]:
                t = b[1] + rng.randint(5, 90)
                continue
            kind = rng.choices([k for k, _ in _MIX], weights=[w for _, w in _MIX])[0]
            if kind in ("notebook", "poker", "starved") and len(group) > 2:
                kind = "batch"
            dur = _duration(kind, rng)
            end = min(t + dur, D)
            if b is not None and t < b[0]:
                end = min(end, b[0])
            if kind == "gap" or end - t < 60:
                t = end + 1
                continue
            devs = tuple((node.name, g) for g in group)
            jobs.append(maker.make(kind, rng.choice(people), t, end, devs, gang=False))
            t = end + rng.randint(0, 120)
    return jobs


def _faults(cfg: SimConfig, jobs: list[SimJob]) -> tuple[list[Outage], set[tuple[str, int]]]:
    """Exporters that die while their node is most held, and batch devices that never report."""
    D = cfg.duration_s
    outages: list[Outage] = []
    at = cfg.dead_exporter_at_s if cfg.dead_exporter_at_s is not None else D // 3
    length = cfg.dead_exporter_for_s if cfg.dead_exporter_for_s is not None else max(60, D // 4)
    held: dict[str, int] = {}
    for j in jobs:
        overlap = max(0, min(j.end_s, at + length) - max(j.start_s, at))
        for n, _ in j.devices:
            held[n] = held.get(n, 0) + overlap
    for name in sorted(held, key=lambda n: (-held[n], n))[: cfg.dead_exporter_nodes]:
        outages.append(Outage(name, at, min(D, at + length)))
    silent: set[tuple[str, int]] = set()
    candidates = [j for j in jobs if j.kind == "batch" and not any(o.node == j.devices[0][0] for o in outages)]
    for j in candidates[: cfg.silent_devices]:
        silent.add(j.devices[0])
    return outages, silent


def build_plan(cfg: SimConfig) -> SimPlan:
    rng = random.Random(cfg.seed)  # noqa: S311 (a reproducible simulation, not cryptography)
    nodes = _build_nodes(cfg, rng)
    people = _build_people()
    maker = _JobMaker(cfg, nodes, rng)
    # 1. Multi-node training gangs on whole nodes.
    jobs, blocked, mig = _training_gangs(cfg, nodes, people, rng, maker)
    # 2. Everything else on per-node GPU groups, one job after another.
    for node in nodes:
        jobs.extend(_node_jobs(cfg, node, people, rng, maker, blocked.get(node.name), node.name in mig))
    jobs.sort(key=lambda j: (j.start_s, int(j.job_id)))
    # 3. Faults: exporters that die while the node is held, devices that never report.
    outages, silent = _faults(cfg, jobs)
    devices = {d.key: d for n in nodes for d in n.devices}
    return SimPlan(cfg, nodes, people, tuple(jobs), tuple(outages), frozenset(silent), devices)


@cache
def plan(cfg: SimConfig) -> SimPlan:
    """The plan of a Slurm-like config (cached: a config is immutable). A Kubernetes one's is
    `producers.simulator.kube.cluster_plan`'s."""
    if cfg.scheduler != "slurm":
        raise ConfigError("simulator: plan() plans the Slurm-like cluster; use kube.cluster_plan for any cluster")
    return build_plan(cfg)


# The Kubernetes cluster beside a Slurm-like one (producers/simulator/kube.py simulates it).
KUBE_SUFFIX = "-k8s"
KUBE_NODE_PREFIX = "k8s-gpu-"


def kube_config(cfg: SimConfig) -> SimConfig | None:
    """The Kubernetes cluster run beside a Slurm-like config, or None when it has none."""
    if cfg.scheduler != "slurm" or not cfg.kube_nodes:
        return None
    return replace(
        cfg,
        scheduler="kube",
        cluster=cfg.cluster + KUBE_SUFFIX,
        nodes=cfg.kube_nodes,
        kube_nodes=0,
        node_prefix=KUBE_NODE_PREFIX,
        mig_nodes=1,
        dead_exporter_nodes=0,
        silent_devices=0,
        training_gangs=1,
        hpc_job_label=False,
    )


def clusters(cfg: SimConfig) -> tuple[SimConfig, ...]:
    """Every cluster a config simulates: itself, then its Kubernetes cluster if it has one."""
    kube = kube_config(cfg)
    return (cfg,) if kube is None else (cfg, kube)
