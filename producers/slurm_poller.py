"""Polling Slurm: detect job transitions between polls, reconcile with accounting.

Pure core: `PollState` + `step(state, listing, accounting, now_ms, ctx) -> events`. It diffs the job
list (`squeue --json`, or `scontrol show job -d`) against the previous poll, and reconciles with
`sacct --json` so that
- a job that started *and* ended between two polls is still recorded, with its real start and end;
- a job that vanished from the listing gets its real end time (not the poll time) once sacct has it;
- a job sacct never reports within `lost_after_ms` is closed at its last-seen time (`exit_state=UNKNOWN`).

The adapter `SlurmPoller` runs the commands (injected runner and clock) and publishes.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, tzinfo
from pathlib import Path
from typing import Any

from base.errors import ParseError, ServiceError
from producers.jobevents import EventContext, EventSink
from producers.slurm import SlurmJob, even_split, parse_capture
from producers.slurm_events import het_gang_sizes, slurm_event
from schemas.topics import JOB_EVENTS, job_key

Runner = Callable[[Sequence[str]], str]
log = logging.getLogger(__name__)
ACCOUNTING_OFF = "accounting_storage/none"


@dataclass
class Tracked:
    job: SlurmJob
    last_seen_ms: int
    emitted: set[str] = field(default_factory=set)  # event types already emitted for the current run


@dataclass
class PollState:
    jobs: dict[str, Tracked] = field(default_factory=dict)  # jobs seen in the listing, not yet closed
    vanished: dict[str, Tracked] = field(default_factory=dict)  # active when last seen, gone since
    closed: dict[str, int] = field(default_factory=dict)  # job_id -> end ms of jobs already ENDED
    # GPU jobs last seen pending that left the listing: sacct may show them run (between two polls) without
    # GPU TRES (AccountingStorageTRES without gres/gpu); their request is what says how many GPUs they held.
    left_pending: dict[str, Tracked] = field(default_factory=dict)
    last_poll_ms: int | None = None


@dataclass(frozen=True)
class PollConfig:
    gpu_jobs_only: bool = True
    lost_after_ms: int = 15 * 60_000
    closed_retention_ms: int = 24 * 3600_000


def track_key(job: SlurmJob) -> str:
    """The key a job is tracked under: its printed id, except for a pending array's meta record, whose
    printed id (`9_[3-9]`) shrinks as tasks start; it is tracked once per array."""
    if job.array_job_id and job.array_task_id is None:
        return f"{job.array_job_id}_[]"
    return job.job_id


def _is_gpu(job: SlurmJob) -> bool:
    return bool(job.gpu_count or job.gpus)


def _allocation_key(job: SlurmJob) -> tuple[Any, ...]:
    return tuple((g.node, g.count, g.indices) for g in job.gpus)


# States of a job sent back to the queue (the base state parse_state gives; REQUEUE_HOLD and REQUEUE_FED are whole
# state names in squeue's output).
REQUEUE_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})


def _run_end_ms(prev: SlurmJob, listed_end_ms: int | None, latest_ms: int) -> int | None:
    """Slurm's end of the run `prev` tracked, within the run (up to `latest_ms`): as the listing shows it now, or as
    it showed it while the run was completing. Back in the queue, the job's end is a projection again (the listing's
    end of a pending job is not kept), so a poll that saw it completing is what knows when the run ended."""
    ended = prev.end_ms if prev.state in ("COMPLETING", "REQUEUED") else None
    for end in (listed_end_ms, ended):
        if end is not None and prev.start_ms is not None and prev.start_ms <= end <= latest_ms:
            return end
    return None


def _requeue_ms(prev: SlurmJob, cur: SlurmJob, now_ms: int) -> int:
    """When the run ended: Slurm's end time of the requeued run when it has one within the run, else the poll's."""
    end = _run_end_ms(prev, cur.end_ms, now_ms)
    return now_ms if end is None else end


def _transitions(prev: SlurmJob | None, cur: SlurmJob, now_ms: int) -> list[tuple[str, int]]:
    """Event types (and event times) that moving from `prev` to `cur` implies."""
    out: list[tuple[str, int]] = []
    p = prev.state if prev else None
    c = cur.state
    if prev is None:
        if c == "PENDING":
            if cur.submit_ms is not None:
                out.append(("SUBMITTED", cur.submit_ms))
            return out
        if cur.start_ms is not None:
            out.append(("STARTED", cur.start_ms))
        if c == "SUSPENDED":
            out.append(("SUSPENDED", cur.suspend_ms or now_ms))
        if c == "REQUEUED" and cur.start_ms is not None:
            out.append(("REQUEUED", cur.end_ms or now_ms))
        if cur.terminal and cur.start_ms is not None:
            out.append(("ENDED", cur.end_ms or now_ms))
        return out
    # COMPLETING still holds the nodes: Slurm shows it between RUNNING and COMPLETED, and between RUNNING and a
    # requeue (RUNNING -> COMPLETING -> REQUEUED -> PENDING), whatever the poll happens to see of that.
    was_active = p in ("RUNNING", "SUSPENDED", "COMPLETING")
    if c in REQUEUE_STATES:
        if was_active:  # back in the queue: requeued (preempted, node failure, scontrol requeue, a requeue hold)
            out.append(("REQUEUED", _requeue_ms(prev, cur, now_ms)))
        return out
    if c in ("RUNNING", "SUSPENDED"):
        if not was_active and cur.start_ms is not None:
            out.append(("STARTED", cur.start_ms))
        elif was_active and prev.start_ms != cur.start_ms and cur.start_ms is not None:
            # requeued and restarted between two polls: its end if a poll saw it completing, else the new start
            end = _run_end_ms(prev, None, cur.start_ms)
            out.append(("REQUEUED", cur.start_ms if end is None else end))
            out.append(("STARTED", cur.start_ms))
        elif was_active and _allocation_key(prev) != _allocation_key(cur):
            out.append(("UPDATED", now_ms))
        if c == "SUSPENDED" and p != "SUSPENDED":
            out.append(("SUSPENDED", cur.suspend_ms or now_ms))
        if c == "RUNNING" and p == "SUSPENDED":
            out.append(("RESUMED", cur.suspend_ms or now_ms))
        return out
    if cur.terminal:
        if not was_active and cur.start_ms is not None:
            out.append(("STARTED", cur.start_ms))
        if was_active or cur.start_ms is not None:
            out.append(("ENDED", cur.end_ms or now_ms))
    return out


def merge_indices(listing: Iterable[SlurmJob], detail: Iterable[SlurmJob]) -> list[SlurmJob]:
    """Fill per-node GPU indices the listing lacks from `scontrol show job -d` records of the same jobs."""
    by_id = {d.job_id: d for d in detail if d.has_indices}
    out = []
    for j in listing:
        d = by_id.get(j.job_id)
        out.append(replace(j, gpus=d.gpus, gpu_count=j.gpu_count or d.gpu_count) if d and not j.has_indices else j)
    return out


def step(
    state: PollState,
    listing: Sequence[SlurmJob],
    accounting: Sequence[SlurmJob],
    now_ms: int,
    ctx: EventContext,
    config: PollConfig | None = None,
) -> list[dict[str, Any]]:
    """Advance the poll state by one cycle; return the events, in event-time order per job."""
    cfg = config or PollConfig()
    events: list[dict[str, Any]] = []

    def emit(job: SlurmJob, kinds: list[tuple[str, int]], tracked: Tracked | None) -> None:
        for etype, ts in kinds:
            if etype in ("STARTED", "ENDED") and tracked is not None and etype in tracked.emitted:
                continue
            events.append(slurm_event(job, etype, ts, ctx, gang_size=het_sizes.get(job.het_job_id or "")))
            if tracked is not None:
                if etype == "REQUEUED":
                    tracked.emitted.clear()  # a requeued job starts and ends again
                else:
                    tracked.emitted.add(etype)
            if etype == "ENDED":
                state.closed[track_key(job)] = ts

    listed = [j for j in listing if _is_gpu(j) or not cfg.gpu_jobs_only]
    het_sizes = het_gang_sizes(listed)
    seen_ids = set()
    for job in listed:
        seen_ids.add(track_key(job))
        tracked = state.jobs.get(track_key(job)) or state.vanished.pop(track_key(job), None)
        if tracked is None:
            if track_key(job) in state.closed and job.terminal:
                continue
            tracked = Tracked(job, now_ms)
            emit(job, _transitions(None, job, now_ms), tracked)
        else:
            emit(job, _transitions(tracked.job, job, now_ms), tracked)
        tracked.job = job
        tracked.last_seen_ms = now_ms
        if job.terminal:
            state.jobs.pop(track_key(job), None)
            state.closed.setdefault(track_key(job), job.end_ms or now_ms)
        else:
            state.jobs[track_key(job)] = tracked

    # Jobs that left the listing while active: their end comes from accounting.
    for job_id in [k for k in state.jobs if k not in seen_ids]:
        tracked = state.jobs.pop(job_id)
        if tracked.job.active:
            state.vanished[job_id] = tracked
        elif tracked.job.gpu_count:
            state.left_pending[job_id] = tracked

    for acct in accounting:
        acct = _with_requested_gpus(state, acct)
        if track_key(acct) in seen_ids:
            continue
        vanished = state.vanished.get(track_key(acct))  # a GPU job, whatever TRES its accounting carries
        if vanished is None and cfg.gpu_jobs_only and not _is_gpu(acct):
            continue
        if vanished is not None:
            if acct.terminal or acct.state == "REQUEUED":
                # keep the device detail the listing had; take the real times and final state from sacct
                merged = replace(
                    acct,
                    gpus=vanished.job.gpus or acct.gpus,
                    gpu_count=vanished.job.gpu_count or acct.gpu_count,
                    user_uid=acct.user_uid or _same_user_uid(vanished.job, acct),
                )
                if acct.state == "REQUEUED":
                    emit(merged, [("REQUEUED", acct.end_ms or now_ms)], vanished)
                else:
                    emit(merged, [("ENDED", acct.end_ms or now_ms)], vanished)
                del state.vanished[track_key(acct)]
            continue
        if track_key(acct) in state.closed or track_key(acct) in state.jobs:
            continue
        if acct.start_ms is None:
            continue
        # Never listed: started (and maybe ended) between polls.
        tracked = Tracked(acct, now_ms)
        emit(acct, _transitions(None, acct, now_ms), tracked)
        if acct.active:
            state.jobs[track_key(acct)] = tracked

    for job_id in [k for k, t in state.vanished.items() if now_ms - t.last_seen_ms >= cfg.lost_after_ms]:
        tracked = state.vanished.pop(job_id)
        lost = replace(tracked.job, state="UNKNOWN", end_ms=tracked.last_seen_ms)
        emit(lost, [("ENDED", tracked.last_seen_ms)], tracked)

    _forget_old(state, now_ms, cfg)
    state.last_poll_ms = now_ms
    return events


def _with_requested_gpus(state: PollState, acct: SlurmJob) -> SlurmJob:
    """A job last seen pending whose accounting names its nodes but carries no GPU TRES: its nodes, with
    the GPUs it asked for spread over them (indices unknown)."""
    pending = state.left_pending.pop(track_key(acct), None)
    if pending is None or _is_gpu(acct) or not acct.nodes:
        return acct
    count = pending.job.gpu_count
    uid = acct.user_uid or _same_user_uid(pending.job, acct)
    return replace(acct, gpu_count=count, gpus=even_split(acct.nodes, count), user_uid=uid)


def _same_user_uid(listed: SlurmJob, acct: SlurmJob) -> str | None:
    """sacct prints no uid: the uid the listing printed for the same job and user name."""
    return listed.user_uid if listed.user == acct.user else None


def _forget_old(state: PollState, now_ms: int, cfg: PollConfig) -> None:
    for job_id in [k for k, end in state.closed.items() if now_ms - end > cfg.closed_retention_ms]:
        del state.closed[job_id]
    for job_id in [k for k, t in state.left_pending.items() if now_ms - t.last_seen_ms > cfg.closed_retention_ms]:
        del state.left_pending[job_id]


# ------------------------------------------------------------------------------------------------
# Adapter: commands in, events out


def run_command(argv: Sequence[str], timeout_s: float = 60.0) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise ServiceError(f"{argv[0]}: not found on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{' '.join(argv)}: no answer within {timeout_s:.0f}s") from exc
    if proc.returncode != 0:
        raise ServiceError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


class SlurmRestRunner:
    """Runs "commands" that are slurmrestd URLs: `[url]` for job lists, `[url, "-S", "now-<N>seconds", ...]`
    for accounting (sent as `start_time`). Other commands go to the fallback (subprocess) runner.

    Auth is slurmrestd's JWT: `X-SLURM-USER-NAME` / `X-SLURM-USER-TOKEN` headers.
    """

    def __init__(
        self,
        user: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 60.0,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        fallback: Runner = run_command,
    ) -> None:
        self.headers = {}
        if user:
            self.headers["X-SLURM-USER-NAME"] = user
        if token:
            self.headers["X-SLURM-USER-TOKEN"] = token
        self.timeout_s = timeout_s
        self.clock = clock
        self.fallback = fallback

    def __call__(self, argv: Sequence[str]) -> str:
        import httpx

        if not argv or not argv[0].startswith(("http://", "https://")):
            return self.fallback(argv)
        params: dict[str, str] = {}
        if "-S" in argv:
            spec = argv[list(argv).index("-S") + 1]
            if spec.startswith("now-") and spec.endswith("seconds"):
                params["start_time"] = str(self.clock() // 1000 - int(spec[4:-7]))
        try:
            resp = httpx.get(argv[0], params=params, headers=self.headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServiceError(f"slurmrestd {argv[0]}: {exc}") from exc
        if resp.status_code != 200:
            raise ServiceError(f"slurmrestd {argv[0]}: HTTP {resp.status_code} {resp.text[:200]}")
        return resp.text


@dataclass(frozen=True)
class SlurmCommands:
    listing: tuple[str, ...] = ("squeue", "--json")
    detail: tuple[str, ...] = ("scontrol", "show", "job", "-d")
    accounting: tuple[str, ...] = ("sacct", "--json", "-X", "--allusers")
    accounting_overlap_s: int = 300
    # Asked when sacct fails, to tell a cluster without accounting (AccountingStorageType) from an outage.
    config: tuple[str, ...] = ("scontrol", "show", "config")


def accounting_storage_type(config_text: str) -> str | None:
    """`AccountingStorageType` from `scontrol show config` (`Key = value` lines); None when absent."""
    for line in config_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "AccountingStorageType":
            return value.strip() or None
    return None


class SlurmPoller:
    """One poll cycle = list jobs, fill missing GPU indices, reconcile with sacct, publish the events."""

    def __init__(
        self,
        ctx: EventContext,
        sink: EventSink,
        *,
        commands: SlurmCommands | None = None,
        runner: Runner = run_command,
        clock: Callable[[], int] = lambda: int(time.time() * 1000),
        config: PollConfig | None = None,
        tz: tzinfo = UTC,
        state_path: Path | None = None,
        max_catch_up_s: int = 7 * 24 * 3600,
    ) -> None:
        self.ctx = ctx
        self.sink = sink
        self.commands = commands or SlurmCommands()
        self.runner = runner
        self.clock = clock
        self.config = config or PollConfig()
        self.tz = tz
        self.state = PollState()
        self.state_path = state_path
        self.max_catch_up_s = max_catch_up_s
        self.accounting_disabled = False  # set once sacct failed on a cluster without accounting
        # When the last run's poll time is known, the first sacct window reaches back to it, so jobs that
        # started and ended while the poller was down are still recorded (same event ids: no duplicates).
        self.resume_from_ms: int | None = None
        if state_path is not None and state_path.exists():
            try:
                self.resume_from_ms = int(json.loads(state_path.read_text(encoding="utf-8"))["last_poll_ms"])
            except (ValueError, KeyError, TypeError, OSError):
                self.resume_from_ms = None

    def save_state(self) -> None:
        """Record the last poll time (after its events were flushed)."""
        if self.state_path is None or self.state.last_poll_ms is None:
            return
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"last_poll_ms": self.state.last_poll_ms}), encoding="utf-8")
        tmp.replace(self.state_path)

    def _accounting_argv(self, now_ms: int) -> list[str]:
        since_s = self.commands.accounting_overlap_s
        last = self.state.last_poll_ms if self.state.last_poll_ms is not None else self.resume_from_ms
        if last is not None:
            since_s += min(self.max_catch_up_s, max(0, (now_ms - last) // 1000))
        else:
            since_s += 3600
        return [*self.commands.accounting, "-S", f"now-{since_s}seconds", "-E", "now"]

    def poll_once(self) -> list[dict[str, Any]]:
        now_ms = self.clock()
        listing = list(parse_capture(self.runner(self.commands.listing), self.tz).jobs)
        needs_detail = [j for j in listing if j.active and j.gpu_count and not j.has_indices]
        if needs_detail and self.commands.detail:
            known = self.state.jobs
            fresh = [j for j in needs_detail if j.job_id not in known or not known[j.job_id].job.has_indices]
            detail: list[SlurmJob] = []
            for j in fresh:
                try:
                    detail.extend(parse_capture(self.runner([*self.commands.detail, str(j.numeric_id)]), self.tz).jobs)
                except (ServiceError, ParseError):
                    continue  # the job may have ended in between: sacct will tell
            listing = merge_indices(listing, detail)
            # jobs already known with indices keep them
            listing = [
                replace(j, gpus=known[j.job_id].job.gpus)
                if j.job_id in known and not j.has_indices and known[j.job_id].job.has_indices
                else j
                for j in listing
            ]
        accounting = self._accounting(now_ms)
        events = step(self.state, listing, accounting, now_ms, self.ctx, self.config)
        for ev in events:
            self.sink.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)
        return events

    def _accounting(self, now_ms: int) -> list[SlurmJob]:
        """sacct's records of the window; none, after one warning, on a cluster whose accounting is disabled
        (sacct then exits 1). Any other sacct failure fails the cycle, as before."""
        if not self.commands.accounting or self.accounting_disabled:
            return []
        try:
            text = self.runner(self._accounting_argv(now_ms))
        except ServiceError:
            if not self._accounting_off():
                raise
            self.accounting_disabled = True
            log.warning(
                "Slurm accounting is disabled on this cluster (AccountingStorageType=%s): polling without sacct, "
                "so a job that starts and ends between two polls is not recorded, and a job that leaves the "
                "listing while running is closed at its last-seen time after %d s", ACCOUNTING_OFF,
                self.config.lost_after_ms // 1000,
            )  # fmt: skip
            return []
        return list(parse_capture(text, self.tz).jobs)

    def _accounting_off(self) -> bool:
        if not self.commands.config:
            return False
        try:
            return accounting_storage_type(self.runner(self.commands.config)) == ACCOUNTING_OFF
        except ServiceError:
            return False

    def run(
        self,
        interval_s: float,
        stop: Callable[[], bool] = lambda: False,
        on_error: Callable[[Exception], None] | None = None,
        every_cycle: Callable[[], None] | None = None,
    ) -> None:
        """Poll every `interval_s` until `stop()`; `every_cycle` runs first each time (e.g. refresh the GPU map)."""
        while not stop():
            started = time.monotonic()
            try:
                if every_cycle is not None:
                    every_cycle()
                self.poll_once()
                flush = getattr(self.sink, "flush", None)
                if callable(flush):
                    flush()
                self.save_state()
            except (ServiceError, ParseError) as exc:
                if on_error is None:
                    raise
                on_error(exc)
            time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
