"""Appeal steps in chat (sinks/chat_appeals.py) without a broker: which steps are posted, where, in which thread,
and once."""

from __future__ import annotations

from typing import Any

from base.settings import ChatRoute, ChatSettings
from schemas.governance_appeals import HOUR_MS, Subject, decide_event, escalations, file_event, fold
from schemas.policy import Policy
from sinks.chat import keyed_url, mask_url, slack_message
from sinks.chat_appeals import AppealBook, AppealNotifier, render_step

NOW = 1_795_000_000_000
POLICY = Policy.model_validate({
    "version": 1, "generations": {"hopper": {"slurm_gres": "h100", "kueue_flavor": "h100"}},
    "tiers": [{"name": "research", "priority": 100}],
    "governance": {"operators": ["ops1"], "appeals": {"deadline_hours": 72, "window_days": 30, "max_credit": "100.00",
                                                      "max_exemption_hours": 48}},
    "teams": [{"name": "vision", "members": ["ana"]}],
})  # fmt: skip
VISION = "json://127.0.0.1:9/vision"
SLACK = "https://chat.example/api/chat.postMessage"


def steps(alert_id: str | None = "a1") -> list[dict[str, Any]]:
    subject = Subject("c1", "88", alert_id, "ana", "vision", "p-v", None, NOW - HOUR_MS)
    filed = file_event({}, POLICY, subject, "ana", "waiting on data", NOW - HOUR_MS)
    decided = decide_event(fold([filed], POLICY)[0], POLICY, filed["appeal_id"], "ops1", "EXEMPTION", "fair",
                           NOW, exemption_hours=24)  # fmt: skip
    return [filed, decided]


def notifier(chat: ChatSettings, events: list[dict[str, Any]], posted: dict[str, tuple[str, str, str]],
             **kw: Any) -> tuple[AppealNotifier, list[tuple[str, ...]]]:  # fmt: skip
    sent: list[tuple[str, ...]] = []

    def apprise(url: str, title: str, body: str) -> bool:
        sent.append(("apprise", url, title, body))
        return True

    def slack(route: ChatRoute, title: str, body: str, thread_ts: str, key: str = "") -> tuple[bool, str]:
        sent.append(("slack", route.url.get_secret_value(), title, thread_ts))
        return True, "200.000001"

    book = AppealBook(lambda: events, POLICY)
    return AppealNotifier(chat, book=book, warning_post=posted.get, sender=apprise, slack_sender=slack, **kw), sent


def test_a_decision_replies_in_the_thread_of_its_warning_on_a_slack_route() -> None:
    chat = ChatSettings(teams={"vision": ChatRoute(url=SLACK, channel="#vision-gpu", format="slack")},
                        default=ChatRoute(url="json://127.0.0.1:9/ops"))  # fmt: skip
    events = steps()
    n, sent = notifier(chat, events, {"a1": (mask_url(SLACK), "#vision-gpu", "100.000001")})
    assert n.handle(events[0]).status == "skipped-kind"  # a filing is not posted
    d = n.handle(events[1])
    assert (d.status, d.channel, d.thread_ts, d.reply_to) == ("sent", "#vision-gpu", "100.000001", "a1")
    ((how, url, title, thread),) = sent
    assert (how, url, thread) == ("slack", SLACK, "100.000001") and "granted: exemption until" in title
    assert n.handle(events[1]).status == "duplicate" and len(sent) == 1


def test_through_apprise_the_decision_goes_to_the_warnings_destination_as_a_new_post() -> None:
    # The warning went to the default route (alice had none of her own then): the decision follows it there.
    chat = ChatSettings(teams={"vision": ChatRoute(url=VISION, channel="#vision-gpu")},
                        default=ChatRoute(url="json://127.0.0.1:9/ops", channel="#ops"))  # fmt: skip
    events = steps()
    n, sent = notifier(chat, events, {"a1": (mask_url("json://127.0.0.1:9/ops"), "#ops", "")})
    d = n.handle(events[1])
    assert (d.status, d.channel, d.thread_ts, d.reply_to) == ("sent", "#ops", "", "a1")
    # the step's event id rides as its Idempotency-Key (a JSON route carries it; sinks/chat.py keyed_url)
    assert [s[:2] for s in sent] == [("apprise", keyed_url("json://127.0.0.1:9/ops", events[1]["event_id"]))]
    assert "Idempotency-Key=%22" in sent[0][1]


def test_without_the_warnings_post_the_decision_goes_to_the_jobs_route() -> None:
    chat = ChatSettings(teams={"vision": ChatRoute(url=SLACK, channel="#vision-gpu", format="slack")})
    for events, posted in ((steps(None), {}), (steps(), {}), (steps(), {"a1": ("json://<secret 0>", "#gone", "")})):
        n, sent = notifier(chat, events, posted)
        d = n.handle(events[1])
        assert (d.status, d.channel, d.reply_to) == ("sent", "#vision-gpu", "") and sent[0][3] == ""


def test_refused_steps_no_policy_and_dry_run() -> None:
    chat = ChatSettings(default=ChatRoute(url="json://127.0.0.1:9/ops"))
    filed, decided = steps()
    forged = {**decided, "event_id": "forged", "actor": "mallory", "ts_ms": NOW + 1}
    n, sent = notifier(chat, [filed, forged], {})
    assert n.handle(forged).status == "refused" and not sent
    quiet = AppealNotifier(chat, book=None, warning_post=lambda a: None, sender=lambda *a: True)
    assert quiet.handle(decided).status == "no-policy"
    dry, sent = notifier(chat.model_copy(update={"dry_run": True}), [filed, decided], {})
    assert dry.handle(decided).status == "dry-run" and not sent
    seeded, sent = notifier(chat, [filed, decided], {}, already_sent=[decided["event_id"]])
    assert seeded.handle(decided).status == "duplicate" and not sent  # posted before a restart


def test_an_escalation_goes_to_the_operators_channel() -> None:
    chat = ChatSettings(teams={"vision": ChatRoute(url=VISION)}, default=ChatRoute(url=SLACK, channel="#gpu-ops",
                                                                                   format="slack"))  # fmt: skip
    filed = steps()[0]
    (escalated,) = escalations(fold([filed], POLICY)[0], filed["ts_ms"] + 73 * HOUR_MS)
    n, sent = notifier(chat, [filed, escalated], {"a1": (mask_url(VISION), "#vision", "")})
    d = n.handle(escalated)
    assert (d.status, d.channel, d.thread_ts, d.reply_to) == ("sent", "#gpu-ops", "200.000001", "")
    assert sent[0][:2] == ("slack", SLACK) and sent[0][3] == "" and "escalated" in sent[0][2]
    early = {**escalated, "event_id": "early", "ts_ms": filed["ts_ms"] + HOUR_MS}  # before the deadline
    assert notifier(chat, [filed, early], {})[0].handle(early).status == "refused"


def test_the_texts_say_what_was_decided_by_whom_and_why() -> None:
    filed, decided = steps()
    appeal = fold([filed, decided], POLICY)[0][filed["appeal_id"]]
    title, body = render_step(decided, appeal)
    assert "granted: exemption until" in title and "job 88 on c1" in title
    assert "by ops1" in body and "note: fair" in body and "filed by ana" in body and "about: alert a1" in body
    credit = {**decided, "decision": "CREDIT", "credit_cents": 1234, "exemption_until_ms": None}
    assert "granted: credit 12.34" in render_step(credit, appeal)[0]
    denied = {**decided, "decision": "DENIED", "exemption_until_ms": None, "text": "it computed nothing"}
    title, body = render_step(denied, appeal)
    assert "denied" in title and "note: it computed nothing" in body and "stand" in body


def test_the_slack_message_replies_in_a_thread_only_when_given_one() -> None:
    route = ChatRoute(url=SLACK, channel="#vision-gpu", format="slack")
    assert slack_message(route, "T", "B") == {"text": "*T*\nB", "unfurl_links": False, "channel": "#vision-gpu"}
    assert slack_message(route, "T", "B", "100.1")["thread_ts"] == "100.1"
    assert "channel" not in slack_message(ChatRoute(url=SLACK, format="slack"), "T", "B")
