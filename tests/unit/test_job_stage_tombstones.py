"""A forgotten job's tombstone across a restart of the job stage (issue 18): job 7 runs 10 minutes and ends,
the stage forgets it and writes its tombstone; the stage restarts and restores its states from what it
wrote. The tombstone keeps the job's end, so the restored stage passes over a replay of that job's events
and minutes, as the stage before the restart did, yet takes the reinstalled scheduler's job 7 (another
user, an hour later) as another job and gives it its job-minutes. A tombstone of an earlier version, without
the end, still restores as before: everything under the id is passed over.

Driven on the pure `JobPartition` (no broker), fed as the drivers feed it; its states go through
`encode_job_state` / `decode_job_state`, the bytes both drivers write to and read from the state topic.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any

from base.processor_settings import ProcessorSettings
from processors.pipeline import run_in_memory
from processors.stages import Forgotten, JobPartition, decode_job_state, encode_job_state
from processors.testing import T0, device, inventory, job_event, scrape
from processors.windows import MINUTE_MS
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key

SETTINGS = ProcessorSettings(realtime=False)
JOB = "c1/7"
FIRST_END = T0 + 10 * MINUTE_MS
SECOND_START = T0 + 60 * MINUTE_MS  # the second job 7 starts an hour after the first ended
Item = tuple[str, int, dict[str, Any]]  # (input: "ev" or "dm", offset, record)


def life(user: str, start: int) -> list[dict[str, Any]]:
    out = []
    for kind, ts in (("STARTED", start), ("ENDED", start + 10 * MINUTE_MS)):
        ev = job_event(kind, "7", ts, {"n1": ["GPU-A"]} if kind == "STARTED" else None, user=user,
                       project=f"p-{user}")  # fmt: skip
        ev["submit_ts_ms"] = start - MINUTE_MS
        out.append(ev)
    return out


@cache
def arrivals() -> tuple[list[Item], list[Item]]:
    """The job stage's input for the first job 7 and for the second, in arrival order, offsets growing
    across both: each job's events, then its device-minutes (from the node stage, in memory)."""
    first, second = life("ana", T0), life("bob", SECOND_START)
    records: list[tuple[Any, bytes, dict[str, Any]]] = [(INVENTORY, node_key("c1", "n1"), inventory("n1", ["GPU-A"]))]
    for s in range(0, 80 * 60, 10):  # a busy scrape every 10 s for 80 minutes
        ts = T0 + s * 1000
        records += [(JOB_EVENTS, job_key("c1", "7"), e) for e in first + second if ts - 10_000 < e["ts_ms"] <= ts]
        records.append((DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", ts, [device("GPU-A", 0, sm=0.9)])))
    minutes = [m for m in run_in_memory(records, SETTINGS).device_minutes if m["job_id"] == "7"]
    offsets = {"ev": 0, "dm": 0}

    def items(events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Item]:
        out: list[Item] = []
        for kind, rec in [("ev", e) for e in events] + [("dm", r) for r in rows]:
            out.append((kind, offsets[kind], rec))
            offsets[kind] += 1
        return out

    a = items(first, [m for m in minutes if m["minute_start_ms"] < SECOND_START])
    b = items(second, [m for m in minutes if m["minute_start_ms"] >= SECOND_START])
    return a, b


def restored(states: dict[str, bytes]) -> JobPartition:
    """A partition as a driver makes one at assignment: the clock observed, its states read back."""
    part = JobPartition(SETTINGS)
    part.horizon.observe_clock(int(time.time() * 1000))
    for job, value in states.items():
        part.restore_state(job, decode_job_state(value))
    return part


def feed(part: JobPartition, items: list[Item], states: dict[str, bytes], now_ms: int) -> list[dict[str, Any]]:
    """Feed, drain and tick at `now_ms` as the drivers do; the job-minutes out, the states written."""
    for kind, offset, rec in items:
        if kind == "ev":
            assert part.on_job_event(rec, offset)
        else:
            assert part.on_device_minute(rec, offset)
    minutes = []
    for out in (part.drain(), part.tick(now_ms)):
        minutes += out.job_minutes
        states.update({j: encode_job_state(st) for j, st in out.states.items()})
    return minutes


def first_life() -> dict[str, bytes]:
    """The states written by a stage that ran the first job 7 to its end and forgot it."""
    states: dict[str, bytes] = {}
    minutes = feed(restored({}), arrivals()[0], states, FIRST_END + 30 * MINUTE_MS)
    assert sum(m["allocated_s"] for m in minutes) == 600 and {m["user"] for m in minutes} == {"ana"}
    return states


def test_the_tombstone_keeps_the_end_of_the_forgotten_job() -> None:
    states = first_life()
    assert decode_job_state(states[JOB]) == Forgotten(FIRST_END)
    assert states[JOB] == b'{"ended_ms": %d, "forgotten": true}' % FIRST_END


def test_after_a_restart_a_replay_of_the_forgotten_job_is_passed_over() -> None:
    states = first_life()
    part = restored(states)
    assert feed(part, arrivals()[0], states, FIRST_END + 31 * MINUTE_MS) == []
    assert {why for why, _, _ in part.skipped} == {"job forgotten"} and len(part.skipped) == 10
    assert part.table.job(JOB) is None and JOB not in part.states


def test_after_a_restart_a_new_job_under_the_id_gets_its_job_minutes() -> None:
    states = first_life()
    part = restored(states)
    minutes = feed(part, arrivals()[1], states, SECOND_START + 11 * MINUTE_MS)
    assert [m["minute_start_ms"] for m in minutes] == [SECOND_START + i * MINUTE_MS for i in range(10)]
    assert sum(m["allocated_s"] for m in minutes) == 600
    assert {(m["user"], m["project"]) for m in minutes} == {("bob", "p-bob")}


def test_a_tombstone_without_its_end_restores_as_before() -> None:
    """Written by an earlier version: end 0, which passes over every job under the id, the second one too."""
    assert decode_job_state(b'{"forgotten": true}') == Forgotten(0)
    states = {JOB: b'{"forgotten": true}'}
    part = restored(states)
    assert feed(part, arrivals()[0], states, FIRST_END + 31 * MINUTE_MS) == []
    assert feed(part, arrivals()[1], states, SECOND_START + 11 * MINUTE_MS) == []
    assert part.table.forgotten(JOB, SECOND_START) and states == {JOB: b'{"forgotten": true}'}
