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

import base64
import contextlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpuledger.errors import ConfigError, PortInUse
from sinks.embedded import native, sqltext
from sinks.embedded.body import POISON, Body, open_pipe_writer, parse_multipart, write_all
from sinks.embedded.engine import Engine, Handle, Lease, Outcome, QueryFailed
from sinks.embedded.lockfile import DataPathLock

log = logging.getLogger(__name__)

DISPLAY_NAME = "gpuledger-embedded"
LOOPBACK = ("127.0.0.1", "::1", "localhost")

# URL parameters the HTTP interface consumes; everything else that is not `param_*` is a setting.
TRANSPORT_PARAMS = frozenset(
    {
        "query",
        "query_id",
        "session_id",
        "session_timeout",
        "session_check",
        "close_session",
        "database",
        "default_format",
        "user",
        "password",
        "quota_key",
        "buffer_size",
        "wait_end_of_query",
        "compress",
        "decompress",
        "client_protocol_version",
        "role",
        "stacktrace",
        "enable_http_compression",
        "http_zlib_compression_level",
        "send_progress_in_http_headers",
        "http_headers_progress_interval_ms",
        "cancel_http_readonly_queries_on_client_close",
        "http_native_compression_disable_checksumming_on_decompress",
    }
)

# ClickHouse's own mapping of error codes to HTTP statuses, for the codes that are not a 500.
_STATUS_BY_CODE = {
    516: 401,  # AUTHENTICATION_FAILED
    192: 401,  # UNKNOWN_USER
    193: 401,  # WRONG_PASSWORD
    194: 401,  # REQUIRED_PASSWORD
    164: 403,  # READONLY
    497: 403,  # ACCESS_DENIED
    60: 404,  # UNKNOWN_TABLE
    81: 404,  # UNKNOWN_DATABASE
    46: 404,  # UNKNOWN_FUNCTION
    47: 404,  # UNKNOWN_IDENTIFIER
    50: 404,  # UNKNOWN_TYPE
    73: 404,  # UNKNOWN_FORMAT
    115: 404,  # UNKNOWN_SETTING
    372: 404,  # SESSION_NOT_FOUND
    62: 400,  # SYNTAX_ERROR
    27: 400,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    26: 400,  # CANNOT_PARSE_QUOTED_STRING
    6: 400,  # CANNOT_PARSE_TEXT
    36: 400,  # BAD_ARGUMENTS
    43: 400,  # ILLEGAL_TYPE_OF_ARGUMENT
    53: 400,  # TYPE_MISMATCH
    117: 400,  # INCORRECT_DATA
    354: 400,  # CANNOT_DECOMPRESS
    456: 400,  # UNKNOWN_QUERY_PARAMETER
    457: 400,  # BAD_QUERY_PARAMETER
    469: 400,  # VIOLATED_CONSTRAINT
    373: 423,  # SESSION_IS_LOCKED
    290: 413,  # LIMIT_EXCEEDED (request body too large)
    48: 501,  # NOT_IMPLEMENTED
}
_NEVER = (429, 503, 504)  # clients retry these; a query error must not invite a retry
# Formats streamed into the engine through a pipe (see `_Handler._insert`).
PIPED_FORMATS = frozenset({"Native", "RowBinary", "RowBinaryWithNames", "RowBinaryWithNamesAndTypes"})
_SECRET_PARAM = re.compile(r"((?:password|X-ClickHouse-Key)=)[^&\s'\"]*", re.IGNORECASE)


def http_status(code: int) -> int:
    status = _STATUS_BY_CODE.get(code, 500)
    return 500 if status in _NEVER else status


def content_type(fmt: str) -> str:
    name = fmt.lower()
    if name.startswith(("tabseparated", "tsv")):
        return "text/tab-separated-values; charset=UTF-8"
    if name.startswith("csv"):
        return "text/csv; charset=UTF-8; header=absent"
    if name.startswith("json"):
        return "application/json; charset=UTF-8"
    if name in ("native", "rowbinary", "arrow", "arrowstream", "parquet", "orc", "avro") or name.startswith(
        "rowbinary"
    ):
        return "application/octet-stream"
    return "text/plain; charset=UTF-8"


@dataclass(frozen=True)
class User:
    name: str
    password: str = field(repr=False)
    readonly: int = 0


@dataclass(frozen=True)
class ServerConfig:
    path: Path
    users: tuple[User, ...]
    host: str = "127.0.0.1"
    port: int = 8123
    max_body_bytes: int = 2 << 30
    session_timeout_s: float = 60.0
    max_sessions: int = 256
    shutdown_grace_s: float = 60.0
    keepalive_timeout_s: float = 30.0
    spool_dir: Path | None = None

    def check(self) -> None:
        if not self.users:
            raise ConfigError("the embedded ClickHouse needs at least one user")
        if self.host not in LOOPBACK and any(not u.password for u in self.users):
            raise ConfigError(
                f"refusing to listen on {self.host} with an empty password: set clickhouse.password and "
                "clickhouse.analyst_password, or listen on 127.0.0.1"
            )


@dataclass
class Parsed:
    """What a request asks for, once its text is read."""

    sql: str = ""
    insert: sqltext.InsertWithData | None = None
    data_head: bytes = b""  # the first bytes of an insert's data
    data_rest: Iterator[bytes] | None = None


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
        return httpd

    def _make_spool_dir(self) -> Path:
        base = self.config.spool_dir
        if base is None:
            shm = Path("/dev/shm")  # noqa: S108 - a private mkdtemp below, memory-backed when it exists
            base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        _sweep_spool_dirs(base)
        return Path(tempfile.mkdtemp(prefix=f"{SPOOL_PREFIX}{os.getpid()}-", dir=base))

    def _reap(self) -> None:
        while not self.stopping.wait(1.0):
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

    # -- connection bookkeeping (for graceful shutdown) -------------------------------------------

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

    # -- auth ------------------------------------------------------------------------------------

    def authenticate(self, headers: Any, params: dict[str, str]) -> User:
        name, password = "default", ""
        auth = headers.get("Authorization") or ""
        if auth.lower().startswith("basic "):
            try:
                decoded = base64.b64decode(auth[6:].strip()).decode()
            except (ValueError, UnicodeDecodeError):
                decoded = ""
            name, _, password = decoded.partition(":")
        elif headers.get("X-ClickHouse-User"):
            name, password = headers["X-ClickHouse-User"], headers.get("X-ClickHouse-Key") or ""
        elif "user" in params:
            name, password = params["user"], params.get("password", "")
        user = self.users.get(name)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            raise QueryFailed.make(
                516,
                "AUTHENTICATION_FAILED",
                f"{name}: Authentication failed: password is incorrect, or there is no user with such name",
            )
        return user


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    app: EmbeddedClickHouse


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    server_version = "gpuledger-embedded-clickhouse"

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connection.settimeout(self.server.app.config.keepalive_timeout_s)

    def handle_one_request(self) -> None:
        app = self.server.app
        if app.stopping.is_set():
            self.close_connection = True
            return
        app.connection_idle(self.connection, True)
        try:
            super().handle_one_request()
        except (TimeoutError, ConnectionError):
            self.close_connection = True
        finally:
            app.connection_idle(self.connection, False)

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
        self._send(200, {"Content-Type": "text/plain; charset=UTF-8"}, b"", head_only=True)

    # -- the request -------------------------------------------------------------------------------

    def _serve(self, method: str) -> None:
        app = self.server.app
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
            self._send(200, {"Content-Type": "text/plain; charset=UTF-8"}, b"Ok.\n")
            return
        if url.path not in ("/", "/query"):
            self._discard_body()
            self._send(404, {"Content-Type": "text/plain; charset=UTF-8"}, b"There is no handler for this path.\n")
            return
        params = dict(parse_qsl(url.query, keep_blank_values=True))
        query_id = params.get("query_id") or str(uuid.uuid4())
        started = time.perf_counter()
        body: Body | None = None
        keyword = ""
        status = 200
        try:
            body = Body(self.rfile, self.headers, app.config.max_body_bytes)
            user = app.authenticate(self.headers, params)
            if method == "GET" and "query" not in params:
                self._send(200, {"Content-Type": "text/plain; charset=UTF-8"}, b"Ok.\n")
                return
            keyword = self._run(method, user, params, query_id, body)
        except QueryFailed as exc:
            status = http_status(exc.code)
            self._fail(exc, query_id, body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # a server bug must still answer as ClickHouse does, not hang up
            log.exception("unexpected error serving query %s", query_id)
            status = 500
            self._fail(QueryFailed.make(1001, "STD_EXCEPTION", f"{type(exc).__name__}: {exc}"), query_id, body)
        finally:
            log.debug(
                "query %s %s status=%d in %.1f ms", query_id, keyword or "-", status,
                (time.perf_counter() - started) * 1e3,
            )

    def _discard_body(self) -> None:
        try:
            body = Body(self.rfile, self.headers, self.server.app.config.max_body_bytes)
        except QueryFailed:
            self.close_connection = True
            return
        if not body.drain():
            self.close_connection = True

    def _run(self, method: str, user: User, params: dict[str, str], query_id: str, body: Body) -> str:
        app = self.server.app
        engine = app.engine
        assert engine is not None
        ctype = self.headers.get("Content-Type") or ""
        binds = {k[6:]: v for k, v in params.items() if k.startswith("param_")}
        parsed = Parsed()
        if ctype.lower().startswith("multipart/form-data"):
            fields = parse_multipart(ctype, body.read_all())
            binds.update({k[6:]: v for k, v in fields.items() if k.startswith("param_")})
            parsed.sql = fields.get("query", params.get("query", ""))
        else:
            parsed = self._parse_text(params.get("query"), body)
        if not parsed.sql.strip() and parsed.insert is None:
            raise QueryFailed.make(62, "SYNTAX_ERROR", "Empty query")
        if user.readonly and (outside := sqltext.reaches_outside(parsed.sql)):
            raise QueryFailed.make(
                497, "ACCESS_DENIED", f"{user.name}: Not enough privileges to use table function {outside}"
            )

        settings = {
            k: v for k, v in params.items() if k not in TRANSPORT_PARAMS and not k.startswith("param_")
        }
        url_readonly = _int(settings.pop("readonly", "0"), "readonly")
        if method == "GET":
            url_readonly = max(url_readonly, 2)
        session_id = params.get("session_id") or None
        timeout = params.get("session_timeout")
        if user.readonly == 0 and url_readonly:
            lease = engine.throwaway(url_readonly)
        else:
            lease = engine.lease(
                user.name,
                user.readonly,
                session_id,
                _float(timeout, "session_timeout") if timeout else None,
                params.get("session_check") == "1",
            )
        try:
            database = params.get("database") or (None if lease.session else "default")
            lease.handle.prepare(database, settings)
            tz = settings.get("session_timezone") or engine.timezone
            if parsed.insert is not None:
                self._insert(lease, parsed, binds, query_id, tz)
                return "INSERT"
            keyword = sqltext.leading_keyword(parsed.sql)
            self._query(lease, parsed.sql, keyword, binds, params, query_id, tz)
            lease.handle.after_statement(keyword, parsed.sql)
            return keyword
        finally:
            lease.release()

    def _parse_text(self, query_param: str | None, body: Body) -> Parsed:
        """Find the statement, and for `INSERT ... FORMAT X` where its data starts."""
        chunks = body.chunks()
        if query_param is not None:
            insert = sqltext.split_insert(query_param) if sqltext.leading_keyword(query_param) == "INSERT" else None
            if insert is not None:
                inline = query_param[insert.data_offset :].encode()
                return Parsed(sql=query_param, insert=insert, data_head=inline, data_rest=chunks)
            rest = b"".join(chunks)
            return Parsed(sql=query_param + ("\n" + _text(rest) if rest else ""))
        head = bytearray()
        exhausted = False

        def pull() -> None:
            nonlocal exhausted
            chunk = next(chunks, None)
            if chunk is None:
                exhausted = True
            else:
                head.extend(chunk)

        while not exhausted and len(head) < 4096:
            pull()
        if sqltext.leading_keyword(head[:4096].decode("latin-1")) == "INSERT":
            while True:
                text = head[:65536].decode("latin-1")
                insert = sqltext.split_insert(text)
                # A match at the very end may be a format name cut by a chunk boundary: read on.
                if insert is not None and (insert.data_offset < len(text) or exhausted):
                    return Parsed(
                        sql=text[: insert.data_offset],
                        insert=insert,
                        data_head=bytes(head[insert.data_offset :]),
                        data_rest=chunks,
                    )
                if exhausted or len(head) >= 1 << 20:
                    break
                pull()
        rest = b"" if exhausted else b"".join(chunks)
        return Parsed(sql=_text(bytes(head) + rest))

    # -- inserts -------------------------------------------------------------------------------

    def _insert(self, lease: Lease, parsed: Parsed, binds: dict[str, str], query_id: str, tz: str) -> None:
        """Run `INSERT ... FROM INFILE` on the body, so the engine reports constraint and view failures.

        Binary row/block formats stream through a named pipe, so receiving overlaps ingesting: if the
        body fails (too large, cut off, undecodable) the pipe gets bytes that cannot parse as a block,
        so the statement fails rather than committing a truncated insert; if the engine fails first,
        the rest of the body is dropped and the engine's error is the answer. Text formats (where any
        bytes may parse as a row) and seekable formats (Parquet, ORC) are spooled to a file first.
        """
        app = self.server.app
        assert parsed.insert is not None and app.spool_dir is not None
        started, cpu = time.perf_counter(), time.thread_time()
        if parsed.insert.fmt in PIPED_FORMATS:
            outcome = self._insert_piped(lease, parsed, binds, query_id)
        else:
            outcome = self._insert_spooled(lease, parsed, binds)
        log.debug(
            "insert %s (%s) took %.1f ms, %.1f ms CPU in the request thread", query_id, parsed.insert.fmt,
            (time.perf_counter() - started) * 1e3, (time.thread_time() - cpu) * 1e3,
        )
        headers = self._common_headers(query_id, tz)
        headers["X-ClickHouse-Summary"] = json.dumps(outcome.summary())
        headers["Content-Type"] = "text/plain; charset=UTF-8"
        self._send(200, headers, b"")

    def _insert_spooled(self, lease: Lease, parsed: Parsed, binds: dict[str, str]) -> Outcome:
        app = self.server.app
        assert parsed.insert is not None and app.spool_dir is not None
        fd, spool = tempfile.mkstemp(prefix="insert-", suffix=".data", dir=app.spool_dir)
        try:
            with os.fdopen(fd, "wb", buffering=0) as out:
                write_all(out.fileno(), parsed.data_head)
                for chunk in parsed.data_rest or ():
                    write_all(out.fileno(), chunk)
            return lease.handle.execute(parsed.insert.from_infile(spool), "TabSeparated", binds)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spool)

    def _insert_piped(self, lease: Lease, parsed: Parsed, binds: dict[str, str], query_id: str) -> Outcome:
        app = self.server.app
        assert parsed.insert is not None and app.spool_dir is not None
        fifo = app.spool_dir / f"insert-{uuid.uuid4().hex}.pipe"
        os.mkfifo(fifo, 0o600)
        result: dict[str, Any] = {}
        statement = parsed.insert.from_infile(str(fifo))

        def ingest() -> None:
            try:
                result["outcome"] = lease.handle.execute(statement, "TabSeparated", binds)
            except BaseException as exc:  # handed to the request thread
                result["error"] = exc

        engine_thread = threading.Thread(target=ingest, name=f"insert-{query_id}", daemon=True)
        engine_thread.start()
        body_error: BaseException | None = None
        try:
            fd = open_pipe_writer(fifo, engine_thread)
            if fd is not None:
                try:
                    write_all(fd, parsed.data_head)
                    for chunk in parsed.data_rest or ():
                        write_all(fd, chunk)
                except BrokenPipeError:
                    pass  # the engine stopped reading: its error is the answer
                except BaseException as exc:
                    body_error = exc
                    with contextlib.suppress(OSError):
                        write_all(fd, POISON)
                finally:
                    os.close(fd)
            engine_thread.join()
        finally:
            with contextlib.suppress(OSError):
                os.unlink(fifo)
        if body_error is not None:
            raise body_error
        if "error" in result:
            raise result["error"]
        outcome: Outcome = result["outcome"]
        return outcome

    # -- queries -------------------------------------------------------------------------------

    def _query(
        self,
        lease: Lease,
        sql: str,
        keyword: str,
        binds: dict[str, str],
        params: dict[str, str],
        query_id: str,
        tz: str,
    ) -> None:
        handle = lease.handle
        fmt = sqltext.trailing_format(sql) or params.get("default_format") or "TabSeparated"
        produces_result = keyword in sqltext.RESULT_KEYWORDS or sqltext.trailing_format(sql) is not None
        streamable = (
            params.get("wait_end_of_query") != "1"
            and keyword in sqltext.STREAMABLE_KEYWORDS
            and fmt in sqltext.STREAM_SAFE_FORMATS
        )
        if streamable:
            self._stream(handle, sql, keyword, fmt, binds, query_id, tz)
            return
        outcome = handle.execute(sql, fmt, binds)
        data = outcome.data
        if fmt == "Native":
            data = handle.repair_native(sql, binds, data, keyword)
        headers = self._common_headers(query_id, tz)
        headers["X-ClickHouse-Summary"] = json.dumps(self._summary(outcome, data))
        headers["Content-Type"] = content_type(fmt) if produces_result else "text/plain; charset=UTF-8"
        if produces_result or data:
            headers["X-ClickHouse-Format"] = fmt
        self._send(200, headers, data)

    @staticmethod
    def _summary(outcome: Outcome, data: bytes) -> dict[str, str]:
        summary = outcome.summary()
        summary["result_bytes"] = str(len(data))
        return summary

    def _stream(
        self, handle: Handle, sql: str, keyword: str, fmt: str, binds: dict[str, str], query_id: str, tz: str
    ) -> None:
        stream = handle.stream(sql, fmt, binds)
        try:
            chunks = iter(stream)
            first = next(chunks, None)  # an error before any data is an ordinary error response
            types: list[str] | None = None
            if fmt == "Native":
                if first is None:
                    first = handle.repair_native(sql, binds, b"", keyword) or None
                elif native.needs_zone_repair(first):
                    engine = self.server.app.engine
                    columns = engine.describe_aside(handle, sql, binds) if engine else None
                    if columns and any(t.startswith("DateTime(") for _, t in columns):
                        types = [t for _, t in columns]
            tag = secrets.token_hex(8)
            headers = self._common_headers(query_id, tz)
            headers["Content-Type"] = content_type(fmt)
            headers["X-ClickHouse-Format"] = fmt
            headers["X-ClickHouse-Exception-Tag"] = tag
            headers["Transfer-Encoding"] = "chunked"
            self._send_head(200, headers)
            try:
                if first is not None:
                    self._write_chunk(self._retype(first, types))
                for chunk in chunks:
                    self._write_chunk(self._retype(chunk, types))
            except QueryFailed as exc:
                message = f"{exc} (version {self.server.app.engine.version if self.server.app.engine else ''})"
                raw = message.encode()
                frame = (
                    b"__exception__\r\n" + tag.encode() + b"\r\n" + raw + b"\n"
                    + str(len(raw)).encode() + b" " + tag.encode() + b"\r\n__exception__\r\n"
                )
                self._write_chunk(frame)
            self.wfile.write(b"0\r\n\r\n")
        finally:
            stream.cancel()

    @staticmethod
    def _retype(chunk: bytes, types: list[str] | None) -> bytes:
        if types is None:
            return chunk
        try:
            return native.retype_blocks(chunk, types)
        except native.NativeLayoutUnknown:
            return chunk

    # -- responses -----------------------------------------------------------------------------

    def _common_headers(self, query_id: str, tz: str) -> dict[str, str]:
        return {
            "X-ClickHouse-Server-Display-Name": DISPLAY_NAME,
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Timezone": tz,
        }

    def _send_head(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self.close_connection or self.server.app.stopping.is_set():
            self.close_connection = True
            lines.append("Connection: close")
        else:
            lines.append(f"Keep-Alive: timeout={int(self.server.app.config.keepalive_timeout_s)}")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    def _send(self, status: int, headers: dict[str, str], data: bytes, head_only: bool = False) -> None:
        headers["Content-Length"] = str(len(data))
        lines = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if self.close_connection or self.server.app.stopping.is_set():
            self.close_connection = True
            lines.append("Connection: close")
        else:
            lines.append(f"Keep-Alive: timeout={int(self.server.app.config.keepalive_timeout_s)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if head_only or not data:
            self.wfile.write(head)
        elif len(data) < 65536:
            self.wfile.write(head + data)
        else:
            self.wfile.write(head)
            self.wfile.write(data)

    def _write_chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")

    def _fail(self, exc: QueryFailed, query_id: str, body: Body | None) -> None:
        if body is None or not body.drain():
            self.close_connection = True
        version = self.server.app.engine.version if self.server.app.engine else ""
        message = f"{exc} (version {version})\n".encode()
        headers = {
            "X-ClickHouse-Server-Display-Name": DISPLAY_NAME,
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Exception-Code": str(exc.code),
            "Content-Type": "text/plain; charset=UTF-8",
        }
        with contextlib.suppress(OSError):
            self._send(http_status(exc.code), headers, message)


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


def _text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise QueryFailed.make(36, "BAD_ARGUMENTS", f"The query is not valid UTF-8: {exc}") from None


def _float(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise QueryFailed.make(36, "BAD_ARGUMENTS", f"{name} must be a number, not {value!r}") from None


def _int(value: str, name: str) -> int:
    try:
        return int(value or 0)
    except ValueError:
        raise QueryFailed.make(36, "BAD_ARGUMENTS", f"Setting {name} must be an integer, not {value!r}") from None
