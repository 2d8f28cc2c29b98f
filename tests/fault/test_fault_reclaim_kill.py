"""The reclaim worker killed -9 mid-batch, four times, on the fault suite's broker and ClickHouse server.

200 Slurm jobs are allocated and idle in the warehouse (a STARTED event, an idle latest job-minute), and a live
action for each, CANCEL for even jobs and REQUEUE for odd ones, is published 20 a second while `reclaim run
--execute` carries them out against a stand-in Slurm on its PATH: `scancel` and `scontrol` that append each call
that changes a job to one file, and answer `scontrol show job -o <job>` from that file as slurmctld would (the
format of `scontrol show job`, tests/fixtures/slurm/scontrol-text: RUNNING with Restarts=0 until cancelled, then
CANCELLED; after a requeue PENDING with Restarts=1, held after a `requeuehold`; `slurm_load_jobs error: Invalid
job id specified` for a job it does not know). The worker is killed -9 each time 30 more calls were made while more
are to come; after the fourth kill a last `reclaim run --execute --max-idle-s 3` finishes.

Exactly once on the engine: a kill between an action's `started` row and its step's outcome leaves it in doubt;
the next life asks `scontrol show job` and records the outcome the engine shows (cancelled, or requeued since the
restart count kept in the started row) or runs the command now (sinks/reclaim_doubt.py). So every job got exactly
one call, of its action's kind, none missed, none twice; every action has its `started` row and an `ok` outcome;
the group's committed offsets reach the topic's end. The log says how many actions were in doubt and how each was
resolved.
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from contract_records import job_event
from fault_harness import PipelineRun, Stack, committed_total, log, wait_until

from schemas import topics
from schemas.topics import RECLAIM_ACTIONS, job_key
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from streams.publish import RecordPublisher

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

JOBS_N = 200
FIRST_JOB = 7000
WAVE, WAVE_EVERY_S = 20, 1.0
CALLS_PER_LIFE = 30
KILLS = 4
MINUTE_COLUMNS = ("cluster", "job_id", "minute_start_ms", "device_count", "allocated_s", "active_s", "starved_s",
                  "idle_s", "dark_s", "sm_weighted_s", "sample_count")  # fmt: skip
# One job as `scontrol show job -o` prints it (Slurm 22.05's fields and order, one line); the state fields are
# filled from the calls recorded so far.
SHOW_JOB = (
    "JobId={job} JobName=train UserId=alice(1000) GroupId=alice(1000) MCS_label=N/A Priority=4294901757 Nice=0 "
    "Account=p-vision QOS=normal JobState={state} Reason={reason} Dependency=(null) Requeue=1 Restarts={restarts} "
    "BatchFlag=1 Reboot=0 ExitCode={exit} RunTime=01:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-12-07T12:00:00 EligibleTime=2026-12-07T12:00:00 AccrueTime=2026-12-07T12:00:00 "
    "StartTime=2026-12-07T12:00:01 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-12-07T12:00:01 Scheduler=Main Partition=gpu AllocNode:Sid=head:4242 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList={nodes} BatchHost=gpu-n01 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
    "ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=1G,node=1,billing=1,gres/gpu=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
    "CoreSpec=* MinCPUsNode=1 MinMemoryNode=1G MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=/home/alice/train.sh WorkDir=/home/alice "
    "Power= TresPerNode=gres:gpu:1"
)
FAKE_SLURM = """#!{python}
# scancel / scontrol stand-in: calls that change a job are appended to $FAKE_SLURM_LOG (under a lock, a line each);
# `scontrol show job -o <job>` answers from them.
import fcntl, os, sys
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
calls_path = os.environ["FAKE_SLURM_LOG"]
first, count = int(os.environ["FAKE_SLURM_FIRST"]), int(os.environ["FAKE_SLURM_JOBS"])
if tool == "scontrol" and args[:2] == ["show", "job"]:
    job = args[-1]
    with open(os.environ["FAKE_SLURM_SHOWS"], "a") as fh:
        fh.write(job + "\\n")
    if not (job.isdigit() and first <= int(job) < first + count):
        sys.stderr.write("slurm_load_jobs error: Invalid job id specified\\n")
        sys.exit(1)
    calls = [line.split() for line in open(calls_path).read().splitlines()]
    mine = [c[:-1] for c in calls if c and c[-1] == job]
    requeues = [c for c in mine if c[:2] in (["scontrol", "requeue"], ["scontrol", "requeuehold"])]
    if ["scancel"] in mine:
        state, reason, code, nodes = "CANCELLED", "None", "0:15", "gpu-n01"
    elif requeues:
        held = requeues[-1][1] == "requeuehold"
        state, reason, code, nodes = "PENDING", "job_requeued_in_held_state" if held else "BeginTime", "0:0", "(null)"
    else:
        state, reason, code, nodes = "RUNNING", "None", "0:0", "gpu-n01"
    print({template!r}.format(job=job, state=state, reason=reason, restarts=len(requeues), exit=code, nodes=nodes))
    sys.exit(0)
with open(calls_path, "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    fh.write(" ".join([tool, *args]) + "\\n")
"""


class ReclaimRun(PipelineRun):
    """A pipeline run's topics, database and environment, with the stand-in `scancel` and `scontrol` first on the
    PATH."""

    def __init__(self, stack: Stack, root: Path) -> None:
        super().__init__(stack, "kill-reclaim", root)
        self.tools = root / "tools"
        self.tools.mkdir(exist_ok=True)
        for tool in ("scancel", "scontrol"):
            fake = self.tools / tool
            fake.write_text(FAKE_SLURM.format(python=sys.executable, template=SHOW_JOB))
            fake.chmod(0o755)
        self.calls = root / "slurm-calls.log"
        self.calls.touch()
        self.shows = root / "slurm-shows.log"
        self.shows.touch()

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(PATH=f"{self.tools}:{os.environ['PATH']}", FAKE_SLURM_LOG=str(self.calls),
                           FAKE_SLURM_SHOWS=str(self.shows), FAKE_SLURM_FIRST=str(FIRST_JOB),
                           FAKE_SLURM_JOBS=str(JOBS_N), **extra)  # fmt: skip

    def engine_calls(self) -> list[tuple[str, str]]:
        """(command, job) of every call that changed a job: ("scancel", "7000"), ("scontrol requeuehold", "7001")."""
        lines = [line.split() for line in self.calls.read_text().splitlines()]
        return [(" ".join(c[:-1]), c[-1]) for c in lines if c]

    def reclaim_committed(self) -> int:
        """Records of reclaim.actions the reclaim group has committed, over all partitions."""
        return committed_total(self.stack.bootstrap, f"{self.sink_group}-reclaim", self.topic(RECLAIM_ACTIONS))


def _job_id(i: int) -> str:
    return str(FIRST_JOB + i)


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
        "action": "CANCEL" if i % 2 == 0 else "REQUEUE", "dry_run": False, "reason": "idle 60 minutes",
        "device_uuids": [f"GPU-{i:04d}"],
        "user": "alice", "project": "p-vision",
    }  # fmt: skip


def test_reclaim_killed_9_mid_batch_acts_on_every_job_exactly_once(stack: Stack, tmp_path: Any) -> None:
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
            done = len(run.engine_calls())
            if done >= JOBS_N:
                break
            if done >= last + CALLS_PER_LIFE:
                run.kill(worker)
                kills += 1
                last = len(run.engine_calls())
                log(f"kill-reclaim: kill -9 #{kills} after {last} engine calls of {published} published, "
                    f"{run.reclaim_committed()} records committed")  # fmt: skip
                if kills < KILLS:
                    worker = run.spawn("reclaim", "reclaim", "run", "--execute")
                    run.more.append(worker)
            time.sleep(0.02)
        while published < JOBS_N:
            publish_wave()
        assert kills == KILLS, f"{len(run.engine_calls())} calls: the kills came too late to land mid-batch"
        out = run.cli("reclaim", "run", "--execute", "--max-idle-s", "3", timeout_s=300)

        calls = run.engine_calls()
        per_job = Counter(job for _, job in calls)
        assert all(n == 1 for n in per_job.values()), {j: n for j, n in per_job.items() if n > 1}
        assert set(per_job) == {_job_id(i) for i in range(JOBS_N)}, "jobs never acted on"
        for command, job in calls:  # each job got its own action's command
            expected = ("scancel",) if (int(job) - FIRST_JOB) % 2 == 0 else ("scontrol requeue", "scontrol requeuehold")
            assert command in expected, (job, command)
        rows = client.query(
            "SELECT action_id, step, status, detail FROM action_outcomes FINAL WHERE NOT dry_run "
            "ORDER BY action_id, step"
        ).result_rows
        started = {a for a, step, status, _ in rows if step == 0 and status == "started"}
        finished = {a: (status, detail) for a, step, status, detail in rows if step == 1}
        ids = {f"reclaimkill-{i}" for i in range(JOBS_N)}
        assert started == ids, f"{len(ids - started)} actions never started; the last run's log: {out[-3000:]}"
        assert set(finished) == ids, f"no outcome: {sorted(ids - set(finished))}; the last run's log: {out[-3000:]}"
        assert all(status == "ok" for status, _ in finished.values()), finished
        in_doubt = {a: d for a, (_, d) in finished.items() if d.startswith("in doubt after a restart")}
        assert len(in_doubt) <= kills, in_doubt  # one action at a time: a kill leaves at most one in doubt
        wait_until(lambda: run.reclaim_committed() == JOBS_N, 30, "the reclaim group committed every action")
        ran_now = sorted(a for a, d in in_doubt.items() if ": run now" in d)
        log(f"kill-reclaim: {len(calls)} engine calls for {JOBS_N} jobs (one each) after {kills} kills; "
            f"{len(run.shows.read_text().split())} `scontrol show job` queries; in doubt: {len(in_doubt)}, "
            f"found done by the engine: {sorted(set(in_doubt) - set(ran_now))}, run now: {ran_now}")  # fmt: skip
