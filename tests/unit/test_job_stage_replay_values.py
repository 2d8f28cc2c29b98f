"""A restarted job stage emits each job-minute with the value an uninterrupted run gives it, on the
simulator's two clusters (the Kubernetes one's pods are submitted well before they start, a gang's Workload
and its pods, a pod whose devices are named late).

The fault suite's kill test caught a short job-minute there: a replay read a pod's SUBMITTED, then its last
minute's device-minutes, then its STARTED. Known but not started, the pod expected no rows, and the minute went
out with the 5 of its 8 rows read so far; the sinks keep a job-minute's first copy. The crash, checkpoint and
replay are `test_job_stage_crash_replay.py`'s; this compares values, not only which minutes came out."""

from __future__ import annotations

import random

from unit.test_job_stage_crash_replay import Item, Values, arrivals, new_partition, run

KUBE_NODES = 3


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
    items = arrivals(KUBE_NODES)
    want: Values = {}
    run(items, new_partition(), 50, set(), {}, want)
    rng = random.Random(3)
    for trial in range(30):
        batch = rng.choice([10, 50, 200])
        got: Values = {}
        crash_at = rng.randrange(batch, len(items))
        checkpoints = run(items[:crash_at], new_partition(), batch, set(), {}, got)
        states, rows_from, events_from = checkpoints[rng.randrange(len(checkpoints))]
        rest = [it for it in items if it[1] >= (rows_from if it[0] == "dm" else events_from)]
        run(interleaved(rest, rng), new_partition(states), batch, set(), dict(states), got)
        short = {k: (v, want[k]) for k, v in got.items() if k in want and v != want[k]}
        assert not short, f"trial {trial}: job-minutes emitted with other values: {sorted(short.items())[:3]}"
        assert set(want) <= set(got), f"trial {trial}: {len(set(want) - set(got))} job-minutes never emitted"
