"""The reclaim worker killed -9 mid-batch, four times, on the fault suite's broker and ClickHouse server.

200 Slurm jobs are allocated and idle in the warehouse (a STARTED event, an idle latest job-minute), and a live
CANCEL action for each is published 20 a second while `reclaim run --execute` carries them out with a fake
`scancel` on its PATH (each call one line in a file). It is killed -9 each time 30 more calls were made while
more are to come; after the fourth kill a last `reclaim run --execute --max-idle-s 3` finishes.

The executor is at most once per action id (a `started` row before the first command, each step's outcome
after it): no job is cancelled twice, whatever the kills cut. Its price is what a kill cuts between the
`started` row and the command's outcome: that action is not run again (its command ran or not, its outcome is
missing), at most one per kill, since the handler runs one action at a time. Every other action was cancelled
once, with its outcome recorded, and the group's committed offsets reach the topic's end.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from contract_records import job_event
from fault_harness import PipelineRun, Stack, log, wait_until

from schemas import topics
from schemas.topics import RECLAIM_ACTIONS, job_key
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from streams.publish import RecordPublisher

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

JOBS_N = 200
WAVE, WAVE_EVERY_S = 20, 1.0
CALLS_PER_LIFE = 30
KILLS = 4
MINUTE_COLUMNS = ("cluster", "job_id", "minute_start_ms", "device_count", "allocated_s", "active_s", "starved_s",
                  "idle_s", "dark_s", "sm_weighted_s", "sample_count")  # fmt: skip
FAKE_SCANCEL = """#!/bin/sh
echo "$*" >> "$FAKE_SLURM_LOG"
"""


class ReclaimRun(PipelineRun):
    """A pipeline run's topics, database and environment, with a fake `scancel` first on the PATH."""

    def __init__(self, stack: Stack, root: Path) -> None:
        super().__init__(stack, "kill-reclaim", root)
        self.tools = root / "tools"
        self.tools.mkdir(exist_ok=True)
        scancel = self.tools / "scancel"
        scancel.write_text(FAKE_SCANCEL)
        scancel.chmod(0o755)
        self.calls = root / "scancel.log"
        self.calls.touch()

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(PATH=f"{self.tools}:{os.environ['PATH']}", FAKE_SLURM_LOG=str(self.calls), **extra)

    def cancelled(self) -> list[str]:
        return self.calls.read_text().split()

    def reclaim_committed(self) -> int:
        topic = self.topic(RECLAIM_ACTIONS)
        consumer = Consumer({"bootstrap.servers": self.stack.bootstrap, "group.id": f"{self.sink_group}-reclaim"})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            tps = consumer.committed([TopicPartition(topic, p) for p in meta], timeout=10)
            return sum(max(tp.offset, 0) for tp in tps)
        finally:
            consumer.close()


def _job_id(i: int) -> str:
    return str(7000 + i)


def _seed_idle_jobs(client: Any, t0: int) -> None:
    """Each job allocated since t0 (STARTED, no closing event) and idle in its latest job-minute."""
    events, _ = SINKS[topics.JOB_EVENTS.name]
    records = [job_event("STARTED", t0, job_id=_job_id(i), event_id=f"e-{i}", gang_size=1) for i in range(JOBS_N)]
    pending = [Pending(events, row, Origin("e", 0, i)) for i, r in enumerate(records) for row in events.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected
    minutes = [["c1", _job_id(i), t0 + 60_000, 1, 60, 0, 0, 60, 0, 0.0, 2] for i in range(JOBS_N)]
    client.insert("job_minutes", minutes, column_names=list(MINUTE_COLUMNS))


def _action(i: int, now_ms: int) -> dict[str, Any]:
    return {
        "action_id": f"reclaimkill-{i}", "ts_ms": now_ms, "cluster": "c1", "job_id": _job_id(i), "scheduler": "SLURM",
        "action": "CANCEL", "dry_run": False, "reason": "idle 60 minutes", "device_uuids": [f"GPU-{i:04d}"],
        "user": "alice", "project": "p-vision",
    }  # fmt: skip


def test_reclaim_killed_9_mid_batch_cancels_no_job_twice(stack: Stack, tmp_path: Any) -> None:
    run = ReclaimRun(stack, tmp_path)
    with run:
        client = stack.client(run.database)
        now_ms = int(time.time() * 1000)
        _seed_idle_jobs(client, now_ms // 60_000 * 60_000 - 3_600_000)  # minutes start on the minute
        pub = RecordPublisher(run.kafka())
        published = 0

        def publish_wave() -> None:
            nonlocal published
            for i in range(published, min(published + WAVE, JOBS_N)):
                pub.publish(RECLAIM_ACTIONS, job_key("c1", _job_id(i)), _action(i, now_ms))
            pub.flush()
            published = min(published + WAVE, JOBS_N)

        publish_wave()
        kills, last, next_wave = 0, 0, time.monotonic() + WAVE_EVERY_S
        deadline = time.monotonic() + 420
        worker = run.spawn("reclaim", "reclaim", "run", "--execute")
        run.more.append(worker)
        while kills < KILLS and time.monotonic() < deadline:
            if published < JOBS_N and time.monotonic() >= next_wave:
                publish_wave()
                next_wave = time.monotonic() + WAVE_EVERY_S
            done = len(run.cancelled())
            if done >= JOBS_N:
                break
            if done >= last + CALLS_PER_LIFE:
                run.kill(worker)
                kills += 1
                last = len(run.cancelled())
                log(f"kill-reclaim: kill -9 #{kills} after {last} cancels of {published} published, "
                    f"{run.reclaim_committed()} records committed")  # fmt: skip
                if kills < KILLS:
                    worker = run.spawn("reclaim", "reclaim", "run", "--execute")
                    run.more.append(worker)
            time.sleep(0.02)
        while published < JOBS_N:
            publish_wave()
        assert kills == KILLS, f"{len(run.cancelled())} cancels: the kills came too late to land mid-batch"
        out = run.cli("reclaim", "run", "--execute", "--max-idle-s", "3", timeout_s=300)

        calls = Counter(run.cancelled())
        assert all(n == 1 for n in calls.values()), {j: n for j, n in calls.items() if n > 1}
        rows = client.query(
            "SELECT action_id, step, status FROM action_outcomes FINAL WHERE NOT dry_run ORDER BY action_id, step"
        ).result_rows
        started = {a for a, step, status in rows if step == 0 and status == "started"}
        finished = {a: status for a, step, status in rows if step == 1}
        ids = {f"reclaimkill-{i}" for i in range(JOBS_N)}
        assert started == ids, f"{len(ids - started)} actions never started; the last run's log: {out[-3000:]}"
        assert all(status == "ok" for status in finished.values()), finished
        cut = sorted(ids - set(finished))  # started, outcome missing: not run again (at most once)
        assert len(cut) <= kills, cut
        for action_id in finished:
            assert calls[_job_id(int(action_id.rsplit("-", 1)[1]))] == 1, action_id
        wait_until(lambda: run.reclaim_committed() == JOBS_N, 30, "the reclaim group committed every action")
        ran_cut = [a for a in cut if calls[_job_id(int(a.rsplit("-", 1)[1]))]]
        log(f"kill-reclaim: {sum(calls.values())} cancels of {JOBS_N} jobs after {kills} kills; cut by a kill: "
            f"{cut} (of which the command ran: {ran_cut})")  # fmt: skip
