"""Chat alerts: routing, templates with evidence and appeal route, dedupe, rate limit, masking."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from base.settings import ChatRoute, ChatSettings
from sinks.chat import ChatNotifier, Deduper, RateLimiter, mask_url, render, resolve

SECRET = "https://hooks.slack.com/services/T000/B000/XXXXSECRETXXXX"


def chat(**kw: Any) -> ChatSettings:
    return ChatSettings(
        users={"alice": ChatRoute(url="json://127.0.0.1:9/alice", channel="@alice")},
        teams={"vision": ChatRoute(url=SECRET, channel="#vision-gpu")},
        default=ChatRoute(url="json://127.0.0.1:9/default"),
        **kw,
    )


def alert(**kw: Any) -> dict[str, Any]:
    return {
        "alert_id": "a1", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "c1", "job_id": "123",
        "node": "n1", "device_uuids": ["GPU-1", "GPU-2"], "user": "bob", "team": "vision", "project": "p1",
        "idle_minutes": 45, "cost_so_far": 3.456, "action": "SUSPEND", "action_at_ms": 1_795_000_900_000,
        "dry_run": False, "message": "2 GPUs idle for 45 min", "appeal_route": None, **kw,
    }  # fmt: skip


def test_routing_prefers_user_then_team_then_default() -> None:
    c = chat()
    assert resolve(alert(user="alice"), c).channel == "@alice"  # type: ignore[union-attr]
    assert resolve(alert(), c).channel == "#vision-gpu"  # type: ignore[union-attr]
    d = resolve(alert(user="zed", team="other"), c)
    assert d is not None and d.kind == "default" and d.channel == "#gpu-alerts"
    assert resolve(alert(user="zed", team="other"), ChatSettings()) is None


def test_template_carries_evidence_next_step_and_appeal() -> None:
    c = chat()
    title, body = render(alert(), resolve(alert(), c), "ask #platform")  # type: ignore[arg-type]
    assert "job 123 on c1" in title
    for needle in ("channel: #vision-gpu", "GPU-1, GPU-2", "idle for 45 min", "$3.46", "next: SUSPEND at",
                   "2026-11-18", "appeal: ask #platform", "2 GPUs idle for 45 min"):  # fmt: skip
        assert needle in body, needle
    _, dry = render(alert(dry_run=True, appeal_route="file RITM"), resolve(alert(), c), "x")  # type: ignore[arg-type]
    assert "dry-run" in dry and "appeal: file RITM" in dry


def test_dedupe_and_rate_limit() -> None:
    d = Deduper(2)
    assert d.first_time("a") and not d.first_time("a") and d.first_time("b") and d.first_time("c")
    assert d.first_time("a")  # forgotten after the window
    r = RateLimiter(2)
    assert r.allow("x", 0) and r.allow("x", 1000) and not r.allow("x", 59_000) and r.allow("y", 59_000)
    assert r.allow("x", 60_001)


def test_notifier_sends_once_and_masks_secrets(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[tuple[str, str, str]] = []
    now = [0]
    notifier = ChatNotifier(
        chat(rate_limit_per_minute=1), clock_ms=lambda: now[0], sender=lambda u, t, b: sent.append((u, t, b)) or True
    )
    with caplog.at_level(logging.DEBUG):
        first = notifier.handle(alert())
        again = notifier.handle(alert())
        limited = notifier.handle(alert(alert_id="a2"))
    assert (first.status, again.status, limited.status) == ("sent", "duplicate", "rate-limited")
    assert len(sent) == 1 and sent[0][0] == SECRET
    assert "SECRET" not in caplog.text and "hooks.slack.com" not in caplog.text
    assert first.destination == mask_url(SECRET) and "SECRET" not in first.destination
    now[0] = 61_000
    assert notifier.handle(alert(alert_id="a3")).status == "sent"
    assert notifier.handle(alert(alert_id="a4", kind="IDLE_RESOLVED")).status == "skipped-kind"


def test_dry_run_sends_nothing() -> None:
    sent: list[Any] = []
    notifier = ChatNotifier(chat(dry_run=True), clock_ms=lambda: 0, sender=lambda *a: sent.append(a) or True)
    assert notifier.handle(alert()).status == "dry-run" and not sent


def test_settings_mask_chat_urls() -> None:
    from base.settings import Settings, SinksSettings

    s = Settings(sinks=SinksSettings(chat=chat()))
    assert "SECRET" not in str(s.masked())


# -- the delivery journal (sinks.chat, used by `gpuledger chat run`) ---------------------------------


class _FakeClient:
    def __init__(self, rows: list[tuple[str]]) -> None:
        self.rows = rows
        self.queries: list[tuple[str, dict[str, Any]]] = []
        self.inserts: list[tuple[str, list[list[Any]], list[str]]] = []

    def query(self, sql: str, parameters: dict[str, Any]) -> Any:
        self.queries.append((sql, parameters))
        return type("Result", (), {"result_rows": self.rows})()

    def insert(self, table: str, rows: list[list[Any]], column_names: list[str]) -> None:
        self.inserts.append((table, rows, column_names))


def test_recently_delivered_is_oldest_first_bounded_by_the_window_and_bound_not_formatted() -> None:
    from sinks.chat import recently_delivered

    client = _FakeClient([("a3",), ("a2",), ("a1",)])  # newest first, as the query orders them
    assert recently_delivered(client, 3) == ["a1", "a2", "a3"]
    ((sql, params),) = client.queries
    assert params == {"n": 3} and "{n:UInt32}" in sql and "status IN ('sent', 'dry-run')" in sql


def test_record_delivery_journals_attempts_and_routing_problems_only() -> None:
    from sinks.chat import Delivery, record_delivery

    client = _FakeClient([])
    assert record_delivery(client, Delivery("a1", "sent", "json://***", "#x"), 5) is True
    assert record_delivery(client, Delivery("a2", "duplicate"), 6) is False
    assert record_delivery(client, Delivery("a3", "skipped-kind"), 7) is False
    assert client.inserts == [
        (
            "chat_deliveries",
            [["a1", 5, "sent", "#x", "json://***", "", ""]],
            ["alert_id", "ts_ms", "status", "channel", "destination", "thread_ts", "reply_to"],
        )
    ]


def test_local_receiver_routes_only_when_nothing_is_configured() -> None:
    from sinks.chat import local_receiver_routes

    routed = local_receiver_routes(ChatSettings(), 8765)
    assert routed.default is not None and routed.default.channel == "#gpu-idle"
    assert routed.default.url.get_secret_value() == "json://127.0.0.1:8765/"
    configured = chat()
    assert local_receiver_routes(configured, 8765) is configured


# -- exactly once: the two-phase journal and the Idempotency-Key -----------------------------------


def test_idempotency_key_rides_on_json_routes_only_as_a_quoted_sf_string() -> None:
    from sinks.chat import keyed_url, parse_idempotency_key

    assert keyed_url("json://127.0.0.1:9/hook", "a1") == "json://127.0.0.1:9/hook?+Idempotency-Key=%22a1%22"
    assert keyed_url("jsons://h/x?+X-Token=t", "a1").endswith("?+X-Token=t&+Idempotency-Key=%22a1%22")
    assert keyed_url(SECRET, "a1") == SECRET  # an apprise scheme that sends no headers: no key
    assert keyed_url("json://h/x", "") == "json://h/x"
    assert parse_idempotency_key('"a1"') == "a1" and parse_idempotency_key("a1") == "a1"
    assert parse_idempotency_key('"a\\"b\\\\c"') == 'a"b\\c'
    for bad in (None, "", '""', "x" * 256, "caf\u00e9", '"' + "y" * 600 + '"'):
        assert parse_idempotency_key(bad) is None, bad


def test_a_post_is_journalled_as_begun_before_it_goes_out_and_carries_its_alert_id_as_key() -> None:
    from sinks.chat import Delivery

    events: list[str] = []
    intents: list[Delivery] = []

    def sender(url: str, title: str, body: str) -> bool:
        events.append(f"post {url}")
        return True

    def intent(d: Delivery) -> None:
        events.append(f"begin {d.alert_id}")
        intents.append(d)

    notifier = ChatNotifier(chat(), clock_ms=lambda: 0, sender=sender, intent=intent)
    assert notifier.handle(alert(user="alice")).status == "sent"
    assert events == ["begin a1", "post json://127.0.0.1:9/alice?+Idempotency-Key=%22a1%22"]
    assert intents[0].status == "posting" and intents[0].channel == "@alice"
    assert notifier.in_doubt_reposted == 0


def test_an_alert_in_doubt_is_posted_again_with_the_same_key() -> None:
    urls: list[str] = []
    notifier = ChatNotifier(
        chat(), clock_ms=lambda: 0, sender=lambda u, t, b: urls.append(u) or True, in_doubt=["a1"],
        intent=lambda d: None,
    )
    assert notifier.handle(alert(user="alice")).status == "sent"
    assert urls == ["json://127.0.0.1:9/alice?+Idempotency-Key=%22a1%22"] and notifier.in_doubt_reposted == 1


def test_the_journal_writes_posting_then_the_outcome_and_reads_back_what_is_in_doubt() -> None:
    from sinks.chat import ChatJournal, Delivery

    client = _FakeClient([("a9",), ("a8",)])
    journal = ChatJournal(client, lambda: 42)
    journal.begin(Delivery("a1", "posting", "json://<secret x>", "#x"))
    journal.end(Delivery("a1", "sent", "json://<secret x>", "#x"))
    assert [rows[0][:3] for _, rows, _ in client.inserts] == [["a1", 42, "posting"], ["a1", 42, "sent"]]
    assert journal.in_doubt(5) == ["a8", "a9"]
    ((sql, params),) = client.queries
    assert params == {"s": "posting", "n": 5} and "{s:String}" in sql
