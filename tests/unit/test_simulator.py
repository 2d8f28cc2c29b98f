"""The simulator: deterministic from a seed, events and samples that agree, a ledger that adds up."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

import pytest

from producers.dcgm import Normalizer
from producers.mapping import load_mappings
from producers.simulator import SimConfig, expected_ledger, plan, simulate, unallocated_seconds, write_ledger
from producers.simulator.telemetry import device_labels, exporter_profile, exporter_samples, truth
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS

SMALL = SimConfig(seed=3, nodes=4, duration_s=40 * 60, upgrade_at_s=20 * 60)
SMALL_MIG = SimConfig(seed=4, nodes=3, duration_s=30 * 60, mig_nodes=1)


@pytest.fixture(scope="module")
def records() -> list[tuple[Any, bytes, dict[str, Any]]]:
    return list(simulate(SMALL))


@pytest.fixture(scope="module", params=["whole", "mig"])
def run_records(request: pytest.FixtureRequest) -> tuple[SimConfig, list[tuple[Any, bytes, dict[str, Any]]]]:
    cfg = SMALL if request.param == "whole" else SMALL_MIG
    return cfg, list(simulate(cfg))


def _digest(cfg: SimConfig, codec: AvroCodec) -> str:
    h = hashlib.sha256()
    for topic, key, rec in simulate(cfg):
        h.update(topic.name.encode())
        h.update(key)
        h.update(codec.encode(topic.subject, rec))
    return h.hexdigest()


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    codec = AvroCodec()
    cfg = SimConfig(seed=11, nodes=2, duration_s=300)
    assert _digest(cfg, codec) == _digest(SimConfig(seed=11, nodes=2, duration_s=300), codec)
    assert _digest(cfg, codec) != _digest(SimConfig(seed=12, nodes=2, duration_s=300), codec)


def test_records_are_in_event_time_order_and_encode(records: list[tuple[Any, bytes, dict[str, Any]]]) -> None:
    codec = AvroCodec()
    last = 0
    for topic, _, rec in records:
        assert rec["ts_ms"] >= last
        assert rec["ts_ms"] % 1000 == 0
        last = rec["ts_ms"]
        decoded = codec.decode(codec.encode(topic.subject, rec)).record
        assert decoded["cluster"] == "sim"
    topics = {t.name for t, _, _ in records}
    assert topics == {DEVICE_SAMPLES.name, JOB_EVENTS.name, INVENTORY.name}


def test_job_events_and_samples_agree(
    run_records: tuple[SimConfig, list[tuple[Any, bytes, dict[str, Any]]]],
) -> None:
    cfg, records = run_records
    p = plan(cfg)
    inventory = {
        r["node"]: {(d["uuid"], d["mig_instance_id"]) for d in r["devices"]} for t, _, r in records if t is INVENTORY
    }
    assert len(inventory) == cfg.nodes
    assert all(len({u for u, _ in v}) == 8 for v in inventory.values())
    held: dict[tuple[str, str, int | None], str] = {}  # (node, uuid, MIG instance) -> job id
    started: set[str] = set()
    ended: set[str] = set()
    seen_devices: dict[tuple[str, str, int | None], int] = defaultdict(int)
    for topic, key, rec in records:
        if topic is JOB_EVENTS:
            assert key == f"sim/{rec['job_id']}".encode()
            devs = [(a["node"], d["uuid"], d["mig_instance_id"]) for a in rec["allocations"] for d in a["devices"]]
            assert rec["gang_size"] == len(devs)
            for node, uuid, mig in devs:
                assert (uuid, mig) in inventory[node]
            if rec["event_type"] == "STARTED":
                assert rec["identity"]["user"] == rec["user"] and rec["project"]
                for dev in devs:
                    assert dev not in held, "a device is never held by two jobs"
                    held[dev] = rec["job_id"]
                started.add(rec["job_id"])
            else:
                for dev in devs:
                    assert held.pop(dev) == rec["job_id"]
                ended.add(rec["job_id"])
        elif topic is DEVICE_SAMPLES:
            assert key == f"sim/{rec['node']}".encode()
            for d in rec["devices"]:
                # The exporter's hpc_job label names the job the scheduler says holds the device.
                dev = (rec["node"], d["uuid"], d["mig_instance_id"])
                assert d["hpc_job"] == held.get(dev)
                seen_devices[dev] += 1
    assert started == ended == {j.job_id for j in p.jobs}
    assert not held
    for key in p.silent:
        silent = p.devices[key]
        assert (silent.node, silent.uuid, silent.mig_instance_id) not in seen_devices
    kinds = {j.kind for j in p.jobs}
    assert {"batch", "notebook", "starved", "poker"} <= kinds
    assert any(len(j.nodes) > 1 for j in p.jobs), "a multi-node gang"
    if cfg.mig_nodes:
        mig_node = p.nodes[-1].name
        slices = {(u, m) for u, m in inventory[mig_node] if m is not None}
        assert len(slices) > 8 and all(m is not None for _, m in inventory[mig_node])
        assert {(mig_node, u, m) for u, m in slices} <= set(seen_devices) | {
            (p.devices[k].node, p.devices[k].uuid, p.devices[k].mig_instance_id) for k in p.silent
        }
        assert any(m is not None for n, _, m in held_ever(records) if n == mig_node)


def held_ever(records: list[tuple[Any, bytes, dict[str, Any]]]) -> set[tuple[str, str, int | None]]:
    return {
        (a["node"], d["uuid"], d["mig_instance_id"])
        for t, _, r in records
        if t is JOB_EVENTS
        for a in r["allocations"]
        for d in a["devices"]
    }


def _ledger_from_records(records: list[tuple[Any, bytes, dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """A consumer-side reading of docs/classification.md over the emitted records (no ground truth)."""
    intervals: dict[tuple[str, str, int | None], list[tuple[int, int, str]]] = defaultdict(list)
    starts: dict[str, dict[str, Any]] = {}
    for topic, _, rec in records:
        if topic is JOB_EVENTS and rec["event_type"] == "STARTED":
            starts[rec["job_id"]] = rec
        elif topic is JOB_EVENTS:
            s = starts[rec["job_id"]]
            for a in s["allocations"]:
                for d in a["devices"]:
                    dev = (a["node"], d["uuid"], d["mig_instance_id"])
                    intervals[dev].append((s["ts_ms"], rec["ts_ms"], rec["job_id"]))
    samples: dict[tuple[str, str, int | None], dict[int, tuple[float, float]]] = defaultdict(dict)
    for topic, _, rec in records:
        if topic is DEVICE_SAMPLES:
            for d in rec["devices"]:
                act = d["sm_active_ratio"]
                if act is None:
                    act = d["gr_engine_active_ratio"]
                if act is None and d["gpu_util_pct"] is not None:
                    act = d["gpu_util_pct"] / 100
                if act is not None:
                    dev = (rec["node"], d["uuid"], d["mig_instance_id"])
                    samples[dev][rec["ts_ms"] // 1000] = (act, d["fb_used_mib"] or 0.0)
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for dev, ivs in intervals.items():
        for start_ms, end_ms, job in ivs:
            minutes: dict[int, list[int]] = defaultdict(list)
            for s in range(start_ms // 1000, end_ms // 1000):
                minutes[s // 60].append(s)
            for secs in minutes.values():
                got = [samples[dev][s] for s in secs if s in samples[dev]]
                led = out[job]
                led["allocated_s"] += len(secs)
                led["dark_s"] += len(secs) - len(got)
                if got:
                    mean = sum(a for a, _ in got) / len(got)
                    fb = max(f for _, f in got)
                    cls = "active" if mean >= 0.25 else "starved" if mean >= 0.05 and fb >= 1024 else "idle"
                    led[f"{cls}_s"] += len(got)
    return out


def test_expected_ledger_matches_the_records(
    run_records: tuple[SimConfig, list[tuple[Any, bytes, dict[str, Any]]]],
) -> None:
    cfg, records = run_records
    expected = expected_ledger(cfg)
    observed = _ledger_from_records(records)
    assert set(expected) == set(observed)
    for job_id, led in expected.items():
        got = observed[job_id]
        for k in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s"):
            assert getattr(led, k) == got.get(k, 0), (job_id, led.kind, k)


def test_ledger_invariants_and_behaviours() -> None:
    cfg = SimConfig(seed=5, nodes=8, duration_s=2 * 3600)
    p = plan(cfg)
    ledger = expected_ledger(cfg)
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job in p.jobs:
        led = ledger[job.job_id]
        assert led.allocated_s == led.active_s + led.starved_s + led.idle_s + led.dark_s
        assert led.allocated_s == len(job.devices) * (job.end_s - job.start_s)
        for k in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s"):
            by_kind[job.kind][k] += getattr(led, k)
    share = {k: {c: v[c] / v["allocated_s"] for c in v} for k, v in by_kind.items()}
    assert share["batch"]["active_s"] > 0.9
    assert share["starved"]["starved_s"] > 0.9
    assert share["poker"]["idle_s"] > 0.9
    assert share["notebook"]["idle_s"] > 0.3  # lunch and reading time
    # The dead exporter and the silent device leave allocated seconds dark, never idle.
    (outage,) = p.outages
    dark_jobs = [j for j in p.jobs if outage.node in j.nodes and j.start_s < outage.end_s and j.end_s > outage.start_s]
    assert dark_jobs and all(ledger[j.job_id].dark_s > 0 for j in dark_jobs)
    (silent,) = p.silent
    silent_job = next(j for j in p.jobs if silent in j.devices)
    assert ledger[silent_job.job_id].dark_s >= silent_job.end_s - silent_job.start_s
    assert unallocated_seconds(SimConfig(seed=5, nodes=2, duration_s=600)) > 0


def test_exporter_upgrade_keeps_canonical_values(records: list[tuple[Any, bytes, dict[str, Any]]]) -> None:
    versions = [(r["ts_ms"], r["mapping_version"], r["exporter_version"]) for t, _, r in records if t is DEVICE_SAMPLES]
    before = {(m, e) for ts, m, e in versions if ts < SMALL.start_ms + SMALL.upgrade_at_s * 1000}  # type: ignore[operator]
    after = {(m, e) for ts, m, e in versions if ts >= SMALL.start_ms + SMALL.upgrade_at_s * 1000}  # type: ignore[operator]
    assert before == {("dcgm-v2", "3.3.5-3.4.0")}
    assert after == {("dcgm-v4", "4.4.2-4.7.1")}
    # The same device-second through both releases: same canonical metrics where both report them.
    p = plan(SMALL)
    job = next(j for j in p.jobs if j.kind == "batch")
    dev = p.devices[job.devices[0]]
    tr = truth(dev, job, 0, job.start_s + 5, SMALL.start_ms // 1000)
    norm = Normalizer()
    out = []
    for version in ("3.3.5-3.4.0", "4.4.2-4.7.1"):
        prof = exporter_profile(version)
        raw = exporter_samples(prof, device_labels(dev, prof, job.job_id), tr)
        (d,) = norm.normalize(raw, mapping=load_mappings().get(prof.mapping_version)).devices
        out.append(d)
    old, new = out
    for k in (
        "gpu_util_pct",
        "fb_used_mib",
        "fb_free_mib",
        "power_w",
        "pcie_tx_bytes_per_s",
        "pcie_rx_bytes_per_s",
        "temperature_c",
        "uuid",
        "index",
        "model",
        "hpc_job",
    ):
        assert old[k] == new[k], k
    assert old["gr_engine_active_ratio"] is None and new["gr_engine_active_ratio"] == old["gpu_util_pct"] / 100
    assert not norm.unknown_counts


def test_write_ledger_json_and_csv(tmp_path: Any) -> None:
    import csv
    import json

    cfg = SimConfig(seed=2, nodes=2, duration_s=600)
    j = json.loads(write_ledger(cfg, tmp_path / "l.json").read_text())
    assert j["classifier_version"] == "c1" and j["jobs"]
    rows = list(csv.DictReader((write_ledger(cfg, tmp_path / "l.csv")).open()))
    assert {r["job_id"] for r in rows} == set(j["jobs"])
    for r in rows:
        assert int(r["allocated_s"]) == sum(int(r[k]) for k in ("active_s", "starved_s", "idle_s", "dark_s"))


def test_realtime_run_paces_records_to_the_clock() -> None:
    from producers.simulator import run

    now = [1000.0]
    published: list[tuple[float, int]] = []

    class Pub:
        def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
            published.append((now[0], record["ts_ms"]))

        def flush(self, timeout_s: float = 30.0) -> None:
            pass

    def sleep(s: float) -> None:
        now[0] += s

    cfg = SimConfig(seed=1, nodes=1, duration_s=90)
    stats = run(cfg, Pub(), realtime=True, clock=lambda: now[0], sleep=sleep)
    assert sum(stats.records.values()) == len(published) == len(list(simulate(cfg)))
    for wall, ts_ms in published:
        assert wall >= 1000.0 + (ts_ms - cfg.start_ms) / 1000 - 1e-9
    last_ts = max(ts for _, ts in published)
    assert now[0] == pytest.approx(1000.0 + (last_ts - cfg.start_ms) / 1000, abs=0.01)


def test_device_minutes_sum_to_the_ledger() -> None:
    from producers.simulator import expected_device_minutes

    cfg = SimConfig(seed=8, nodes=2, duration_s=900)
    rows = expected_device_minutes(cfg)
    ledger = expected_ledger(cfg)
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        assert r.minute_start_ms % 60_000 == 0 and 0 < r.allocated_s <= 60
        assert r.allocated_s == r.active_s + r.starved_s + r.idle_s + r.dark_s
        assert r.sample_count == r.allocated_s - r.dark_s
        assert sum(1 for c in (r.active_s, r.starved_s, r.idle_s) if c) <= 1  # one class per device-minute
        for k in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s"):
            sums[r.job_id][k] += getattr(r, k)
    for job_id, led in ledger.items():
        assert {k: getattr(led, k) for k in sums[job_id]} == dict(sums[job_id])


def test_fast_run_never_hands_over_a_record_far_past_an_undelivered_one() -> None:
    """A producer orders records per partition only, so a flush comes before any record AHEAD_MS past the
    oldest one not yet delivered: a lingering partition (a job event's, or samples behind a moving partition
    leader) can then never fall more than the grace behind the others."""
    from producers.simulator import run
    from producers.simulator.run import AHEAD_MS

    pending: list[int] = []  # record times handed over since the last flush
    worst = 0
    flushes = 0

    class Pub:
        def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
            nonlocal worst
            if pending:
                worst = max(worst, record["ts_ms"] - min(pending))
            pending.append(record["ts_ms"])

        def flush(self, timeout_s: float = 30.0) -> None:
            nonlocal flushes
            flushes += 1
            pending.clear()

    cfg = SimConfig(seed=6, nodes=3, duration_s=1800)
    run(cfg, Pub())
    assert sum(1 for r in simulate(cfg) if r[0] is JOB_EVENTS) > 10
    assert AHEAD_MS - 1000 <= worst < AHEAD_MS  # samples every second: each flush just before the bound
    assert flushes <= cfg.duration_s * 1000 // (AHEAD_MS - 1000) + 1  # one per few seconds, not one per record


def test_a_flush_waits_out_a_broker_away_and_a_refusal_is_an_error() -> None:
    from base.errors import NotDelivered, ServiceError
    from producers.simulator.run import WithinGrace

    outcomes: list[Exception | None] = [NotDelivered("3 records not delivered within 30s"), None]

    class Pub:
        def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None: ...

        def flush(self, timeout_s: float = 30.0) -> None:
            outcome = outcomes.pop(0)
            if outcome is not None:
                raise outcome

    WithinGrace(Pub()).flush()  # waited for: the second flush delivered
    assert outcomes == []
    outcomes[:] = [ServiceError("1 records failed delivery, first: MSG_SIZE_TOO_LARGE")]
    with pytest.raises(ServiceError, match="failed delivery"):
        WithinGrace(Pub()).flush()


def test_the_demo_policy_fleet_is_the_simulated_fleet() -> None:
    """producers/simulator/org.py sizes deploy/policy.sim.yaml's quota from the whole GPUs the demo's plans hold
    (MIG slices left out), for the config `gpuledger simulate run` runs by default."""
    import dataclasses
    import inspect
    from collections import Counter

    from producers.simulator.kube import cluster_plan
    from producers.simulator.model import clusters
    from producers.simulator.org import DEMO_CONFIG, sim_fleet_gpus
    from producers.telemetry_cli import simulate_run

    options = inspect.signature(simulate_run).parameters
    assert (DEMO_CONFIG.seed, DEMO_CONFIG.nodes, DEMO_CONFIG.kube_nodes) == tuple(
        options[name].default.default for name in ("seed", "nodes", "kube_nodes"))
    whole: Counter[str] = Counter()
    for c in clusters(dataclasses.replace(DEMO_CONFIG, duration_s=600)):
        whole.update(d.generation for d in cluster_plan(c).devices.values() if d.mig_instance_id is None)
    assert sim_fleet_gpus() == dict(whole) == {"hopper": 24, "ampere": 16, "ada": 16, "volta": 24}
