"""A loopback stand-in for the part of Slack's Web API the chat worker uses (Slack itself is not reachable from
here), following Slack's documented shapes (docs.slack.dev, reference/methods):

- `POST /api/chat.postMessage` (JSON body, `Authorization: Bearer <token>`): `channel` (an id, or a channel's
  name with or without `#`), `text`, optional `thread_ts` and `metadata` (`event_type` + `event_payload`). Every
  post is stored, as Slack stores it: Slack honours no idempotency key, so a post made twice is there twice.
  Answer `{"ok": true, "channel": <id>, "ts": <ts>, "message": {...}}`.
- `GET /api/conversations.history` (`channel` id only, `oldest`, `latest`, `inclusive`, `limit`, `cursor`,
  `include_all_metadata`): the channel's top-level messages newest first, `metadata` only when asked for,
  `has_more` and `response_metadata.next_cursor` (cursor pagination).
- `GET /api/conversations.replies` (`channel`, `ts` of the parent, the same paging): the parent, then its replies.
- `GET /api/conversations.list` (`types`, `exclude_archived`, `limit`, `cursor`): the channels, `id` and `name`.

Errors as Slack gives them: HTTP 200 with `{"ok": false, "error": ...}` (`not_authed`, `invalid_auth`,
`channel_not_found`, `no_text`, `invalid_metadata_format`, `thread_not_found`, `missing_scope` with `needed` and
`provided`, `invalid_cursor`). `scopes` limits what the token may do (Slack's bot scopes: `chat:write`,
`channels:history`, `channels:read`).

`hold_post(n)`: the n-th post is stored, then its answer is held until `release()` (or 30 s): a test kills the
poster while Slack has the message and the poster has no answer, the post in doubt.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

ALL_SCOPES = frozenset({"chat:write", "channels:history", "channels:read"})
NEEDS = {"chat.postMessage": "chat:write", "conversations.history": "channels:history",
         "conversations.replies": "channels:history", "conversations.list": "channels:read"}  # fmt: skip


class SlackStandIn:
    def __init__(self, channels: dict[str, str], token: str = "xoxb-stand-in",
                 scopes: frozenset[str] = ALL_SCOPES) -> None:  # fmt: skip
        self.channels = dict(channels)  # id -> name
        self.token, self.scopes = token, scopes
        self.messages: dict[str, list[dict[str, Any]]] = {cid: [] for cid in channels}  # by channel, oldest first
        self.calls: Counter[str] = Counter()
        self.posts = 0
        self._lock = threading.Lock()
        self._last_ts = 0.0
        self._hold_at = 0
        self.held = threading.Event()
        self._release = threading.Event()
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    args = json.loads(raw) if raw else {}
                except ValueError:
                    args = None
                self._answer(stand_in._call(self._method(), self.headers.get("Authorization"), args))

            def do_GET(self) -> None:
                query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
                self._answer(stand_in._call(self._method(), self.headers.get("Authorization"), query))

            def _method(self) -> str:
                return urlsplit(self.path).path.removeprefix("/api/")

            def _answer(self, answer: dict[str, Any]) -> None:
                if answer.pop("_hold", False):
                    stand_in.held.set()
                    stand_in._release.wait(30)
                data = json.dumps(answer).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the poster was killed while its answer was held
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True

    def start(self) -> SlackStandIn:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()

    def url(self, method: str = "chat.postMessage") -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/api/{method}"

    def hold_post(self, n: int) -> None:
        """Hold the answer to the n-th post (counted from the start) until `release()`."""
        self.held.clear()
        self._release.clear()
        self._hold_at = n

    def release(self) -> None:
        self._hold_at = 0
        self._release.set()

    def keys(self) -> Counter[str]:
        """How many stored messages carry each metadata key (every channel, replies included)."""
        with self._lock:
            return Counter(m["metadata"]["event_payload"].get("key") for msgs in self.messages.values() for m in msgs
                           if isinstance(m.get("metadata"), dict))  # fmt: skip

    # -- the methods ----------------------------------------------------------------------------------

    def _call(self, method: str, authorization: str | None, args: Any) -> dict[str, Any]:
        with self._lock:
            self.calls[method] += 1
            if authorization is None or not authorization.startswith("Bearer "):
                return {"ok": False, "error": "not_authed"}
            if authorization.removeprefix("Bearer ") != self.token:
                return {"ok": False, "error": "invalid_auth"}
            if method not in NEEDS:
                return {"ok": False, "error": "unknown_method"}
            if NEEDS[method] not in self.scopes:
                return {"ok": False, "error": "missing_scope", "needed": NEEDS[method],
                        "provided": ",".join(sorted(self.scopes))}  # fmt: skip
            if not isinstance(args, dict):
                return {"ok": False, "error": "invalid_json"}
            return getattr(self, "_" + method.replace(".", "_"))(args)

    def _channel(self, given: Any, names: bool) -> str | None:
        if given in self.channels:
            return str(given)
        if names and isinstance(given, str):
            found = [cid for cid, name in self.channels.items() if name == given.removeprefix("#")]
            return found[0] if found else None
        return None

    def _chat_postMessage(self, args: dict[str, Any]) -> dict[str, Any]:
        cid = self._channel(args.get("channel"), names=True)
        if cid is None:
            return {"ok": False, "error": "channel_not_found"}
        if not args.get("text"):
            return {"ok": False, "error": "no_text"}
        metadata = args.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and isinstance(metadata.get("event_type"), str)
                                         and isinstance(metadata.get("event_payload"), dict)):  # fmt: skip
            return {"ok": False, "error": "invalid_metadata_format"}
        thread_ts = args.get("thread_ts")
        if thread_ts and not any(m["ts"] == thread_ts for m in self.messages[cid]):
            return {"ok": False, "error": "thread_not_found"}
        self._last_ts = max(time.time(), self._last_ts + 0.000001)
        message: dict[str, Any] = {"type": "message", "subtype": "bot_message", "bot_id": "B0STANDIN",
                                   "app_id": "A0STANDIN", "text": str(args["text"])}  # fmt: skip
        message["ts"] = f"{self._last_ts:.6f}"
        if thread_ts:
            message["thread_ts"] = thread_ts
        if metadata is not None:
            message["metadata"] = metadata
        self.messages[cid].append(message)
        self.posts += 1
        answer = {"ok": True, "channel": cid, "ts": message["ts"], "message": dict(message)}
        if self._hold_at and self.posts == self._hold_at:
            answer["_hold"] = True
        return answer

    def _page(self, items: list[dict[str, Any]], args: dict[str, Any], field: str) -> dict[str, Any]:
        try:
            start = int(base64.b64decode(args["cursor"]).decode().removeprefix("next:")) if args.get("cursor") else 0
            limit = max(1, min(int(args.get("limit") or 100), 999))
        except ValueError:
            return {"ok": False, "error": "invalid_cursor"}
        page = items[start : start + limit]
        more = start + limit < len(items)
        cursor = base64.b64encode(f"next:{start + limit}".encode()).decode() if more else ""
        return {"ok": True, field: page, "has_more": more, "response_metadata": {"next_cursor": cursor}}

    def _timeline(self, messages: list[dict[str, Any]], args: dict[str, Any]) -> list[dict[str, Any]]:
        oldest, latest = float(args.get("oldest") or 0), float(args.get("latest") or time.time() + 1)
        inclusive = str(args.get("inclusive", "")).lower() in ("1", "true")
        with_metadata = str(args.get("include_all_metadata", "")).lower() in ("1", "true")
        out = []
        for m in messages:
            ts = float(m["ts"])
            if (oldest <= ts <= latest) if inclusive else (oldest < ts < latest):
                out.append(m if with_metadata else {k: v for k, v in m.items() if k != "metadata"})
        return out

    def _conversations_history(self, args: dict[str, Any]) -> dict[str, Any]:
        cid = self._channel(args.get("channel"), names=False)
        if cid is None:
            return {"ok": False, "error": "channel_not_found"}
        top = [m for m in self.messages[cid] if m.get("thread_ts", m["ts"]) == m["ts"]]
        answer = self._page(self._timeline(top, args)[::-1], args, "messages")
        answer["pin_count"] = 0
        return answer

    def _conversations_replies(self, args: dict[str, Any]) -> dict[str, Any]:
        cid = self._channel(args.get("channel"), names=False)
        if cid is None:
            return {"ok": False, "error": "channel_not_found"}
        parent = [m for m in self.messages[cid] if m["ts"] == args.get("ts")]
        if not parent:
            return {"ok": False, "error": "thread_not_found"}
        thread = parent + [m for m in self.messages[cid] if m.get("thread_ts") == args["ts"] and m["ts"] != args["ts"]]
        return self._page(self._timeline(thread, args), args, "messages")

    def _conversations_list(self, args: dict[str, Any]) -> dict[str, Any]:
        channels = [{"id": cid, "name": name, "is_channel": True, "is_private": False, "is_archived": False}
                    for cid, name in sorted(self.channels.items())]  # fmt: skip
        return self._page(channels, args, "channels")
