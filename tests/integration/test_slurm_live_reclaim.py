"""The reclaim executor (sinks/reclaim.py) acting on jobs of the live Slurm: the checkpoint signal reaches
the job, the grace passes, the job is requeued (back in the queue, its GPUs free for others) or cancelled,
as squeue, scontrol and sacct confirm. `scontrol suspend` is shown to keep the job's GPUs, which is why the
executor refuses SUSPEND for a Slurm job."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from unit.test_reclaim import Recorder

from sinks.reclaim import ReclaimExecutor
from stack.slurm.cluster import SlurmClient


def action(kind: str, job_id: str) -> dict[str, Any]:
    return {"action_id": f"{kind}-{job_id}", "cluster": "gpuledger", "job_id": job_id, "scheduler": "SLURM",
            "action": kind, "dry_run": False}  # fmt: skip


def checkpointing_job(slurm: SlurmClient, marker: Path) -> str:
    """A running GPU job that writes `marker` when it gets SIGUSR1 (its checkpoint) and otherwise waits.
    Returns once its handler is installed (a signal before that would just kill the script)."""
    ready = marker.with_suffix(".ready")
    job = slurm.submit("--gres=gpu:h100:2", wrap=f"trap 'echo checkpoint >> {marker}' USR1; touch {ready}; "
                       "while true; do sleep 1; done")  # fmt: skip
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline, f"job {job} never started its script: {slurm.show_job(job)}"
        time.sleep(0.1)
    return job


def sacct_states(slurm: SlurmClient, job_id: str) -> list[str]:
    """Every run of the job in accounting (`-D`: requeued runs too), oldest first."""
    out = slurm.run("sacct", "-X", "-D", "-n", "-P", "-j", job_id, "-o", "State").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def test_checkpoint_then_requeue_signals_waits_and_requeues(slurm: SlurmClient, tmp_path: Path) -> None:
    marker = tmp_path / "checkpointed"
    job = checkpointing_job(slurm, marker)
    recorder = Recorder()
    started = time.monotonic()
    out = ReclaimExecutor(recorder, dry_run=False, signal="USR1", grace_s=3).execute(
        action("CHECKPOINT_THEN_REQUEUE", job))
    assert [(o.command, o.status) for o in out] == [
        (f"scancel --signal=USR1 --full {job}", "ok"), ("wait 3s for the checkpoint", "ok"),
        (f"scontrol requeuehold {job}", "ok")], out  # fmt: skip
    assert time.monotonic() - started >= 3
    assert marker.read_text(encoding="utf-8").strip() == "checkpoint"  # the job had its chance
    assert slurm.wait_for_state(job, "PENDING") == "PENDING"
    assert slurm.show_job(job)["Restarts"] == "1"
    assert sacct_states(slurm, job)[0] == "REQUEUED"
    # Its GPUs are free: another job gets the same two h100 at once.
    other = slurm.submit("--gres=gpu:h100:2")
    slurm.wait_for_state(other, "RUNNING", timeout=30)
    assert slurm.gres_indices(other) == {"gpu-node-1": (0, 1)}


def test_cancel_ends_the_job(slurm: SlurmClient) -> None:
    job = slurm.submit("--gres=gpu:a100:2")
    slurm.wait_for_state(job, "RUNNING")
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("CANCEL", job))
    assert [(o.command, o.status) for o in out] == [(f"scancel {job}", "ok")]
    slurm.wait_for_state(job, "CANCELLED")
    deadline = time.monotonic() + 30
    while sacct_states(slurm, job) != ["CANCELLED"] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sacct_states(slurm, job) == ["CANCELLED"]


def test_suspend_keeps_the_gpus_so_the_executor_refuses_it(slurm: SlurmClient) -> None:
    holder = slurm.submit("--gres=gpu:h100:2")
    slurm.wait_for_state(holder, "RUNNING")
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("SUSPEND", holder))
    assert [o.status for o in out] == ["failed"] and "keeps its GPUs" in out[0].detail
    assert slurm.state(holder) == "RUNNING"  # nothing was run

    # What Slurm does with a suspended job: its processes stop, its GPUs stay allocated to it.
    slurm.run("scontrol", "suspend", holder)
    slurm.wait_for_state(holder, "SUSPENDED")
    waiting = slurm.submit("--gres=gpu:h100:2")
    time.sleep(6)  # three scheduling passes (sched_interval=2, bf_interval=2)
    assert slurm.state(waiting) == "PENDING" and slurm.show_job(waiting)["Reason"] == "Resources"
    assert slurm.gres_indices(holder) == {"gpu-node-1": (0, 1)}
    slurm.run("scancel", holder)
    slurm.wait_for_state(waiting, "RUNNING", timeout=30)  # freed only when the holder ended
