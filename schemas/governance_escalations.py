"""Escalations (issue 41 item 5): a request to raise a job's priority for a while, what a sequence of
`EscalationEvent`s means, the checks before a new one, and what the escalation service must do now.

Pure: events, the policy and `now_ms` in; escalations, events or one-line `ConfigError`s out. At the contracts
layer for the same reason as `schemas/governance_appeals.py`: the `escalate` commands, the deciders' page, the
service that carries grants out on the engines (sinks/escalations.py) and the statements read the steps alike.

    REQUESTED ──(a decider, within decide_within_hours)──> GRANTED ──(the service)──> APPLIED ──(until)──> REVERTED
        │                                                     │
        ├──(a decider)──> DENIED                              └──(until passed before it was applied)──> (over)
        └──(undecided past the deadline)──> LAPSED

Policy (`governance.escalations`, docs/governance.md): who may ask (`askers`: the job's user, its team's members
or leads, the operators), who decides (`deciders`, else the operators; never the asker), by when
(`decide_within_hours`), the longest a grant lasts (`max_hours`), the tier a raised job runs at (`tier`) and what
a raised GPU-hour costs (`price_per_gpu_hour`, a line on the team's statement). A job has at most one escalation
open or in force at a time, so a repeated request is refused and nothing is applied twice. The first valid
decision is the decision; later ones, and steps the rules refuse, are reported by `fold` and change nothing.
Events are folded in (ts_ms, step, event_id) order, so the topic and a table of it give the same escalations.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from base.errors import ConfigError
from schemas.governance_appeals import HOUR_MS, Ignored, clean_text, iso_minute, ordered_steps
from schemas.policy import EscalationRules, Policy

SERVICE_ACTOR = "gpuledger-escalations"
STEP_ORDER = {"REQUESTED": 0, "GRANTED": 1, "DENIED": 1, "LAPSED": 2, "APPLIED": 3, "REVERTED": 4}
ENGINES = ("SLURM", "KUEUE")
MAX_ID = 256


@dataclass(frozen=True, slots=True)
class Job:
    """The job a request is about, as the ledger knows it (who runs it, which team, how many GPUs)."""

    cluster: str
    job_id: str
    user: str | None
    team: str | None
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class Escalation:
    escalation_id: str
    job: Job
    tier: str
    hours: int
    asked_by: str
    asked_ms: int
    reason: str
    deadline_ms: int
    decision: str | None = None  # GRANTED, DENIED, LAPSED
    decided_by: str | None = None
    decided_ms: int | None = None
    note: str | None = None
    until_ms: int | None = None  # GRANTED: when it falls back
    engine: str | None = None  # APPLIED: SLURM or KUEUE
    before: str | None = None  # APPLIED: the job's QOS or priority class before it was raised ("" for none)
    applied_ms: int | None = None
    reverted_ms: int | None = None

    @property
    def state(self) -> str:
        if self.reverted_ms is not None:
            return "REVERTED"
        if self.applied_ms is not None:
            return "RAISED"
        return self.decision or "REQUESTED"

    def in_force(self, now_ms: int) -> bool:
        """Still open, or granted and not yet over: a second request for the job is refused meanwhile."""
        if self.decision is None:
            return now_ms < self.deadline_ms
        if self.decision != "GRANTED" or self.reverted_ms is not None:
            return False
        return self.applied_ms is not None or (self.until_ms or 0) > now_ms

    def raised_window(self, now_ms: int) -> tuple[int, int] | None:
        """[from, to) while the engine ran the job raised (to: the revert, else now, never past `until_ms`)."""
        if self.applied_ms is None or self.until_ms is None:
            return None
        end = min(self.reverted_ms if self.reverted_ms is not None else now_ms, max(self.until_ms, self.applied_ms))
        return (self.applied_ms, end) if end > self.applied_ms else None


def _id(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def rules_of(policy: Policy) -> EscalationRules:
    rules = policy.governance.escalations
    if rules is None:
        raise ConfigError("the policy allows no escalations (governance.escalations is not set)")
    return rules


def deciders(policy: Policy) -> tuple[str, ...]:
    rules = policy.governance.escalations
    return (rules.deciders if rules is not None else ()) or policy.governance.operators


def _event(e: Escalation, kind: str, actor: str, now_ms: int, text: str, **extra: Any) -> dict[str, Any]:
    base = {
        "event_id": _id(e.escalation_id, kind, actor, now_ms, extra.get("engine")), "event_type": kind,
        "escalation_id": e.escalation_id, "ts_ms": now_ms, "actor": actor, "cluster": e.job.cluster,
        "job_id": e.job.job_id, "user": e.job.user, "team": e.job.team, "gpus": e.job.gpus, "tier": e.tier,
        "hours": e.hours, "text": text[:2000], "until_ms": None, "deadline_ms": None, "engine": None,
        "engine_ref": None,
    }  # fmt: skip
    return {**base, **extra}


# -- who may ask ----------------------------------------------------------------------------------------------


def may_ask(policy: Policy, job: Job, asker: str) -> str | None:
    """None when `asker` may ask to raise `job`, else the one line that says who may."""
    rules = rules_of(policy)
    team = next((t for t in policy.teams if job.team in (t.name, t.account)), None)
    roles = set(rules.askers)
    if "operators" in roles and asker in policy.governance.operators:
        return None
    if "user" in roles and job.user and asker == job.user:
        return None
    if team is not None and (("members" in roles and asker in team.members)
                             or ("leads" in roles and asker in team.leads)):  # fmt: skip
        return None
    who = {"user": "its user", "members": "the team's members", "leads": "the team's leads",
           "operators": "the operators"}  # fmt: skip
    allowed = [who[r] for r in rules.askers]
    return (f"{asker!r} may not ask to raise job {job.job_id}: it is {job.user or 'unknown'!r}'s, team "
            f"{job.team or '?'} (policy governance.escalations.askers: {', '.join(allowed)} may)")  # fmt: skip


# -- the fold -------------------------------------------------------------------------------------------------


def _decision_problem(esc: Escalation, e: Mapping[str, Any], policy: Policy) -> str | None:
    kind, actor = e["event_type"], e["actor"]
    if esc.decision:
        return f"escalation {esc.escalation_id} was already decided ({esc.decision} by {esc.decided_by})"
    if kind == "LAPSED":
        return None if actor == SERVICE_ACTOR and e["ts_ms"] >= esc.deadline_ms else (
            f"escalation {esc.escalation_id} is not past its deadline")  # fmt: skip
    if actor not in deciders(policy):
        named = ", ".join(deciders(policy)) or "none named"
        return f"{actor!r} may not decide escalations (policy governance.escalations.deciders: {named})"
    if actor == esc.asked_by:
        return f"{actor!r} asked for escalation {esc.escalation_id} and may not decide it"
    if e["ts_ms"] >= esc.deadline_ms:
        return f"escalation {esc.escalation_id} lapsed at {iso_minute(esc.deadline_ms)}: undecided past its deadline"
    if not (e.get("text") or "").strip():
        return "a decision carries a note"
    if kind == "GRANTED":
        until = e.get("until_ms")
        if not (isinstance(until, int) and e["ts_ms"] < until <= e["ts_ms"] + esc.hours * HOUR_MS):
            return f"a grant lasts at most the {esc.hours} hours asked"
    return None


def fold(events: Iterable[Mapping[str, Any]], policy: Policy) -> tuple[dict[str, Escalation], list[Ignored]]:
    """The escalations the events describe under `policy`, and the events the rules refused (with why)."""
    out: dict[str, Escalation] = {}
    ignored: list[Ignored] = []
    for e in ordered_steps(events, STEP_ORDER):
        eid, kind = e["escalation_id"], e["event_type"]
        current = out.get(eid)
        if kind == "REQUESTED":
            if current is not None:
                ignored.append(Ignored(e["event_id"], f"escalation {eid} was already requested"))
                continue
            job = Job(e["cluster"], e["job_id"], e.get("user"), e.get("team"), int(e.get("gpus") or 0))
            out[eid] = Escalation(eid, job, e["tier"], int(e["hours"]), e["actor"], e["ts_ms"], e["text"],
                                  int(e.get("deadline_ms") or e["ts_ms"]))  # fmt: skip
            continue
        if current is None:
            ignored.append(Ignored(e["event_id"], f"{kind} of unknown escalation {eid}"))
            continue
        if kind in ("GRANTED", "DENIED", "LAPSED"):
            problem = _decision_problem(current, e, policy)
            if problem:
                ignored.append(Ignored(e["event_id"], problem))
                continue
            out[eid] = replace(current, decision=kind, decided_by=e["actor"], decided_ms=e["ts_ms"], note=e["text"],
                               until_ms=e.get("until_ms") if kind == "GRANTED" else None)  # fmt: skip
        elif kind == "APPLIED":
            if current.decision != "GRANTED" or current.applied_ms is not None or e["actor"] != SERVICE_ACTOR:
                ignored.append(Ignored(e["event_id"], f"escalation {eid} is not granted and waiting to be applied"))
                continue
            out[eid] = replace(current, engine=e.get("engine"), before=e.get("engine_ref"), applied_ms=e["ts_ms"])
        elif kind == "REVERTED":
            if current.applied_ms is None or current.reverted_ms is not None or e["actor"] != SERVICE_ACTOR:
                ignored.append(Ignored(e["event_id"], f"escalation {eid} is not raised on an engine"))
                continue
            out[eid] = replace(current, reverted_ms=e["ts_ms"])
        else:
            ignored.append(Ignored(e["event_id"], f"unknown step {kind!r}"))
    return out, ignored


# -- new steps, checked -----------------------------------------------------------------------------------------


def ask_event(escalations: Mapping[str, Escalation], policy: Policy, job: Job, asker: str, hours: int, reason: str,
              now_ms: int) -> dict[str, Any]:  # fmt: skip
    """The REQUESTED step, or a one-line ConfigError: not allowed (who may), too long, or one already open or in
    force for the job (a repeated request asks nothing twice). That the job exists and is still running is the
    engine's answer, asked by the caller first."""
    rules = rules_of(policy)
    refusal = may_ask(policy, job, asker)
    if refusal:
        raise ConfigError(refusal)
    if not 1 <= hours <= rules.max_hours:
        raise ConfigError(f"--hours must be 1..{rules.max_hours} (policy governance.escalations.max_hours), "
                          f"got {hours}")  # fmt: skip
    reason = clean_text(reason, "--reason")
    for esc in escalations.values():
        if (esc.job.cluster, esc.job.job_id) == (job.cluster, job.job_id) and esc.in_force(now_ms):
            raise ConfigError(f"escalation {esc.escalation_id} of job {job.job_id} is already {esc.state.lower()}"
                              f" (asked by {esc.asked_by}): nothing asked twice")  # fmt: skip
    if max(len(job.cluster), len(job.job_id), len(asker)) > MAX_ID:
        raise ConfigError(f"a cluster, job id or user name is at most {MAX_ID} characters")
    eid = "esc-" + _id(job.cluster, job.job_id, asker, now_ms)[:12]
    esc = Escalation(eid, job, rules.tier, hours, asker, now_ms, reason, now_ms + rules.decide_within_hours * HOUR_MS)
    return _event(esc, "REQUESTED", asker, now_ms, reason, deadline_ms=esc.deadline_ms)


def decide_event(escalations: Mapping[str, Escalation], policy: Policy, escalation_id: str, decider: str,
                 grant: bool, note: str, now_ms: int) -> dict[str, Any]:  # fmt: skip
    """The GRANTED (for the hours asked, from now) or DENIED step, or a one-line ConfigError saying why not."""
    esc = escalations.get(escalation_id)
    if esc is None:
        raise ConfigError(f"no escalation {escalation_id!r}")
    kind = "GRANTED" if grant else "DENIED"
    until = now_ms + esc.hours * HOUR_MS if grant else None
    event = _event(esc, kind, decider, now_ms, clean_text(note, "--note"), until_ms=until)
    problem = _decision_problem(esc, event, policy)
    if problem:
        raise ConfigError(problem)
    return event


# -- what the service does now ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Due:
    """What the service must do now: lapse undecided requests; raise granted ones not yet raised; lower raised ones
    whose time is up (a grant whose time ran out before it was raised is over: nothing to apply)."""

    lapsed: tuple[dict[str, Any], ...]
    raise_: tuple[Escalation, ...]
    lower: tuple[Escalation, ...]


def due(escalations: Mapping[str, Escalation], now_ms: int) -> Due:
    lapsed, to_raise, to_lower = [], [], []
    for esc in sorted(escalations.values(), key=lambda e: (e.asked_ms, e.escalation_id)):
        if esc.decision is None and now_ms >= esc.deadline_ms:
            late_h = (now_ms - esc.asked_ms) // HOUR_MS
            lapsed.append(_event(esc, "LAPSED", SERVICE_ACTOR, now_ms,
                                 f"undecided {late_h} h after the request, past the policy's deadline"))  # fmt: skip
        elif esc.decision == "GRANTED" and esc.applied_ms is None and (esc.until_ms or 0) > now_ms:
            to_raise.append(esc)
        elif esc.applied_ms is not None and esc.reverted_ms is None and (esc.until_ms or 0) <= now_ms:
            to_lower.append(esc)
    return Due(tuple(lapsed), tuple(to_raise), tuple(to_lower))


def applied_event(esc: Escalation, engine: str, before: str, now_ms: int, text: str) -> dict[str, Any]:
    """The engine ran `esc`'s job at its tier from now; `before` is what to put back ("" for nothing)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    return _event(esc, "APPLIED", SERVICE_ACTOR, now_ms, text, engine=engine, engine_ref=before[:MAX_ID],
                  until_ms=esc.until_ms)  # fmt: skip


def reverted_event(esc: Escalation, now_ms: int, text: str) -> dict[str, Any]:
    return _event(esc, "REVERTED", SERVICE_ACTOR, now_ms, text, engine=esc.engine, engine_ref=esc.before)


def step_key(event: Mapping[str, Any]) -> bytes:
    """A step's record key: its job, so one job's escalation steps stay in order on one partition."""
    from schemas.topics import job_key

    return job_key(str(event["cluster"]), str(event["job_id"]))


# -- on the statement -------------------------------------------------------------------------------------------


def raised_months(esc: Escalation, now_ms: int) -> Iterator[tuple[str, int]]:
    """(month, GPU-seconds) the job ran raised in each UTC month: what a priced escalation charges."""
    from schemas.governance_reservations import month_windows

    window = esc.raised_window(now_ms)
    if window is None or esc.job.gpus <= 0:
        return
    for month, start, stop in month_windows(*window):
        yield month, esc.job.gpus * (stop - start) // 1000


def cents_of(gpu_seconds: int, price_per_gpu_hour: Decimal) -> int:
    """GPU-seconds at a price per GPU-hour, in cents, rounded half up (the statement's cents)."""
    from decimal import ROUND_HALF_UP

    return int((Decimal(gpu_seconds) * price_per_gpu_hour * 100 / 3600).quantize(Decimal(1), ROUND_HALF_UP))


def list_row(esc: Escalation) -> dict[str, Any]:
    """An escalation as `escalate list` and the deciders' page show it."""
    return {
        "escalation_id": esc.escalation_id, "state": esc.state, "cluster": esc.job.cluster, "job_id": esc.job.job_id,
        "user": esc.job.user or "", "team": esc.job.team or "", "tier": esc.tier, "hours": esc.hours,
        "asked_by": esc.asked_by, "asked": iso_minute(esc.asked_ms),
        "decide_by": "" if esc.decision else iso_minute(esc.deadline_ms), "decided_by": esc.decided_by or "",
        "until": iso_minute(esc.until_ms), "reason": esc.reason, "note": esc.note or "",
    }  # fmt: skip
