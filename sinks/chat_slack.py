"""Slack's Web API for a chat route of format "slack": the message, its post, and what makes the post exactly once
across a kill.

A post goes out as chat.postMessage's JSON (`slack_message`) with message metadata, the app's own structured data
that Slack keeps with the message and does not show in it: `{"event_type": "gpuledger_post", "event_payload":
{"key": <the alert id or step event id>}}`. Slack honours no idempotency key, so a post a kill cut between Slack's
answer and the journal's `sent` row (the post in doubt, sinks/chat.py `ChatJournal`) would be posted twice.
Instead, before posting an in-doubt key again, the next life reads the channel's history since the `posting` row
(conversations.history with `include_all_metadata`, or conversations.replies for a reply in a thread) and looks
for a message whose metadata carries that key: found, the post is taken as sent with that message's `ts` and not
made again; not found, it is posted. The look-up needs the Web API (the route's URL ends in `chat.postMessage`,
with a bot token holding the `*:history` scopes, and `channels:read`/`groups:read` when the route names a channel
by name, resolved by conversations.list). Where it cannot be asked (an incoming webhook has no history; a refused
scope; Slack away) the post is made again, at least once: at most one duplicate per kill, logged.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from typing import Any

from base.errors import ServiceError
from base.settings import ChatRoute

log = logging.getLogger(__name__)

EVENT_TYPE = "gpuledger_post"  # the metadata's event_type: alphanumeric and underscores, as Slack's guide asks
POST_METHOD = "chat.postMessage"
CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{8,}")  # a conversation id (public, private, direct); else a name
PAGE_LIMIT = 200  # messages or channels a page (Slack recommends at most 200)
MAX_PAGES = 50  # 10,000 messages since the post in doubt: beyond, the look-up says it cannot tell
SKEW_MS = 60_000  # the history is read from a minute before the `posting` row (clocks of two machines)
TIMEOUT_S = 10.0


def mask_url(url: str) -> str:
    """A webhook URL fit for logs: its scheme and a short digest, never the token it carries."""
    scheme = url.split("://", 1)[0] if "://" in url else "?"
    return f"{scheme}://<secret {hashlib.sha256(url.encode()).hexdigest()[:8]}>"


def slack_message(route: ChatRoute, title: str, body: str, thread_ts: str = "", key: str = "") -> dict[str, Any]:
    """Slack's message JSON: the title in bold over the body; the channel when the route names one (the Web
    API needs it; an incoming webhook posts to its own); `thread_ts` to reply in a thread; with a `key`, the
    metadata that lets a later life find this post in the channel's history."""
    message: dict[str, Any] = {"text": f"*{title}*\n{body}", "unfurl_links": False}
    if route.channel:
        message["channel"] = route.channel
    if thread_ts:
        message["thread_ts"] = thread_ts
    if key:
        message["metadata"] = {"event_type": EVENT_TYPE, "event_payload": {"key": key}}
    return message


def slack_post(route: ChatRoute, title: str, body: str, thread_ts: str = "", key: str = "") -> tuple[bool, str]:
    """POST `slack_message` to the route's endpoint (`Authorization: Bearer` with its token). Delivered when it
    answers 2xx and not Slack's `{"ok": false}`; the post's `ts` when the answer carries one (chat.postMessage
    does; an incoming webhook answers `ok` and gives none, so nothing can reply in its thread)."""
    import httpx

    url = route.url.get_secret_value()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if route.token is not None:
        headers["Authorization"] = f"Bearer {route.token.get_secret_value()}"
    try:
        message = slack_message(route, title, body, thread_ts, key)
        resp = httpx.post(url, json=message, headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as exc:
        log.error("chat post to %s failed: %s", mask_url(url), type(exc).__name__)
        return False, ""
    if resp.status_code // 100 != 2:
        log.error("chat post to %s: HTTP %d", mask_url(url), resp.status_code)
        return False, ""
    try:
        answer = resp.json()
    except ValueError:
        return True, ""  # an incoming webhook's plain "ok"
    if not isinstance(answer, dict):
        return True, ""
    if answer.get("ok") is False:
        log.error("chat post to %s refused: %s", mask_url(url), str(answer.get("error", "?"))[:80])
        return False, ""
    return True, str(answer.get("ts") or "")


def web_api_base(url: str) -> str | None:
    """`https://slack.com/api/` for a route posting to `https://slack.com/api/chat.postMessage` (any host: a
    compatible endpoint); None for anything else (an incoming webhook has no Web API to ask)."""
    path = url.split("?", 1)[0]
    if not path.endswith("/" + POST_METHOD):
        return None
    return path[: -len(POST_METHOD)]


class SlackHistory:
    """Reads a channel's messages back to find an earlier post of a key (`posted`). Channel ids resolved from
    names are kept for the life of the process."""

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], str] = {}

    def posted(self, route: ChatRoute, channel: str, key: str, thread_ts: str, since_ms: int) -> str | None:
        """The `ts` of a message in `channel` (in the thread of `thread_ts`, when given) posted since `since_ms`
        whose metadata carries `key`; None when there is none. ServiceError when Slack cannot be asked."""
        base = web_api_base(route.url.get_secret_value())
        if base is None or route.token is None:
            raise ServiceError("not Slack's Web API with a token (an incoming webhook has no history to read)")
        token = route.token.get_secret_value()
        params = {"channel": self.channel_id(base, token, channel), "include_all_metadata": "true",
                  "oldest": f"{max(0, since_ms - SKEW_MS) / 1000:.6f}"}  # fmt: skip
        method = "conversations.history"
        if thread_ts:
            method, params["ts"] = "conversations.replies", thread_ts
        for message in _pages(base, token, method, params, "messages"):
            metadata = message.get("metadata")
            if not isinstance(metadata, dict) or metadata.get("event_type") != EVENT_TYPE:
                continue
            payload = metadata.get("event_payload")
            if isinstance(payload, dict) and payload.get("key") == key:
                return str(message.get("ts") or "")
        return None

    def channel_id(self, base: str, token: str, channel: str) -> str:
        """The conversation id of the route's channel: as it is when it is one, else its name looked up with
        conversations.list (public and private channels the token sees)."""
        if CHANNEL_ID.fullmatch(channel):
            return channel
        if (base, channel) not in self._ids:
            name = channel.removeprefix("#")
            if not name or channel.startswith("@"):
                raise ServiceError(f"channel {channel!r} is neither a channel id nor a channel name")
            params = {"types": "public_channel,private_channel", "exclude_archived": "true"}
            found = [c for c in _pages(base, token, "conversations.list", params, "channels") if c.get("name") == name]
            if not found:
                raise ServiceError(f"no channel named {name!r} among those the token can list")
            self._ids[(base, channel)] = str(found[0]["id"])
        return self._ids[(base, channel)]


def _pages(base: str, token: str, method: str, params: dict[str, str], field: str) -> Iterator[dict[str, Any]]:
    """The items of a Web API list method, page after page (cursor pagination, `response_metadata.next_cursor`),
    at most MAX_PAGES pages; ServiceError when a page is refused or unreadable, or when there are more pages."""
    import httpx

    cursor = ""
    for _ in range(MAX_PAGES):
        query = {**params, "limit": str(PAGE_LIMIT), **({"cursor": cursor} if cursor else {})}
        try:
            resp = httpx.get(base + method, params=query, headers={"Authorization": f"Bearer {token}"},
                             timeout=TIMEOUT_S)  # fmt: skip
            answer = resp.json() if resp.status_code // 100 == 2 else {"error": f"HTTP {resp.status_code}"}
        except (httpx.HTTPError, ValueError) as exc:
            raise ServiceError(f"{method}: {type(exc).__name__}") from exc
        if not isinstance(answer, dict) or answer.get("ok") is not True:
            error = answer.get("error", "?") if isinstance(answer, dict) else "not an object"
            raise ServiceError(f"{method}: {str(error)[:80]}")
        items = answer.get(field)
        if not isinstance(items, list):
            raise ServiceError(f"{method}: no {field} in the answer")
        yield from (item for item in items if isinstance(item, dict))
        cursor = str((answer.get("response_metadata") or {}).get("next_cursor") or "")
        if not cursor:
            return
    raise ServiceError(f"{method}: more than {MAX_PAGES} pages since the post in doubt")
