"""Devices of unknown identity (issue 18): a 4-GPU pod whose devices no source named is four devices,
charged four, its rows marked `unidentified:K` (the data-quality finding), never merged into one; once
its UUIDs are known (an UPDATED naming them) the unidentified intervals end and the real GPUs are charged.

Worked ledger, node n1 with GPU-A..GPU-D busy (sm 0.8) all along, over [T0, T0 + 120 s):
- P1 (4 GPUs, identity never known) runs [0 s, 120 s): 4 x 120 allocated, all dark (no sample names
  its devices); GPU-A..D are unallocated for those seconds (their samples match no allocation).
- P3 (2 GPUs, identity never known) on n1 too, [0 s, 60 s): 2 x 60, dark; P1's unidentified devices
  and P3's are different devices, neither takes the other's seconds.
- P2 (2 GPUs) on n2 starts count-only at 0 s; its UUIDs (GPU-E, GPU-F, busy) arrive at 30 s: 2 x 30
  dark, then 2 x 90 active.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from base.processor_settings import ProcessorSettings
from processors.attribution import UNIDENTIFIED, AllocationTable
from processors.pipeline import run_in_memory
from processors.testing import T0, device, inventory, job_event, scrape
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key

S = 1000


def count_only(kind: str, job: str, ts: int, node: str, n: int) -> dict[str, Any]:
    ev = job_event(kind, job, ts, {node: [f"x{i}" for i in range(n)]})
    for dev in ev["allocations"][0]["devices"]:
        dev["uuid"] = None  # what `kube watch` publishes for a pod whose devices nobody named
    return ev


def records() -> list[tuple[Any, bytes, dict[str, Any]]]:
    out: list[tuple[Any, bytes, dict[str, Any]]] = []
    events = {
        0: [count_only("STARTED", "P1", T0, "n1", 4), count_only("STARTED", "P2", T0, "n2", 2),
            count_only("STARTED", "P3", T0, "n1", 2)],
        30: [job_event("UPDATED", "P2", T0 + 30 * S, {"n2": ["GPU-E", "GPU-F"]})],
        60: [job_event("ENDED", "P3", T0 + 60 * S)],
        120: [job_event("ENDED", "P1", T0 + 120 * S), job_event("ENDED", "P2", T0 + 120 * S)],
    }
    for second in range(121):
        for ev in events.get(second, ()):
            out.append((JOB_EVENTS, job_key("c1", ev["job_id"]), ev))
        n1 = [device(f"GPU-{c}", i, sm=0.8) for i, c in enumerate("ABCD")]
        n2 = [device("GPU-E", 0, sm=0.8), device("GPU-F", 1, sm=0.8)]
        out.append((DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", T0 + second * S, n1)))
        out.append((DEVICE_SAMPLES, node_key("c1", "n2"), scrape("n2", T0 + second * S, n2)))
    return out


def test_count_only_devices_are_not_merged() -> None:
    t = AllocationTable()
    t.apply("n1", count_only("STARTED", "P1", T0, "n1", 4))
    assert len(t.intervals("n1")) == 4
    assert t.job_devices("c1/P1") == [f"n1:{UNIDENTIFIED}{k}" for k in range(4)]
    assert t.expected_devices("c1/P1", T0) == 4
    # the same allocation again (a RESUMED, a re-published STARTED) does not add devices
    t.apply("n1", count_only("RESUMED", "P1", T0 + 5 * S, "n1", 4))
    assert len([iv for iv in t.intervals("n1") if iv.end_ms is None]) == 4
    assert t.owner_at("n1", "GPU-A", 0, None, T0 + 10 * S) is None  # an unidentified device matches no sample


def test_unidentified_pod_charged_per_device_and_flagged() -> None:
    result = run_in_memory(records(), ProcessorSettings())
    assert result.ledger() == {
        "P1": {"allocated_s": 480, "active_s": 0, "starved_s": 0, "idle_s": 0, "dark_s": 480},
        "P2": {"allocated_s": 240, "active_s": 180, "starved_s": 0, "idle_s": 0, "dark_s": 60},
        # on P1's node at the same time: its unidentified:0 and :1 are not P1's, both jobs are charged
        "P3": {"allocated_s": 120, "active_s": 0, "starved_s": 0, "idle_s": 0, "dark_s": 120},
    }
    p1 = [r for r in result.device_minutes if r["job_id"] == "P1"]
    per_device: Counter[str] = Counter()
    for r in p1:
        per_device[r["device_uuid"]] += r["allocated_s"]
    assert per_device == {f"{UNIDENTIFIED}{k}": 120 for k in range(4)}
    assert {r["device_count"] for r in result.job_minutes if r["job_id"] == "P1"} == {4}
    free: Counter[str] = Counter()
    for r in result.device_minutes:
        if r["job_id"] is None:
            free[r["device_uuid"]] += r["unallocated_s"]
    # the real GPUs show as unallocated, not as P1's; GPU-E/F before P2's identity arrived, and at 120 s
    assert free == {**{f"GPU-{c}": 121 for c in "ABCD"}, "GPU-E": 31, "GPU-F": 31}
    p2: Counter[str] = Counter()
    for r in result.device_minutes:
        if r["job_id"] == "P2":
            p2[r["device_uuid"]] += r["allocated_s"]
    assert p2 == {f"{UNIDENTIFIED}0": 30, f"{UNIDENTIFIED}1": 30, "GPU-E": 90, "GPU-F": 90}


@pytest.mark.parametrize("late_first", [False, True])
def test_devices_named_after_the_end_open_nothing(late_first: bool) -> None:
    """The UUIDs of a pod that ended meanwhile (published by `kube podresources` just after its end): in either
    arrival order, the job holds its unidentified devices until its end and nothing after."""
    t = AllocationTable()
    late = job_event("UPDATED", "P1", T0 + 70 * S, {"n1": ["GPU-A", "GPU-B", "GPU-C", "GPU-D"]})
    t.apply("n1", count_only("STARTED", "P1", T0, "n1", 4))
    ended = job_event("ENDED", "P1", T0 + 60 * S)
    for ev in ([late, ended] if late_first else [ended, late]):
        t.apply("n1", ev)
    assert sorted((iv.ref.label, iv.start_ms, iv.end_ms) for iv in t.intervals("n1")) == [
        (f"{UNIDENTIFIED}{k}", T0, T0 + 60 * S) for k in range(4)]


def test_an_unidentified_gpu_on_a_node_of_one_kind_is_priced_as_that_kind() -> None:
    """n1's inventory: four H100s, so P1's and P3's unidentified GPUs are hopper (priced as such, still flagged
    `unidentified:K`). n2 holds an H100 and an A100: which one P2's count-only devices were is unknown, so its
    first 30 s stay `unknown` (unpriced, in the data-quality figure); GPU-E and GPU-F are named after that."""
    mixed = inventory("n2", ["GPU-E", "GPU-F"])
    mixed["devices"][1].update(model="NVIDIA A100-SXM4-80GB", generation="ampere")
    inv = [(INVENTORY, node_key("c1", "n1"), inventory("n1", [f"GPU-{c}" for c in "ABCD"])),
           (INVENTORY, node_key("c1", "n2"), mixed)]  # fmt: skip
    rows = run_in_memory(inv + records(), ProcessorSettings()).device_minutes
    placeholders = {(r["job_id"], r["generation"]) for r in rows if r["device_uuid"].startswith(UNIDENTIFIED)}
    assert placeholders == {("P1", "hopper"), ("P3", "hopper"), ("P2", "unknown")}
    named = {(r["device_uuid"], r["generation"]) for r in rows if r["job_id"] == "P2" and r["allocated_s"]}
    assert named >= {("GPU-E", "hopper"), ("GPU-F", "ampere")}
