"""The processors against the simulator's expected ledger (written from its ground truth, not by us).

Runs the same stage objects the Kafka runtime drives, in memory, over one simulated cluster: training
gangs, batch, notebooks idling over lunch, data-starved jobs, a poking script, an exporter that dies
while its node is held, a device that never reports and an exporter upgrade mid-run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import pytest

from base.processor_settings import IdlePolicy, ProcessorSettings
from processors.classify import JobMinuteClass, classify_job_minute
from processors.pipeline import PipelineResult, run_in_memory
from producers.simulator import Ledger, SimConfig, expected_ledger, plan, simulate, unallocated_seconds

CFG = SimConfig(seed=3, nodes=4, duration_s=7200)
POLICY = IdlePolicy(idle_after_min_interactive=10, idle_after_min_batch=15, grace_min=5)
FIELDS = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s")


@pytest.fixture(scope="module")
def records() -> list[Any]:
    return list(simulate(CFG))


@pytest.fixture(scope="module")
def expected() -> dict[str, Ledger]:
    return expected_ledger(CFG)


@pytest.fixture(scope="module")
def result(records: list[Any]) -> PipelineResult:
    return run_in_memory(records, ProcessorSettings(idle=POLICY))


def test_every_job_matches_the_expected_ledger_to_the_second(
    result: PipelineResult, expected: dict[str, Ledger]
) -> None:
    got = result.ledger()
    assert set(got) == set(expected)
    for job_id, led in expected.items():
        assert got[job_id] == {f: getattr(led, f) for f in FIELDS}, f"job {job_id} ({led.kind})"
    sm: dict[str, float] = defaultdict(float)
    for r in result.job_minutes:
        sm[r["job_id"]] += r["sm_weighted_s"]
    for job_id, led in expected.items():
        assert sm[job_id] == pytest.approx(led.sm_weighted_s, abs=1e-6)


def test_every_device_matches(result: PipelineResult, expected: dict[str, Ledger]) -> None:
    per_device: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in result.device_minutes:
        if r["job_id"] is not None:
            for f in FIELDS:
                per_device[(r["job_id"], f"{r['node']}/{r['device_uuid']}")][f] += r[f]
    for job_id, led in expected.items():
        for dev, counts in led.devices.items():
            assert dict(per_device[(job_id, dev)]) == {f: counts[f] for f in FIELDS}


def test_idle_and_dark_job_minutes_match(result: PipelineResult, expected: dict[str, Ledger]) -> None:
    classes: dict[str, Counter[JobMinuteClass]] = defaultdict(Counter)
    for r in result.job_minutes:
        classes[r["job_id"]][classify_job_minute(r["active_s"], r["starved_s"], r["idle_s"])] += 1
    for job_id, led in expected.items():
        assert classes[job_id][JobMinuteClass.IDLE] == led.idle_minutes, job_id
        assert classes[job_id][JobMinuteClass.DARK] == led.dark_minutes, job_id


def _alerts(result: PipelineResult) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for a in sorted(result.alerts, key=lambda a: a["ts_ms"]):
        if a["job_id"]:
            out[a["job_id"]].append(a["kind"])
    return out


def test_idle_notebooks_warned_then_reclaimed_dry_run(result: PipelineResult, expected: dict[str, Ledger]) -> None:
    alerts = _alerts(result)
    actions = {a["job_id"]: a for a in result.actions}
    reclaimed = [j for j, led in expected.items() if led.kind == "notebook" and j in actions]
    assert reclaimed, "no idle notebook was reclaimed"
    for job_id in reclaimed:
        kinds = alerts[job_id]
        assert kinds.index("IDLE_WARNING") < kinds.index("RECLAIM_NOTICE")
        assert actions[job_id]["dry_run"] is True and actions[job_id]["action"] == "CANCEL"


def test_the_poking_script_does_not_escape(result: PipelineResult, expected: dict[str, Ledger]) -> None:
    pokers = [j for j, led in expected.items() if led.kind == "poker" and led.idle_minutes >= 15 + 5 + 1]
    assert pokers
    actions = {a["job_id"] for a in result.actions}
    for job_id in pokers:
        assert "IDLE_WARNING" in _alerts(result)[job_id]
        assert job_id in actions


def test_starved_busy_and_dark_jobs_are_never_warned(result: PipelineResult, expected: dict[str, Ledger]) -> None:
    alerts = _alerts(result)
    starved = [j for j, led in expected.items() if led.kind == "starved"]
    assert starved
    for job_id, led in expected.items():
        if led.kind in ("starved", "training") or led.idle_minutes == 0:
            assert "IDLE_WARNING" not in alerts[job_id], f"{job_id} ({led.kind}) warned"


def test_dark_node_and_silent_device_raise_coverage_gaps(result: PipelineResult) -> None:
    p = plan(CFG)
    gaps = {(a["node"], a["device_uuids"][0]) for a in result.alerts if a["kind"] == "COVERAGE_GAP"}
    dead = {o.node for o in p.outages}
    assert {n for n, _ in gaps} >= dead
    for node, index in p.silent:
        assert (node, p.devices[(node, index)].uuid) in gaps


def test_same_ledger_over_four_partitions(records: list[Any], result: PipelineResult) -> None:
    four = run_in_memory(records, ProcessorSettings(idle=POLICY), partitions=4)

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["minute_start_ms"], r["node"], r["device_uuid"], r["job_id"] or "")

    assert sorted(four.device_minutes, key=key) == sorted(result.device_minutes, key=key)
    assert four.ledger() == result.ledger()
    assert sorted(a["alert_id"] for a in four.alerts) == sorted(a["alert_id"] for a in result.alerts)


def test_a_mig_mode_gpu_is_not_a_device_of_its_own() -> None:
    """A MIG node's physical GPUs report board metrics on their own series beside their instances'. Those rows
    are no device anyone can hold: counted, they added each parent's seconds to the unallocated ones. The
    unallocated seconds equal the simulator's plan (its devices are the instances) to the second."""
    cfg = SimConfig(seed=3, nodes=4, duration_s=900, mig_nodes=1)
    result = run_in_memory(list(simulate(cfg)), ProcessorSettings(idle=POLICY))
    free = [r for r in result.device_minutes if r["job_id"] is None]
    mig_gpus = {r["device_uuid"] for r in result.device_minutes if r["mig_instance_id"] is not None}
    assert mig_gpus and not [r for r in free if r["mig_instance_id"] is None and r["device_uuid"] in mig_gpus]
    assert sum(r["unallocated_s"] for r in free) == unallocated_seconds(cfg)
