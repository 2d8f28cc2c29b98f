"""A job id used again by another job, through the whole pipeline in memory (issue 18, item 3): job 7 runs
10 minutes and ends; once the job stage has forgotten it, the reinstalled scheduler's job 7 (another user,
another submit time) runs 10 minutes on the same GPU. The node stage charges each job its own device-minutes
(processors/attribution.py `_new_life`). The job stage must give the second job its job-minutes (the idle
state machine and its warnings read them) as it does the first: a forgotten job's tombstone passes over only
what is at or before its end (`AllocationTable.forgotten`). A tombstone a restart restores keeps that end:
tests/unit/test_job_stage_tombstones.py."""

from __future__ import annotations

from typing import Any

from base.processor_settings import ProcessorSettings
from processors.pipeline import PipelineResult, run_in_memory
from processors.testing import T0, device, inventory, job_event, scrape
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key

MIN = 60_000
SECOND_START = T0 + 60 * MIN  # the second job starts an hour after the first ended


def life(user: str, start: int, submit: int) -> list[tuple[Any, bytes, dict[str, Any]]]:
    out = []
    for kind, ts in (("STARTED", start), ("ENDED", start + 10 * MIN)):
        ev = job_event(kind, "7", ts, {"n1": ["GPU-A"]} if kind == "STARTED" else None, user=user,
                       project=f"p-{user}")  # fmt: skip
        ev["submit_ts_ms"] = submit
        out.append((JOB_EVENTS, job_key("c1", "7"), ev))
    return out


def records() -> list[tuple[Any, bytes, dict[str, Any]]]:
    events = life("ana", T0, T0 - MIN) + life("bob", SECOND_START, SECOND_START - MIN)
    out: list[tuple[Any, bytes, dict[str, Any]]] = [(INVENTORY, node_key("c1", "n1"), inventory("n1", ["GPU-A"]))]
    for second in range(0, 80 * 60, 10):  # a scrape every 10 s for 80 minutes, busy throughout
        ts = T0 + second * 1000
        out += [e for e in events if e[2]["ts_ms"] <= ts and e[2]["ts_ms"] > ts - 10_000]
        busy = device("GPU-A", 0, sm=0.9, fb_mib=1000.0)
        out.append((DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", ts, [busy])))
    return out


def result() -> PipelineResult:
    return run_in_memory(records(), ProcessorSettings(realtime=False))


def test_each_job_of_a_reused_id_has_its_own_device_minutes() -> None:
    rows = [r for r in result().device_minutes if r["job_id"] == "7"]
    by_user = {u: sum(r["allocated_s"] for r in rows if r["user"] == u) for u in ("ana", "bob")}
    assert by_user == {"ana": 600, "bob": 600}
    assert {r["project"] for r in rows if r["minute_start_ms"] >= SECOND_START} == {"p-bob"}


def test_the_second_job_of_a_reused_id_has_its_job_minutes() -> None:
    minutes = [r for r in result().job_minutes if r["job_id"] == "7"]
    first = [r for r in minutes if r["minute_start_ms"] < SECOND_START]
    second = [r for r in minutes if r["minute_start_ms"] >= SECOND_START]
    assert sum(r["allocated_s"] for r in first) == 600 and {r["user"] for r in first} == {"ana"}
    assert sum(r["allocated_s"] for r in second) == 600 and {r["user"] for r in second} == {"bob"}
