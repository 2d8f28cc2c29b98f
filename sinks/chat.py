"""Chat alerts: route each alert to the channel people read, with its evidence and appeal route.

Pure parts (routing, templates, dedupe, rate limit, URL masking) take plain data and an injected
clock; `ChatNotifier` sends through apprise (Slack, Mattermost, Teams, email, generic JSON webhook:
any apprise URL), or, for a route of format "slack", posts Slack's message JSON itself (`slack_post`) and keeps
the `ts` the endpoint answers with: the thread an appeal's decision is posted into (sinks/chat_appeals.py).
`WebhookReceiver` is a loopback webhook endpoint for tests and demos; it answers a Slack-format post as
chat.postMessage does, with a `ts`.

Exactly once across kill -9 (`ChatJournal`, two phases in `chat_deliveries`): an alert's `posting` row is
written before its post and its outcome (`sent`, ...) after. A kill between the two leaves the alert in doubt:
its record was not acked, so the next life handles it again and posts it again, with the same key. Every post of
an apprise JSON route (`json://`, `jsons://`) carries an `Idempotency-Key` header (the IETF httpapi draft
"The Idempotency-Key HTTP Header Field"), its value the alert id, so a receiver that honours it, as
`WebhookReceiver` does, keeps the first and answers the repeat without recording it. A route of format "slack"
(Slack's Web API, which honours no such key) carries the key in the message's metadata instead, and a post in
doubt is looked up in the channel's history before it is made again (`InDoubt`, sinks/chat_slack.py). A route
that can do neither (a Slack incoming webhook, Teams, email, any other apprise scheme) stays at least once: at
most one post per kill comes twice.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

from base.errors import ServiceError
from base.settings import ChatRoute, ChatSettings
from sinks.chat_slack import SlackHistory, slack_post
from sinks.chat_slack import mask_url as mask_url
from sinks.chat_slack import slack_message as slack_message

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Destination:
    kind: str  # user, team, default
    name: str
    channel: str
    route: ChatRoute

    @property
    def masked(self) -> str:
        return mask_url(self.route.url.get_secret_value())


def routes(chat: ChatSettings) -> list[Destination]:
    """Every configured route as the destination `resolve` would make of it."""
    out = [Destination("user", user, route.channel or f"@{user}", route) for user, route in chat.users.items()]
    out += [Destination("team", team, route.channel or f"#{team}", route) for team, route in chat.teams.items()]
    if chat.default is not None:
        out.append(Destination("default", "default", chat.default.channel or "#gpu-alerts", chat.default))
    return out


def by_masked(chat: ChatSettings, masked: str, channel: str) -> Destination | None:
    """The configured route a delivery went to, from what was journalled of it (the masked URL and the
    channel): the same webhook and channel, whichever user or team it is configured under."""
    found = [d for d in routes(chat) if d.masked == masked and d.channel == channel]
    return found[0] if found else None


def resolve(alert: dict[str, Any], chat: ChatSettings) -> Destination | None:
    """User route first (their channel or a direct message), then team channel, then default."""
    user, team = alert.get("user"), alert.get("team")
    if user and user in chat.users:
        route = chat.users[user]
        return Destination("user", user, route.channel or f"@{user}", route)
    if team and team in chat.teams:
        route = chat.teams[team]
        return Destination("team", team, route.channel or f"#{team}", route)
    if chat.default is not None:
        return Destination("default", "default", chat.default.channel or "#gpu-alerts", chat.default)
    return None


_TITLES = {
    "IDLE_WARNING": "Idle GPUs: action pending",
    "RECLAIM_NOTICE": "GPUs being reclaimed",
    "IDLE_RESOLVED": "Idle GPUs: resolved",
    "COVERAGE_GAP": "GPU telemetry missing (coverage gap)",
    "COVERAGE_RECOVERED": "GPU telemetry restored",
    "POLICY_DRIFT": "Scheduler differs from the policy",
    "POLICY_DRIFT_CLEARED": "Scheduler matches the policy again",
}


def _when(ms: Any) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def render(alert: dict[str, Any], destination: Destination, default_appeal: str) -> tuple[str, str]:
    """Title and body: what happened, the evidence, what happens next, and how to appeal."""
    kind = str(alert.get("kind", "ALERT"))
    title = f"[gpuledger] {_TITLES.get(kind, kind)}"
    if alert.get("engine"):  # policy drift: the message carries each differing line; no job, owner or devices
        title += f": {alert['engine']} on {alert.get('cluster', '?')}"
        evidence = [f"channel: {destination.channel}", f"alert: {alert.get('alert_id')} ({kind}) at "
                    f"{_when(alert.get('ts_ms'))}"]  # fmt: skip
        if alert.get("action"):
            evidence.append(f"next: {alert['action']}")
        return title, "\n".join([str(alert.get("message") or "").strip(), *evidence])
    if alert.get("gang_id"):
        title += f": gang {alert['gang_id']} on {alert.get('cluster', '?')}"
    elif alert.get("job_id"):
        title += f": job {alert['job_id']} on {alert.get('cluster', '?')}"
    devices = alert.get("device_uuids") or []
    evidence = [
        f"channel: {destination.channel}",
        f"alert: {alert.get('alert_id')} ({kind}) at {_when(alert.get('ts_ms'))}",
        f"job: {alert.get('job_id') or '-'}  cluster: {alert.get('cluster') or '-'}  node: {alert.get('node') or '-'}",
    ]
    if alert.get("members"):
        members = list(alert["members"])
        more = " ..." if len(members) > 8 else ""
        evidence.append(f"gang members: {len(members)} pod(s) {', '.join(members[:8])}{more}")
    evidence += [
        f"owner: user {alert.get('user') or '-'}, team {alert.get('team') or '-'}, "
        f"project {alert.get('project') or '-'}",
        f"evidence: {len(devices)} device(s) {', '.join(devices[:8])}{' ...' if len(devices) > 8 else ''}",
    ]
    if alert.get("idle_minutes") is not None:
        evidence.append(f"idle for {alert['idle_minutes']} min (time-integrated device activity, not sessions)")
    if alert.get("cost_so_far") is not None:
        evidence.append(f"cost of the idle time so far: ${float(alert['cost_so_far']):.2f}")
    if alert.get("action"):
        mode = " (dry-run: nothing will be done)" if alert.get("dry_run") else ""
        evidence.append(f"next: {alert['action']} at {_when(alert.get('action_at_ms'))}{mode}")
    message = str(alert.get("message") or "").strip()
    appeal = f"appeal: {alert.get('appeal_route') or default_appeal}"
    body = "\n".join([*([message] if message else []), *evidence, appeal])
    return title, body


class Deduper:
    """Remembers the last N alert ids; `first_time(id)` is True once per id."""

    def __init__(self, capacity: int) -> None:
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def first_time(self, alert_id: str) -> bool:
        if alert_id in self._seen:
            self._seen.move_to_end(alert_id)
            return False
        self._seen[alert_id] = None
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return True

    def __contains__(self, alert_id: str) -> bool:
        return alert_id in self._seen


class RateLimiter:
    """At most `per_minute` messages per destination in any 60 s window (clock in ms, injected)."""

    def __init__(self, per_minute: int) -> None:
        self._per_minute = per_minute
        self._sent: dict[str, deque[int]] = {}

    def allow(self, destination: str, now_ms: int) -> bool:
        window = self._sent.setdefault(destination, deque())
        while window and window[0] <= now_ms - 60_000:
            window.popleft()
        if len(window) >= self._per_minute:
            return False
        window.append(now_ms)
        return True


@dataclass(frozen=True, slots=True)
class Delivery:
    alert_id: str  # an alert's id, or an appeal step's event_id
    status: str  # sent, dry-run, duplicate, rate-limited, no-route, skipped-kind, failed (appeals: + no-policy)
    destination: str = ""  # masked
    channel: str = ""
    thread_ts: str = ""  # the id the chat gave the post (format slack), its thread's for the replies to it
    reply_to: str = ""  # a reply's: the alert whose thread it went to
    # a gang's post: its members' own alerts, journalled as delivered in it (an appeal of one is answered there)
    members: tuple[str, ...] = ()


GangAlerts = Callable[[dict[str, Any]], tuple[bool, dict[str, Any] | None]]  # alert -> (in a gang, the gang's)


Sender = Callable[[str, str, str], bool]  # (url, title, body) -> delivered
# (route, title, body, thread_ts to reply in or "", the post's key) -> (delivered, the post's ts or "")
SlackSender = Callable[[ChatRoute, str, str, str, str], tuple[bool, str]]


def apprise_send(url: str, title: str, body: str) -> bool:
    import apprise

    app = apprise.Apprise()
    if not app.add(url):
        log.error("not a usable apprise URL: %s", mask_url(url))
        return False
    return bool(app.notify(body=body, title=title))


# apprise schemes whose posts carry the Idempotency-Key header (apprise adds a `+Name=value` query item as a header)
KEYED_SCHEMES = ("json", "jsons")
IDEMPOTENCY_KEY_MAX = 255  # characters of a key a receiver accepts (alert and event ids are far shorter)


def idempotency_key_value(key: str) -> str:
    """The header's value: a Structured Field string (the draft's type), `"` and `\\` escaped."""
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_idempotency_key(value: str | None) -> str | None:
    """The key from an `Idempotency-Key` value (a quoted sf-string; a bare token is taken as it is); None when
    absent, empty, too long or not printable ASCII."""
    if value is None:
        return None
    value = value.strip()
    if len(value) > 2 * IDEMPOTENCY_KEY_MAX + 2:  # bound the work before unescaping
        return None
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = re.sub(r'\\(["\\])', r"\1", value[1:-1])
    if not value or len(value) > IDEMPOTENCY_KEY_MAX or not all(" " <= c <= "~" for c in value):
        return None
    return value


def keyed_url(url: str, key: str) -> str:
    """The apprise URL with an `Idempotency-Key` header for this post, when its scheme sends headers (JSON);
    other schemes as they are (they take no key)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if not key or scheme not in KEYED_SCHEMES:
        return url
    item = "+Idempotency-Key=" + quote(idempotency_key_value(key), safe="")
    return f"{url}{'&' if '?' in url else '?'}{item}"


class InDoubt:
    """The posts a killed life began and never journalled (`ChatJournal.in_doubt_since`: key -> when its `posting`
    row was written), shared by the notifiers of one chat worker. Each is taken once, by the next post of its key
    (`post`): on a `slack` route the channel's history is read first (sinks/chat_slack.py), and a post found there
    is not made again (`found`); elsewhere, or when the history cannot be read, it is posted again with the same
    key (`reposted`). A post in doubt is not journalled as `posting` again: its first row says since when the
    history is to be read, however many lives a kill cut short before it was settled."""

    def __init__(self, since_ms: Mapping[str, int] | Iterable[str] = (), history: SlackHistory | None = None) -> None:
        self._since = dict(since_ms) if isinstance(since_ms, Mapping) else dict.fromkeys(since_ms, 0)
        self._history = history or SlackHistory()
        self.found = 0
        self.reposted = 0

    def __contains__(self, key: str) -> bool:
        return key in self._since

    def settle(self, dest: Destination, key: str, thread_ts: str) -> str | None:
        """For a key in doubt (taken: asked once), the `ts` of its earlier post when the chat shows one; else None
        (not in doubt, not found, or the chat cannot be asked: the caller posts)."""
        since = self._since.pop(key, None) if key else None
        if since is None:
            return None
        if dest.route.format == "slack":
            try:
                ts = self._history.posted(dest.route, dest.channel, key, thread_ts, since)
            except ServiceError as exc:
                log.warning("post %s in doubt, the history of %s not read (%s): posted again", key, dest.channel, exc)
            else:
                if ts is not None:
                    self.found += 1
                    log.info("post %s in doubt: found in %s (ts %s), not posted again", key, dest.channel, ts)
                    return ts
        self.reposted += 1
        log.info("post %s in doubt (a kill cut it between post and journal): posted again, key %s", key, key)
        return None


def post(dest: Destination, title: str, body: str, thread_ts: str, sender: Sender, slack_sender: SlackSender,
         key: str = "", doubt: InDoubt | None = None) -> tuple[bool, str]:  # fmt: skip
    """Send to `dest` the way its route's format wants: (delivered, the post's ts or ""). `key`: the post's
    idempotency key (the alert's id, a step's event id), sent where the route can carry it (`keyed_url`; a Slack
    post's metadata). `doubt`: the worker's posts in doubt; one of them found already posted is not posted again."""
    if doubt is not None and (found := doubt.settle(dest, key, thread_ts)) is not None:
        return True, found
    if dest.route.format == "slack":
        return slack_sender(dest.route, title, body, thread_ts, key)
    return sender(keyed_url(dest.route.url.get_secret_value(), key), title, body), ""


Intent = Callable[["Delivery"], None]  # journal a post as begun, before it goes out (`ChatJournal.begin`)


def journalled_post(dest: Destination, title: str, body: str, thread_ts: str, key: str, *, sender: Sender,
                    slack_sender: SlackSender, intent: Intent | None, doubt: InDoubt | None,
                    reply_to: str = "") -> tuple[bool, str]:  # fmt: skip
    """A notifier's post under the two-phase journal: its `posting` row (not again for a key in doubt: its first
    row says since when), then `post`; the notifier journals the outcome."""
    if intent is not None and (doubt is None or key not in doubt):
        intent(Delivery(key, "posting", dest.masked, dest.channel, "", reply_to))
    return post(dest, title, body, thread_ts, sender, slack_sender, key=key, doubt=doubt)


class StepNotifier:
    """What the workflow steps' notifiers share (appeals, reservations, escalations: sinks/chat_*.py): the dedupe
    seeded from the journal, the checks every step passes before its post (a kind posted, not a duplicate, a policy
    to judge it by and the rules counting it) and the post under the two-phase journal, dry-run aside. Each
    subclass keeps its workflow's own: which steps, where they go, what they say."""

    def __init__(self, chat: ChatSettings, *, sender: Sender = apprise_send, slack_sender: SlackSender = slack_post,
                 already_sent: Iterable[str] = (), intent: Intent | None = None,
                 doubt: InDoubt | None = None) -> None:  # fmt: skip
        self._chat, self._intent, self._doubt = chat, intent, doubt
        self._send, self._slack_send = sender, slack_sender
        self._dedupe = Deduper(chat.dedupe_window)
        for event_id in already_sent:  # remembered across restarts (chat_deliveries)
            self._dedupe.first_time(event_id)

    def _unposted(self, event: dict[str, Any], kinds: Collection[str]) -> Delivery | None:
        """Why the step is not posted when it is not of `kinds` or was already handled; None otherwise."""
        event_id = str(event.get("event_id") or "")
        if event.get("event_type") not in kinds:
            return Delivery(event_id, "skipped-kind")
        if not self._dedupe.first_time(event_id):
            return Delivery(event_id, "duplicate")
        return None

    def _counted(self, event: dict[str, Any], book: Any, what: str, id_field: str) -> tuple[Any, Delivery | None]:
        """(the workflow item as the rules count the step, None) or (None, why it is not posted): no policy to
        judge it by (`book` None), or the rules do not count it (`book.counted` None)."""
        event_id = str(event.get("event_id") or "")
        if book is None:
            log.warning("%s step %s not posted: no policy to judge it by (set policy_path)", what, event_id)
            return None, Delivery(event_id, "no-policy")
        item = book.counted(event)
        if item is None:
            log.info("%s step %s (%s of %s) not posted: the rules do not count it", what, event_id,
                     event.get("event_type"), event.get(id_field))  # fmt: skip
            return None, Delivery(event_id, "refused")
        return item, None

    def _post(self, event_id: str, dest: Destination, title: str, body: str, thread_ts: str = "",
              reply_to: str = "") -> Delivery:  # fmt: skip
        """The step posted to `dest` (in the thread of `thread_ts` when given), journalled; logged only in a dry run."""
        if self._chat.dry_run:
            log.info("dry-run chat to %s (%s): %s", dest.channel, dest.masked, title)
            return Delivery(event_id, "dry-run", dest.masked, dest.channel, "", reply_to)
        ok, ts = journalled_post(dest, title, body, thread_ts, event_id, sender=self._send,
                                 slack_sender=self._slack_send, intent=self._intent, doubt=self._doubt,
                                 reply_to=reply_to)  # fmt: skip
        log.info("chat %s to %s (%s)%s: %s", "sent" if ok else "FAILED", dest.channel, dest.masked,
                 f" in the thread of {reply_to}" if thread_ts else "", title)  # fmt: skip
        return Delivery(event_id, "sent" if ok else "failed", dest.masked, dest.channel, thread_ts or ts, reply_to)


class ChatNotifier:
    def __init__(
        self,
        chat: ChatSettings,
        *,
        clock_ms: Callable[[], int],
        sender: Sender = apprise_send,
        already_sent: Iterable[str] = (),
        slack_sender: SlackSender = slack_post,
        gangs: GangAlerts | None = None,
        intent: Intent | None = None,
        in_doubt: InDoubt | Mapping[str, int] | Iterable[str] = (),
    ) -> None:
        self._chat = chat
        # two-phase journal: a `posting` row before each post (None: no journal, at least once across kills)
        self._intent = intent
        # posts a killed life began and never journalled (`ChatJournal.in_doubt_since`): found in the chat's history
        # (a `slack` route) or posted again with the same idempotency key, so a receiver honouring it records once
        self.doubt = in_doubt if isinstance(in_doubt, InDoubt) else InDoubt(in_doubt)
        # a gang member's idle alert -> the gang's alert it completes, or None (held): sinks/gang.py
        self._gangs = gangs
        self._clock_ms = clock_ms
        self._send = sender
        self._slack_send = slack_sender
        self._dedupe = Deduper(chat.dedupe_window)
        for alert_id in already_sent:  # remembered across restarts (chat_deliveries)
            self._dedupe.first_time(alert_id)
        self._limit = RateLimiter(chat.rate_limit_per_minute)

    @property
    def in_doubt_reposted(self) -> int:
        return self.doubt.reposted

    def handle(self, alert: dict[str, Any]) -> Delivery:
        alert_id = str(alert.get("alert_id") or "")
        if self._chat.kinds and str(alert.get("kind")) not in self._chat.kinds:
            return Delivery(alert_id, "skipped-kind")
        members: tuple[str, ...] = ()
        if self._gangs is not None and alert_id not in self._dedupe:
            in_gang, gang_alert = self._gangs(alert)
            if in_gang and gang_alert is None:
                return Delivery(alert_id, "gang-held")
            if gang_alert is not None:
                members = tuple(m for m in gang_alert["member_alert_ids"] if m != gang_alert["alert_id"])
                alert, alert_id = gang_alert, str(gang_alert["alert_id"])
        if not self._dedupe.first_time(alert_id):
            return Delivery(alert_id, "duplicate")
        dest = resolve(alert, self._chat)
        if dest is None:
            log.warning("no chat route for alert %s (user %s, team %s)", alert_id, alert.get("user"), alert.get("team"))
            return Delivery(alert_id, "no-route")
        if not self._limit.allow(dest.masked, self._clock_ms()):
            log.warning("rate limit reached for %s; alert %s not sent", dest.masked, alert_id)
            return Delivery(alert_id, "rate-limited", dest.masked, dest.channel)
        title, body = render(alert, dest, self._chat.appeal_route)
        if self._chat.dry_run:
            log.info("dry-run chat to %s (%s): %s", dest.channel, dest.masked, title)
            for m in members:
                self._dedupe.first_time(m)
            return Delivery(alert_id, "dry-run", dest.masked, dest.channel, members=members)
        for m in members:  # delivered in the gang's post
            self._dedupe.first_time(m)
        ok, ts = journalled_post(dest, title, body, "", alert_id, sender=self._send, slack_sender=self._slack_send,
                                 intent=self._intent, doubt=self.doubt)  # fmt: skip
        log.info("chat %s to %s (%s): %s", "sent" if ok else "FAILED", dest.channel, dest.masked, title)
        return Delivery(alert_id, "sent" if ok else "failed", dest.masked, dest.channel, ts,
                        members=members if ok else ())  # fmt: skip


# -- the delivery journal (ClickHouse `chat_deliveries`) ---------------------------------------------

# Outcomes worth a row: a send attempt or a routing problem; duplicates and skipped kinds are not.
RECORDED_STATUSES = frozenset({"sent", "dry-run", "failed", "rate-limited", "no-route", "no-policy", "gang-held"})
DELIVERY_COLUMNS = ["alert_id", "ts_ms", "status", "channel", "destination", "thread_ts", "reply_to"]


def recently_delivered(client: Any, window: int) -> list[str]:
    """The ids of the last `window` alerts delivered (or dry-run), oldest first: a restarted notifier
    seeds its dedupe with them (`ChatNotifier(already_sent=...)`) so nothing is posted twice."""
    rows = client.query(
        "SELECT alert_id FROM chat_deliveries FINAL WHERE status IN ('sent', 'dry-run') "
        "ORDER BY ts_ms DESC LIMIT {n:UInt32}",
        parameters={"n": window},
    ).result_rows
    return [row[0] for row in reversed(rows)]


def record_delivery(client: Any, delivery: Delivery, ts_ms: int) -> bool:
    """Journal one delivery outcome in `chat_deliveries` when it is worth a row; True when written. A gang's
    post is journalled under each member's alert too (in the post's thread, `reply_to` the gang's alert)."""
    if delivery.status not in RECORDED_STATUSES:
        return False
    rows = [[delivery.alert_id, ts_ms, delivery.status, delivery.channel, delivery.destination, delivery.thread_ts,
             delivery.reply_to]]  # fmt: skip
    rows += [[m, ts_ms, delivery.status, delivery.channel, delivery.destination, delivery.thread_ts, delivery.alert_id]
             for m in delivery.members]  # fmt: skip
    client.insert("chat_deliveries", rows, column_names=DELIVERY_COLUMNS)
    return True


IN_DOUBT = "posting"  # the journal's first phase: the post is about to go out


class ChatJournal:
    """The two-phase delivery journal in `chat_deliveries` (a ReplacingMergeTree on alert_id, version ts_ms):
    `begin` writes the `posting` row before a post, `end` the outcome after it, which replaces it. An alert
    whose latest row is still `posting` was cut by a kill between the two: in doubt (`in_doubt`)."""

    def __init__(self, client: Any, clock_ms: Callable[[], int]) -> None:
        self._client = client
        self._clock_ms = clock_ms

    def begin(self, delivery: Delivery) -> None:
        row = [delivery.alert_id, self._clock_ms(), IN_DOUBT, delivery.channel, delivery.destination, "", ""]
        self._client.insert("chat_deliveries", [row], column_names=DELIVERY_COLUMNS)

    def end(self, delivery: Delivery) -> bool:
        return record_delivery(self._client, delivery, self._clock_ms())

    def in_doubt_since(self, window: int) -> dict[str, int]:
        """The last `window` posts left in doubt: key -> when their `posting` row was written (ms)."""
        rows = self._client.query(
            "SELECT alert_id, ts_ms FROM chat_deliveries FINAL WHERE status = {s:String} "
            "ORDER BY ts_ms DESC LIMIT {n:UInt32}",
            parameters={"s": IN_DOUBT, "n": window},
        ).result_rows
        return {str(row[0]): int(row[1]) for row in reversed(rows)}

    def in_doubt(self, window: int) -> list[str]:
        """The ids of the last `window` alerts left in doubt, oldest first."""
        rows = self._client.query(
            "SELECT alert_id FROM chat_deliveries FINAL WHERE status = {s:String} ORDER BY ts_ms DESC LIMIT {n:UInt32}",
            parameters={"s": IN_DOUBT, "n": window},
        ).result_rows
        return [row[0] for row in reversed(rows)]


def delivered_post(client: Any, alert_id: str) -> tuple[str, str, str] | None:
    """(masked destination, channel, thread_ts) of the alert's post, when one was sent (or dry-run)."""
    rows = client.query(
        "SELECT destination, channel, thread_ts FROM chat_deliveries FINAL "
        "WHERE alert_id = {a:String} AND status IN ('sent', 'dry-run')",
        parameters={"a": alert_id},
    ).result_rows
    return (str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None


def local_receiver_routes(chat: ChatSettings, port: int) -> ChatSettings:
    """With no route configured (demos, tests), everything goes to the loopback `chat receiver` on `port`;
    configured routes are kept as they are."""
    if chat.default is not None or chat.users or chat.teams:
        return chat
    from pydantic import SecretStr

    return chat.model_copy(
        update={"default": ChatRoute(url=SecretStr(f"json://127.0.0.1:{port}/"), channel="#gpu-idle")}
    )


# -- local webhook receiver ----------------------------------------------------------------------


# Idempotency keys a `WebhookReceiver` remembers: a repeat comes from the next life of a killed chat worker,
# within one batch of its last post (seconds), so the last 10,000 keys (the chat worker's own dedupe window by
# default) bound the memory (about a megabyte) with room to spare; an older key is forgotten, oldest first.
RECEIVER_KEYS = 10_000


class WebhookReceiver:
    """Loopback HTTP endpoint that stores every POST it gets (path, JSON or text body, its idempotency key) in
    memory and, when given, as JSON lines in a file. `GET /received` returns what it has.

    It honours the `Idempotency-Key` header (the IETF httpapi draft): a POST whose key it has already recorded
    is answered as the first was (200, the same `ts` for a Slack-format post) and not recorded again; each such
    repeat is counted in `repeats` (key -> count). It remembers the last `max_keys` keys. A POST without the header
    is recorded each time. A key is not checked against the payload (the draft's 422 for a reused key): a
    repeat may carry fresher figures for the same alert, and it is still that alert's one post."""

    def __init__(self, port: int = 0, out: Path | None = None, host: str = "127.0.0.1",
                 max_keys: int = RECEIVER_KEYS) -> None:  # fmt: skip
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("the webhook receiver listens on loopback only")
        self.received: list[dict[str, Any]] = []
        self.repeats: Counter[str] = Counter()
        self._answers: OrderedDict[str, bytes] = OrderedDict()  # key -> the answer given to its first post
        self._max_keys = max_keys
        self._out = out
        self._lock = threading.Lock()
        self._posts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                header = self.headers.get("Idempotency-Key")
                key = parse_idempotency_key(header)
                if header is not None and key is None:
                    self.send_error(400, "bad Idempotency-Key")
                    return
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                item = {"path": self.path, "content_type": self.headers.get("Content-Type"), "body": body}
                if key is not None:
                    item["idempotency_key"] = key
                answer = receiver._accept(item, key)
                self.send_response(200)
                if answer:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:
                with receiver._lock:
                    data = json.dumps(receiver.received).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("receiver: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def _accept(self, item: dict[str, Any], key: str | None) -> bytes:
        """Record a post (unless its key was seen: then count the repeat) and give its answer: a Slack-format
        post's chat.postMessage answer with its `ts`, the first post's for a repeat; b"" otherwise."""
        with self._lock:  # one lock over look-up and store: two concurrent posts of one key record one
            if key is not None and key in self._answers:
                self._answers.move_to_end(key)
                self.repeats[key] += 1
                return self._answers[key]
            answer = b""
            body = item["body"]
            if isinstance(body, dict) and "text" in body:  # Slack's message JSON: answer as chat.postMessage
                self._posts += 1
                item["ts"] = f"{int(time.time())}.{self._posts:06d}"  # Slack-like: epoch seconds, a sequence
                answer = json.dumps({"ok": True, "channel": body.get("channel", ""), "ts": item["ts"]}).encode()
            self.received.append(item)
            if self._out is not None:
                with self._out.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(item) + "\n")
            if key is not None:
                self._answers[key] = answer
                if len(self._answers) > self._max_keys:
                    self._answers.popitem(last=False)
            return answer

    def start(self) -> WebhookReceiver:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
