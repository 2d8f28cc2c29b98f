"""Escalation steps in chat (issue 41): the chat worker's fourth input, `escalations.v1`.

Each step of an escalation the team should hear of goes to the team's route (its channel, else the default), the
route its idle warnings and reservation notices take (sinks/chat.py `resolve`):

- REQUESTED: who asked to raise which job, to which tier, for how long and why; who decides and by when, and how
  (`escalate decide` or the deciders' page /escalations);
- GRANTED / DENIED: by whom, the note, and what it means (raised until when / the job keeps its priority);
- LAPSED: undecided past the policy's deadline (the escalation service writes it);
- REVERTED: the grant is over and the job is back where it was (or, the service says, left as someone else set
  it, or the job had ended).
APPLIED (the service carrying a grant out on the engine, within a pass of GRANTED) is not posted: the grant's post
already says it is raised until its end.

Only steps the rules count are posted: the topic is folded under the settings' policy as the commands and the
deciders' page fold it (`schemas.governance_escalations.fold`), so a "grant" by someone who may not decide, a second
decision or a service step written by anyone else is not posted (status `refused`); without a policy nothing is
(status `no-policy`). Which steps are posted and what they say is `render_step`, pure.

Once per step, across restarts, as for alerts, appeal and reservation steps: each delivery is journalled in
`chat_deliveries` under the step's event_id (sinks/chat.py `ChatJournal`), the dedupe is seeded from that journal
at start, and each post carries the event_id as its `Idempotency-Key`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from base.settings import ChatSettings
from schemas.governance_appeals import iso_minute
from schemas.governance_escalations import Escalation, deciders, fold
from schemas.policy import Policy
from sinks.chat import Delivery, InDoubt, Intent, StepNotifier, resolve
from sinks.chat_appeals import StepBook

log = logging.getLogger(__name__)
POSTED = ("REQUESTED", "GRANTED", "DENIED", "LAPSED", "REVERTED")


class EscalationBook(StepBook[Escalation]):
    """The escalations as the rules see them: `escalations.v1` read whole and folded under the policy."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]], policy: Policy) -> None:
        super().__init__(read, lambda events: fold(events, policy), "escalation_id")


def team_of(policy: Policy, team: str | None) -> str | None:
    """The policy's name of the job's team: the ledger gives the team, or on Slurm the account the policy maps."""
    found = next((t.name for t in policy.teams if team in (t.name, t.account)), None)
    return found or team


def render_step(event: dict[str, Any], esc: Escalation, policy: Policy) -> tuple[str, str]:
    """Title and body of a posted step: what happened to which job, by whom, and what it means now."""
    kind, eid = event["event_type"], esc.escalation_id
    job = f"job {esc.job.job_id} on {esc.job.cluster}"
    owner = f"user {esc.job.user or '-'}, team {team_of(policy, esc.job.team) or '-'}, {esc.job.gpus} GPUs"
    asked = f"asked by {esc.asked_by} at {iso_minute(esc.asked_ms)} for {esc.hours} h: {esc.reason}"
    if kind == "REQUESTED":
        who = ", ".join(deciders(policy)) or "none named"
        title = f"[gpuledger] Escalation {eid} asked: {job} to {esc.tier} for {esc.hours} h"
        lines = [asked, f"owner: {owner}",
                 f"decide by {iso_minute(esc.deadline_ms)} ({who}): gpuledger escalate decide {eid} --grant|--deny "
                 "--note TEXT, or the deciders' page /escalations; undecided by then it lapses"]  # fmt: skip
    elif kind == "GRANTED":
        title = f"[gpuledger] Escalation {eid} granted: {job} runs at {esc.tier} until {iso_minute(esc.until_ms)}"
        lines = [f"granted by {esc.decided_by}: {esc.note}",
                 f"what it means: the job runs at tier {esc.tier} until {iso_minute(esc.until_ms)}, then falls back to "
                 "what it had", asked, f"owner: {owner}"]  # fmt: skip
    elif kind == "DENIED":
        title = f"[gpuledger] Escalation {eid} denied: {job}"
        lines = [f"denied by {esc.decided_by}: {esc.note}", "what it means: the job keeps its priority", asked,
                 f"owner: {owner}"]  # fmt: skip
    elif kind == "LAPSED":
        title = f"[gpuledger] Escalation {eid} lapsed: {job}, undecided past its deadline"
        lines = [f"no decision by {iso_minute(esc.deadline_ms)}: {event['text']}",
                 "what it means: the job keeps its priority; ask again if it is still needed", asked,
                 f"owner: {owner}"]  # fmt: skip
    else:  # REVERTED
        title = f"[gpuledger] Escalation {eid} ended: {job}"
        lines = [f"the grant ended at {iso_minute(esc.until_ms)}: {event['text']}", asked, f"owner: {owner}"]
    return title, "\n".join(lines)


class EscalationNotifier(StepNotifier):
    """Posts the counted escalation steps to the job's team route; `handle` returns what happened."""

    def __init__(self, chat: ChatSettings, *, book: EscalationBook | None, policy: Policy | None,
                 **kw: Any) -> None:  # fmt: skip
        """`kw`: StepNotifier's (sender, slack_sender, already_sent, intent, doubt)."""
        super().__init__(chat, **kw)
        self._book, self._policy = book, policy

    def handle(self, event: dict[str, Any]) -> Delivery:
        event_id = str(event.get("event_id") or "")
        unposted = self._unposted(event, POSTED)
        if unposted is not None:
            return unposted
        esc, refused = self._counted(event, None if self._policy is None else self._book, "escalation",
                                     "escalation_id")  # fmt: skip
        if refused is not None or self._policy is None:
            return refused or Delivery(event_id, "no-policy")
        dest = resolve({"team": team_of(self._policy, esc.job.team)}, self._chat)
        if dest is None:
            log.warning("no chat route for escalation %s (%s)", esc.escalation_id, event["event_type"])
            return Delivery(event_id, "no-route")
        title, body = render_step(event, esc, self._policy)
        return self._post(event_id, dest, title, body)


def escalation_notifier(chat: ChatSettings, kafka: Any, policy: Policy | None, already_sent: Iterable[str],
                        intent: Intent | None = None, doubt: InDoubt | None = None) -> EscalationNotifier:  # fmt: skip
    """The chat worker's notifier of escalation steps: `escalations.v1` read whole with the worker's own login
    (assigned partitions, no group)."""
    from schemas.topics import ESCALATIONS
    from streams.eventlog import read_steps

    book = None if policy is None else EscalationBook(lambda: read_steps(kafka, ESCALATIONS), policy)
    return EscalationNotifier(chat, book=book, policy=policy, already_sent=already_sent, intent=intent, doubt=doubt)
