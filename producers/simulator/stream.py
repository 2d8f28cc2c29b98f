"""The simulator's records in event-time order, built with the same code as the real producers."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import cache
from typing import Any

from producers.dcgm import Normalizer, RawSample, scrape_record
from producers.mapping import load_mappings
from producers.records import inventory_device, node_inventory_record
from producers.simulator.kube import cluster_plan, kube_job_events
from producers.simulator.model import MIG_MODEL, SimConfig, SimDevice, SimJob, SimPlan, clusters
from producers.simulator.telemetry import (
    ExporterProfile,
    device_labels,
    device_schedules,
    exporter_profile,
    exporter_samples,
    mig_instance_samples,
    mig_parent_samples,
    render_exposition,
    truth,
)
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, Topic, job_key, node_key

SOURCE = "simulator"
Record = tuple[Topic, bytes, dict[str, Any]]


def inventory_records(p: SimPlan, ts_ms: int) -> list[Record]:
    cfg = p.config
    out: list[Record] = []
    for node in p.nodes:
        devices = [
            inventory_device(
                index=d.index,
                model=d.model,
                generation=d.generation,
                uuid=d.uuid,
                mig_profile=d.mig_profile,
                mig_instance_id=d.mig_instance_id,
            )
            for d in node.devices
        ]
        rec = node_inventory_record(cluster=cfg.cluster, node=node.name, ts_ms=ts_ms, source=SOURCE, devices=devices)
        out.append((INVENTORY, node_key(cfg.cluster, node.name), rec))
    return out


def _allocations(p: SimPlan, job: SimJob) -> list[dict[str, Any]]:
    per_node: dict[str, list[dict[str, Any]]] = {}
    for node, slot in job.devices:
        dev = p.devices[(node, slot)]
        per_node.setdefault(node, []).append(
            {
                "index": dev.index,
                "uuid": dev.uuid,
                "mig_instance_id": dev.mig_instance_id,
                "mig_profile": dev.mig_profile,
            }
        )
    return [{"node": n, "devices": devs} for n, devs in per_node.items()]


def job_event_record(p: SimPlan, job: SimJob, event_type: str) -> dict[str, Any]:
    """A sched.job-events record (JobEvent) for STARTED or ENDED."""
    cfg = p.config
    base_s = cfg.start_ms // 1000
    start_ms = (base_s + job.start_s) * 1000
    end_ms = (base_s + job.end_s) * 1000
    ts_ms = start_ms if event_type == "STARTED" else end_ms
    person = job.person
    return {
        "event_id": f"{cfg.cluster}/{job.job_id}/{event_type}/{ts_ms}",
        "event_type": event_type,
        "ts_ms": ts_ms,
        "scheduler": "SIMULATOR",
        "cluster": cfg.cluster,
        "job_id": job.job_id,
        "array_job_id": None,
        "array_task_id": None,
        "het_job_id": None,
        "het_job_offset": None,
        "job_name": f"{job.kind}-{job.job_id}",
        "user": person.user,
        "account": person.team,
        "project": job.project,
        "project_source": job.project_source,
        "project_validation": "VALID",
        "identity": {
            "user": person.user,
            "teams": [person.team],
            "groups": [person.team, "gpu-users"],
            "projects": list(person.projects),
            "primary_team": person.team,
            "cost_centre": person.cost_centre,
            "snapshot_ts_ms": start_ms,
        },
        "partition": job.partition,
        "qos": job.qos,
        "preemptible": job.preemptible,
        "interactive": job.interactive,
        "checkpointable": job.checkpointable,
        "gang_size": len(job.devices),
        "gang_id": job.gang_id,
        # ENDED repeats the allocations so a consumer keyed by node can close them without a look-up.
        "allocations": _allocations(p, job),
        "requested_devices": len(job.devices),
        "pricing_tier": job.pricing_tier,
        "submit_ts_ms": (base_s + job.submit_s) * 1000,
        "start_ts_ms": start_ms,
        "end_ts_ms": end_ms if event_type == "ENDED" else None,
        "exit_state": "COMPLETED" if event_type == "ENDED" else None,
        "exit_code": 0 if event_type == "ENDED" else None,
    }


class _NodeScraper:
    """Produces one node's scrape at a second: exporter samples -> shared Normalizer -> record."""

    def __init__(self, p: SimPlan, normalizer: Normalizer) -> None:
        self.plan = p
        self.normalizer = normalizer
        self.schedules = device_schedules(p)
        self._labels: dict[tuple[str, int, str, str | None], dict[str, str]] = {}
        self.base_s = p.config.start_ms // 1000
        self.kube = p.config.scheduler == "kube"

    def labels(
        self, key: tuple[str, int], profile: ExporterProfile, job_id: str | None, dev: SimDevice | None = None
    ) -> dict[str, str]:
        lk = (key[0], key[1], profile.version, job_id)
        labels = self._labels.get(lk)
        if labels is None:
            labels = device_labels(dev or self.plan.devices[key], profile, job_id, self.kube)
            self._labels[lk] = labels
        return labels

    def raw(self, node_name: str, t: int, profile: ExporterProfile) -> list[RawSample]:
        p = self.plan
        samples: list[RawSample] = []
        node = p.node(node_name)
        parents_done: set[int] = set()
        for dev in node.devices:
            key = dev.key
            if dev.mig_instance_id is not None and dev.index not in parents_done:
                parents_done.add(dev.index)
                parent = replace(
                    dev,
                    slot=-1,
                    mig_instance_id=None,
                    mig_profile=None,
                    memory_mib=MIG_MODEL[1],
                    power_max_w=MIG_MODEL[2],
                )
                samples.extend(
                    mig_parent_samples(
                        self.labels((dev.node, -1 - dev.index), profile, None, parent),
                        truth(parent, None, 0, t, self.base_s),
                    )
                )
            if key in p.silent:
                continue
            held = self.schedules[key].at(t)
            job, pos = held if held is not None else (None, 0)
            job_id = job.job_id if job is not None and (p.config.hpc_job_label or self.kube) else None
            if dev.mig_instance_id is not None:
                samples.extend(
                    mig_instance_samples(self.labels(key, profile, job_id), truth(dev, job, pos, t, self.base_s))
                )
                continue
            samples.extend(
                exporter_samples(profile, self.labels(key, profile, job_id), truth(dev, job, pos, t, self.base_s))
            )
        return samples

    def record(self, node_name: str, t: int, profile: ExporterProfile) -> dict[str, Any]:
        cfg = self.plan.config
        mapping = load_mappings().get(profile.mapping_version)
        normalized = self.normalizer.normalize(self.raw(node_name, t, profile), mapping=mapping)
        return scrape_record(
            cluster=cfg.cluster,
            node=node_name,
            ts_ms=(self.base_s + t) * 1000,
            normalized=normalized,
            exporter_version=profile.version,
            source=SOURCE,
        )


def exporter_version_at(cfg: SimConfig, t: int) -> str:
    up = cfg.upgrade_second
    if up is not None and cfg.upgrade_to is not None and t >= up:
        return cfg.upgrade_to
    return cfg.exporter_version


def scrape_text(p: SimPlan) -> Callable[[str, int], str]:
    """(node, run second) -> the node's exporter output at that second, as Prometheus text: one series per
    device (its framebuffer, which every device and MIG slice reports; the labels are those of all its series)."""
    scraper = _NodeScraper(p, Normalizer())
    cfg = p.config
    profiles = {v: exporter_profile(v) for v in {cfg.exporter_version, cfg.upgrade_to} if v}

    def text(node: str, t: int) -> str:
        samples = scraper.raw(node, t, profiles[exporter_version_at(cfg, t)])
        return render_exposition([x for x in samples if x.name == "DCGM_FI_DEV_FB_USED"])

    return text


def simulate(config: SimConfig, *, start_s: int = 0, end_s: int | None = None) -> Iterator[Record]:
    """Every record of the run in event-time order: (topic, key, record dict).

    Order within one second: inventory (first second only), ENDED events, STARTED events, then one
    device-samples record per node whose exporter is alive. Jobs ending at the run's end emit
    ENDED at `start_ms + duration_s*1000` after the last scrape. `start_s`/`end_s` select a slice
    of run seconds (for chunked or real-time publishing). With `kube_nodes`, the Kubernetes cluster's
    records (producers/simulator/kube.py) are merged in by event time, after the first cluster's of
    the same millisecond.
    """
    streams = [_simulate_cluster(c, start_s=start_s, end_s=end_s) for c in clusters(config)]
    if len(streams) == 1:
        yield from streams[0]
    else:
        yield from heapq.merge(*streams, key=lambda r: r[2]["ts_ms"])


def _job_events(p: SimPlan) -> Callable[[int], list[dict[str, Any]]]:
    """Run second -> the job events published in it (ENDED before STARTED), by the cluster's scheduler."""
    cfg = p.config
    if cfg.scheduler == "kube":
        by_second = _kube_events(cfg)
        return lambda t: by_second.get(t, [])
    starts: dict[int, list[SimJob]] = {}
    ends: dict[int, list[SimJob]] = {}
    for job in p.jobs:
        starts.setdefault(job.start_s, []).append(job)
        ends.setdefault(job.end_s, []).append(job)

    def at(t: int) -> list[dict[str, Any]]:
        return [job_event_record(p, job, "ENDED") for job in ends.get(t, ())] + [
            job_event_record(p, job, "STARTED") for job in starts.get(t, ())
        ]

    return at


@cache
def _kube_events(cfg: SimConfig) -> dict[int, list[dict[str, Any]]]:
    """The Kubernetes producer's events of a kube config's plan, by run second (cached: a config is immutable)."""
    p = cluster_plan(cfg)
    return kube_job_events(p, scrape_text(p))


def _simulate_cluster(config: SimConfig, *, start_s: int = 0, end_s: int | None = None) -> Iterator[Record]:
    p = cluster_plan(config)
    cfg = p.config
    end = cfg.duration_s if end_s is None else min(end_s, cfg.duration_s)
    events = _job_events(p)
    scraper = _NodeScraper(p, Normalizer())
    profiles = {v: exporter_profile(v) for v in {cfg.exporter_version, cfg.upgrade_to} if v}
    if start_s == 0:
        yield from inventory_records(p, cfg.start_ms)
    for t in range(start_s, end):
        for ev in events(t):
            yield JOB_EVENTS, job_key(cfg.cluster, ev["job_id"]), ev
        profile = profiles[exporter_version_at(cfg, t)]
        for node in p.nodes:
            if p.outage_at(node.name, t):
                continue
            yield DEVICE_SAMPLES, node_key(cfg.cluster, node.name), scraper.record(node.name, t, profile)
    if end == cfg.duration_s:
        for ev in events(cfg.duration_s):
            yield JOB_EVENTS, job_key(cfg.cluster, ev["job_id"]), ev
