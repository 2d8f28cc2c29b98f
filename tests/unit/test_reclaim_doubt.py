"""A reclaim action a kill -9 left in doubt (started, a step's outcome missing) is resolved by the engine's own
answer: recorded as done, or carried out now, never twice (sinks/reclaim_doubt.py, ReclaimExecutor._resume)."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from base.errors import ServiceError
from sinks.reclaim import Outcome, ReclaimExecutor, plan
from sinks.reclaim_doubt import Resolution, baseline, baseline_restarts, parse_show_job, slurm_in_doubt

FIXTURE = (
    Path(__file__).parents[1]
    / "fixtures/slurm/scontrol-text/irush-cs_slurm-scripts_t_get_jobs.t.scontrol-show-job-d.txt"
)


class Journal:
    """action_outcomes in memory, the latest outcome per (action, step) as FINAL reads it."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], Outcome] = {}

    def record(self, outcomes: Sequence[Outcome]) -> None:
        for o in outcomes:
            self.rows[(o.action_id, o.step)] = o

    def has_run(self, action_id: str) -> bool:
        return bool(self.outcomes_of(action_id))

    def outcomes_of(self, action_id: str) -> list[Outcome]:
        return sorted((o for (a, _), o in self.rows.items() if a == action_id and not o.dry_run), key=lambda o: o.step)


def action(kind: str, job: str = "4242") -> dict[str, Any]:
    return {"action_id": f"x-{kind}", "cluster": "c1", "job_id": job, "scheduler": "SLURM", "action": kind,
            "dry_run": False}  # fmt: skip


def show(state: str, reason: str = "None", restarts: int = 0) -> dict[str, str]:
    return {"JobId": "4242", "JobState": state, "Reason": reason, "Restarts": str(restarts)}


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """scontrol and scancel that log their arguments."""
    log = tmp_path / "calls.log"
    log.touch()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("scontrol", "scancel"):
        script = bindir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return log


def executor(journal: Journal, engine: dict[str, str] | Exception) -> ReclaimExecutor:
    def slurm_show(job_id: str) -> dict[str, str]:
        if isinstance(engine, Exception):
            raise engine
        return engine

    return ReclaimExecutor(journal, dry_run=False, progress=journal.outcomes_of, slurm_show=slurm_show,
                           clock_ms=lambda: 5, sleep=lambda s: None)  # fmt: skip


def cut_after_started(journal: Journal, act: dict[str, Any], detail: str = "1 step(s)") -> None:
    """What a kill leaves between the started row and the step's outcome."""
    journal.record([Outcome(act["action_id"], 0, 1, "c1", act["job_id"], "SLURM", act["action"], "", False,
                            "started", detail)])  # fmt: skip


def test_show_job_is_read_from_slurms_own_one_line_record() -> None:
    record = FIXTURE.read_text().split("\n\n")[0]  # `scontrol show job -d`; `-o` prints the same fields on one line
    fields = parse_show_job(" ".join(line.strip() for line in record.splitlines()))
    assert (fields["JobId"], fields["JobState"], fields["Reason"], fields["Restarts"]) == ("1", "RUNNING", "None", "0")
    assert baseline(fields) == "restarts=0" and baseline_restarts("1 step(s); restarts=3") == 3
    assert baseline_restarts("1 step(s)") is None and baseline({}) == ""
    assert parse_show_job("x" * 100_000 + " JobState=RUNNING") == {}  # bounded: only the first 64 KiB is read


@pytest.mark.parametrize(
    ("argv", "fields", "before", "expected"),
    [
        (("scancel", "1"), show("CANCELLED"), None, (False, "ok")),
        (("scancel", "1"), show("COMPLETED"), None, (False, "ok")),
        (("scancel", "1"), {}, None, (False, "ok")),  # purged from slurmctld: ended
        (("scancel", "1"), show("RUNNING"), None, (True, "")),
        (("scancel", "1"), show("PENDING", "Resources"), None, (True, "")),
        (("scontrol", "requeuehold", "1"), show("PENDING", "job_requeued_in_held_state", 1), None, (False, "ok")),
        (("scontrol", "requeue", "1"), show("RUNNING", restarts=1), 0, (False, "ok")),  # requeued and started again
        (("scontrol", "requeue", "1"), show("PENDING", "BeginTime", 1), 0, (False, "ok")),
        (("scontrol", "requeuehold", "1"), show("RUNNING", restarts=1), 1, (True, "")),  # not requeued yet
        (("scontrol", "requeuehold", "1"), show("RUNNING"), None, (True, "")),
        (("scontrol", "requeuehold", "1"), show("CANCELLED"), 0, (False, "skipped")),
        (("scontrol", "requeuehold", "1"), {}, 0, (False, "skipped")),
        (("scancel", "--signal=USR1", "--full", "1"), {}, None, (True, "")),  # a signal leaves no trace: again
    ],
)
def test_a_step_in_doubt_is_decided_by_what_slurmctld_shows(
    argv: tuple[str, ...], fields: dict[str, str], before: int | None, expected: tuple[bool, str]
) -> None:
    got: Resolution = slurm_in_doubt(argv, fields, before)
    assert (got.run, got.status) == expected, got.detail


def test_a_cancel_the_engine_shows_done_is_recorded_not_run_again(calls: Path) -> None:
    journal, act = Journal(), action("CANCEL")
    cut_after_started(journal, act)
    (out,) = executor(journal, show("CANCELLED")).execute(act)
    assert (out.step, out.status) == (1, "ok") and out.detail.startswith("in doubt after a restart")
    assert calls.read_text() == ""
    assert executor(journal, show("CANCELLED")).execute(act)[0].status == "duplicate"  # finished now: once


def test_a_cancel_the_engine_shows_not_done_is_run_now_once(calls: Path) -> None:
    journal, act = Journal(), action("CANCEL")
    cut_after_started(journal, act)
    (out,) = executor(journal, show("RUNNING")).execute(act)
    assert out.status == "ok" and ": run now" in out.detail
    assert calls.read_text().splitlines() == ["scancel 4242"]


def test_a_requeue_is_judged_by_the_restart_count_kept_in_its_started_row(calls: Path) -> None:
    journal, act = Journal(), action("REQUEUE")
    requeue = plan(act)[0].describe()  # scontrol requeue(hold) 4242
    (out,) = executor(journal, show("RUNNING", restarts=2)).execute(act)  # a first life, not cut
    started = journal.rows[(act["action_id"], 0)]
    assert started.detail == "1 step(s); restarts=2" and out.status == "ok"
    assert calls.read_text().splitlines() == [requeue]

    journal, calls_before = Journal(), calls.read_text()
    cut_after_started(journal, act, started.detail)
    (out,) = executor(journal, show("RUNNING", restarts=3)).execute(act)  # requeued, released, running again
    assert out.status == "ok" and "already requeued" in out.detail and calls.read_text() == calls_before
    journal = Journal()
    cut_after_started(journal, act, started.detail)
    (out,) = executor(journal, show("RUNNING", restarts=2)).execute(act)  # the kill came before the command
    assert out.status == "ok" and calls.read_text().splitlines()[-1] == requeue


def test_a_checkpoint_cut_after_its_signal_resumes_at_the_wait_and_requeues_once(calls: Path) -> None:
    journal, act = Journal(), action("CHECKPOINT_THEN_REQUEUE")
    cut_after_started(journal, act, "3 step(s); restarts=0")
    journal.record([Outcome(act["action_id"], 1, 2, "c1", "4242", "SLURM", act["action"], "scancel", False, "ok", "")])
    outs = executor(journal, show("RUNNING")).execute(act)
    assert [(o.step, o.status) for o in outs] == [(2, "ok"), (3, "ok")]
    assert calls.read_text().splitlines() == [plan(act)[2].describe()]  # the signal (step 1) is not sent again


def test_an_engine_that_cannot_be_asked_fails_the_step_and_runs_nothing(calls: Path) -> None:
    journal, act = Journal(), action("CANCEL")
    cut_after_started(journal, act)
    (out,) = executor(
        journal, ServiceError("scontrol show job 4242: exit 1: Unable to contact slurm controller")
    ).execute(act)
    assert out.status == "failed" and "could not be asked" in out.detail and calls.read_text() == ""


def test_a_finished_or_skipped_action_is_a_duplicate(calls: Path) -> None:
    journal, act = Journal(), action("CANCEL")
    journal.record([Outcome(act["action_id"], 0, 1, "c1", "4242", "SLURM", "CANCEL", "", False, "skipped", "busy")])
    assert executor(journal, show("RUNNING")).execute(act)[0].status == "duplicate"
    assert calls.read_text() == ""


def test_a_kueue_deactivation_in_doubt_found_inactive_is_done() -> None:
    journal = Journal()
    act = {**action("CANCEL", job="team-a/wl-1"), "scheduler": "KUEUE"}
    cut_after_started(journal, act)
    patches: list[Any] = []
    ex = ReclaimExecutor(journal, dry_run=False, progress=journal.outcomes_of, clock_ms=lambda: 5,
                         kueue_patch=lambda ns, n, body: patches.append((ns, n, body)),
                         kueue_read=lambda ns, n: {"spec": {"active": False}})  # fmt: skip
    (out,) = ex.execute(act)
    assert out.status == "ok" and "spec.active=false" in out.detail and not patches
