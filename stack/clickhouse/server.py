"""The ClickHouse HTTP interface in front of chDB, so clients use the embedded engine like a server.

What it speaks is what clickhouse-connect, curl and analysts' tools expect of a ClickHouse server
(`../shared/notes/clickhouse-http.md`): `POST /` with SQL in the body or the `query` parameter,
`param_*` binds (also as multipart form fields), per-query settings as URL parameters, `database`,
`session_id`, compressed and chunked request bodies, errors marked by `X-ClickHouse-Exception-Code`
(never 429/503/504, which clients retry), mid-stream errors framed with `X-ClickHouse-Exception-Tag`.

Inserts with data (`INSERT ... FORMAT X` + body) are spooled to a file and run as `INSERT ... FROM
INFILE`: chDB's streaming-insert API can report success while a CHECK constraint or a materialized
view failed and nothing was stored; the file path reports those errors.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from base.errors import ConfigError, PortInUse
from stack.clickhouse import sqltext
from stack.clickhouse.authorisation import User, authenticate, authorise, requested_readonly
from stack.clickhouse.body import Body
from stack.clickhouse.engine import Engine, Lease, QueryFailed
from stack.clickhouse.execution import InsertRunner, QueryRunner
from stack.clickhouse.lockfile import DataPathLock
from stack.clickhouse.request import StatementReader, float_param, url_settings
from stack.clickhouse.response import PLAIN_TEXT, ResponseWriter, http_status

__all__ = ["AnalystLimits", "EmbeddedClickHouse", "ServerConfig", "User"]

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "::1", "localhost")
_SECRET_PARAM = re.compile(r"((?:password|X-ClickHouse-Key)=)[^&\s'\"]*", re.IGNORECASE)


@dataclass(frozen=True)
class AnalystLimits:
    """What one read-only query may use; fixed on the handle before `readonly = 1`, so the engine
    itself refuses to lift them."""

    max_execution_time_s: int = 60
    max_memory_usage_bytes: int = 4 << 30
    max_result_rows: int = 10_000_000
    max_result_bytes: int = 1 << 30
    max_threads: int = 2

    def settings(self) -> dict[str, str]:
        return {
            "max_execution_time": str(self.max_execution_time_s),
            "max_memory_usage": str(self.max_memory_usage_bytes),
            "max_result_rows": str(self.max_result_rows),
            "max_result_bytes": str(self.max_result_bytes),
            "result_overflow_mode": "throw",
            "max_threads": str(self.max_threads),
        }


@dataclass(frozen=True)
class ServerConfig:
    path: Path
    users: tuple[User, ...]
    host: str = "127.0.0.1"
    port: int = 8123
    max_body_bytes: int = 2 << 30  # an insert's data, counted decompressed
    max_query_bytes: int = 1 << 20  # a request without insert data (the statement and its binds)
    session_timeout_s: float = 60.0
    max_sessions: int = 256
    max_connections: int = 64
    shutdown_grace_s: float = 60.0
    keepalive_timeout_s: float = 30.0
    header_timeout_s: float = 10.0  # from a request's first line to the end of its headers
    body_timeout_s: float = 600.0  # from the end of the headers to the end of the body
    spool_dir: Path | None = None
    ledger_database: str = "gpuledger"
    analyst_limits: AnalystLimits = field(default_factory=AnalystLimits)

    def check(self) -> None:
        if not self.users:
            raise ConfigError("the embedded ClickHouse needs at least one user")
        if self.host not in LOOPBACK and any(not u.password for u in self.users):
            raise ConfigError(
                f"refusing to listen on {self.host} with an empty password: set clickhouse.password and "
                "clickhouse.analyst_password, or listen on 127.0.0.1"
            )


class EmbeddedClickHouse:
    """Owns the data path, the engine and the HTTP listener."""

    def __init__(self, config: ServerConfig) -> None:
        config.check()
        self.config = config
        self.users = {u.name: u for u in config.users}
        self.lock = DataPathLock(config.path)
        self.engine: Engine | None = None
        self.httpd: _HTTPServer | None = None
        self.stopping = threading.Event()
        self._idle: set[socket.socket] = set()
        self._deadlines: dict[socket.socket, float] = {}
        self._active = 0
        self._state = threading.Condition()
        self._threads: list[threading.Thread] = []
        self.spool_dir: Path | None = None
        self.url = ""

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        self.lock.acquire()
        try:
            self.httpd = self._bind()
            self.engine = Engine(
                self.config.path,
                max_sessions=self.config.max_sessions,
                session_timeout_s=self.config.session_timeout_s,
                readonly_limits=self.config.analyst_limits.settings(),
            )
            self.spool_dir = self._make_spool_dir()
            host, port = str(self.httpd.server_address[0]), int(self.httpd.server_address[1])
            shown = f"[{host}]" if ":" in host else host
            self.url = f"http://{shown}:{port}"
            self.lock.update({"url": self.url, "path": str(self.config.path)})
        except BaseException:
            self._close_resources()
            raise
        serve = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        reaper = threading.Thread(target=self._reap, daemon=True)
        serve.start()
        reaper.start()
        self._threads = [serve, reaper]

    def _bind(self) -> _HTTPServer:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        _HTTPServer.address_family = family
        try:
            httpd = _HTTPServer((self.config.host, self.config.port), _Handler)
        except OSError as exc:
            raise PortInUse(
                f"cannot listen on {self.config.host}:{self.config.port} for the embedded ClickHouse: {exc.strerror}"
            ) from exc
        httpd.app = self
        httpd.slots = threading.BoundedSemaphore(self.config.max_connections)
        return httpd

    def _make_spool_dir(self) -> Path:
        base = self.config.spool_dir
        if base is None:
            shm = Path("/dev/shm")  # noqa: S108 - a private mkdtemp below, memory-backed when it exists
            base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        _sweep_spool_dirs(base)
        return Path(tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", dir=base))

    def _reap(self) -> None:
        while not self.stopping.wait(0.5):
            self._enforce_deadlines()
            if self.engine is not None:
                expired = self.engine.reap()
                if expired:
                    log.debug("expired %d idle sessions", expired)

    def stop(self) -> None:
        """Stop accepting, finish the requests in flight, then close the engine and release the path."""
        self.stopping.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        with self._state:
            for sock in list(self._idle):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            deadline = time.monotonic() + self.config.shutdown_grace_s
            while self._active and time.monotonic() < deadline:
                self._state.wait(0.2)
            if self._active:
                log.warning("stopping with %d requests still running", self._active)
        self._close_resources()

    def _close_resources(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self.spool_dir is not None:
            shutil.rmtree(self.spool_dir, ignore_errors=True)
            self.spool_dir = None
        self.lock.release()

    def serve_until_signalled(self, ready: Callable[[str], None] | None = None) -> None:
        done = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            done.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            if ready is not None:
                ready(self.url)
            while not done.wait(0.5):
                pass
            log.info("stopping: finishing requests in flight")
            self.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    # -- connection bookkeeping (for graceful shutdown and read deadlines) -------------------------

    def set_deadline(self, sock: socket.socket, seconds: float | None) -> None:
        """Cut the connection if the client has not sent what it owes within `seconds` (None: no deadline)."""
        with self._state:
            if seconds is None:
                self._deadlines.pop(sock, None)
            else:
                self._deadlines[sock] = time.monotonic() + seconds

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        with self._state:
            late = [sock for sock, due in self._deadlines.items() if due < now]
            for sock in late:
                del self._deadlines[sock]
        for sock in late:
            log.info("closing a connection that did not send its request in time")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def connection_idle(self, sock: socket.socket, idle: bool) -> None:
        with self._state:
            if idle:
                self._idle.add(sock)
            else:
                self._idle.discard(sock)

    def request_started(self, sock: socket.socket) -> None:
        with self._state:
            self._idle.discard(sock)
            self._active += 1

    def request_finished(self) -> None:
        with self._state:
            self._active -= 1
            self._state.notify_all()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    app: EmbeddedClickHouse
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread a connection, up to `max_connections`; beyond that, one error and a hang-up."""
        if not self.slots.acquire(blocking=False):
            body = (
                f"Code: 202. DB::Exception: Too many simultaneous connections "
                f"(the limit is {self.app.config.max_connections}). (TOO_MANY_SIMULTANEOUS_QUERIES)\n"
            ).encode()
            head = (
                "HTTP/1.1 500 Internal Server Error\r\nX-ClickHouse-Exception-Code: 202\r\n"
                f"Content-Type: text/plain; charset=UTF-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            with contextlib.suppress(OSError):
                request.settimeout(1.0)
                request.sendall(head + body)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _DeadlineReader:
    """The request stream; once a request's first line has arrived, its headers are due within
    `header_timeout_s` (a client that trickles bytes is cut off by the server's deadline sweep)."""

    def __init__(self, raw: Any, app: EmbeddedClickHouse, sock: socket.socket) -> None:
        self._raw = raw
        self._app = app
        self._sock = sock
        self.awaiting_request = True

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self._raw.readline(size)
        if self.awaiting_request:
            self.awaiting_request = False
            self._app.set_deadline(self._sock, self._app.config.header_timeout_s)
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Handler(BaseHTTPRequestHandler):
    """One connection: its deadlines and bookkeeping, and each request handed to its collaborators:
    `StatementReader` (what is asked), `authorisation` (who asks, and whether they may), the runners
    in `execution` (running it) and `ResponseWriter` (answering)."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    server_version = "gpuledger-embedded-clickhouse"

    def setup(self) -> None:
        super().setup()
        app = self.server.app
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.settimeout(app.config.keepalive_timeout_s)
        self.rfile = _DeadlineReader(self.rfile, app, self.connection)  # type: ignore[assignment]
        self.response = ResponseWriter(self, app.config.keepalive_timeout_s, app.stopping)
        self.reader = StatementReader(app.config.max_query_bytes)

    def handle_one_request(self) -> None:
        app = self.server.app
        if app.stopping.is_set():
            self.close_connection = True
            return
        app.connection_idle(self.connection, True)
        reader = self.rfile
        if isinstance(reader, _DeadlineReader):
            reader.awaiting_request = True
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError, ValueError):  # ValueError: a read on a socket cut off
            self.close_connection = True
        finally:
            app.connection_idle(self.connection, False)
            app.set_deadline(self.connection, None)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        # The request line can carry `?password=`: scrub it before anything reaches a log.
        log.debug("http: %s", _SECRET_PARAM.sub(r"\1***", format % args))

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_HEAD(self) -> None:
        self.response.send(200, {"Content-Type": PLAIN_TEXT}, b"", head_only=True)

    # -- the request -------------------------------------------------------------------------------

    def _serve(self, method: str) -> None:
        app = self.server.app
        app.set_deadline(self.connection, app.config.body_timeout_s)
        app.request_started(self.connection)
        try:
            self._serve_inner(method)
        finally:
            if app.stopping.is_set():
                self.close_connection = True
            app.request_finished()

    def _serve_inner(self, method: str) -> None:
        app = self.server.app
        url = urlsplit(self.path)
        if url.path in ("/ping", "/replicas_status"):
            self._discard_body()
            self.response.send(200, {"Content-Type": PLAIN_TEXT}, b"Ok.\n")
            return
        if url.path not in ("/", "/query"):
            self._discard_body()
            self.response.send(404, {"Content-Type": PLAIN_TEXT}, b"There is no handler for this path.\n")
            return
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        started = time.perf_counter()
        body: Body | None = None
        keyword = ""
        status = 200
        try:
            body = Body(self.rfile, self.headers, app.config.max_body_bytes)
            user = authenticate(app.users, self.headers, params)
            if method == "GET" and "query" not in params:
                self.response.send(200, {"Content-Type": PLAIN_TEXT}, b"Ok.\n")
                return
            keyword = self._run(method, user, params, query_id, body)
        except QueryFailed as exc:
            status = http_status(exc.code)
            self.response.fail(exc, query_id, body, self._version())
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a server bug must still answer as ClickHouse does, not hang up
            log.exception("unexpected error serving query %s", query_id)
            status = 500
            failure = QueryFailed.make(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}")
            self.response.fail(failure, query_id, body, self._version())
        finally:
            log.debug(
                "query %s %s status=%d in %.1f ms", query_id, keyword or "-", status,
                (time.perf_counter() - started) * 1e3,
            )

    def _version(self) -> str:
        engine = self.server.app.engine
        return engine.version if engine else ""

    def _discard_body(self) -> None:
        try:
            body = Body(self.rfile, self.headers, self.server.app.config.max_body_bytes)
        except QueryFailed:
            self.close_connection = True
            return
        if not body.drain():
            self.close_connection = True

    def _body_received(self) -> None:
        self.server.app.set_deadline(self.connection, None)

    def _run(self, method: str, user: User, params: dict[str, str], query_id: str, body: Body) -> str:
        app = self.server.app
        engine = app.engine
        assert engine is not None
        parsed, binds = self.reader.read(params, self.headers.get("Content-Type") or "", body)
        if parsed.insert is None:
            self._body_received()  # the whole request has arrived
        if not parsed.sql.strip() and parsed.insert is None:
            raise QueryFailed.make(62, "SYNTAX_ERROR", "Empty query")
        settings = url_settings(params)
        url_readonly = requested_readonly(user, method, params, settings)
        lease = self._lease(engine, user, params, url_readonly)
        try:
            self._prepare(lease, user, params.get("database"), settings)
            tz = settings.get("session_timezone") or engine.timezone
            if parsed.insert is not None:
                assert app.spool_dir is not None
                InsertRunner(engine, app.spool_dir, self.response, self._body_received).run(
                    lease, user, parsed, binds, query_id, tz
                )
                return "INSERT"
            authorise(engine, lease, user, parsed.sql, binds)
            keyword = sqltext.leading_keyword(parsed.sql)
            QueryRunner(engine, self.response).run(lease, parsed.sql, keyword, binds, params, query_id, tz)
            lease.handle.after_statement(keyword, parsed.sql)
            return keyword
        finally:
            lease.release()

    @staticmethod
    def _lease(engine: Engine, user: User, params: dict[str, str], url_readonly: int) -> Lease:
        """A throwaway handle for a writer's read-only request, else the user's session (or a fresh handle)."""
        if user.readonly == 0 and url_readonly:
            return engine.throwaway(url_readonly)
        timeout = params.get("session_timeout")
        return engine.lease(
            user.name,
            user.readonly,
            params.get("session_id") or None,
            float_param(timeout, "session_timeout") if timeout else None,
            params.get("session_check") == "1",
        )

    def _prepare(self, lease: Lease, user: User, database: str | None, settings: dict[str, str]) -> None:
        """The request's database and settings on its handle. An analyst who names no database works in
        the ledger's (in `default` before the migrations created it)."""
        if database or not user.readonly:
            lease.handle.prepare(database or (None if lease.session else "default"), settings)
            return
        try:
            lease.handle.prepare(self.server.app.config.ledger_database, settings)
        except QueryFailed as exc:
            if exc.code != 81:  # UNKNOWN_DATABASE
                raise
            lease.handle.prepare("default", settings)


SPOOL_PREFIX = "gpuledger-clickhouse-spool-"


def _sweep_spool_dirs(base: Path) -> None:
    """Remove spool directories left by servers that died without cleaning up (`kill -9`)."""
    for entry in base.glob(f"{SPOOL_PREFIX}*"):
        pid_text = entry.name[len(SPOOL_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except PermissionError:
            continue  # alive, someone else's
