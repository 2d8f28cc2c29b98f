"""Reservations with expiry (issue 19): what a sequence of `ReservationEvent`s means, the checks before a new
one, what the reservation service must do now, and what a reservation is charged. Pure: events, the policy and
`now_ms` in; reservations, events or one-line `ConfigError`s out. At the contracts layer for the same reason as
`schemas/governance_appeals.py`: the commands, the service and the statements must read the steps alike.

    REQUESTED ──(within auto_approve limits, or an operator approves)──> APPROVED ──(start <= now)──> active
        │                                                                     │      (EXTENDED moves the end)
        └── RELEASED (the requester, a member or an operator; or idle) <──────┤
                                                  EXPIRED (end <= now) <──────┘
    The service renders an approved reservation onto the engine (RENDERED: Slurm ahead of its start, Kueue at
    it) and takes it off once it has ended (REMOVED); Slurm also drops a reservation at its end by itself.

Policy (`governance.reservations`, `docs/governance.md`): a member of the team (or an operator) reserves at most
what the team may hold of a generation (quota + borrowing limit; `max_gpus` when lower; the known fleet), at
most `max_lead_days` ahead, for at most `max_hours` (extensions included), never overlapping another live
reservation of the team and generation, and never more than the fleet across teams at any moment.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from base.errors import ConfigError, ContractError
from schemas.governance_appeals import HOUR_MS, Ignored, clean_text, iso_minute, ordered_steps
from schemas.policy import Policy

MINUTE_MS = 60_000
DAY_MS = 24 * HOUR_MS
PAST_GRACE_MS = 5 * MINUTE_MS  # a start this far in the past is "now"
SERVICE_ACTOR = "gpuledger-reservations"
STEP_ORDER = {"REQUESTED": 0, "APPROVED": 1, "EXTENDED": 2, "RENDERED": 3, "IDLE_WARNED": 4, "RELEASED": 5,
              "EXPIRED": 6, "REMOVED": 7}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Reservation:
    reservation_id: str
    cluster: str
    team: str
    generation: str
    gpus: int
    nodes: tuple[str, ...]
    start_ms: int
    end_ms: int
    requested_by: str
    requested_ms: int
    reason: str
    approved_by: str | None = None
    ended_ms: int | None = None  # released or expired
    ended_how: str | None = None  # RELEASED | EXPIRED
    idle_warned_ms: int | None = None
    rendered: Mapping[str, str] = field(default_factory=dict)  # engine -> its name for it
    rendered_nodes: tuple[str, ...] = ()
    removed: frozenset[str] = frozenset()

    @property
    def state(self) -> str:
        if self.ended_how:
            return self.ended_how
        return "APPROVED" if self.approved_by else "REQUESTED"

    @property
    def live(self) -> bool:
        """Requested or approved and not ended: it holds (or will hold) capacity."""
        return self.ended_how is None

    def until_ms(self) -> int:
        """When it stops holding capacity: its end, or when it was released or expired, if earlier."""
        return min(self.end_ms, self.ended_ms) if self.ended_ms is not None else self.end_ms

    def active(self, now_ms: int) -> bool:
        return self.approved_by is not None and self.live and self.start_ms <= now_ms < self.end_ms


def _id(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def _event(r: Reservation, kind: str, actor: str, now_ms: int, text: str, **extra: Any) -> dict[str, Any]:
    base = {
        "event_id": _id(r.reservation_id, kind, actor, now_ms, extra.get("engine"), extra.get("end_ms")),
        "event_type": kind, "reservation_id": r.reservation_id, "ts_ms": now_ms, "actor": actor,
        "cluster": r.cluster, "team": r.team, "generation": r.generation, "gpus": r.gpus, "nodes": list(r.nodes),
        "start_ms": r.start_ms, "end_ms": r.end_ms, "text": text, "engine": None, "engine_ref": None,
    }  # fmt: skip
    return {**base, **extra}


# -- the fold -------------------------------------------------------------------------------------


def _apply(r: Reservation, e: Mapping[str, Any], policy: Policy) -> Reservation | str:
    """`r` after step `e`, or why the rules refuse it."""
    kind, actor, ts = e["event_type"], e["actor"], e["ts_ms"]
    ops = policy.governance.operators
    if kind == "APPROVED":
        if r.approved_by or not r.live:
            return f"reservation {r.reservation_id} is {r.state.lower()}"
        if actor != SERVICE_ACTOR and actor not in ops:
            return f"{actor!r} may not approve reservations (policy governance.operators)"
        return replace(r, approved_by=actor)
    if kind == "EXTENDED":
        if not r.live or e["end_ms"] <= r.end_ms:
            return f"reservation {r.reservation_id} cannot be extended to {e['end_ms']}"
        if e["end_ms"] - r.start_ms > policy.governance.reservations.max_hours * HOUR_MS:
            return f"longer than the policy's {policy.governance.reservations.max_hours} hours"
        return replace(r, end_ms=e["end_ms"])
    if kind in ("RELEASED", "EXPIRED"):
        if not r.live:
            return f"reservation {r.reservation_id} has already ended"
        if kind == "EXPIRED" and ts < r.end_ms:
            return f"reservation {r.reservation_id} has not reached its end"
        return replace(r, ended_ms=ts if kind == "RELEASED" else r.end_ms, ended_how=kind)
    if kind == "IDLE_WARNED":
        return replace(r, idle_warned_ms=r.idle_warned_ms or ts)
    if kind == "RENDERED" and e.get("engine"):
        return replace(r, rendered={**r.rendered, e["engine"]: e.get("engine_ref") or ""},
                       rendered_nodes=tuple(e.get("nodes") or r.rendered_nodes))  # fmt: skip
    if kind == "REMOVED" and e.get("engine"):
        return replace(r, removed=r.removed | {e["engine"]})
    return f"{kind} of reservation {r.reservation_id} not understood"


def fold(events: Iterable[Mapping[str, Any]], policy: Policy) -> tuple[dict[str, Reservation], list[Ignored]]:
    """The reservations the steps describe under `policy`, and the steps the rules refused (with why). A request
    is re-checked against the policy and the reservations before it, so one written past the commands that
    breaks the rules is ignored, not held."""
    out: dict[str, Reservation] = {}
    ignored: list[Ignored] = []
    for e in ordered_steps(events, STEP_ORDER):
        rid = e["reservation_id"]
        if e["event_type"] == "REQUESTED":
            r = Reservation(rid, e["cluster"], e["team"], e["generation"], int(e["gpus"]), tuple(e.get("nodes") or ()),
                            e["start_ms"], e["end_ms"], e["actor"], e["ts_ms"], e["text"])  # fmt: skip
            problem = None if rid not in out else f"reservation {rid} was already requested"
            try:
                problem = problem or _check_request(out, policy, r, e["ts_ms"])
            except ConfigError as exc:
                problem = str(exc)
            if problem:
                ignored.append(Ignored(e["event_id"], problem))
            else:
                out[rid] = r
            continue
        current = out.get(rid)
        if current is None:
            ignored.append(Ignored(e["event_id"], f"{e['event_type']} of unknown reservation {rid}"))
            continue
        after = _apply(current, e, policy)
        if isinstance(after, str):
            ignored.append(Ignored(e["event_id"], after))
        else:
            out[rid] = after
    return out, ignored


# -- new steps, checked ----------------------------------------------------------------------------


def _may_act(who: str, team: str, policy: Policy) -> bool:
    if who in policy.governance.operators:
        return True
    members = next((t.members for t in policy.teams if t.name == team), ())
    return who in members


def _overlaps(a_start: int, a_end: int, b_start: int, b_end: int) -> bool:
    return a_start < b_end and b_start < a_end


def _capacity_problem(existing: Mapping[str, Reservation], policy: Policy, r: Reservation, end_ms: int,
                      ignore: str | None = None) -> str | None:  # fmt: skip
    others = [o for o in existing.values() if o.live and o.reservation_id != ignore and o.cluster == r.cluster
              and o.generation == r.generation and _overlaps(o.start_ms, o.until_ms(), r.start_ms, end_ms)]  # fmt: skip
    for o in others:
        if o.team == r.team:
            return f"overlapping reservation {o.reservation_id} of {o.team} ({o.gpus} {o.generation} GPUs)"
    fleet = policy.generations[r.generation].fleet_gpus
    if fleet is not None:
        # The most GPUs reserved at any instant of the window: at each start within it.
        instants = [r.start_ms, *(o.start_ms for o in others if r.start_ms <= o.start_ms < end_ms)]
        peak = max(sum(o.gpus for o in others if o.start_ms <= t < o.until_ms()) for t in instants) + r.gpus
        if peak > fleet:
            return f"{peak} {r.generation} GPUs would be reserved at once; the fleet has {fleet}"
    return None


def _check_request(existing: Mapping[str, Reservation], policy: Policy, r: Reservation, now_ms: int) -> str | None:
    rules = policy.governance.reservations
    team = next((t for t in policy.teams if t.name == r.team), None)
    if team is None:
        return f"unknown team {r.team!r} (policy teams: {', '.join(t.name for t in policy.teams)})"
    if r.generation not in policy.generations:
        return f"unknown generation {r.generation!r} (policy generations: {', '.join(policy.generations)})"
    if not _may_act(r.requested_by, r.team, policy):
        return f"{r.requested_by!r} may not reserve for {r.team} (its members and the operators may)"
    cap = team.quota.get(r.generation, 0) + team.borrowing_limit.get(r.generation, 0)
    cap = min(cap, rules.max_gpus.get(r.generation, cap))
    if not 1 <= r.gpus <= cap:
        return f"{r.team} may reserve 1..{cap} {r.generation} GPUs (quota + borrowing, policy), not {r.gpus}"
    if r.start_ms < now_ms - PAST_GRACE_MS:
        return "the start is in the past"
    if r.start_ms > now_ms + rules.max_lead_days * DAY_MS:
        return f"the start is more than {rules.max_lead_days} days ahead (policy reservations.max_lead_days)"
    if not 0 < r.end_ms - r.start_ms <= rules.max_hours * HOUR_MS:
        return f"a reservation lasts at most {rules.max_hours} hours (policy reservations.max_hours)"
    return _capacity_problem(existing, policy, r, r.end_ms)


def request_events(existing: Mapping[str, Reservation], policy: Policy, *, cluster: str, team: str,
                   generation: str, gpus: int, nodes: Iterable[str], start_ms: int, end_ms: int, reason: str,
                   requester: str, now_ms: int) -> list[dict[str, Any]]:  # fmt: skip
    """REQUESTED, and APPROVED with it when within the automatic limits; a one-line ConfigError otherwise."""
    reason = clean_text(reason, "--reason")
    start_ms = max(start_ms, now_ms) if start_ms >= now_ms - PAST_GRACE_MS else start_ms
    rid = "rsv-" + _id(cluster, team, generation, gpus, start_ms, requester, now_ms)[:10]
    r = Reservation(rid, cluster, team, generation, gpus, tuple(nodes), start_ms, end_ms, requester, now_ms, reason)
    problem = _check_request(existing, policy, r, now_ms)
    if problem:
        raise ConfigError(problem)
    out = [_event(r, "REQUESTED", requester, now_ms, reason)]
    rules = policy.governance.reservations
    if gpus <= rules.auto_approve_gpus and end_ms - start_ms <= rules.auto_approve_hours * HOUR_MS:
        out.append(_event(r, "APPROVED", SERVICE_ACTOR, now_ms, "within the policy's automatic approval"))
    return out


def _live(existing: Mapping[str, Reservation], rid: str) -> Reservation:
    r = existing.get(rid)
    if r is None:
        raise ConfigError(f"no reservation {rid!r}")
    if not r.live:
        raise ConfigError(f"reservation {rid} has already ended ({r.state.lower()})")
    return r


def approve_event(existing: Mapping[str, Reservation], policy: Policy, rid: str, who: str,
                  now_ms: int) -> dict[str, Any]:  # fmt: skip
    r = _live(existing, rid)
    if r.approved_by:
        raise ConfigError(f"reservation {rid} is already approved (by {r.approved_by})")
    if who not in policy.governance.operators:
        raise ConfigError(f"{who!r} may not approve reservations (policy governance.operators)")
    return _event(r, "APPROVED", who, now_ms, "approved by an operator")


def extend_event(existing: Mapping[str, Reservation], policy: Policy, rid: str, who: str, hours: float,
                 now_ms: int) -> dict[str, Any]:  # fmt: skip
    r = _live(existing, rid)
    if not _may_act(who, r.team, policy):
        raise ConfigError(f"{who!r} may not extend {r.team}'s reservation")
    if not 0 < hours <= policy.governance.reservations.max_hours:
        raise ConfigError(f"--hours must be above 0 and at most {policy.governance.reservations.max_hours}")
    if now_ms >= r.end_ms:
        raise ConfigError(f"reservation {rid} ended at its end time; request a new one")
    end = r.end_ms + int(hours * HOUR_MS)
    if end - r.start_ms > policy.governance.reservations.max_hours * HOUR_MS:
        raise ConfigError(f"a reservation lasts at most {policy.governance.reservations.max_hours} hours, "
                          "extensions included")  # fmt: skip
    problem = _capacity_problem(existing, policy, r, end, ignore=rid)
    if problem:
        raise ConfigError(problem)
    return _event(r, "EXTENDED", who, now_ms, f"extended by {hours:g} h", end_ms=end)


def release_event(existing: Mapping[str, Reservation], policy: Policy, rid: str, who: str, now_ms: int,
                  why: str = "released") -> dict[str, Any]:  # fmt: skip
    r = _live(existing, rid)
    if who != SERVICE_ACTOR and not _may_act(who, r.team, policy):
        raise ConfigError(f"{who!r} may not release {r.team}'s reservation")
    return _event(r, "RELEASED", who, now_ms, why)


# -- what the service must do now ------------------------------------------------------------------


def idle_minutes_at(r: Reservation, last_active_ms: int | None, now_ms: int) -> int:
    """Minutes `r`'s GPUs have been idle at `now_ms`: since the last minute its team computed on them inside its
    window (`last_active_ms`, that minute's start; None: none yet), or since its start. The service's measure
    (`sinks.reservations.idle_minutes`) and the what-if's replay of it (`sinks.whatif`) both take it from here."""
    since = r.start_ms if last_active_ms is None else max(r.start_ms, last_active_ms + MINUTE_MS)
    return max(0, (now_ms - since) // MINUTE_MS)


@dataclass(frozen=True, slots=True)
class Due:
    """The service's work at `now`: reservations to put on an engine, to take off, and steps to publish."""

    render: tuple[tuple[str, Reservation], ...]  # (engine, reservation)
    remove: tuple[tuple[str, Reservation], ...]
    events: tuple[dict[str, Any], ...]


def due(existing: Mapping[str, Reservation], now_ms: int, engines: Iterable[str],
        idle_minutes: Mapping[str, int] | None = None, policy: Policy | None = None) -> Due:  # fmt: skip
    """What to do now: EXPIRED for a live reservation past its end; each approved, live reservation not yet on
    an engine is rendered (Slurm takes future reservations; Kueue's quota only while active); each ended one still
    on an engine is removed. With `idle_minutes` (reservation -> minutes its GPUs have been idle) and the policy's
    idle limits: IDLE_WARNED once, then RELEASED early."""
    engines = tuple(engines)
    events: list[dict[str, Any]] = []
    render: list[tuple[str, Reservation]] = []
    remove: list[tuple[str, Reservation]] = []
    rules = policy.governance.reservations if policy is not None else None
    for r in sorted(existing.values(), key=lambda r: r.reservation_id):
        if r.live and now_ms >= r.end_ms:
            events.append(_event(r, "EXPIRED", SERVICE_ACTOR, r.end_ms, "reached its end"))
            r = replace(r, ended_ms=r.end_ms, ended_how="EXPIRED")
        idle = (idle_minutes or {}).get(r.reservation_id)
        if rules is not None and idle is not None and r.active(now_ms):
            if rules.idle_release_minutes is not None and idle >= rules.idle_release_minutes:
                events.append(_event(r, "RELEASED", SERVICE_ACTOR, now_ms, f"idle {idle} min: released early"))
                r = replace(r, ended_ms=now_ms, ended_how="RELEASED")
            elif rules.idle_warn_minutes is not None and idle >= rules.idle_warn_minutes and not r.idle_warned_ms:
                events.append(_event(r, "IDLE_WARNED", SERVICE_ACTOR, now_ms, f"its GPUs idle for {idle} min"))
        for engine in engines:
            on = engine in r.rendered and engine not in r.removed
            wanted = r.live and r.approved_by is not None and (engine == "SLURM" or r.start_ms <= now_ms)
            if wanted and engine not in r.rendered:
                render.append((engine, r))
            elif on and not r.live:
                remove.append((engine, r))
    return Due(tuple(render), tuple(remove), tuple(events))


def rendered_event(r: Reservation, engine: str, ref: str, nodes: Iterable[str], now_ms: int,
                   text: str) -> dict[str, Any]:  # fmt: skip
    return _event(r, "RENDERED", SERVICE_ACTOR, now_ms, text, engine=engine, engine_ref=ref, nodes=list(nodes))


def removed_event(r: Reservation, engine: str, now_ms: int, text: str) -> dict[str, Any]:
    return _event(r, "REMOVED", SERVICE_ACTOR, now_ms, text, engine=engine, engine_ref=r.rendered.get(engine))


# -- the charge ------------------------------------------------------------------------------------


def month_windows(start_ms: int, end_ms: int) -> list[tuple[str, int, int]]:
    """[start, end) cut at month boundaries (UTC): (YYYY-MM, start, end) per month."""
    import calendar
    import datetime as dt

    out = []
    t = start_ms
    while t < end_ms:
        d = dt.datetime.fromtimestamp(t / 1000, dt.UTC)
        year, month = (d.year + d.month // 12, d.month % 12 + 1)
        nxt = calendar.timegm((year, month, 1, 0, 0, 0)) * 1000
        out.append((f"{d.year}-{d.month:02d}", t, min(nxt, end_ms)))
        t = nxt
    return out


def reserved_seconds(r: Reservation, now_ms: int) -> list[tuple[str, int]]:
    """(month, reserved GPU-seconds) of an approved reservation up to now: GPUs x the part of its window that has
    passed (it is charged on allocation, as it goes, like a job). None before approval."""
    if r.approved_by is None:
        return []
    end = min(r.until_ms(), now_ms)
    return [(month, r.gpus * (e - s) // 1000) for month, s, e in month_windows(r.start_ms, end)]


# The steps as a person asks for them, from what they typed (`gpuledger reserve`, the team page's form): both
# build, check and key a step here, so a reservation asked for on the page is the one the command would publish.


def start_ms(text: str, now_ms: int) -> int:
    """A requested start: `now`, or an ISO time (UTC when it names no zone)."""
    if text == "now":
        return now_ms
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--start must be now or an ISO time like 2026-12-03T08:00Z, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)  # a time without a zone is UTC
    return int(when.timestamp() * 1000)


def request_steps(existing: Mapping[str, Reservation], policy: Policy, *, cluster: str, team: str, generation: str,
                  gpus: int, hours: float, start: str, nodes: str, reason: str, requester: str,
                  now_ms: int) -> list[dict[str, Any]]:  # fmt: skip
    """`reserve create`'s steps (REQUESTED, and APPROVED when within the automatic limits) from its options as
    given (start `now` or ISO, nodes comma-separated); a one-line ConfigError when the rules refuse."""
    if not 0 < hours <= 24 * 366:
        raise ConfigError(f"--hours must be above 0, got {hours:g}")
    begin = start_ms(start, now_ms)
    names = [n.strip() for n in nodes.split(",") if n.strip()]
    return request_events(existing, policy, cluster=cluster, team=team, generation=generation, gpus=gpus,
                          nodes=names, start_ms=begin, end_ms=max(begin, now_ms) + int(hours * HOUR_MS),
                          reason=reason, requester=requester, now_ms=now_ms)  # fmt: skip


def step_event(kind: str, existing: Mapping[str, Reservation], policy: Policy, rid: str, who: str, now_ms: int,
               **kw: Any) -> dict[str, Any]:  # fmt: skip
    """`reserve approve|extend|release`'s step, checked by the rules (a one-line ConfigError when refused)."""
    if kind == "approve":
        return approve_event(existing, policy, rid, who, now_ms)
    if kind == "extend":
        return extend_event(existing, policy, rid, who, kw["hours"], now_ms)
    return release_event(existing, policy, rid, who, now_ms, kw["reason"])


def check_steps(events: list[dict[str, Any]]) -> None:
    """Each step validated against the contract before any is published (a one-line ConfigError if not)."""
    from schemas.models import validate
    from schemas.topics import RESERVATIONS

    for event in events:
        try:
            validate(RESERVATIONS.subject, event)
        except ContractError as exc:
            raise ConfigError(str(exc).splitlines()[0][:300]) from exc


def step_key(event: Mapping[str, Any]) -> bytes:
    """A step's record key: its reservation, so one reservation's steps stay in order on one partition."""
    return f"{event['cluster']}/{event['reservation_id']}".encode()


def list_row(r: Reservation) -> dict[str, Any]:
    """One reservation as a line of `reserve list` and of the team page's reservations table."""
    return {
        "reservation_id": r.reservation_id, "state": r.state, "cluster": r.cluster, "team": r.team,
        "generation": r.generation, "gpus": r.gpus, "start": iso_minute(r.start_ms), "end": iso_minute(r.until_ms()),
        "requested_by": r.requested_by, "approved_by": r.approved_by or "",
        "on": ",".join(e for e in sorted(r.rendered) if e not in r.removed),
        "nodes": ",".join(r.rendered_nodes or r.nodes), "reason": r.reason,
    }  # fmt: skip
