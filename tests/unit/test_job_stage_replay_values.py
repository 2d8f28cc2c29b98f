"""A restarted job stage emits each job-minute with the value an uninterrupted run gives it, on the
simulator's two clusters (the Kubernetes one's pods are submitted well before they start, a gang's Workload
and its pods, a pod whose devices are named late).

The fault suite's kill test caught a short job-minute there: a replay read a pod's SUBMITTED, then its last
minute's device-minutes, then its STARTED. Known but not started, the pod expected no rows, and the minute went
out with the 5 of its 8 rows read so far; the sinks keep a job-minute's first copy. The crash, checkpoint and
replay are `test_job_stage_crash_replay.py`'s; this compares values, not only which minutes came out."""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from unit.test_job_stage_crash_replay import SETTINGS, Item, new_partition

from processors.pipeline import run_in_memory
from processors.stages import JobPartition, encode_job_state
from processors.windows import MINUTE_MS
from producers.simulator import DEFAULT_START_MS, SimConfig, simulate
from schemas.topics import JOB_EVENTS

Emitted = dict[tuple[str, int], tuple[int, int]]  # (job, minute) -> (devices, allocated seconds), first copy


@cache
def arrivals() -> list[Item]:
    config = SimConfig(seed=11, nodes=5, duration_s=1500, start_ms=DEFAULT_START_MS, kube_nodes=3)
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


def feed(items: list[Item], part: JobPartition, batch: int, emitted: Emitted, states: dict[str, bytes]) -> list[Any]:
    checkpoints = []
    for i in range(0, len(items), batch):
        for kind, offset, rec in items[i : i + batch]:
            if kind == "ev":
                part.on_job_event(rec, offset)
            else:
                part.on_device_minute(rec, offset)
        for out in (part.drain(), part.tick((part.max_ts or 0) + MINUTE_MS)):
            for jm in out.job_minutes:
                emitted.setdefault((jm["job_id"], jm["minute_start_ms"]), (jm["device_count"], jm["allocated_s"]))
            states.update({j: encode_job_state(st) for j, st in out.states.items()})
        checkpoints.append((dict(states), part.rows_commit_offset(), part.events_commit_offset()))
    return checkpoints


def interleaved(rest: list[Item], rng: random.Random) -> list[Item]:
    """The replay's two inputs in runs, as fetches come back: a few job events, then many device-minutes, so
    a job's submission is often read well before its start, and rows of its minutes in between."""
    events, rows, out = [it for it in rest if it[0] == "ev"], [it for it in rest if it[0] == "dm"], []
    while events or rows:
        src, n = (
            (events, rng.randint(1, 5)) if events and (not rows or rng.random() < 0.5) else (rows, rng.randint(1, 400))
        )
        out += src[:n]
        del src[:n]
    return out


def test_a_replay_that_reads_rows_before_the_start_emits_whole_job_minutes() -> None:
    want: Emitted = {}
    feed(arrivals(), new_partition(), 50, want, {})
    rng = random.Random(3)
    for trial in range(30):
        batch = rng.choice([10, 50, 200])
        got: Emitted = {}
        crash_at = rng.randrange(batch, len(arrivals()))
        checkpoints = feed(arrivals()[:crash_at], new_partition(), batch, got, {})
        states, rows_from, events_from = checkpoints[rng.randrange(len(checkpoints))]
        rest = [it for it in arrivals() if it[1] >= (rows_from if it[0] == "dm" else events_from)]
        feed(interleaved(rest, rng), new_partition(states), batch, got, dict(states))
        short = {k: (v, want[k]) for k, v in got.items() if k in want and v != want[k]}
        assert not short, f"trial {trial}: job-minutes emitted with other values: {sorted(short.items())[:3]}"
        assert set(want) <= set(got), f"trial {trial}: {len(set(want) - set(got))} job-minutes never emitted"
