"""A job-minute is summed only once the job stage holds every row its nodes wrote for it (issue 18).

Job 9 holds GPU-A from the start; an UPDATED 90 s in names GPU-B too (a pod whose devices the watcher learnt
late). The node stage read that UPDATED and wrote two rows for minute 1. The job stage reads its inputs
independently: here it has the STARTED only when minute 1's rows come, one per batch. By its own allocation
table one row was due, and it summed minute 1 from GPU-A's row alone; GPU-B's row, read next, was passed over
as a minute already out. Each row now carries how many rows the node stage wrote for the job on its node in
that minute (`job_node_rows`), and the job stage waits for them."""

from __future__ import annotations

from typing import Any

from base.processor_settings import ProcessorSettings
from processors.pipeline import run_in_memory
from processors.stages import NODE_ROWS_WAIT_MS, JobPartition
from processors.testing import T0, device, inventory, job_event, scrape
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key

MIN = 60_000
STARTED = job_event("STARTED", "9", T0, {"n1": ["GPU-A"]})
UPDATED = job_event("UPDATED", "9", T0 + 90_000, {"n1": ["GPU-A", "GPU-B"]})


def node_rows() -> list[dict[str, Any]]:
    """Job 9's device-minutes as the node stage writes them (it reads the UPDATED in time)."""
    out: list[tuple[Any, bytes, dict[str, Any]]] = [
        (INVENTORY, node_key("c1", "n1"), inventory("n1", ["GPU-A", "GPU-B"])),
        (JOB_EVENTS, job_key("c1", "9"), STARTED),
    ]
    for second in range(0, 4 * 60):
        ts = T0 + second * 1000
        if ts == UPDATED["ts_ms"]:
            out.append((JOB_EVENTS, job_key("c1", "9"), UPDATED))
        devices = [device("GPU-A", 0, sm=0.9, fb_mib=1000.0), device("GPU-B", 1, sm=0.9, fb_mib=1000.0)]
        out.append((DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", ts, devices)))
    rows = run_in_memory(out, ProcessorSettings(realtime=False)).device_minutes
    return sorted((r for r in rows if r["job_id"] == "9"), key=lambda r: (r["minute_start_ms"], r["device_uuid"]))


def test_the_node_stage_says_how_many_rows_it_wrote_for_the_job() -> None:
    rows = node_rows()
    assert [(r["minute_start_ms"] - T0, r["device_uuid"], r["job_node_rows"]) for r in rows[:3]] == [
        (0, "GPU-A", 1),
        (MIN, "GPU-A", 2),
        (MIN, "GPU-B", 2),
    ]


def test_a_minute_waits_for_the_rows_of_an_update_the_job_stage_has_not_read() -> None:
    rows = node_rows()
    stage = JobPartition(ProcessorSettings(realtime=False))
    stage.on_job_event(STARTED, 0)  # the UPDATED is not read yet
    emitted: list[dict[str, Any]] = []
    for offset, row in enumerate(rows[:3]):
        stage.on_device_minute(row, offset)
        emitted += stage.drain().job_minutes
        if offset == 1:
            assert [jm["minute_start_ms"] - T0 for jm in emitted] == [0]  # minute 1 waits for GPU-B's row
    assert [(jm["minute_start_ms"] - T0, jm["allocated_s"]) for jm in emitted] == [(0, 60), (MIN, 60 + 30)]


def test_rows_promised_and_never_written_hold_the_minute_only_so_long() -> None:
    """A row count no rows answer (lost, or forged) holds the minute until a later minute comes from that
    node, or the partition has read `NODE_ROWS_WAIT_MS` past it: the minute goes out with what came."""
    rows = node_rows()
    stage = JobPartition(ProcessorSettings(realtime=False))
    stage.on_job_event(STARTED, 0)
    stage.on_job_event(UPDATED, 1)
    promised = {**rows[1], "job_node_rows": 3}  # minute 1, GPU-A, 3 rows promised
    stage.on_device_minute(rows[0], 0)
    stage.on_device_minute(promised, 1)
    stage.on_device_minute(rows[2], 2)
    assert [jm["minute_start_ms"] - T0 for jm in stage.drain().job_minutes] == [0]
    stage.on_device_minute(rows[3], 3)  # minute 2 from the same node
    assert [jm["minute_start_ms"] - T0 for jm in stage.drain().job_minutes] == [MIN]

    other = JobPartition(ProcessorSettings(realtime=False))
    other.on_job_event(STARTED, 0)
    other.on_job_event(UPDATED, 1)
    other.on_device_minute({**rows[1], "job_node_rows": 3}, 0)
    other.on_device_minute(rows[2], 1)
    assert other.drain().job_minutes == []
    waited = NODE_ROWS_WAIT_MS // MIN
    out_after: list[int] = []
    for k in range(1, waited + 1):  # another job's minutes on this partition, read on as it goes
        later = {**rows[0], "job_id": "other", "minute_start_ms": rows[1]["minute_start_ms"] + k * MIN}
        assert other.on_device_minute(later, 1 + k)
        out_after += [k for jm in other.drain().job_minutes if jm["job_id"] == "9"]
    assert out_after == [waited]
