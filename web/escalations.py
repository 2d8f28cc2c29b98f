"""Escalations in the browser (issue 41 item 5, `schemas/governance_escalations.py`): the deciders' page and the job
page's "ask for escalation" form, the same rules as `gpuledger escalate ask|decide` (`sinks/escalate_cli.py`), never
a second copy of them.

- Shown: the escalations the steps on escalations.v1 describe (read whole and folded under the policy, as the
  commands do): those to decide (undecided, before their deadline), those in force, and the ones that are over.
- Decided: once, by a decider of the policy (`governance.escalations.deciders`, else the operators) who did not ask
  for it, within its deadline, with a note: granted (the job is raised for the hours asked by the escalation
  service, which holds the engine credentials this app never has) or denied. Anyone else gets 403 naming the
  deciders. Each step is checked against the topic read whole, validated against the contract and published
  keyed by its job.
- Asked (the job page): by whoever the policy lets ask (`governance.escalations.askers`: the job's user, its team's
  members or leads, the operators; `may_ask` decides, and its one line is the 403 for anyone else), for a job the
  ledger knows and has not seen end, for 1..max_hours hours with a reason; one open or in force per job. The page
  holds no scheduler credentials: where `escalate ask` also asks the engine, the page goes by the ledger, and the
  escalation service asks the engine again before it raises anything (a job that ended is never raised).
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


def ask_refusal(policy: Any, job: Any, ended: bool, asker: str, cluster: str, job_id: str) -> str | None:
    """Why `asker` may not ask to raise the job from its page (the rules' one line), or None: shown in place of the
    form, and the POST's answer."""
    from schemas.governance_escalations import may_ask

    if job is None:
        return f"no job {job_id} on {cluster} in the ledger"
    refusal = may_ask(policy, job, asker)
    if refusal is not None:
        return refusal
    return f"job {job_id} on {cluster} has ended (the ledger's last event): nothing to raise" if ended else None


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

    def ask(self, viewer: Viewer, values: dict[str, str], job: Any, ended: bool, now_ms: int) -> dict[str, Any]:
        """The REQUESTED step from the job page's form, published; 403 (one line) for someone the policy does not
        let ask, 400 (the rules' one line) for the rest."""
        from schemas.governance_escalations import ask_event, may_ask

        cluster, job_id = params.cluster(values.get("cluster")), params.job_id(values.get("job_id"))
        denied = None if job is None else may_ask(self.policy, job, viewer.user)
        if denied is not None:
            raise Forbidden(denied)
        refusal = ask_refusal(self.policy, job, ended, viewer.user, cluster, job_id)
        if refusal is not None:
            raise params.BadRequest(refusal)
        hours = values.get("hours") or ""
        if not hours.isdigit() or len(hours) > 4:
            raise params.BadRequest("hours: a whole number of hours")
        reason = params.reason(values.get("reason"))
        event = _checked(lambda: ask_event(self.current(), self.policy, job, viewer.user, int(hours), reason, now_ms))
        return self._publish(event)

    def _publish(self, event: dict[str, Any]) -> dict[str, Any]:
        from base.errors import ContractError
        from schemas.models import validate
        from schemas.topics import ESCALATIONS

        try:
            validate(ESCALATIONS.subject, event)
        except ContractError as exc:
            raise params.BadRequest(str(exc).splitlines()[0][:300]) from exc
        self.publish(event)
        return event

    def decide(self, viewer: Viewer, values: dict[str, str], now_ms: int) -> dict[str, Any]:
        from schemas.governance_escalations import decide_event

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
        return self._publish(event)
