"""Reclaim executor: plans per scheduler, dry-run by default, real commands via fake Slurm tools."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuledger.errors import ConfigError
from sinks.reclaim import Outcome, ReclaimExecutor, plan


class Recorder:
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
    """scontrol and scancel that log their arguments; `scontrol requeue 13` fails like Slurm does."""
    calls = tmp_path / "calls.log"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("scontrol", "scancel"):
        script = bindir / tool
        script.write_text(
            "#!/bin/sh\n"
            f'echo "{tool} $*" >> "{calls}"\n'
            'if [ "$1 $2" = "requeue 13" ]; then echo "Requested operation is presently disabled" >&2; exit 1; fi\n'
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_slurm_plans() -> None:
    assert [s.describe() for s in plan(action("SUSPEND"))] == ["scontrol suspend 4242"]
    assert [s.describe() for s in plan(action("CANCEL"))] == ["scancel 4242"]
    assert [s.describe() for s in plan(action("CHECKPOINT_THEN_REQUEUE"), signal="USR2", grace_s=30)] == [
        "scancel --signal=USR2 --full 4242", "wait 30s for the checkpoint", "scontrol requeue 4242",
    ]  # fmt: skip
    assert [s.describe() for s in plan(action("CHECKPOINT_THEN_CANCEL"))][-1] == "scancel 4242"
    assert plan(action("REQUEUE", job_id="77_3"))[0].argv == ("scontrol", "requeue", "77_3")


@pytest.mark.parametrize(
    "bad",
    [{"job_id": "42; rm -rf /"}, {"job_id": "--all"}, {"action": "NUKE"}, {"scheduler": "PBS"},
     {"scheduler": "KUEUE", "job_id": "no-slash"}],
)  # fmt: skip
def test_bad_actions_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        plan(action("SUSPEND", **bad))


def test_dry_run_by_default_records_the_plan(fake_slurm: Path) -> None:
    rec = Recorder()
    out = ReclaimExecutor(rec, clock_ms=lambda: 5).execute(action("CHECKPOINT_THEN_CANCEL"))
    assert [o.status for o in out] == ["planned"] * 3 and all(o.dry_run for o in out)
    assert rec.outcomes == out and not fake_slurm.exists()
    # An action the processors marked dry-run stays dry even on a live executor.
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("SUSPEND", dry_run=True))
    assert out[0].status == "planned" and not fake_slurm.exists()


def test_live_checkpoint_then_requeue_runs_the_commands(fake_slurm: Path) -> None:
    slept: list[float] = []
    rec = Recorder()
    ex = ReclaimExecutor(rec, dry_run=False, grace_s=90, sleep=slept.append, clock_ms=lambda: 7)
    out = ex.execute(action("CHECKPOINT_THEN_REQUEUE"))
    assert [o.status for o in out] == ["ok", "ok", "ok"] and slept == [90]
    assert fake_slurm.read_text().splitlines() == ["scancel --signal=USR1 --full 4242", "scontrol requeue 4242"]
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
    out = ReclaimExecutor(Recorder(), dry_run=False).execute(action("SUSPEND"))
    assert out[0].status == "failed" and "not found" in out[0].detail


def test_kueue_deactivates_the_workload() -> None:
    patches: list[tuple[str, str, dict[str, Any]]] = []
    ex = ReclaimExecutor(Recorder(), dry_run=False, kueue_patch=lambda ns, n, b: patches.append((ns, n, b)))
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
    out = ReclaimExecutor(rec).execute(action("SUSPEND", job_id="../../x"))
    assert out[0].status == "failed" and rec.outcomes == out
