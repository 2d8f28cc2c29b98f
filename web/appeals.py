"""Appeals in the browser (issue 19's appeals, `schemas/governance_appeals.py`): the same rules as `gpuledger
appeal file|decide`, never a second copy of them.

- Shown: the appeals the stored steps describe (`appeal_events`, folded under the policy), for a team, a job,
  or, on the deciders' page, every one still to decide.
- Filed: against a job's charge in a month, or one of its idle alerts, by the viewer; decided once, by a
  decider of the policy who did not file it, as a credit (a credit line on the team's statement), an
  exemption, or a denial with a note. Each new step is checked against the appeals read whole from the
  topic (as the commands do, so a step filed a second ago counts), validated against the contract, and
  published on `appeals.v1` keyed by its job.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from base.errors import ConfigError
from web import params
from web.access import Forbidden, Viewer
from web.model import Column, Table

_ALERT_ID = re.compile(r"[0-9a-f]{8,64}")
_APPEAL_ID = re.compile(r"ap-[0-9a-f]{12}")
DECISIONS = {"credit": "CREDIT", "exemption": "EXEMPTION", "deny": "DENIED"}

COLUMNS = (
    Column("appeal_id", "appeal"), Column("job_id", "job"), Column("alert_id", "alert"),
    Column("period", "month"), Column("filed_by", "filed by"), Column("filed", "filed (UTC)"),
    Column("reason", "reason"), Column("state", "state"), Column("decision", "decision"),
    Column("credit", "credit", "money"), Column("exempt_until", "exempt until"), Column("decided_by", "decided by"),
    Column("decided", "decided (UTC)"), Column("note", "note"), Column("deadline", "decide by"),
)  # fmt: skip


def _utc(ms: int | None) -> str:
    return "" if ms is None else dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M")


def row(a: Any) -> dict[str, Any]:
    """One appeal (`schemas.governance_appeals.Appeal`) as a table row."""
    s = a.subject
    return {
        "appeal_id": a.appeal_id, "cluster": s.cluster, "job_id": s.job_id, "alert_id": s.alert_id or "",
        "period": s.period or "", "team": s.team or "", "filed_by": a.filed_by, "filed": _utc(a.filed_ms),
        "reason": a.reason, "state": a.state, "decision": a.decision or "",
        "credit": None if not a.credit_cents else (Decimal(a.credit_cents) / 100).quantize(Decimal("0.01")),
        "exempt_until": _utc(a.exemption_until_ms), "decided_by": a.decided_by or "", "decided": _utc(a.decided_ms),
        "note": a.note or "", "deadline": "" if a.decision else _utc(a.deadline_ms), "_filed_ms": a.filed_ms,
    }  # fmt: skip


def table(name: str, title: str, appeals: Iterable[Any], note: str = "") -> Table:
    rows = sorted((row(a) for a in appeals), key=lambda r: (-r["_filed_ms"], r["appeal_id"]))
    return Table(name, title, COLUMNS, rows, note=note)


def stored(client: Any, policy: Any) -> list[Any]:
    """The appeals the sink has stored, folded under the policy (what the statements' credits come from)."""
    from schemas.governance_appeals import fold
    from web.queries import appeal_events

    appeals, _ = fold(appeal_events(client), policy)
    return list(appeals.values())


@dataclass
class AppealService:
    """Files and decides appeals for the web app: `read_events()` reads appeals.v1 whole, `publish(event)`
    publishes a step (keyed by its job) and waits for delivery."""

    policy: Any
    read_events: Callable[[], list[dict[str, Any]]]
    publish: Callable[[dict[str, Any]], None]

    def current(self) -> dict[str, Any]:
        from schemas.governance_appeals import fold

        appeals, _ = fold(self.read_events(), self.policy)
        return appeals

    def file(self, client: Any, viewer: Viewer, values: dict[str, str], now_ms: int) -> dict[str, Any]:
        from schemas.governance_appeals import file_event
        from web.queries import alert_subject, job_subject

        cluster, job_id = params.cluster(values["cluster"]), params.job_id(values["job_id"])
        reason = params.reason(values["reason"])
        alert = values.get("alert_id") or ""
        if alert:
            if not _ALERT_ID.fullmatch(alert):
                raise params.BadRequest("not a valid alert id")
            subject = alert_subject(client, alert)
            if subject is not None and (subject.cluster, subject.job_id) != (cluster, job_id):
                subject = None  # an alert of another job: not this page's to appeal
        else:
            subject = job_subject(client, cluster, job_id, params.period(values["period"], now_ms).text)
        if subject is None:
            raise params.BadRequest("the ledger has no such charge or alert of this job")
        if not viewer.sees_team(subject.team or ""):
            raise Forbidden(f"{viewer.user} may not see team {subject.team}")
        event = _checked(lambda: file_event(self.current(), self.policy, subject, viewer.user, reason, now_ms))
        self._publish(event)
        return event

    def decide(self, viewer: Viewer, values: dict[str, str], now_ms: int) -> dict[str, Any]:
        from schemas.governance_appeals import decide_event, parse_amount

        if viewer.user not in self.policy.governance.deciders:
            raise Forbidden(f"{viewer.user} does not decide appeals (policy governance.appeals.deciders)")
        appeal_id = values.get("appeal_id") or ""
        if not _APPEAL_ID.fullmatch(appeal_id):
            raise params.BadRequest("not a valid appeal id")
        decision = DECISIONS.get(values.get("decision") or "")
        if decision is None:
            raise params.BadRequest("decide with credit, exemption or deny")
        rules = self.policy.governance.appeals
        cents = None
        if decision == "CREDIT":
            cents = _checked(lambda: parse_amount(values.get("amount") or "", rules.max_credit))
        hours = _hours(values.get("hours"), rules.max_exemption_hours) if decision == "EXEMPTION" else None
        note = params.reason(values.get("note"))
        event = _checked(lambda: decide_event(self.current(), self.policy, appeal_id, viewer.user, decision, note,
                                              now_ms, credit_cents=cents, exemption_hours=hours))  # fmt: skip
        self._publish(event)
        return event

    def _publish(self, event: dict[str, Any]) -> None:
        from base.errors import ContractError
        from schemas.models import validate
        from schemas.topics import APPEALS

        try:
            validate(APPEALS.subject, event)
        except ContractError as exc:
            raise params.BadRequest(str(exc).splitlines()[0][:300]) from exc
        self.publish(event)


def _hours(text: str | None, limit: int) -> int:
    if not text or len(text) > 6 or not (text.isascii() and text.isdigit()) or not 0 < int(text) <= limit:
        raise params.BadRequest(f"an exemption lasts 1 to {limit} hours (policy)")
    return int(text)


def _checked(make: Callable[[], Any]) -> Any:
    """The rules' one-line refusal as a 400 naming it (their messages are meant for people)."""
    try:
        return make()
    except ConfigError as exc:
        text = str(exc).replace("--reason", "the reason").replace("--note", "the note").replace("--amount", "amount")
        raise params.BadRequest(text) from None
