"""Appeals with decisions (issue 19): what a sequence of `AppealEvent`s means, and the checks before a new one.

Pure: events and the policy in, appeals or one-line `ConfigError`s out; no IO, no clock (`now_ms` is given).
At the contracts layer, like `schemas/policy.py`, because three readers must agree on it: the `appeal` commands
(is this step allowed?), the appeals service (what is overdue?) and the statements (which credits count?).

    FILED ──(a decider: CREDIT | EXEMPTION | DENIED with a note)──> DECIDED
      │
      └──(undecided past the policy's deadline)──> ESCALATED ──(a decider)──> DECIDED

- An appeal is filed against an alert (an idle warning or a reclaim notice) or a job's charge, by the job's
  user, a member of its team (policy `teams[].members`) or an operator, within `appeals.window_days` of the
  alert or the job's last activity; one undecided appeal per alert (or per job's charge) at a time.
- It is decided once, by someone in `governance.appeals.deciders` (the operators when none are listed) who
  did not file it: CREDIT (0 < amount <= `max_credit`), EXEMPTION (at most `max_exemption_hours`), or DENIED
  (the note says why). The first valid decision is the decision; a later one is ignored, as is any event
  the rules refuse (`fold` reports them), so an event written past the commands never becomes a credit.
- Events are folded in (ts_ms, step, event_id) order, so the topic and a table of it give the same appeals.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from base.errors import ConfigError
from schemas.policy import Policy

MAX_TEXT = 2000
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
STEP_ORDER = {"FILED": 0, "DECIDED": 1, "ESCALATED": 2}
RESUME_ASKED = "RESUME_ASKED"  # shares the topic (the job page's resume button, sinks/reclaim_resume.py): no appeal
DECISIONS = ("EXEMPTION", "CREDIT", "DENIED")
SERVICE_ACTOR = "gpuledger-appeals"


@dataclass(frozen=True, slots=True)
class Subject:
    """What is appealed against, as the ledger knows it: a job (and the alert, if any)."""

    cluster: str
    job_id: str
    alert_id: str | None
    user: str | None
    team: str | None
    project: str | None
    period: str | None  # the month of the job's charge
    seen_ms: int  # the alert's time, or the job's last activity: the window counts from it


@dataclass(frozen=True, slots=True)
class Appeal:
    appeal_id: str
    subject: Subject
    filed_by: str
    filed_ms: int
    reason: str
    deadline_ms: int
    decision: str | None = None
    decided_by: str | None = None
    decided_ms: int | None = None
    note: str | None = None
    credit_cents: int | None = None
    exemption_until_ms: int | None = None
    escalated_ms: int | None = None

    @property
    def state(self) -> str:
        return "DECIDED" if self.decision else "ESCALATED" if self.escalated_ms is not None else "OPEN"


@dataclass(frozen=True, slots=True)
class Ignored:
    event_id: str
    why: str


def _id(*parts: object) -> str:
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()


def iso_minute(ms: int | None) -> str:
    """A time as the governance commands and the team page print it (UTC, to the minute); "" for none."""
    return "" if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%MZ")


def clean_text(text: str, what: str) -> str:
    """`text` stripped, non-empty, at most MAX_TEXT characters, without control characters but newline/tab."""
    text = (text or "").strip()
    if not text:
        raise ConfigError(f"{what} must not be empty")
    if len(text) > MAX_TEXT:
        raise ConfigError(f"{what} is {len(text)} characters; at most {MAX_TEXT}")
    if any((ord(c) < 32 and c not in "\n\t") or ord(c) == 127 for c in text):
        raise ConfigError(f"{what} holds control characters")
    return text


def parse_amount(text: str, limit: Decimal) -> int:
    """A credit given as money (`12.34`): its cents, refused in one line unless 0 < amount <= limit, 2 places."""
    try:
        amount = Decimal(text.strip())
    except (InvalidOperation, AttributeError):
        raise ConfigError(f"--amount must be money like 12.34, got {text!r}") from None
    if not amount.is_finite() or amount <= 0:
        raise ConfigError(f"--amount must be positive with at most 2 decimals, got {text!r}")
    if amount > limit:
        raise ConfigError(f"credit {amount} is above the policy's max_credit of {limit}")
    if amount != amount.quantize(Decimal("0.01")):
        raise ConfigError(f"--amount must be positive with at most 2 decimals, got {text!r}")
    return int(amount * 100)


# -- the fold -------------------------------------------------------------------------------------


def ordered_steps(events: Iterable[Mapping[str, Any]], step_order: Mapping[str, int]) -> list[Mapping[str, Any]]:
    """A workflow's steps (appeals, reservations, escalations) in the order they are folded: by time, then by the
    workflow's step order, then by id; a step read twice (a replay) once."""
    seen: set[str] = set()
    out = []
    for e in sorted(events, key=lambda e: (e["ts_ms"], step_order.get(e["event_type"], 9), e["event_id"])):
        if e["event_id"] not in seen:
            seen.add(e["event_id"])
            out.append(e)
    return out


def _decision_problem(appeal: Appeal, e: Mapping[str, Any], policy: Policy) -> str | None:
    rules = policy.governance.appeals
    if appeal.decision:
        return f"appeal {appeal.appeal_id} was already decided ({appeal.decision} by {appeal.decided_by})"
    if e["actor"] not in policy.governance.deciders:
        return f"{e['actor']!r} may not decide appeals (policy governance.appeals.deciders)"
    if e["actor"] == appeal.filed_by:
        return f"{e['actor']!r} filed appeal {appeal.appeal_id} and may not decide it"
    decision, cents, until = e.get("decision"), e.get("credit_cents"), e.get("exemption_until_ms")
    if decision not in DECISIONS:
        return f"unknown decision {decision!r}"
    if decision == "CREDIT" and not (isinstance(cents, int) and 0 < cents <= int(rules.max_credit * 100)):
        return f"credit of {cents} cents is outside 0..{rules.max_credit}"
    if decision == "EXEMPTION" and not (
        isinstance(until, int) and e["ts_ms"] < until <= e["ts_ms"] + rules.max_exemption_hours * HOUR_MS
    ):
        return f"an exemption lasts at most {rules.max_exemption_hours} hours"
    if not (e.get("text") or "").strip():
        return "a decision carries a note"
    return None


def fold(events: Iterable[Mapping[str, Any]], policy: Policy) -> tuple[dict[str, Appeal], list[Ignored]]:
    """The appeals the events describe under `policy`, and the events the rules refused (with why)."""
    appeals: dict[str, Appeal] = {}
    ignored: list[Ignored] = []
    for e in ordered_steps(events, STEP_ORDER):
        aid, kind = e["appeal_id"], e["event_type"]
        if kind == RESUME_ASKED:
            continue  # not an appeal's step, nor a refused one
        current = appeals.get(aid)
        if kind == "FILED":
            if current is not None:
                ignored.append(Ignored(e["event_id"], f"appeal {aid} was already filed"))
                continue
            subject = Subject(e["cluster"], e["job_id"], e.get("alert_id"), e.get("user"), e.get("team"),
                              e.get("project"), e.get("period"), e["ts_ms"])  # fmt: skip
            deadline = e.get("deadline_ms") or e["ts_ms"] + policy.governance.appeals.deadline_hours * HOUR_MS
            appeals[aid] = Appeal(aid, subject, e["actor"], e["ts_ms"], e["text"], deadline)
            continue
        if current is None:
            ignored.append(Ignored(e["event_id"], f"{kind} of unknown appeal {aid}"))
            continue
        if kind == "DECIDED":
            problem = _decision_problem(current, e, policy)
            if problem:
                ignored.append(Ignored(e["event_id"], problem))
                continue
            appeals[aid] = replace(current, decision=e["decision"], decided_by=e["actor"], decided_ms=e["ts_ms"],
                                   note=e["text"], credit_cents=e.get("credit_cents"),
                                   exemption_until_ms=e.get("exemption_until_ms"))  # fmt: skip
        elif kind == "ESCALATED":
            if current.decision or current.escalated_ms is not None or e["ts_ms"] < current.deadline_ms:
                ignored.append(Ignored(e["event_id"], f"appeal {aid} is not overdue and undecided"))
                continue
            appeals[aid] = replace(current, escalated_ms=e["ts_ms"])
    return appeals, ignored


# -- new steps, checked -----------------------------------------------------------------------------


def _may_file(filer: str, subject: Subject, policy: Policy) -> bool:
    if filer == subject.user or filer in policy.governance.operators or filer in policy.governance.deciders:
        return True
    team = next((t for t in policy.teams if t.name == subject.team), None)
    return team is not None and filer in team.members


def file_event(appeals: Mapping[str, Appeal], policy: Policy, subject: Subject, filer: str, reason: str,
               now_ms: int) -> dict[str, Any]:  # fmt: skip
    """The FILED event of a new appeal, or a one-line ConfigError saying why not."""
    reason = clean_text(reason, "--reason")
    if not _may_file(filer, subject, policy):
        raise ConfigError(f"{filer!r} may not appeal job {subject.job_id}: it is {subject.user!r}'s, team "
                          f"{subject.team!r} (its members and the operators may)")  # fmt: skip
    window = policy.governance.appeals.window_days
    if now_ms - subject.seen_ms > window * DAY_MS:
        raise ConfigError(f"too late to appeal: appeals are filed within {window} days (policy appeals.window_days)")
    for a in appeals.values():
        s = a.subject
        if (s.cluster, s.job_id, s.alert_id) == (subject.cluster, subject.job_id, subject.alert_id) and not a.decision:
            raise ConfigError(f"appeal {a.appeal_id} on the same {'alert' if s.alert_id else 'job'} is still open")
    aid = "ap-" + _id(subject.cluster, subject.job_id, subject.alert_id, filer, now_ms)[:12]
    deadline = now_ms + policy.governance.appeals.deadline_hours * HOUR_MS
    return {
        "event_id": _id(aid, "FILED"), "event_type": "FILED", "appeal_id": aid, "ts_ms": now_ms, "actor": filer,
        "cluster": subject.cluster, "job_id": subject.job_id, "alert_id": subject.alert_id, "user": subject.user,
        "team": subject.team, "project": subject.project, "period": subject.period, "text": reason,
        "decision": None, "credit_cents": None, "exemption_until_ms": None, "deadline_ms": deadline,
    }  # fmt: skip


def decide_event(appeals: Mapping[str, Appeal], policy: Policy, appeal_id: str, decider: str, decision: str,
                 note: str, now_ms: int, *, credit_cents: int | None = None,
                 exemption_hours: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The DECIDED event, or a one-line ConfigError (unknown appeal, decided already, not a decider, ...)."""
    appeal = appeals.get(appeal_id)
    if appeal is None:
        raise ConfigError(f"no appeal {appeal_id!r}")
    until = None if exemption_hours is None else now_ms + exemption_hours * HOUR_MS
    event = {
        "event_id": _id(appeal_id, "DECIDED", decider, now_ms), "event_type": "DECIDED", "appeal_id": appeal_id,
        "ts_ms": now_ms, "actor": decider, "cluster": appeal.subject.cluster, "job_id": appeal.subject.job_id,
        "alert_id": appeal.subject.alert_id, "user": appeal.subject.user, "team": appeal.subject.team,
        "project": appeal.subject.project, "period": appeal.subject.period,
        "text": clean_text(note, "--note"), "decision": decision,
        "credit_cents": credit_cents if decision == "CREDIT" else None,
        "exemption_until_ms": until if decision == "EXEMPTION" else None, "deadline_ms": None,
    }  # fmt: skip
    if decision == "CREDIT" and credit_cents is None:
        raise ConfigError("--grant credit needs --amount")
    if decision == "EXEMPTION" and exemption_hours is None:
        raise ConfigError("--grant exemption needs --hours")
    problem = _decision_problem(appeal, event, policy)
    if problem:
        raise ConfigError(problem)
    return event


def escalations(appeals: Mapping[str, Appeal], now_ms: int) -> list[dict[str, Any]]:
    """ESCALATED events for the appeals undecided past their deadline and not escalated yet (deterministic ids:
    two services escalating the same appeal write one event)."""
    out = []
    for a in sorted(appeals.values(), key=lambda a: a.appeal_id):
        if a.decision or a.escalated_ms is not None or now_ms < a.deadline_ms:
            continue
        late_h = (now_ms - a.filed_ms) // HOUR_MS
        out.append({
            "event_id": _id(a.appeal_id, "ESCALATED"), "event_type": "ESCALATED", "appeal_id": a.appeal_id,
            "ts_ms": now_ms, "actor": SERVICE_ACTOR, "cluster": a.subject.cluster, "job_id": a.subject.job_id,
            "alert_id": a.subject.alert_id, "user": a.subject.user, "team": a.subject.team,
            "project": a.subject.project, "period": a.subject.period,
            "text": f"undecided {late_h} h after filing, past the policy's deadline", "decision": None,
            "credit_cents": None, "exemption_until_ms": None, "deadline_ms": None,
        })  # fmt: skip
    return out
