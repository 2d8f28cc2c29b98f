"""Escalations in the browser (issue 41 item 5, `schemas/governance_escalations.py`): the deciders' page, the same
rules as `gpuledger escalate decide` (`sinks/escalate_cli.py`), never a second copy of them.

- Shown: the escalations the steps on escalations.v1 describe (read whole and folded under the policy, as the
  commands do): those to decide (undecided, before their deadline), those in force, and the ones that are over.
- Decided: once, by a decider of the policy (`governance.escalations.deciders`, else the operators) who did not ask
  for it, within its deadline, with a note: granted (the job is raised for the hours asked by the escalation
  service, which holds the engine credentials this app never has) or denied. Anyone else gets 403 naming the
  deciders. Each step is checked against the topic read whole, validated against the contract and published
  keyed by its job.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from web import params
from web.access import Forbidden, Viewer
from web.appeals import _checked
from web.model import Column, Table

_ESCALATION_ID = re.compile(r"esc-[0-9a-f]{12}")

COLUMNS = (
    Column("escalation_id", "escalation"), Column("state", "state"), Column("cluster", "cluster"),
    Column("job_id", "job"), Column("user", "user"), Column("team", "team"), Column("tier", "raised to"),
    Column("hours", "hours", "int"), Column("asked_by", "asked by"), Column("asked", "asked (UTC)"),
    Column("decide_by", "decide by (UTC)"), Column("decided_by", "decided by"), Column("until", "until (UTC)"),
    Column("reason", "reason"), Column("note", "note"),
)  # fmt: skip


def table(name: str, title: str, escalations: Iterable[Any], note: str = "") -> Table:
    from schemas.governance_escalations import list_row

    ordered = sorted(escalations, key=lambda e: (-e.asked_ms, e.escalation_id))
    return Table(name, title, COLUMNS, [list_row(e) for e in ordered], note=note)


def deciders(policy: Any) -> tuple[str, ...]:
    from schemas.governance_escalations import deciders as named

    return named(policy)


@dataclass
class EscalationService:
    """Decides escalations for the web app: `read_events()` reads escalations.v1 whole, `publish(event)` publishes a
    step (keyed by its job) and waits for delivery."""

    policy: Any
    read_events: Callable[[], list[dict[str, Any]]]
    publish: Callable[[dict[str, Any]], None]

    def deciders(self) -> tuple[str, ...]:
        return deciders(self.policy)

    def current(self) -> dict[str, Any]:
        from schemas.governance_escalations import fold

        return fold(self.read_events(), self.policy)[0]

    def decide(self, viewer: Viewer, values: dict[str, str], now_ms: int) -> dict[str, Any]:
        from base.errors import ContractError
        from schemas.governance_escalations import decide_event
        from schemas.models import validate
        from schemas.topics import ESCALATIONS

        if viewer.user not in deciders(self.policy):
            raise Forbidden(f"{viewer.user} does not decide escalations (policy governance.escalations.deciders: "
                            f"{', '.join(deciders(self.policy)) or 'none named'})")  # fmt: skip
        escalation_id = values.get("escalation_id") or ""
        if not _ESCALATION_ID.fullmatch(escalation_id):
            raise params.BadRequest("not a valid escalation id")
        decision = values.get("decision") or ""
        if decision not in ("grant", "deny"):
            raise params.BadRequest("decide with grant or deny")
        note = params.reason(values.get("note"))
        event = _checked(lambda: decide_event(self.current(), self.policy, escalation_id, viewer.user,
                                              decision == "grant", note, now_ms))  # fmt: skip
        try:
            validate(ESCALATIONS.subject, event)
        except ContractError as exc:
            raise params.BadRequest(str(exc).splitlines()[0][:300]) from exc
        self.publish(event)
        return event
