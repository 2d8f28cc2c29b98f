"""The idle state machine, one per job (a gang is one job, judged as one unit).

    OK --(idle_after consecutive idle job-minutes)--> IDLE_WARNED --(grace more)--> RECLAIMED
     ^                                                    |                            |
     +------------- a busy (or all-dark) minute: IDLE_RESOLVED ------------------------+

`step(state, job_minute, policy) -> (state, outputs)` consumes the job's JobMinutes in minute order;
`on_tick(state, now_ms, policy) -> (state | None, outputs)` forgets jobs that ended. Pure: the clock is
the caller's, times are epoch milliseconds, outputs are plain Alert / ReclaimAction records.

Exemptions: the policy's (loaded at start), and the job's own `granted` ones (appeals decided EXEMPTION,
`granted_exemptions`), kept in its state so they survive a restart. An exempt idle minute sends nothing. A
granted exemption also cancels the current streak (a warned job goes back to OK, silently: the appeal's
decision is the message), so once it expires the job is warned afresh, with a full grace, before any reclaim.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from enum import StrEnum
from operator import attrgetter
from typing import Any

from base.processor_settings import Exemption, IdlePolicy
from processors.attribution import JobInfo
from processors.classify import JobMinuteClass, classify_job_minute
from processors.windows import MINUTE_MS
from schemas.governance_appeals import Appeal
from schemas.topics import qualified_job

FORGET_AFTER_END_MS = 5 * MINUTE_MS


class Status(StrEnum):
    OK = "OK"
    IDLE_WARNED = "IDLE_WARNED"
    RECLAIMED = "RECLAIMED"


@dataclass(frozen=True, slots=True)
class Output:
    kind: str  # "alert" or "action"
    record: dict[str, Any]


@dataclass(frozen=True, slots=True)
class IdleState:
    job: JobInfo
    status: Status = Status.OK
    idle_minutes: int = 0
    idle_since_ms: int | None = None  # start of the first minute of the current idle streak
    idle_device_s: int = 0  # allocated device-seconds of the streak
    cost_so_far: float | None = None
    action_at_ms: int | None = None
    last_minute_ms: int | None = None
    ended_ms: int | None = None
    devices: tuple[str, ...] = ()
    granted: tuple[Exemption, ...] = ()  # from appeals decided EXEMPTION

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": _info_dict(self.job),
            "status": self.status.value,
            "idle_minutes": self.idle_minutes,
            "idle_since_ms": self.idle_since_ms,
            "idle_device_s": self.idle_device_s,
            "cost_so_far": self.cost_so_far,
            "action_at_ms": self.action_at_ms,
            "last_minute_ms": self.last_minute_ms,
            "ended_ms": self.ended_ms,
            "devices": list(self.devices),
        }
        if self.granted:  # absent when none: a state without appeals is written as before
            out["granted"] = [ex.model_dump() for ex in self.granted]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IdleState:
        return cls(
            job=JobInfo(**data["job"]),
            status=Status(data["status"]),
            idle_minutes=data["idle_minutes"],
            idle_since_ms=data["idle_since_ms"],
            idle_device_s=data["idle_device_s"],
            cost_so_far=data["cost_so_far"],
            action_at_ms=data["action_at_ms"],
            last_minute_ms=data["last_minute_ms"],
            ended_ms=data["ended_ms"],
            devices=tuple(data["devices"]),
            granted=tuple(Exemption(**ex) for ex in data.get("granted", ())),
        )


_STATE_FIELDS = tuple(f.name for f in fields(IdleState))
_STATE_VALUES = attrgetter(*_STATE_FIELDS)


def _evolve(state: IdleState, **changes: Any) -> IdleState:
    """`dataclasses.replace` without its per-call field introspection: the replay steps tens of millions of
    job-minutes through here (bench/whatif_replay.py), and `replace` was most of a step's time."""
    values = dict(zip(_STATE_FIELDS, _STATE_VALUES(state), strict=True))
    values.update(changes)
    return IdleState(**values)


def _info_dict(info: JobInfo) -> dict[str, Any]:
    return {f.name: getattr(info, f.name) for f in fields(info)}


def idle_after_min(job: JobInfo, policy: IdlePolicy) -> int:
    """Minutes of idleness before a warning: project override, else partition/queue, else job class."""
    if job.project is not None and job.project in policy.idle_after_min_by_project:
        return policy.idle_after_min_by_project[job.project]
    if job.partition is not None and job.partition in policy.idle_after_min_by_partition:
        return policy.idle_after_min_by_partition[job.partition]
    return policy.idle_after_min_interactive if job.interactive else policy.idle_after_min_batch


def exemption_for(
    job: JobInfo, at_ms: int, policy: IdlePolicy, granted: tuple[Exemption, ...] = ()
) -> Exemption | None:
    """The exemption covering `job` at `at_ms`: the policy's, else one granted to the job on appeal."""
    for ex in (*policy.exemptions, *granted):
        if ex.expires_ms is not None and at_ms >= ex.expires_ms:
            continue
        if ex.starts_ms is not None and at_ms < ex.starts_ms:
            continue
        target = {"job": job.job_id, "user": job.user, "project": job.project}[ex.kind]
        if target is not None and target == ex.value:
            return ex
    return None


def reclaim_kind(job: JobInfo, policy: IdlePolicy) -> str:
    """Suspend or requeue with a checkpoint signal when the workload supports it, cancel otherwise.
    A Slurm job is never suspended to reclaim it: Slurm's suspend keeps the job's GPUs allocated."""
    if not job.checkpointable:
        return "CANCEL"
    if policy.reclaim_mode == "SUSPEND" and job.scheduler != "SLURM":
        return "SUSPEND"
    return "CHECKPOINT_THEN_REQUEUE"


def _id(*parts: object) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode(), usedforsecurity=False).hexdigest()[:24]


def new_state(job: JobInfo, devices: tuple[str, ...] = ()) -> IdleState:
    return IdleState(job=job, devices=devices)


def _alert(state: IdleState, kind: str, ts_ms: int, policy: IdlePolicy, message: str, **extra: Any) -> Output:
    job = state.job
    record: dict[str, Any] = {
        "alert_id": _id(kind, job.cluster, job.job_id, state.idle_since_ms),
        "kind": kind,
        "ts_ms": ts_ms,
        "cluster": job.cluster,
        "job_id": job.job_id,
        "node": None,
        "device_uuids": list(state.devices),
        "user": job.user,
        "team": job.team,
        "project": job.project,
        "idle_minutes": state.idle_minutes,
        "cost_so_far": state.cost_so_far,
        "action": None,
        "action_at_ms": None,
        "dry_run": policy.dry_run,
        "message": message,
        "appeal_route": policy.appeal_route,
        "emitted_ts_ms": None,
    }
    record.update(extra)
    return Output("alert", record)


def _cost(idle_device_s: int, generation: str, policy: IdlePolicy) -> float | None:
    rate = policy.rate_per_device_hour.get(generation)
    return None if rate is None else round(idle_device_s * rate / 3600.0, 6)


def _clean(state: IdleState) -> bool:
    """Nothing to resolve or reset: what a busy or dark minute leaves."""
    return (
        state.status is Status.OK
        and state.idle_minutes == 0
        and state.idle_since_ms is None
        and state.idle_device_s == 0
        and state.cost_so_far is None
        and state.action_at_ms is None
    )


def _resolve(
    state: IdleState, ts_ms: int, policy: IdlePolicy, why: str, clock_ms: int | None = None
) -> tuple[IdleState, list[Output]]:
    """Back to OK (an IDLE_RESOLVED alert when it was warned or reclaimed); `clock_ms`: the last minute taken, moved
    in the same update."""
    outs: list[Output] = []
    if _clean(state):  # nothing to resolve or reset: a busy job's every minute comes here
        return (state if clock_ms is None else _evolve(state, last_minute_ms=clock_ms)), outs
    if state.status is not Status.OK:
        outs.append(
            _alert(
                state,
                "IDLE_RESOLVED",
                ts_ms,
                policy,
                f"Job {state.job.job_id} is no longer idle ({why}) after {state.idle_minutes} idle minutes; "
                "no action will be taken.",
            )
        )
    return _forgive(state, clock_ms), outs


def _forgive(state: IdleState, clock_ms: int | None = None) -> IdleState:
    """The streak forgotten: back to OK with nothing counted (a resolution, or an exemption granted on appeal)."""
    return _evolve(
        state,
        status=Status.OK,
        idle_minutes=0,
        idle_since_ms=None,
        idle_device_s=0,
        cost_so_far=None,
        action_at_ms=None,
        last_minute_ms=state.last_minute_ms if clock_ms is None else clock_ms,
    )


def _accrue(state: IdleState, minute: int, n: int, jm: Mapping[str, Any], policy: IdlePolicy) -> IdleState:
    """`n` idle minutes from `minute` (each like `jm`) added to the streak: its clock, length, device-seconds and
    cost. `step` adds one; `step_run` adds the minutes in which nothing else can happen (`_quiet`) at once."""
    idle_s = state.idle_device_s + n * int(jm["allocated_s"])
    return _evolve(
        state,
        last_minute_ms=minute + (n - 1) * MINUTE_MS,
        idle_minutes=state.idle_minutes + n,
        idle_since_ms=state.idle_since_ms if state.idle_since_ms is not None else minute,
        idle_device_s=idle_s,
        cost_so_far=_cost(idle_s, str(jm.get("generation") or ""), policy),
    )


def step(state: IdleState, jm: Mapping[str, Any], policy: IdlePolicy) -> tuple[IdleState, list[Output]]:
    """Advance the job's machine by one JobMinute (summed over the whole gang)."""
    return _step(state, jm, policy, None)


def _step(
    state: IdleState, jm: Mapping[str, Any], policy: IdlePolicy, through_ms: int | None
) -> tuple[IdleState, list[Output]]:
    """`step`; `through_ms` (`step_run`): a busy or dark minute stands for the alike minutes up to that one, which
    would each only move the clock of the clean state it leaves (`_resolve` on a clean state)."""
    minute = int(jm["minute_start_ms"])
    if state.last_minute_ms is not None and minute <= state.last_minute_ms:
        return state, []  # replayed minute: already applied
    end = minute + MINUTE_MS
    gap = state.last_minute_ms is not None and minute != state.last_minute_ms + MINUTE_MS
    cls = classify_job_minute(int(jm["active_s"]), int(jm["starved_s"]), int(jm["idle_s"]))
    outs: list[Output] = []
    if gap and state.idle_minutes:
        state, outs = _resolve(state, minute, policy, "its devices were not held in between")
    if cls is not JobMinuteClass.IDLE:
        why = "device activity" if cls is JobMinuteClass.BUSY else "no telemetry: missing data is never idle"
        state, more = _resolve(state, end, policy, why, minute if through_ms is None else through_ms)
        return state, outs + more
    state = _accrue(state, minute, 1, jm, policy)
    idle_since = state.idle_since_ms if state.idle_since_ms is not None else minute
    idle_s = state.idle_device_s
    job = state.job
    ex = exemption_for(job, end, policy, state.granted)
    if ex is not None and ex in state.granted:
        return _forgive(state), outs
    if ex is not None:
        return state, outs
    after = idle_after_min(job, policy)
    action = reclaim_kind(job, policy)
    mode = "dry-run: recorded, not executed" if policy.dry_run else "will be executed"
    if state.status is Status.OK and state.idle_minutes >= after:
        action_at = idle_since + (after + policy.grace_min) * MINUTE_MS
        state = _evolve(state, status=Status.IDLE_WARNED, action_at_ms=action_at)
        cost = "unknown (no rate)" if state.cost_so_far is None else f"{state.cost_so_far:.2f}"
        outs.append(
            _alert(
                state,
                "IDLE_WARNING",
                end,
                policy,
                f"Job {job.job_id} ({_devices(len(state.devices) or int(jm.get('device_count') or 0))}) has been "
                f"idle for {state.idle_minutes} minutes (no device active or starved; judged over the whole job). "
                f"Idle cost so far: {cost}. If it stays idle, {action} at {_utc(action_at)} ({mode}). "
                f"Appeal: {policy.appeal_route}",
                action=action,
                action_at_ms=action_at,
            )
        )
    elif state.status is Status.IDLE_WARNED and state.action_at_ms is not None and end >= state.action_at_ms:
        state = _evolve(state, status=Status.RECLAIMED)
        reason = (
            f"idle {state.idle_minutes} min since {_utc(idle_since)} on {_devices(len(state.devices))}; "
            f"idle device-seconds {idle_s}; cost so far "
            f"{'unknown' if state.cost_so_far is None else f'{state.cost_so_far:.2f}'}"
        )
        outs.append(
            _alert(
                state,
                "RECLAIM_NOTICE",
                end,
                policy,
                f"Job {job.job_id}: {action} ({mode}): {reason}. Appeal: {policy.appeal_route}",
                action=action,
                action_at_ms=end,
            )
        )
        outs.append(
            Output(
                "action",
                {
                    "action_id": _id("reclaim", job.cluster, job.job_id, idle_since),
                    "ts_ms": end,
                    "cluster": job.cluster,
                    "job_id": job.job_id,
                    "scheduler": job.scheduler,
                    "action": action,
                    "dry_run": policy.dry_run,
                    "reason": reason,
                    "device_uuids": list(state.devices),
                    "user": job.user,
                    "project": job.project,
                },
            )
        )
    return state, outs


def step_run(state: IdleState, jm: Mapping[str, Any], n: int, policy: IdlePolicy) -> tuple[IdleState, list[Output]]:
    """What `n` calls of `step` give for `n` contiguous job-minutes that are all `jm` but for their start (`jm` is the
    first): the state and every output, the same (tests/unit/test_idle_runs.py holds it to stepping minute by
    minute). `step` itself takes each minute in which something can happen; the minutes between, in which `step`
    would only move the streak's counters and clock (`_quiet`, read off `step`'s own conditions; a busy or dark
    run's minutes after its first), pass in one move of the same updates (`_accrue`, `_forgive`, the clock). A
    what-if replay of a month feeds runs, not minutes (processors/whatif.py)."""
    minute = int(jm["minute_start_ms"])
    if state.last_minute_ms is not None and minute <= state.last_minute_ms:  # replayed minutes: already applied
        done = min(n, (state.last_minute_ms - minute) // MINUTE_MS + 1)
        minute, n = minute + done * MINUTE_MS, n - done
        if n <= 0:
            return state, []
        jm = {**jm, "minute_start_ms": minute}
    if classify_job_minute(int(jm["active_s"]), int(jm["starved_s"]), int(jm["idle_s"])) is not JobMinuteClass.IDLE:
        return _step(state, jm, policy, minute + (n - 1) * MINUTE_MS)
    state, outs = _step(state, jm, policy, None)
    minute += MINUTE_MS
    left = n - 1
    while left > 0:
        k = min(left, _quiet(state, minute, policy))
        if k > 0:
            ex = exemption_for(state.job, minute + MINUTE_MS, policy, state.granted)
            state = _accrue(state, minute, k, jm, policy)
            if ex is not None and ex in state.granted:
                state = _forgive(state)
            minute += k * MINUTE_MS
            left -= k
        if left > 0:
            state, more = step(state, {**jm, "minute_start_ms": minute}, policy)
            outs += more
            minute += MINUTE_MS
            left -= 1
    return state, outs


def _quiet(state: IdleState, minute: int, policy: IdlePolicy) -> int:
    """How many contiguous idle minutes from `minute` `step` would take with no output and no change but `_accrue`
    (then `_forgive` under an exemption granted on appeal); 0 when the next may do more. Read off `step`: an idle
    minute warns when the streak reaches `idle_after_min`, reclaims at `action_at_ms`, and either only when no
    exemption covers the minute's end (`exemption_for`, whose answer changes only at an exemption's start or
    expiry)."""
    end = minute + MINUTE_MS
    quiet = 1 << 62
    for ex in (*policy.exemptions, *state.granted):
        for bound in (ex.starts_ms, ex.expires_ms):
            if bound is not None and bound > end:  # minute ends in [end, bound) see exemption_for's answer at end
                quiet = min(quiet, (bound - end - 1) // MINUTE_MS + 1)
    if exemption_for(state.job, end, policy, state.granted) is not None:
        return quiet
    if state.status is Status.OK:
        return min(quiet, idle_after_min(state.job, policy) - state.idle_minutes - 1)
    if state.status is Status.IDLE_WARNED and state.action_at_ms is not None:
        return min(quiet, (state.action_at_ms - end - 1) // MINUTE_MS + 1)
    return quiet


def granted_exemptions(appeals: Iterable[Appeal]) -> dict[str, tuple[Exemption, ...]]:
    """The exemptions granted on appeal, by job ("cluster/job_id"): from each EXEMPTION decision to its end."""
    out: dict[str, list[Exemption]] = {}
    for a in sorted(appeals, key=lambda a: (a.decided_ms or 0, a.appeal_id)):
        if a.decision != "EXEMPTION" or a.exemption_until_ms is None:
            continue
        ex = Exemption(kind="job", value=a.subject.job_id, reason=f"appeal {a.appeal_id}",
                       starts_ms=a.decided_ms, expires_ms=a.exemption_until_ms)  # fmt: skip
        out.setdefault(qualified_job(a.subject.cluster, a.subject.job_id), []).append(ex)
    return {jid: tuple(exs) for jid, exs in out.items()}


def mark_ended(state: IdleState, ended_ms: int) -> IdleState:
    return replace(state, ended_ms=ended_ms)


def on_tick(state: IdleState, now_ms: int, policy: IdlePolicy) -> tuple[IdleState | None, list[Output]]:
    """Forget a job once it ended and its last minutes are past; nothing else is time-driven, so a
    lagging input can never trigger an action by itself."""
    if state.ended_ms is not None and now_ms >= state.ended_ms + FORGET_AFTER_END_MS:
        return None, []
    return state, []


def _utc(ms: int) -> str:
    """An event time as people read it in a message (UTC, to the minute); records keep epoch ms."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _devices(n: int) -> str:
    return f"{n} device" if n == 1 else f"{n} devices"
