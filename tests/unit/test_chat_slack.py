"""A `slack` chat route exactly once across a kill (sinks/chat_slack.py): each post carries its key in Slack's
message metadata, and a post in doubt is looked up in the channel's history before it is made again. Against the
loopback Slack stand-in (tests/fixtures_slack.py: Slack's documented chat.postMessage, conversations.history,
conversations.replies and conversations.list shapes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures_slack import SlackStandIn

import sinks.chat_slack as chat_slack
from base.settings import ChatRoute, ChatSettings
from sinks.chat import ChatJournal, ChatNotifier, Delivery, Destination, InDoubt, post, slack_post

CHANNEL = "C0GPUIDLE1"


@pytest.fixture
def slack() -> Iterator[SlackStandIn]:
    s = SlackStandIn({CHANNEL: "gpu-idle", "C0OTHERCH1": "other"}).start()
    try:
        yield s
    finally:
        s.stop()


def route(slack: SlackStandIn, channel: str = "#gpu-idle", token: str | None = None) -> ChatRoute:
    return ChatRoute(url=slack.url(), channel=channel, format="slack", token=token or slack.token)  # type: ignore[arg-type]


def alert(i: int = 1) -> dict[str, Any]:
    return {"alert_id": f"a{i}", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "c1",
            "job_id": str(i), "user": None, "team": None, "message": f"job {i} idle"}  # fmt: skip


def notifier(r: ChatRoute, in_doubt: Any = ()) -> ChatNotifier:
    return ChatNotifier(ChatSettings(default=r), clock_ms=lambda: 0, in_doubt=in_doubt, intent=lambda d: None)


def no_apprise(url: str, title: str, body: str) -> bool:
    raise AssertionError("a slack route does not go through apprise")


def test_a_post_carries_its_key_in_the_metadata(slack: SlackStandIn) -> None:
    d = notifier(route(slack)).handle(alert())
    assert d.status == "sent" and d.thread_ts
    ((message,),) = [m for m in slack.messages.values() if m]
    assert message["metadata"] == {"event_type": "gpuledger_post", "event_payload": {"key": "a1"}}
    assert message["ts"] == d.thread_ts and "alert: a1 (IDLE_WARNING)" in message["text"]


def test_a_post_in_doubt_found_in_the_history_is_not_posted_again(slack: SlackStandIn) -> None:
    since = int(time.time() * 1000)
    first = notifier(route(slack)).handle(alert())  # Slack has it; the kill came before the journal's `sent` row
    for i in range(2, 6):  # later posts: the look-up reads past them
        notifier(route(slack)).handle(alert(i))
    again = notifier(route(slack), in_doubt={"a1": since})
    d = again.handle(alert())
    assert (d.status, d.thread_ts) == ("sent", first.thread_ts)
    assert slack.keys()["a1"] == 1 and again.doubt.found == 1 and again.in_doubt_reposted == 0
    assert slack.calls["conversations.list"] == 1 and slack.calls["conversations.history"] == 1
    assert again.handle(alert()).status == "duplicate"  # settled: asked once


def test_a_post_in_doubt_that_never_reached_slack_is_posted_once(slack: SlackStandIn) -> None:
    n = notifier(route(slack, channel=CHANNEL), in_doubt={"a1": int(time.time() * 1000)})
    assert n.handle(alert()).status == "sent"
    assert slack.keys()["a1"] == 1 and n.in_doubt_reposted == 1 and n.doubt.found == 0
    assert slack.calls["conversations.list"] == 0  # a channel id is used as it is


def test_the_history_is_read_page_after_page(slack: SlackStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_slack, "PAGE_LIMIT", 2)
    since = int(time.time() * 1000)
    first = notifier(route(slack)).handle(alert())
    for i in range(2, 9):
        notifier(route(slack)).handle(alert(i))
    d = notifier(route(slack), in_doubt={"a1": since}).handle(alert())
    assert d.thread_ts == first.thread_ts and slack.calls["conversations.history"] == 4 and slack.keys()["a1"] == 1


def test_when_the_history_cannot_be_read_the_post_is_made_again(
    slack: SlackStandIn, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At least once where Slack cannot be asked: a token without the history scope, an incoming webhook (no Web
    API), more pages than the look-up reads. Logged, never silent."""
    since = int(time.time() * 1000)
    notifier(route(slack)).handle(alert())
    slack.scopes = frozenset({"chat:write", "channels:read"})
    with caplog.at_level(logging.WARNING):
        n = notifier(route(slack), in_doubt={"a1": since})
        assert n.handle(alert()).status == "sent"
    assert slack.keys()["a1"] == 2 and n.in_doubt_reposted == 1
    assert "history of #gpu-idle not read (conversations.history: missing_scope): posted again" in caplog.text
    hook = ChatRoute(url="https://hooks.slack.com/services/T0/B0/X", format="slack")  # type: ignore[arg-type]
    with pytest.raises(chat_slack.ServiceError, match="incoming webhook"):
        chat_slack.SlackHistory().posted(hook, "", "a1", "", since)
    slack.scopes = frozenset({"chat:write", "channels:read", "channels:history"})
    monkeypatch.setattr(chat_slack, "PAGE_LIMIT", 1)
    monkeypatch.setattr(chat_slack, "MAX_PAGES", 1)
    with pytest.raises(chat_slack.ServiceError, match="more than 1 pages"):
        chat_slack.SlackHistory().posted(route(slack), "#gpu-idle", "zz", "", since)


def test_a_reply_in_doubt_is_looked_up_in_its_thread(slack: SlackStandIn) -> None:
    r = route(slack)
    dest = Destination("default", "default", "#gpu-idle", r)
    since = int(time.time() * 1000)
    _, parent = slack_post(r, "warning", "body", "", "a1")
    ok, reply = post(dest, "decided", "credit", parent, no_apprise, slack_post, key="e1")
    assert ok and reply != parent
    doubt = InDoubt({"e1": since})
    assert post(dest, "decided", "credit", parent, no_apprise, slack_post, key="e1", doubt=doubt) == (True, reply)
    assert slack.calls["conversations.replies"] == 1 and slack.keys()["e1"] == 1 and doubt.found == 1


def test_the_journal_says_since_when_each_post_is_in_doubt() -> None:
    class Client:
        def query(self, sql: str, parameters: dict[str, Any]) -> Any:
            assert "ts_ms" in sql and parameters == {"s": "posting", "n": 7}
            return type("R", (), {"result_rows": [("a9", 900), ("a8", 800)]})()

    assert ChatJournal(Client(), lambda: 0).in_doubt_since(7) == {"a8": 800, "a9": 900}


def test_a_post_in_doubt_keeps_its_first_posting_row() -> None:
    """Its history is read from the first `posting` row, however many lives a kill cut short before it settled."""
    begun: list[Delivery] = []
    n = ChatNotifier(ChatSettings(default=ChatRoute(url="json://127.0.0.1:9/x")), clock_ms=lambda: 0,  # type: ignore[arg-type]
                     sender=lambda u, t, b: True, in_doubt={"a1": 5}, intent=begun.append)  # fmt: skip
    assert n.handle(alert(1)).status == "sent" and n.handle(alert(2)).status == "sent"
    assert [d.alert_id for d in begun] == ["a2"]
