"""The expected ledger: what the pipeline must compute, from the simulator's ground truth.

Written from docs/classification.md (classifier c1) and the truth functions only; it shares no code
with the processors. Per job: allocated = active + starved + idle + dark seconds, always.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from base.outputs import csv_text
from producers.simulator.kube import cluster_plan
from producers.simulator.model import SimConfig, SimDevice, SimJob, SimPlan, clusters, plan
from producers.simulator.telemetry import DeviceSchedule, device_schedules, truth

CLASSIFIER_VERSION = "c1"
UNIDENTIFIED = "unidentified:"  # a device-minute row's device_uuid for a device no job event identified (Kth)
_Sample = Callable[[int], "tuple[float, int] | None"]  # run second -> (activity ratio, fb MiB), None: dark


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Classifier c1 defaults (docs/classification.md)."""

    active_min_ratio: float = 0.25
    starved_min_ratio: float = 0.05
    starved_min_fb_mib: float = 1024.0


@dataclass(slots=True)
class Ledger:
    """Expected seconds of one job, summed over its devices."""

    job_id: str
    kind: str
    user: str
    user_uid: str | None  # the identifier beside the name (Kubernetes: the admission stamp's; Slurm-like: none)
    team: str
    project: str
    gpus: int
    nodes: list[str]
    start_ms: int
    end_ms: int
    preemptible: bool
    pricing_tier: str
    allocated_s: int = 0
    active_s: int = 0
    starved_s: int = 0
    idle_s: int = 0
    dark_s: int = 0
    sm_weighted_s: float = 0.0
    idle_minutes: int = 0  # job-minutes in which no device was active or starved and one reported
    dark_minutes: int = 0  # job-minutes in which no device reported
    devices: dict[str, dict[str, int]] = field(default_factory=dict)  # "node/uuid" -> per-class seconds
    cluster: str = ""

    def check(self) -> None:
        total = self.active_s + self.starved_s + self.idle_s + self.dark_s
        if total != self.allocated_s:
            raise AssertionError(f"job {self.job_id}: allocated {self.allocated_s} != classes {total}")


def _classify(mean: float, fb_max: float, th: Thresholds) -> str:
    if mean >= th.active_min_ratio:
        return "active"
    if mean >= th.starved_min_ratio and fb_max >= th.starved_min_fb_mib:
        return "starved"
    return "idle"


@dataclass(frozen=True, slots=True)
class DeviceMinute:
    """Expected seconds of one job on one device in one event-time minute [minute_start_ms, +60 s)."""

    job_id: str
    node: str
    uuid: str
    mig_instance_id: int | None
    minute_start_ms: int
    allocated_s: int
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    sm_weighted_s: float
    sample_count: int


def _device_name(dev: SimDevice) -> str:
    """`node/uuid`, and `/GPU_I_ID` for a MIG slice: the key of Ledger.devices."""
    base = f"{dev.node}/{dev.uuid}"
    return base if dev.mig_instance_id is None else f"{base}/{dev.mig_instance_id}"


def _close_minute(
    m: int | None,
    sampled: list[tuple[float, int]],
    dark: int,
    counts: dict[str, int],
    job_minutes: dict[int, list[bool]],
    led: Ledger,
    th: Thresholds,
    rows: list[DeviceMinute] | None = None,
    where: tuple[str, str, int | None] | None = None,
) -> None:
    """Account one device's allocated seconds of one minute (classifier c1); `where` is (node, uuid, MIG
    instance) as its device-minute row names it."""
    if m is None:
        return
    counts["allocated_s"] += len(sampled) + dark
    counts["dark_s"] += dark
    flags = job_minutes.setdefault(m, [False, False])
    by_class = {"active": 0, "starved": 0, "idle": 0}
    weighted = 0.0
    if sampled:
        mean = sum(a for a, _ in sampled) / len(sampled)
        cls = _classify(mean, max(f for _, f in sampled), th)
        counts[f"{cls}_s"] += len(sampled)
        by_class[cls] = len(sampled)
        weighted = sum(a for a, _ in sampled)
        led.sm_weighted_s += weighted
        flags[0] = True
        flags[1] = flags[1] or cls != "idle"
    if rows is not None and where is not None:
        rows.append(
            DeviceMinute(
                job_id=led.job_id,
                node=where[0],
                uuid=where[1],
                mig_instance_id=where[2],
                minute_start_ms=m * 60_000,
                allocated_s=len(sampled) + dark,
                active_s=by_class["active"],
                starved_s=by_class["starved"],
                idle_s=by_class["idle"],
                dark_s=dark,
                sm_weighted_s=round(weighted, 6),
                sample_count=len(sampled),
            )
        )


def _sample_of(
    p: SimPlan,
    job: SimJob,
    schedules: dict[tuple[str, int], DeviceSchedule],
    dev: SimDevice,
    pos: int,
    t: int,
    *,
    silent: bool,
) -> tuple[float, int] | None:
    """What the pipeline sees of the job's device `dev` (its `pos`-th) at run second `t`; None: dark."""
    cfg = p.config
    if silent or t >= cfg.duration_s or p.outage_at(dev.node, t):
        return None
    held = schedules[dev.key].at(t)
    assert held is not None and held[0] is job
    tr = truth(dev, job, pos, t, cfg.start_ms // 1000)
    return tr.activity_pct / 100, tr.fb_used_mib


def _job_ledger(
    p: SimPlan,
    job: SimJob,
    schedules: dict[tuple[str, int], DeviceSchedule],
    th: Thresholds,
    rows: list[DeviceMinute] | None = None,
) -> Ledger:
    cfg = p.config
    base_s = cfg.start_ms // 1000
    led = Ledger(
        job_id=job.job_id,
        kind=job.kind,
        user=job.person.user,
        user_uid=job.submitter_uid,
        team=job.person.team,
        project=job.project,
        gpus=len(job.devices),
        nodes=list(job.nodes),
        start_ms=(base_s + job.start_s) * 1000,
        end_ms=(base_s + job.end_s) * 1000,
        preemptible=job.preemptible,
        pricing_tier=job.pricing_tier,
        cluster=cfg.cluster,
    )
    # job-minute -> (any device reported, any device busy)
    job_minutes: dict[int, list[bool]] = {}

    def account(name: str, where: tuple[str, str, int | None], seconds: range, sample: _Sample) -> None:
        """One device's allocated seconds, grouped by event-time minute; `sample(t)` None: dark."""
        counts = {"allocated_s": 0, "active_s": 0, "starved_s": 0, "idle_s": 0, "dark_s": 0}
        minute: int | None = None
        sampled: list[tuple[float, int]] = []
        dark = 0
        for t in seconds:
            m = (base_s + t) // 60
            if m != minute:
                _close_minute(minute, sampled, dark, counts, job_minutes, led, th, rows, where)
                minute, sampled, dark = m, [], 0
            got = sample(t)
            if got is None:
                dark += 1
            else:
                sampled.append(got)
        _close_minute(minute, sampled, dark, counts, job_minutes, led, th, rows, where)
        led.devices[name] = counts
        for k in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s"):
            setattr(led, k, getattr(led, k) + counts[k])

    # A Pod whose devices the watcher learned late (`SimJob.labels_s`): its count-only STARTED holds that many
    # unidentified devices until the UPDATED naming them, devices no sample matches (allocated, dark); the real
    # GPUs are charged from the UPDATED on, their samples before it belong to no job (`unallocated_seconds`).
    named_s = job.start_s if job.labels_s is None else min(job.labels_s, job.end_s)
    for slot in range(len(job.devices) if job.labels_s is not None else 0):
        node, label = job.nodes[0], f"{UNIDENTIFIED}{slot}"
        account(f"{node}/{label}", (node, label, None), range(job.start_s, named_s), lambda t: None)
    for pos, key in enumerate(job.devices):
        dev = p.devices[key]
        sample = partial(_sample_of, p, job, schedules, dev, pos, silent=key in p.silent)
        account(_device_name(dev), (dev.node, dev.uuid, dev.mig_instance_id), range(named_s, job.end_s), sample)
    led.sm_weighted_s = round(led.sm_weighted_s, 6)
    for reported, busy in job_minutes.values():
        if not reported:
            led.dark_minutes += 1
        elif not busy:
            led.idle_minutes += 1
    led.check()
    return led


def expected_ledger(config: SimConfig, thresholds: Thresholds | None = None) -> dict[str, Ledger]:
    """job_id -> expected Ledger for every job of the run, of every cluster it simulates (classifier c1
    defaults unless given). Job ids of the two clusters never collide (numbers; `namespace/pod`)."""
    th = thresholds or Thresholds()
    out: dict[str, Ledger] = {}
    for cfg in clusters(config):
        p = cluster_plan(cfg)
        schedules = device_schedules(p)
        out.update((job.job_id, _job_ledger(p, job, schedules, th)) for job in p.jobs)
    return out


def expected_device_minutes(config: SimConfig, thresholds: Thresholds | None = None) -> list[DeviceMinute]:
    """Every (job, device, minute) the ledger is made of: what usage.device-minutes rows must say."""
    th = thresholds or Thresholds()
    rows: list[DeviceMinute] = []
    for cfg in clusters(config):
        p = cluster_plan(cfg)
        schedules = device_schedules(p)
        for job in p.jobs:
            _job_ledger(p, job, schedules, th, rows)
    return rows


def unallocated_seconds(config: SimConfig) -> int:
    """Device-seconds with telemetry and no allocation, over the whole run (every cluster)."""
    total = 0
    for cfg in clusters(config):
        p = cluster_plan(cfg)
        schedules = device_schedules(p)
        for key, sched in schedules.items():
            if key in p.silent:
                continue
            for t in range(config.duration_s):
                held = sched.at(t)
                # a Pod's devices before the watcher named them are held by no job the pipeline knows
                free = held is None or (held[0].labels_s is not None and t < held[0].labels_s)
                if free and not p.outage_at(key[0], t):
                    total += 1
    return total


LEDGER_COLUMNS = (
    "cluster",
    "job_id",
    "kind",
    "user",
    "user_uid",
    "team",
    "project",
    "gpus",
    "start_ms",
    "end_ms",
    "preemptible",
    "pricing_tier",
    "allocated_s",
    "active_s",
    "starved_s",
    "idle_s",
    "dark_s",
    "sm_weighted_s",
    "idle_minutes",
    "dark_minutes",
)


def ledger_json(config: SimConfig, ledger: dict[str, Ledger]) -> dict[str, Any]:
    p = plan(config)
    totals = {
        k: sum(getattr(led, k) for led in ledger.values())
        for k in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s")
    }
    return {
        "classifier_version": CLASSIFIER_VERSION,
        "clusters": [c.cluster for c in clusters(config)],
        "config": asdict(config),
        "totals": totals,
        "outages": [asdict(o) for o in p.outages],
        "silent_devices": [_device_name(p.devices[k]) for k in sorted(p.silent)],
        "jobs": {job_id: asdict(led) for job_id, led in ledger.items()},
    }


def ledger_csv(ledger: dict[str, Ledger]) -> str:
    return csv_text(LEDGER_COLUMNS, ([getattr(led, c) for c in LEDGER_COLUMNS] for led in ledger.values()))


def write_ledger(config: SimConfig, path: Path, ledger: dict[str, Ledger] | None = None) -> Path:
    """Write the expected ledger as JSON (`.json`) or CSV (any other suffix)."""
    ledger = ledger if ledger is not None else expected_ledger(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".json":
        path.write_text(json.dumps(ledger_json(config, ledger), indent=1, sort_keys=True), encoding="utf-8")
    else:
        path.write_text(ledger_csv(ledger), encoding="utf-8")
    return path
