"""Appeal steps in chat (issue 19): the chat worker's second input, `appeals.v1`.

- A decision (DECIDED) the rules count goes where the warning it answers went: the destination of the alert's
  post as `chat_deliveries` journalled it, as a reply in that post's thread (a route of format "slack": `thread_ts`
  = the `ts` its endpoint gave the warning's post). With no post of the warning on record (an appeal of a charge,
  a warning never posted, a route no longer configured) it goes to the job's route (user, team, default) as a
  new post; through apprise (which gives no message id back) it is a new post to the same destination.
- An escalation (ESCALATED: the appeals service writes it for an appeal undecided past the policy's deadline)
  goes to the operators' channel: the default route.
- Filings are not posted, nor any step the rules refuse (a "decision" by someone who may not decide, a second
  decision, an early escalation): the same fold as the commands and the statements (`schemas.governance_appeals`),
  under the settings' policy; without a policy no step is posted (status `no-policy`).

Once per step, across restarts: each delivery is journalled in `chat_deliveries` under the step's event_id (its
`posting` row before the post, its outcome after, sinks/chat.py `ChatJournal`), the notifier's dedupe is seeded
from that journal at start, and each post carries the event_id as its `Idempotency-Key`, as for alerts.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from base.settings import ChatSettings
from schemas.governance_appeals import Appeal, Ignored, fold
from schemas.policy import Policy
from sinks.chat import Delivery, Destination, InDoubt, Intent, StepNotifier, by_masked, resolve

log = logging.getLogger(__name__)
POSTED = ("DECIDED", "ESCALATED")
T = TypeVar("T")
Fold = Callable[[list[dict[str, Any]]], tuple[dict[str, T], list[Ignored]]]  # a workflow's steps -> (items, refused)
WarningPost = Callable[[str], tuple[str, str, str] | None]  # alert id -> (masked destination, channel, thread_ts)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


class StepBook(Generic[T]):
    """A workflow's topic as the rules see it: read whole (`read()`, as the commands read it) and folded by `fold`
    (the workflow's pure fold under the policy), read again only when asked about a step the last read did not
    hold. `key` names the workflow's id field (appeal_id, escalation_id)."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]], fold: Fold[T], key: str) -> None:
        self._read, self._fold, self._key = read, fold, key
        self._seen: set[str] = set()
        self._ignored: set[str] = set()
        self._items: dict[str, T] = {}

    def counted(self, event: dict[str, Any]) -> T | None:
        """The item as it stands when the rules count `event` (a valid step), else None."""
        if event["event_id"] not in self._seen:
            events = self._read()
            self._items, ignored = self._fold(events)
            self._seen = {e["event_id"] for e in events}
            self._ignored = {i.event_id for i in ignored}
        if event["event_id"] not in self._seen or event["event_id"] in self._ignored:
            return None
        return self._items.get(event[self._key])


class AppealBook(StepBook[Appeal]):
    """The appeals as the rules see them (a valid decision, a due escalation): `appeals.v1` folded under the
    policy."""

    def __init__(self, read: Callable[[], list[dict[str, Any]]], policy: Policy) -> None:
        super().__init__(read, lambda events: fold(events, policy), "appeal_id")


def render_step(event: dict[str, Any], appeal: Appeal) -> tuple[str, str]:
    """Title and body of a decision or an escalation: what was decided (or is overdue), by whom, the note, and
    the appeal it answers."""
    s = appeal.subject
    job = f"job {s.job_id} on {s.cluster}"
    filed = f"appeal: filed by {appeal.filed_by} at {_when(appeal.filed_ms)}: {appeal.reason}"
    about = f"about: alert {s.alert_id}" if s.alert_id else f"about: the charge of {s.period or 'its month'}"
    if event["event_type"] == "ESCALATED":
        title = f"[gpuledger] Appeal {appeal.appeal_id} escalated: undecided past its deadline ({job})"
        body = [
            f"owner: user {s.user or '-'}, team {s.team or '-'}, project {s.project or '-'}",
            filed, about, f"deadline: {_when(appeal.deadline_ms)}; {event['text']}",
            f"decide: gpuledger appeal decide {appeal.appeal_id} --grant credit --amount X | --grant exemption "
            f"--hours N | --deny, with --note",
        ]  # fmt: skip
        return title, "\n".join(body)
    decision, actor, note = event["decision"], event["actor"], event["text"]
    if decision == "CREDIT":
        amount = f"{(event.get('credit_cents') or 0) / 100:.2f}"
        what = f"granted: credit {amount}"
        means = f"a credit of {amount} on team {s.team or '-'}'s statement, naming the appeal"
    elif decision == "EXEMPTION":
        what = f"granted: exemption until {_when(event.get('exemption_until_ms'))}"
        means = "no idle warning and no reclaim of this job until then; its idle count starts again after"
    else:
        what = "denied"
        means = "the warning and the charge stand"
    title = f"[gpuledger] Appeal {appeal.appeal_id} {what} ({job})"
    body = [f"decision: {what}, by {actor} at {_when(event['ts_ms'])}", f"note: {note}", f"what it means: {means}",
            filed, about]  # fmt: skip
    return title, "\n".join(body)


class AppealNotifier(StepNotifier):
    """Posts the appeal steps the rules count (see the module's docstring); `handle` returns what happened."""

    def __init__(self, chat: ChatSettings, *, book: AppealBook | None, warning_post: WarningPost,
                 **kw: Any) -> None:  # fmt: skip
        """`kw`: StepNotifier's (sender, slack_sender, already_sent, intent, doubt)."""
        super().__init__(chat, **kw)
        self._book = book
        self._warning_post = warning_post

    def _where(self, appeal: Appeal, escalated: bool) -> tuple[Destination | None, str, str]:
        """(destination, thread_ts to reply in, the alert replied to)."""
        if escalated:
            d = self._chat.default
            return (None if d is None else Destination("default", "default", d.channel or "#gpu-alerts", d)), "", ""
        s = appeal.subject
        posted = self._warning_post(s.alert_id) if s.alert_id else None
        if posted is not None:
            dest = by_masked(self._chat, posted[0], posted[1])
            if dest is not None:
                return dest, posted[2] if dest.route.format == "slack" else "", s.alert_id or ""
            log.warning("alert %s went to %s, no longer configured: decision of %s posted to the job's route",
                        s.alert_id, posted[1], appeal.appeal_id)  # fmt: skip
        return resolve({"user": s.user, "team": s.team}, self._chat), "", ""

    def handle(self, event: dict[str, Any]) -> Delivery:
        event_id = str(event.get("event_id") or "")
        unposted = self._unposted(event, POSTED)
        if unposted is not None:
            return unposted
        appeal, refused = self._counted(event, self._book, "appeal", "appeal_id")
        if refused is not None:
            return refused
        dest, thread_ts, reply_to = self._where(appeal, event["event_type"] == "ESCALATED")
        if dest is None:
            log.warning("no chat route for appeal %s (%s)", appeal.appeal_id, event["event_type"])
            return Delivery(event_id, "no-route")
        title, body = render_step(event, appeal)
        return self._post(event_id, dest, title, body, thread_ts, reply_to)


def appeal_notifier(chat: ChatSettings, client: Any, kafka: Any, policy: Policy | None, already_sent: Iterable[str],
                    intent: Intent | None = None, doubt: InDoubt | None = None) -> AppealNotifier:  # fmt: skip
    """The chat worker's notifier of appeal steps: the warning posts from `chat_deliveries`, the appeals read
    from `appeals.v1` whole with the worker's own login (assigned partitions, no group)."""
    from schemas.topics import APPEALS
    from sinks.chat import delivered_post
    from streams.eventlog import read_steps

    def read() -> list[dict[str, Any]]:
        events = read_steps(kafka, APPEALS)
        return events

    book = None if policy is None else AppealBook(read, policy)
    return AppealNotifier(chat, book=book, warning_post=lambda alert_id: delivered_post(client, alert_id),
                          already_sent=already_sent, intent=intent, doubt=doubt)  # fmt: skip
