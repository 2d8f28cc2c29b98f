"""The simulator's second cluster (producers/simulator/kube.py): Kubernetes pods and Kueue Workloads whose job
events are the real Kubernetes producer's, a ledger over both clusters equal to the processors', and a rate
card that prices every generation and tier the simulator runs."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from typing import Any

import pytest

from base.errors import ConfigError
from base.processor_settings import ProcessorSettings
from processors.pipeline import LEDGER_FIELDS, PipelineResult, run_in_memory
from producers.simulator import (
    DEFAULT_START_MS,
    SimConfig,
    expected_device_minutes,
    expected_ledger,
    simulate,
)
from producers.simulator.kube import KUBE_TIER, LABEL_REFRESH_S, cluster_plan, next_label_refresh
from producers.simulator.model import MIG_MODEL, MODELS, PRICING_TIERS, clusters, kube_config
from schemas.generations import generation_of
from schemas.topics import JOB_EVENTS
from sinks.ratecard import TIERS, load_card

CFG = SimConfig(seed=11, nodes=2, duration_s=900, kube_nodes=3)


@pytest.fixture(scope="module")
def records() -> list[Any]:
    return list(simulate(CFG))


@pytest.fixture(scope="module")
def result(records: list[Any]) -> PipelineResult:
    return run_in_memory(records, ProcessorSettings())


def _events(records: list[Any], cluster: str) -> list[dict[str, Any]]:
    return [r for t, _, r in records if t is JOB_EVENTS and r["cluster"] == cluster]


def test_one_cluster_by_default_in_the_dataclass_two_when_asked() -> None:
    assert clusters(SimConfig(nodes=2)) == (SimConfig(nodes=2),)
    kube = kube_config(CFG)
    assert kube is not None and [c.cluster for c in clusters(CFG)] == ["sim", "sim-k8s"]
    assert kube.scheduler == "kube" and kube.nodes == 3 and kube.kube_nodes == 0
    with pytest.raises(ConfigError):
        SimConfig(kube_nodes=2)


def test_the_single_cluster_records_are_unchanged_by_a_kubernetes_cluster_beside_them(records: list[Any]) -> None:
    alone = list(simulate(SimConfig(seed=11, nodes=2, duration_s=900)))
    assert [r for r in records if r[2]["cluster"] == "sim"] == alone


def test_kubernetes_job_events_are_the_kube_producers(records: list[Any]) -> None:
    events = _events(records, "sim-k8s")
    schedulers = {e["scheduler"] for e in events}
    assert schedulers == {"KUEUE", "KUBERNETES"}
    assert all("/" in e["job_id"] for e in events)
    started = {e["job_id"]: e for e in events if e["event_type"] == "STARTED"}
    # Every pod names its devices (UUIDs from the exporters' pod labels), never a count alone, but the one whose
    # labels the watcher reads only at its next refresh (test_a_pod_whose_labels_lag_...).
    lagging = {j.job_id for j in cluster_plan(kube_config(CFG)).jobs if j.labels_s is not None}  # type: ignore[arg-type]
    for e in started.values():
        named = all(d["uuid"] for a in e["allocations"] for d in a["devices"])
        assert named != (e["job_id"] in lagging), e["job_id"]
    # A multi-pod gang: one Kueue pod group, one pod per node, each pod the gang's member.
    gangs: dict[str, set[str]] = defaultdict(set)
    for e in started.values():
        if e["gang_id"]:
            gangs[e["gang_id"]].add(e["allocations"][0]["node"])
    assert any(len(nodes) >= 2 for nodes in gangs.values())
    # Pods on MIG slices.
    mig = [e for e in started.values() if any(d["mig_instance_id"] for a in e["allocations"] for d in a["devices"])]
    assert mig and all(d["mig_profile"] for e in mig for a in e["allocations"] for d in a["devices"])
    # 4-GPU pods that start while the watcher runs (after its first second).
    assert any(e["ts_ms"] > CFG.start_ms and len(e["allocations"][0]["devices"]) == 4 for e in started.values())
    # Notebooks as plain pods; Kueue Workloads as gang jobs of their own (SUBMITTED, admitted UPDATED, ENDED).
    assert any(e["interactive"] and e["scheduler"] == "KUBERNETES" for e in started.values())
    workload_types = Counter(e["event_type"] for e in events if e["job_id"].split("/")[1].startswith("job-"))
    assert workload_types["SUBMITTED"] == workload_types["UPDATED"] > 0
    assert all(e["project"] and e["project_validation"] == "VALID" for e in events)


def test_processors_ledger_equals_the_expected_ledger_of_both_clusters(result: PipelineResult) -> None:
    expected = expected_ledger(CFG)
    assert {led.cluster for led in expected.values()} == {"sim", "sim-k8s"}
    assert result.ledger() == {j: {f: getattr(led, f) for f in LEDGER_FIELDS} for j, led in expected.items()}


def test_device_minutes_of_both_clusters_match_mig_slices_included(result: PipelineResult) -> None:
    def row(r: Any) -> tuple[int, ...]:
        return tuple(r[f] if isinstance(r, dict) else getattr(r, f) for f in LEDGER_FIELDS)

    expected = {
        (m.job_id, m.node, m.uuid, m.mig_instance_id, m.minute_start_ms): row(m) for m in expected_device_minutes(CFG)
    }
    got = {
        (r["job_id"], r["node"], r["device_uuid"], r["mig_instance_id"], r["minute_start_ms"]): row(r)
        for r in result.device_minutes
        if r["job_id"] is not None
    }
    assert any(k[3] is not None for k in expected)
    assert got == expected


def test_every_generation_and_tier_the_simulator_uses_is_priced() -> None:
    card = load_card()
    generations = {generation_of(m[0]) for m in MODELS} | {generation_of(MIG_MODEL[0])}
    assert set(PRICING_TIERS) | {KUBE_TIER} <= set(TIERS)
    days = [dt.datetime.fromtimestamp(DEFAULT_START_MS / 1000, dt.UTC).date(), dt.date(2026, 12, 2)]
    unpriced = [
        (g, t, p, d)
        for g in sorted(generations)
        for t in sorted(set(PRICING_TIERS) | {KUBE_TIER})
        for p in (False, True)
        for d in days
        if card.rate_for(g, t, p, d) is None
    ]
    assert unpriced == []
    # And what a demo-sized plan actually runs: every job's devices, in both clusters.
    demo = SimConfig(seed=1, nodes=24, duration_s=3600, kube_nodes=3)
    for c in clusters(demo):
        p = cluster_plan(c)
        for job in p.jobs:
            for key in job.devices:
                gen = p.devices[key].generation
                assert card.rate_for(gen, job.pricing_tier, job.preemptible, days[0]) is not None, (gen, job)


def test_the_two_clusters_have_gpus_of_their_own() -> None:
    """Drawn with one seed, the Kubernetes cluster's nodes are the Slurm-like one's models, never its GPUs: one
    UUID in two clusters is one device claimed twice (the demo's report showed every such second as an overlap)."""
    cfg = SimConfig(seed=1, nodes=8, kube_nodes=3)
    slurm, kube = (cluster_plan(c) for c in clusters(cfg))
    uuids = [{d.uuid for n in p.nodes for d in n.devices} for p in (slurm, kube)]
    assert uuids[0] and uuids[1] and not uuids[0] & uuids[1]
    assert [n.model for n in kube.nodes][:2] == [n.model for n in slurm.nodes][:2]  # the same draw otherwise


def test_a_pod_whose_labels_lag_starts_count_only_and_is_named_at_the_next_label_refresh(
    records: list[Any], result: PipelineResult
) -> None:
    """A Pod started after the watcher's last label scrape: `KubeTracker` publishes a STARTED with its GPU count
    only, and at the watcher's next label refresh (`kube watch --dcgm-interval`, 30 s) an UPDATED naming its
    UUIDs. Until then the job holds that many unidentified devices (allocated, dark) and its real GPUs' samples
    belong to no job; from then on the real GPUs are charged."""
    kube = kube_config(CFG)
    assert kube is not None
    p = cluster_plan(kube)
    (job,) = [j for j in p.jobs if j.labels_s is not None]
    assert job.labels_s == next_label_refresh(job.start_s) == (job.start_s // LABEL_REFRESH_S + 1) * LABEL_REFRESH_S
    lag_s, gpus = job.labels_s - job.start_s, len(job.devices)
    assert 0 < lag_s < LABEL_REFRESH_S + 1 and job.labels_s < job.end_s and gpus > 1
    assert all(p.devices[k].mig_instance_id is None for k in job.devices)

    mine = [e for e in _events(records, "sim-k8s") if e["job_id"] == job.job_id]
    assert [e["event_type"] for e in mine] == ["SUBMITTED", "STARTED", "UPDATED", "ENDED"]
    started, updated = mine[1], mine[2]
    base_ms = CFG.start_ms
    assert started["ts_ms"] == base_ms + job.start_s * 1000 and updated["ts_ms"] == base_ms + job.labels_s * 1000
    ((alloc,),) = [started["allocations"]]
    assert len(alloc["devices"]) == gpus and all(d["uuid"] is None and d["index"] is None for d in alloc["devices"])
    uuids = [d["uuid"] for a in updated["allocations"] for d in a["devices"]]
    assert uuids == [p.devices[k].uuid for k in job.devices] and updated["start_ts_ms"] == started["ts_ms"]
    # The Slurm-like cluster plans no such job (its records are unchanged: the test above).
    assert all(j.labels_s is None for j in cluster_plan(CFG).jobs)

    # The expected ledger: `gpus` unidentified devices dark over the lag, the real GPUs from the UPDATED on.
    led = expected_ledger(CFG)[job.job_id]
    placeholders = {n: c for n, c in led.devices.items() if "/unidentified:" in n}
    assert len(placeholders) == gpus
    assert all(c["allocated_s"] == c["dark_s"] == lag_s for c in placeholders.values())
    real = [c for n, c in led.devices.items() if n not in placeholders]
    assert len(real) == gpus and all(c["allocated_s"] == job.end_s - job.labels_s for c in real)
    assert led.allocated_s == gpus * (job.end_s - job.start_s) and led.dark_s >= gpus * lag_s
    # ... and the processors agree, to the second and the device-minute (the placeholders' rows included).
    assert result.ledger()[job.job_id] == {f: getattr(led, f) for f in LEDGER_FIELDS}
    rows = [r for r in result.device_minutes if r["job_id"] == job.job_id and r["device_uuid"].startswith("unid")]
    assert sum(r["dark_s"] for r in rows) == gpus * lag_s and {r["sample_count"] for r in rows} == {0}
    # The real GPUs over the lag are unallocated: their samples there belong to no job.
    unallocated = sum(
        r["unallocated_s"]
        for r in result.device_minutes
        if r["job_id"] is None and r["device_uuid"] in uuids and r["minute_start_ms"] < updated["ts_ms"]
    )
    assert unallocated >= gpus * lag_s
