"""The job stage's commit protocol under crashes, on the pure `JobPartition` (no broker).

A worker writes its idle states at every checkpoint, but its input offsets commit only on an interval, so
after a kill -9 the states it restores can be newer than the offsets it replays from. And the replay may
interleave the two inputs (job events, device-minutes) in any order. Whatever the crash point, batch size
and interleaving, the job-minutes of the run before the crash and of the run after it must cover every
job-minute of an uninterrupted run. The second test shows the check can fail: offsets newer than the
states (the order `_checkpoint` forbids: states are flushed before inputs are acked) lose job-minutes.
"""

from __future__ import annotations

import random
import time
from functools import cache
from typing import Any

from base.processor_settings import ProcessorSettings
from processors.pipeline import run_in_memory
from processors.stages import JobPartition, decode_job_state, encode_job_state
from processors.windows import MINUTE_MS
from producers.simulator import DEFAULT_START_MS, SimConfig, simulate
from schemas.topics import JOB_EVENTS

SETTINGS = ProcessorSettings(realtime=False)
Item = tuple[str, int, dict[str, Any]]  # (input, offset, record)
Checkpoint = tuple[dict[str, bytes], int, int]  # (states written, rows commit offset, events commit offset)
Values = dict[tuple[str, int], tuple[int, int]]  # (job, minute) -> (devices, allocated seconds)


@cache
def arrivals(kube_nodes: int = 0) -> list[Item]:
    """Job events and device-minutes of a simulated cluster (and a Kubernetes one of `kube_nodes`) as one
    partition receives them: each device-minute after its minute closed, offsets growing in arrival order per
    input."""
    config = SimConfig(seed=11, nodes=5, duration_s=1500, start_ms=DEFAULT_START_MS, kube_nodes=kube_nodes)
    records = list(simulate(config))
    minutes = run_in_memory(records, SETTINGS).device_minutes
    timed = [("ev", r["ts_ms"], r) for t, _, r in records if t is JOB_EVENTS]
    timed += [("dm", d["minute_start_ms"] + MINUTE_MS + 10_000 + (i % 7) * 10, d) for i, d in enumerate(minutes)]
    timed.sort(key=lambda x: (x[1], x[0] != "ev"))
    offsets = {"ev": 0, "dm": 0}
    out: list[Item] = []
    for kind, _, rec in timed:
        out.append((kind, offsets[kind], rec))
        offsets[kind] += 1
    return out


def new_partition(states: dict[str, bytes] | None = None) -> JobPartition:
    """A partition as the agent makes one: the wall clock observed (history lies behind it), its states
    restored from the changelog."""
    part = JobPartition(SETTINGS)
    part.horizon.observe_clock(int(time.time() * 1000))
    for job, value in (states or {}).items():
        part.restore_state(job, decode_job_state(value))
    return part


def run(items: list[Item], part: JobPartition, batch: int, emitted: set[tuple[str, int]],
        states: dict[str, bytes], values: Values | None = None) -> list[Checkpoint]:  # fmt: skip
    """Feed in batches; after each, drain and tick as the agent does, and checkpoint. `values`: each job-minute's
    first copy (devices, allocated seconds), the one the sinks keep."""
    checkpoints: list[Checkpoint] = []
    for i in range(0, len(items), batch):
        for kind, offset, rec in items[i : i + batch]:
            if kind == "ev":
                part.on_job_event(rec, offset)
            else:
                part.on_device_minute(rec, offset)
        for out in (part.drain(), part.tick((part.max_ts or 0) + MINUTE_MS)):
            emitted.update((jm["job_id"], jm["minute_start_ms"]) for jm in out.job_minutes)
            for jm in out.job_minutes if values is not None else ():
                values.setdefault((jm["job_id"], jm["minute_start_ms"]), (jm["device_count"], jm["allocated_s"]))
            states.update({j: encode_job_state(st) for j, st in out.states.items()})
        checkpoints.append((dict(states), part.rows_commit_offset(), part.events_commit_offset()))
    return checkpoints


def replayed(states: dict[str, bytes], rows_from: int, events_from: int, order: str,
             rng: random.Random) -> list[Item]:  # fmt: skip
    rest = [it for it in arrivals() if it[1] >= (rows_from if it[0] == "dm" else events_from)]
    if order == "events-first":
        return sorted(rest, key=lambda it: it[0] != "ev")
    if order == "rows-first":
        return sorted(rest, key=lambda it: it[0] == "ev")
    if order == "blocks":  # the two inputs in runs of random length, as fetches come back
        events, rows, out = [it for it in rest if it[0] == "ev"], [it for it in rest if it[0] == "dm"], []
        while events or rows:
            src = events if events and (not rows or rng.random() < 0.3) else rows
            n = rng.randint(1, 300)
            out += src[:n]
            del src[:n]
        return out
    return rest


def uninterrupted() -> set[tuple[str, int]]:
    emitted: set[tuple[str, int]] = set()
    run(arrivals(), new_partition(), 50, emitted, {})
    return emitted


def crash_and_replay(rng: random.Random, offsets_newer: bool = False) -> set[tuple[str, int]]:
    """Job-minutes out of one run killed at a random point and restarted; the restart restores the states
    of one checkpoint and replays from the offsets of an older one (or, `offsets_newer`, a newer one)."""
    batch = rng.choice([10, 50, 200])
    emitted: set[tuple[str, int]] = set()
    crash_at = rng.randrange(batch, len(arrivals()))
    checkpoints = run(arrivals()[:crash_at], new_partition(), batch, emitted, {})
    newer = rng.randrange(len(checkpoints))
    older = rng.randrange(newer + 1)
    states = checkpoints[older if offsets_newer else newer][0]
    _, rows_from, events_from = checkpoints[newer if offsets_newer else older]
    order = rng.choice(["arrival", "events-first", "rows-first", "blocks"])
    run(replayed(states, rows_from, events_from, order, rng), new_partition(states), batch, emitted, dict(states))
    return emitted


def test_no_job_minute_is_lost_however_the_worker_dies_and_its_input_comes_back() -> None:
    want = uninterrupted()
    assert len(want) == 255
    rng = random.Random(16)
    for trial in range(80):
        missing = want - crash_and_replay(rng)
        assert not missing, f"trial {trial}: {len(missing)} job-minutes never emitted, e.g. {sorted(missing)[:3]}"


def test_offsets_committed_ahead_of_the_states_would_lose_job_minutes() -> None:
    want = uninterrupted()
    rng = random.Random(16)
    losses = sum(bool(want - crash_and_replay(rng, offsets_newer=True)) for _ in range(40))
    assert losses > 0  # the check above sees a loss when there is one
