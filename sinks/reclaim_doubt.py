"""A reclaim action in doubt, and how the engine resolves it.

The executor records an action's `started` row before its first command and each step's outcome after it
(sinks/reclaim.py). A kill -9 between the two leaves the action in doubt: the command may have run or not. After
a restart the record comes again (it was not acked) and the executor asks the engine what the job's state is,
rather than guess:

- `scancel <job>` (cancel): done when slurmctld shows the job finished (CANCELLED, or any other end) or no longer
  knows it (`Invalid job id specified`: purged after MinJobAge); run now while it is still pending, running or
  suspended. Cancelling twice would be harmless on Slurm, but then the engine would have been asked twice; asking
  its state first keeps every command once.
- `scontrol requeue` / `requeuehold <job>`: not idempotent (a second requeue restarts a job that was started
  again), so always checked first. The job's `Restarts` count is read before the started row (`restarts=N` in its
  detail); done when it grew since, or when the job waits held by a requeue (`job_requeued_in_held_state`); nothing
  to do when the job has ended; run now while it is still running on the count it had.
- `scancel --signal=<SIG> --full <job>` (the checkpoint request): a signal leaves no trace on the engine, so it
  is sent again: the job may be asked to checkpoint twice, never not at all.
- A wait runs again; a Kueue deactivation is idempotent on the engine (`spec.active=false` again changes nothing,
  an inactive owner is not patched), so it is carried out again and an owner found stopped counts as done.

Pure decisions over what `scontrol show job -o` prints (`parse_show_job`, `slurm_in_doubt`), and the probe that
runs it (`scontrol_show_job`). A probe that fails for any other reason (slurmctld unreachable, a timeout) fails the
step rather than act blind.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from base.errors import ServiceError

FINISHED = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "COMPLETING"})  # fmt: skip
REQUEUED_HELD = "job_requeued_in_held_state"  # the Reason `scontrol requeuehold` leaves on a job
UNKNOWN_JOB = "Invalid job id specified"  # slurm_load_jobs' error for a job slurmctld does not (or no longer) know
SHOW_JOB_MAX = 64 * 1024  # characters of one job's `scontrol show job -o` read (a record is a few hundred)
BASELINE = re.compile(r"\brestarts=(\d{1,9})\b")


def parse_show_job(text: str) -> dict[str, str]:
    """`scontrol show job -o <job>` (one line of `Key=value` separated by spaces) -> key -> value; the first
    record and the first value of a key only; values with spaces (a Command's arguments) are cut, which the
    fields read here (JobState, Reason, Restarts) never have."""
    fields: dict[str, str] = {}
    for token in text[:SHOW_JOB_MAX].split("\n", 1)[0].split():
        key, sep, value = token.partition("=")
        if sep and key and key not in fields:
            fields[key] = value
    return fields


def scontrol_show_job(job_id: str, timeout_s: float = 30.0) -> dict[str, str]:
    """The job as slurmctld has it; {} when slurmctld does not know it. Raises `ServiceError` when it cannot be
    asked (no scontrol, slurmctld unreachable, a timeout): not knowing is not the same as an unknown job."""
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                              timeout=timeout_s, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"scontrol show job {job_id}: {type(exc).__name__}: {exc}"[:500]) from exc
    if proc.returncode != 0:
        if UNKNOWN_JOB in proc.stderr[:SHOW_JOB_MAX]:
            return {}
        raise ServiceError(f"scontrol show job {job_id}: exit {proc.returncode}: {proc.stderr.strip()[:400]}")
    fields = parse_show_job(proc.stdout)
    if "JobState" not in fields:
        raise ServiceError(f"scontrol show job {job_id}: no JobState in {proc.stdout[:200]!r}")
    return fields


def effect(argv: tuple[str, ...]) -> str:
    """What a Slurm command does to the job: cancel, requeue, signal, or other."""
    if argv[:1] == ("scancel",):
        return "signal" if any(a.startswith("--signal=") for a in argv) else "cancel"
    if argv[:2] in (("scontrol", "requeue"), ("scontrol", "requeuehold")):
        return "requeue"
    return "other"


def restarts(fields: dict[str, str]) -> int | None:
    value = fields.get("Restarts", "")
    return int(value) if value.isdigit() and len(value) < 10 else None


def baseline(fields: dict[str, str]) -> str:
    """What the started row keeps of the job before a requeue: `restarts=N` (`BASELINE` reads it back)."""
    count = restarts(fields)
    return "" if count is None else f"restarts={count}"


def baseline_restarts(started_detail: str) -> int | None:
    found = BASELINE.search(started_detail)
    return int(found.group(1)) if found else None


@dataclass(frozen=True, slots=True)
class Resolution:
    run: bool  # carry the step out now
    status: str  # without running it: ok (the engine shows it done) or skipped (nothing left to do)
    detail: str


def slurm_in_doubt(argv: tuple[str, ...], fields: dict[str, str], before: int | None) -> Resolution:
    """Decide a Slurm step in doubt from the job as slurmctld shows it now ({}: unknown) and, for a requeue, the
    restart count it had before the action started (pure)."""
    kind = effect(argv)
    state, reason, now = fields.get("JobState", ""), fields.get("Reason", ""), restarts(fields)
    seen = f"slurmctld shows JobState={state or '-'} Reason={reason or '-'} Restarts={now if now is not None else '-'}"
    if kind in ("signal", "other"):
        return Resolution(True, "", "a signal leaves no trace on the engine: sent again")
    if not fields:
        what = "cancelled or ended" if kind == "cancel" else "ended"
        return Resolution(False, "ok" if kind == "cancel" else "skipped",
                          f"slurmctld no longer knows the job ({UNKNOWN_JOB}): {what}, not run again")  # fmt: skip
    if kind == "cancel":
        if state in FINISHED:
            return Resolution(False, "ok", f"{seen}: already done, not run again")
        return Resolution(True, "", f"{seen}: not cancelled yet")
    if before is not None and now is not None and now > before:
        return Resolution(False, "ok", f"{seen} (was {before}): already requeued, not run again")
    if state == "PENDING" and reason == REQUEUED_HELD:
        return Resolution(False, "ok", f"{seen}: already requeued held, not run again")
    if state in FINISHED:
        return Resolution(False, "skipped", f"{seen}: the job has ended, nothing to requeue")
    if state == "PENDING":
        return Resolution(False, "skipped", f"{seen}: pending, holds no devices, nothing to requeue")
    return Resolution(True, "", f"{seen}{'' if before is None else f' (was {before})'}: not requeued yet")
