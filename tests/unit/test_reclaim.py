"""Reclaim executor: plans per scheduler, dry-run by default, real commands via fake Slurm tools."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from base.errors import ConfigError
from sinks.reclaim import JobNow, Outcome, ReclaimExecutor, plan, recheck


class Recorder:
    """The executor's outcomes kept in memory (the ClickHouse recorder's contract); test_reclaim_resume.py and
    test_slurm_live_reclaim.py use it too."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def record(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes.extend(outcomes)

    def has_run(self, action_id: str) -> bool:
        return any(o.action_id == action_id and not o.dry_run for o in self.outcomes)


def action(kind: str, **kw: Any) -> dict[str, Any]:
    return {"action_id": "x1", "cluster": "c1", "job_id": "4242", "scheduler": "SLURM", "action": kind,
            "dry_run": False, "reason": "idle", **kw}  # fmt: skip


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol and scancel that log their arguments; `scontrol requeuehold 13` fails like Slurm does."""
    calls = tmp_path / "calls.log"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("scontrol", "scancel"):
        script = bindir / tool
        script.write_text(
            "#!/bin/sh\n"
            f'echo "{tool} $*" >> "{calls}"\n'
            'if [ "$1 $2" = "requeuehold 13" ]; then echo "Requested operation is presently disabled" >&2; exit 1; fi\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_slurm_plans() -> None:
    assert [s.describe() for s in plan(action("REQUEUE"))] == ["scontrol requeuehold 4242"]
    assert [s.describe() for s in plan(action("CANCEL"))] == ["scancel 4242"]
    assert [s.describe() for s in plan(action("CHECKPOINT_THEN_REQUEUE"), signal="USR2", grace_s=30)] == [
        "scancel --signal=USR2 --full 4242", "wait 30s for the checkpoint", "scontrol requeuehold 4242",
    ]  # fmt: skip
    assert [s.describe() for s in plan(action("CHECKPOINT_THEN_CANCEL"))][-1] == "scancel 4242"
    assert plan(action("REQUEUE", job_id="77_3"))[0].argv == ("scontrol", "requeuehold", "77_3")


def test_slurm_suspend_is_refused_it_keeps_the_gpus(fake_slurm: Path) -> None:
    """`scontrol suspend` leaves a Slurm job's GPUs allocated (tests/integration/test_slurm_live_reclaim.py
    shows it on a live Slurm): it reclaims nothing, so it is never planned, and a live executor records why."""
    with pytest.raises(ConfigError, match="keeps its GPUs"):
        plan(action("SUSPEND"))
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("SUSPEND"))
    assert [o.status for o in out] == ["failed"] and "keeps its GPUs" in out[0].detail
    assert not fake_slurm.exists()  # nothing ran
    assert [s.kind for s in plan(action("SUSPEND", scheduler="KUEUE", job_id="team-a/w1"))] == ["kueue-deactivate"]


@pytest.mark.parametrize(
    "bad",
    [{"job_id": "42; rm -rf /"}, {"job_id": "--all"}, {"action": "NUKE"}, {"scheduler": "PBS"},
     {"scheduler": "KUEUE", "job_id": "no-slash"}],
)  # fmt: skip
def test_bad_actions_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        plan(action("REQUEUE", **bad))


def test_dry_run_by_default_records_the_plan(fake_slurm: Path) -> None:
    rec = Recorder()
    out = ReclaimExecutor(rec, clock_ms=lambda: 5).execute(action("CHECKPOINT_THEN_CANCEL"))
    assert [o.status for o in out] == ["planned"] * 3 and all(o.dry_run for o in out)
    assert rec.outcomes == out and not fake_slurm.exists()
    # An action the processors marked dry-run stays dry even on a live executor.
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("REQUEUE", dry_run=True))
    assert out[0].status == "planned" and not fake_slurm.exists()


def test_live_checkpoint_then_requeue_runs_the_commands(fake_slurm: Path) -> None:
    slept: list[float] = []
    rec = Recorder()
    ex = ReclaimExecutor(rec, dry_run=False, grace_s=90, sleep=slept.append, clock_ms=lambda: 7)
    out = ex.execute(action("CHECKPOINT_THEN_REQUEUE"))
    assert [o.status for o in out] == ["ok", "ok", "ok"] and slept == [90]
    assert fake_slurm.read_text().splitlines() == ["scancel --signal=USR1 --full 4242", "scontrol requeuehold 4242"]
    assert [(o.step, o.status) for o in rec.outcomes] == [(0, "started"), (1, "ok"), (2, "ok"), (3, "ok")]
    # Redelivered or replayed after a restart: not run again.
    again = ex.execute(action("CHECKPOINT_THEN_REQUEUE"))
    assert [o.status for o in again] == ["duplicate"] and len(fake_slurm.read_text().splitlines()) == 2


def test_a_failed_step_stops_the_action(fake_slurm: Path) -> None:
    out = ReclaimExecutor(Recorder(), dry_run=False, sleep=lambda s: None).execute(
        action("CHECKPOINT_THEN_REQUEUE", job_id="13")
    )
    assert [o.status for o in out] == ["ok", "ok", "failed"]
    assert "exit 1" in out[2].detail and "presently disabled" in out[2].detail


def test_missing_tool_is_a_recorded_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("REQUEUE"))
    assert out[0].status == "failed" and "not found" in out[0].detail


def test_kueue_deactivates_the_workload() -> None:
    patches: list[tuple[str, str, dict[str, Any]]] = []
    ex = ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=lambda ns, n, b: patches.append((ns, n, b)),
                         kueue_read=None)  # fmt: skip
    out = ex.execute(action("REQUEUE", scheduler="KUEUE", job_id="team-a/job-train-7f3c"))
    assert out[0].status == "ok" and patches == [("team-a", "job-train-7f3c", {"spec": {"active": False}})]

    def refuse(ns: str, n: str, b: dict[str, Any]) -> None:
        raise RuntimeError("403 Forbidden")

    failed = ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=refuse).execute(
        action("SUSPEND", scheduler="KUEUE", job_id="team-a/w1")
    )
    assert failed[0].status == "failed" and "403" in failed[0].detail


def test_invalid_action_is_recorded_not_raised() -> None:
    rec = Recorder()
    out = ReclaimExecutor(rec).execute(action("REQUEUE", job_id="../../x"))
    assert out[0].status == "failed" and rec.outcomes == out


# -- the re-check before acting ------------------------------------------------------------------

IDLE_NOW = JobNow(last_open_ms=1_000, last_close_ms=None, last_minute_ms=60_000, last_minute=(0, 0, 120))


@pytest.mark.parametrize(
    "now,reason",
    [
        (IDLE_NOW, "ok"),
        (JobNow(1_000, 500, 60_000, (0, 0, 60)), "ok"),  # closed before a later resume: holds its devices
        (JobNow(None, None, 60_000, (0, 0, 60)), "not-allocated"),
        (JobNow(1_000, 90_000, 60_000, (0, 0, 60)), "ended"),
        (JobNow(1_000, 1_000, 60_000, (0, 0, 60)), "ended"),  # ended at the very moment it started
        (JobNow(1_000, None, None, None), "no-minutes"),
        (JobNow(1_000, None, 60_000, (5, 0, 115)), "busy"),
        (JobNow(1_000, None, 60_000, (0, 30, 90)), "busy"),  # starved is the job's own work, not idle
        (JobNow(1_000, None, 60_000, (0, 0, 0)), "dark"),  # no telemetry is not evidence of idleness
    ],
)
def test_recheck_decides_from_allocation_and_the_latest_minute(now: JobNow, reason: str) -> None:
    verdict = recheck(now)
    assert (verdict.ok, verdict.reason) == (reason == "ok", reason)


def test_a_job_that_ended_or_woke_up_is_not_reclaimed(fake_slurm: Path) -> None:
    states = {"4242": JobNow(1_000, 90_000, 60_000, (0, 0, 60)), "4243": JobNow(1_000, None, 60_000, (40, 0, 20)),
              "4244": IDLE_NOW}  # fmt: skip
    asked: list[tuple[str, str]] = []

    def job_state(cluster: str, job_id: str) -> JobNow:
        asked.append((cluster, job_id))
        return states[job_id]

    rec = Recorder()
    live = ReclaimExecutor(rec, dry_run=False, job_state=job_state)
    ended = live.execute(action("CANCEL", job_id="4242"))
    busy = live.execute(action("CANCEL", job_id="4243", action_id="x2"))
    assert [(o.status, o.detail.split(":")[:2]) for o in ended + busy] == [
        ("skipped", ["re-check", " ended"]), ("skipped", ["re-check", " busy"])]  # fmt: skip
    assert not fake_slurm.exists()  # nothing ran
    done = live.execute(action("CANCEL", job_id="4244", action_id="x3"))
    assert [o.status for o in done] == ["ok"] and fake_slurm.read_text() == "scancel 4244\n"
    assert asked == [("c1", "4242"), ("c1", "4243"), ("c1", "4244")]
    assert live.skipped == {"ended": 1, "busy": 1}

    # A dry run re-checks too: it says what it would do only for a job still allocated and idle.
    dry = ReclaimExecutor(Recorder(), dry_run=True, job_state=job_state)
    assert [o.status for o in dry.execute(action("REQUEUE", job_id="4242"))] == ["skipped"]
    assert [o.status for o in dry.execute(action("REQUEUE", job_id="4244"))] == ["planned"]


def test_a_failed_recheck_does_not_act(fake_slurm: Path) -> None:
    def unreachable(cluster: str, job_id: str) -> JobNow:
        raise ConnectionError("ClickHouse down")

    ex = ReclaimExecutor(Recorder(), dry_run=False, job_state=unreachable)
    (out,) = ex.execute(action("CANCEL"))
    assert out.status == "skipped" and "check-failed: ConnectionError: ClickHouse down" in out.detail
    assert not fake_slurm.exists() and ex.skipped == {"check-failed": 1}


def test_kueues_eviction_is_read_back_into_the_outcome_within_a_few_seconds() -> None:
    """After the patch the Workload is read back: Kueue's Evicted condition (reason Deactivated) goes into
    the outcome; a Workload Kueue has not evicted yet is read a few times, 3 s at most, and stays `ok`."""
    evicted = {"type": "Evicted", "status": "True", "reason": "Deactivated", "message": "The workload is deactivated"}
    reads: list[tuple[str, str]] = []

    def read(ns: str, n: str) -> dict[str, Any]:
        reads.append((ns, n))
        return {"status": {"conditions": [evicted] if len(reads) >= 2 else []}}

    slept: list[float] = []
    ex = ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=lambda ns, n, b: None, kueue_read=read,
                         sleep=slept.append)  # fmt: skip
    (done,) = ex.execute(action("SUSPEND", scheduler="KUEUE", job_id="team-a/w1"))
    assert done.status == "ok"
    assert done.detail == "Workload deactivated; Kueue: Evicted/Deactivated: The workload is deactivated"
    assert reads == [("team-a", "w1")] * 2 and slept == [0.5]

    slept.clear()
    never = ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=lambda ns, n, b: None,
                            kueue_read=lambda ns, n: {"status": {}}, sleep=slept.append)  # fmt: skip
    (late,) = never.execute(action("SUSPEND", scheduler="KUEUE", job_id="team-a/w2"))
    assert late.status == "ok" and "not evicted it within 3 s" in late.detail and sum(slept) <= 3

    def unreadable(ns: str, n: str) -> dict[str, Any]:
        raise RuntimeError("403 Forbidden")

    quiet = ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=lambda ns, n, b: None, kueue_read=unreadable)
    (unread,) = quiet.execute(action("SUSPEND", scheduler="KUEUE", job_id="team-a/w3"))
    assert unread.status == "ok" and "not read: RuntimeError: 403" in unread.detail
