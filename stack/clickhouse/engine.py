"""chDB, owned by this process: connection handles, sessions, and result repairs.

One engine per data path and per process (chDB's rule). Every HTTP session gets its own connection
handle, so `SET`, `USE` and temporary tables stay per session; requests without a session borrow a
pooled handle. A handle is only ever used by one request at a time, and every object that can still
touch a handle (a stream) holds a strong reference to it: chDB closes a handle whose Python wrapper
is collected, and a streaming fetch on a closed handle blocks forever.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chdb import _chdb

from base.errors import ServiceError
from stack.clickhouse import access, native, sqltext
from stack.clickhouse.lockfile import chdb_status_pid

log = logging.getLogger(__name__)

_CODE = re.compile(r"Code:\s*(\d+)\.")
_NAME = re.compile(r"\(([A-Z][A-Z0-9_]+)\)\s*(?:\(version [^)]*\))?\s*\.?\s*$")
# The longest statement the parser takes (the server's limit for a request without insert data).
PARSE_MAX_QUERY_BYTES = 16 << 20
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TRAILING_FORMAT = re.compile(
    r"\s*\bFORMAT\s+[A-Za-z0-9_]+(?:\s+SETTINGS\s+[^;]*?)?\s*;?\s*$", re.IGNORECASE | re.DOTALL
)


class QueryFailed(ServiceError):
    """The engine (or the server on its behalf) refused a statement; carries ClickHouse's code and name."""

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.name = name

    @classmethod
    def from_engine(cls, exc: BaseException) -> QueryFailed:
        text = str(exc)
        start = text.find("Code: ")
        if start > 0:
            text = text[start:]
        text = text.strip()
        code_match = _CODE.search(text)
        name_match = _NAME.search(text)
        if code_match is None:
            return cls(1001, "STD_EXCEPTION", f"Code: 1001. DB::Exception: {text}. (STD_EXCEPTION)")
        return cls(int(code_match.group(1)), name_match.group(1) if name_match else "", text)

    @classmethod
    def make(cls, code: int, name: str, message: str) -> QueryFailed:
        return cls(code, name, f"Code: {code}. DB::Exception: {message}. ({name})")


@dataclass
class Outcome:
    """A buffered statement's output and the statistics for `X-ClickHouse-Summary`."""

    data: bytes
    read_rows: int = 0
    read_bytes: int = 0
    written_rows: int = 0
    written_bytes: int = 0
    elapsed_s: float = 0.0

    def summary(self) -> dict[str, str]:
        return {
            "read_rows": str(self.read_rows),
            "read_bytes": str(self.read_bytes),
            "written_rows": str(self.written_rows),
            "written_bytes": str(self.written_bytes),
            "total_rows_to_read": str(self.read_rows),
            "result_rows": "0",
            "result_bytes": str(len(self.data)),
            "elapsed_ns": str(int(self.elapsed_s * 1e9)),
        }


def _quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _setting_name(name: str) -> str:
    if not _SETTING_NAME.fullmatch(name):
        raise QueryFailed.make(115, "UNKNOWN_SETTING", f"Setting name {name!r} is not an identifier")
    return name


def _without_format(sql: str) -> str:
    return _TRAILING_FORMAT.sub("", sql.rstrip().rstrip(";"))


class Handle:
    """One chDB connection: its current database and the per-request settings applied to it."""

    def __init__(self, conn: Any, readonly: int = 0, limits: Mapping[str, str] | None = None) -> None:
        self.conn = conn
        self.database = "default"
        self.readonly = readonly
        self.overrides: dict[str, str] = {}
        self.baseline: dict[str, tuple[str, bool]] = {}
        self.dirty = False  # state changed by the statement itself (SET, USE, a temporary table)
        self.broken = False  # state unknown (a failed restore or cancel): never reuse
        self.closed = False
        if limits:  # before readonly: afterwards the engine refuses to change any setting
            self.run("SET " + ", ".join(f"{_setting_name(k)} = {_quote(v)}" for k, v in limits.items()))
        if readonly:
            self.run(f"SET readonly = {int(readonly)}")

    def run(self, sql: str, fmt: str = "TabSeparated", params: Mapping[str, str] | None = None) -> Any:
        try:
            return self.conn.query(sql, fmt, params=dict(params or {}))
        except RuntimeError as exc:
            raise QueryFailed.from_engine(exc) from None

    def prepare(self, database: str | None, settings: Mapping[str, str]) -> None:
        """Make the handle's database and per-request settings those of this request."""
        if database and database != self.database:
            self.run(f"USE `{database.replace('`', '``')}`")
            self.database = database
        stale = [name for name in self.overrides if name not in settings]
        changed = {k: v for k, v in settings.items() if self.overrides.get(k) != v}
        if stale:
            self._restore(stale)
        if changed:
            self._apply(changed)

    def _apply(self, settings: Mapping[str, str]) -> None:
        fresh = [_setting_name(name) for name in settings if name not in self.overrides]
        if fresh:
            names = ", ".join(_quote(name) for name in fresh)
            result = self.run(
                f"SELECT name, value, changed FROM system.settings WHERE name IN ({names})", "JSONEachRow"
            )
            for line in result.bytes().splitlines():
                row = json.loads(line)
                self.baseline[row["name"]] = (row["value"], bool(row["changed"]))
            for name in fresh:
                self.baseline.setdefault(name, ("", False))
        assignments = ", ".join(f"{_setting_name(k)} = {_quote(v)}" for k, v in settings.items())
        try:
            self.run(f"SET {assignments}")
        except QueryFailed:
            self._restore(list(settings))
            raise
        self.overrides.update(settings)

    def _restore(self, names: list[str]) -> None:
        for name in names:
            value, was_changed = self.baseline.pop(name, ("", False))
            self.overrides.pop(name, None)
            if was_changed:
                literal = value if len(value) >= 2 and value[0] == value[-1] == "'" else _quote(value)
                statement = f"SET {name} = {literal}"
            else:
                statement = f"SET {name} = DEFAULT"
            try:
                self.run(statement)
            except QueryFailed:
                log.debug("could not restore setting %s; retiring the handle", name)
                self.broken = True

    def after_statement(self, keyword: str, sql: str) -> None:
        """Record what a statement did to the handle's own state."""
        if keyword == "USE":
            self.database = self.run("SELECT currentDatabase()").bytes().decode().strip()
            self.dirty = True
        elif keyword == "SET":
            # The statement may have set a name that a request also overrides: re-read the baseline.
            for name in list(self.overrides):
                self.baseline.pop(name, None)
                self.overrides.pop(name, None)
            self.dirty = True
        elif sqltext.statement_has_temporary_table(sql):
            self.dirty = True

    def describe(self, sql: str, params: Mapping[str, str]) -> list[tuple[str, str]] | None:
        """Names and full types of a query's result, without running it."""
        try:
            result = self.run(f"DESCRIBE TABLE ({_without_format(sql)})", "JSONCompactEachRow", params)
        except QueryFailed:
            return None
        return [(row[0], row[1]) for row in map(json.loads, result.bytes().splitlines())]

    def result_columns(self, sql: str, params: Mapping[str, str]) -> list[tuple[str, str]] | None:
        columns = self.describe(sql, params)
        if columns is not None:
            return columns
        try:  # SHOW, EXISTS, ...: run it again in a format that always carries its columns
            meta = json.loads(self.run(_without_format(sql), "JSON", params).bytes())["meta"]
        except (QueryFailed, ValueError, KeyError):
            return None
        return [(col["name"], col["type"]) for col in meta]

    def repair_native(self, sql: str, params: Mapping[str, str], data: bytes, keyword: str) -> bytes:
        """Native output as a server writes it: a header block when empty, zones on DateTime columns."""
        if not data:
            if keyword not in sqltext.RESULT_KEYWORDS:
                return data
            columns = self.result_columns(sql, params)
            return native.header_block(columns) if columns else data
        if native.needs_zone_repair(data):
            columns = self.describe(sql, params)
            if columns and any(t.startswith("DateTime(") for _, t in columns):
                try:
                    return native.retype_blocks(data, [t for _, t in columns])
                except native.NativeLayoutUnknown as exc:
                    log.debug("left DateTime zones unrepaired: %s", exc)
        return data

    def execute(self, sql: str, fmt: str, params: Mapping[str, str]) -> Outcome:
        started = time.perf_counter()
        result = self.run(sql, fmt, params)
        data = result.bytes() or b""
        return Outcome(
            data=data,
            read_rows=result.rows_read(),
            read_bytes=result.bytes_read(),
            written_rows=result.rows_written(),
            written_bytes=result.bytes_written(),
            elapsed_s=time.perf_counter() - started,
        )

    def stream(self, sql: str, fmt: str, params: Mapping[str, str]) -> Stream:
        try:
            c_result = self.conn.send_query(sql, fmt, params=dict(params))
        except RuntimeError as exc:
            raise QueryFailed.from_engine(exc) from None
        return Stream(self, c_result)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.conn.close()
            except Exception:  # the handle is going away either way
                log.debug("error closing a chDB handle", exc_info=True)


class Stream:
    """A streaming SELECT. Holds its handle, so the handle cannot be collected under it."""

    def __init__(self, handle: Handle, c_result: Any) -> None:
        self.handle = handle
        self._result = c_result
        self.done = False
        self.rows = 0

    def __iter__(self) -> Iterator[bytes]:
        conn = self.handle.conn
        while not self.done:
            try:
                chunk = conn.streaming_fetch_result(self._result)
            except RuntimeError as exc:
                self.done = True
                raise QueryFailed.from_engine(exc) from None
            if chunk is None or chunk.rows_read() == 0:
                self.done = True
                return
            self.rows += chunk.rows_read()
            data = chunk.bytes()
            if data:
                yield data

    def cancel(self) -> None:
        """Stop a stream the client no longer reads; the handle is reusable afterwards."""
        if not self.done:
            self.done = True
            try:
                self.handle.conn.streaming_cancel_query(self._result)
            except RuntimeError:
                log.debug("cancelling a stream failed; retiring its handle", exc_info=True)
                self.handle.broken = True


@dataclass
class Session:
    user: str
    session_id: str
    handle: Handle
    timeout_s: float
    last_used: float
    busy: bool = False


@dataclass
class Lease:
    """A handle lent to one request; `release` gives it back (or retires it)."""

    handle: Handle
    session: Session | None
    _release: Callable[[Lease], None] = field(repr=False)

    def release(self) -> None:
        self._release(self)


class Engine:
    """The chDB engine on one data path, its sessions and its pool of session-less handles."""

    def __init__(
        self,
        path: Path,
        *,
        max_sessions: int = 256,
        session_timeout_s: float = 60.0,
        max_session_timeout_s: float = 3600.0,
        pool_size: int = 8,
        clock: Callable[[], float] = time.monotonic,
        readonly_limits: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.max_sessions = max_sessions
        self.session_timeout_s = session_timeout_s
        self.max_session_timeout_s = max_session_timeout_s
        self.pool_size = pool_size
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], Session] = {}
        self._pools: dict[int, list[Handle]] = {}
        self._leased: set[int] = set()  # id() of handles lent out right now
        # Settings every read-only handle gets before `readonly = 1` fixes them (the analyst's limits).
        self.readonly_limits = dict(readonly_limits or {})
        self._parsers: list[Handle] = []  # handles that only parse, with default settings
        # An empty folder of its own as `user_files_path`: a relative path in a file function that got
        # past `access` resolves to nothing. (chDB, being clickhouse-local, does not confine absolute
        # paths to it: those are refused by `access` alone.)
        user_files = path.parent / f"{path.name}-user-files"
        user_files.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._connection_string = f"{path}?user_files_path={user_files}"
        # The root handle keeps the engine up for the life of the server.
        self._root = Handle(self._connect())
        info = self._root.run("SELECT version(), timezone()").bytes().decode().strip().split("\t")
        self.version, self.timezone = info[0], info[1]
        listed = self._root.run("SELECT lower(name) FROM system.table_functions").bytes().decode().split()
        self.table_functions = frozenset(listed)

    def _connect(self) -> Any:
        try:
            return _chdb.connect(self._connection_string)  # type: ignore[attr-defined]
        except RuntimeError as exc:
            owner = chdb_status_pid(self.path)
            if owner is not None and owner != os.getpid():
                raise ServiceError(
                    f"ClickHouse data path {self.path} is in use by process {owner} (it holds chDB's lock on "
                    f"{self.path / 'status'}); stop that process or choose another --path"
                ) from None
            raise ServiceError(f"chDB could not open {self.path}: {exc}") from None

    def open_handle(self, readonly: int = 0) -> Handle:
        return Handle(self._connect(), readonly, self.readonly_limits if readonly else None)

    def inspect(self, sql: str, params: Mapping[str, str]) -> tuple[str, access.Node]:
        """The engine's own parse of `sql`: its canonical text and its tree.

        `formatQuery` first, because it refuses more than one statement; `EXPLAIN AST` on a text of
        several statements would run the later ones. Both run on a handle of their own with default
        settings, so a `dialect` or other setting of the caller's session cannot change the parse.
        """
        with self._lock:
            handle = self._parsers.pop() if self._parsers else None
        if handle is None:
            handle = Handle(self._connect())
            handle.run(f"SET max_query_size = {PARSE_MAX_QUERY_BYTES}")
        try:
            formatted = handle.run(f"SELECT formatQuerySingleLine({_quote(sql)})", "TSVRaw").bytes().decode()
            text = handle.run("EXPLAIN AST " + sql, "TSVRaw", params).bytes().decode(errors="replace")
            tree = access.parse_tree(text)
        except access.UnreadableTree as exc:
            raise QueryFailed.make(62, "SYNTAX_ERROR", f"The statement's parse tree is not understood: {exc}") from None
        finally:
            with self._lock:
                if len(self._parsers) < self.pool_size:
                    self._parsers.append(handle)
                    handle = None
            if handle is not None:
                handle.close()
        return formatted, tree

    # -- leases ---------------------------------------------------------------------------------

    def lease(
        self,
        user: str,
        readonly: int,
        session_id: str | None,
        session_timeout_s: float | None = None,
        session_check: bool = False,
    ) -> Lease:
        if not session_id:
            return self._pooled(user, readonly)
        key = (user, session_id)
        timeout = self.session_timeout_s if session_timeout_s is None else session_timeout_s
        if timeout < 0 or timeout > self.max_session_timeout_s:
            raise QueryFailed.make(
                36, "BAD_ARGUMENTS", f"Session timeout {timeout} is outside [0, {self.max_session_timeout_s}]"
            )
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.busy:
                raise QueryFailed.make(
                    373, "SESSION_IS_LOCKED", f"Session {session_id} is locked by a concurrent client"
                )
            if session is None:
                if session_check:
                    raise QueryFailed.make(372, "SESSION_NOT_FOUND", f"Session {session_id} not found")
                self._make_room()
                # Opened under the lock (a fraction of a millisecond) so two requests can never
                # create the same session twice.
                session = Session(user, session_id, self.open_handle(readonly), timeout, self._clock())
                self._sessions[key] = session
            session.busy = True
            session.timeout_s = timeout
        return self._lend(session.handle, session)

    def _make_room(self) -> None:
        if len(self._sessions) < self.max_sessions:
            return
        idle = [s for s in self._sessions.values() if not s.busy]
        if not idle:
            raise QueryFailed.make(
                202, "TOO_MANY_SIMULTANEOUS_QUERIES", f"All {self.max_sessions} sessions are busy"
            )
        oldest = min(idle, key=lambda s: s.last_used)
        del self._sessions[(oldest.user, oldest.session_id)]
        oldest.handle.close()

    def _pooled(self, user: str, readonly: int) -> Lease:
        with self._lock:
            pool = self._pools.setdefault(readonly, [])
            handle = pool.pop() if pool else None
        if handle is None:
            handle = self.open_handle(readonly)
        return self._lend(handle, None)

    def _lend(self, handle: Handle, session: Session | None) -> Lease:
        with self._lock:
            self._leased.add(id(handle))
        return Lease(handle, session, self._release)

    def _release(self, lease: Lease) -> None:
        handle = lease.handle
        session = lease.session
        with self._lock:
            self._leased.discard(id(handle))
        if session is not None:
            with self._lock:
                session.busy = False
                session.last_used = self._clock()
                handle.dirty = False
                if handle.broken or handle.closed:
                    self._sessions.pop((session.user, session.session_id), None)
            if handle.broken:
                handle.close()
            return
        if handle.dirty or handle.broken or handle.closed:
            handle.close()
            return
        with self._lock:
            pool = self._pools.setdefault(handle.readonly, [])
            if len(pool) < self.pool_size:
                pool.append(handle)
                return
        handle.close()

    def throwaway(self, readonly: int) -> Lease:
        """A fresh handle for one request (a per-request `readonly` must not stick to a shared one)."""
        handle = self.open_handle(readonly)
        handle.dirty = True
        return self._lend(handle, None)

    def describe_aside(self, handle: Handle, sql: str, params: Mapping[str, str]) -> list[tuple[str, str]] | None:
        """`describe` on another handle, for when `handle` is busy streaming (same database)."""
        lease = self._pooled("", handle.readonly)
        try:
            lease.handle.prepare(handle.database, {})
            return lease.handle.describe(sql, params)
        except QueryFailed:
            return None
        finally:
            lease.release()

    def reap(self) -> int:
        """Close sessions idle past their timeout; returns how many."""
        now = self._clock()
        with self._lock:
            expired = [
                key for key, s in self._sessions.items() if not s.busy and now - s.last_used > s.timeout_s
            ]
            handles = [self._sessions.pop(key).handle for key in expired]
        for handle in handles:
            handle.close()
        return len(handles)

    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close(self) -> None:
        """Close every idle handle. A handle still lent out (a request that outlived the shutdown
        grace) is left to the process's exit: closing it under a running query could block."""
        with self._lock:
            handles = [s.handle for s in self._sessions.values()]
            handles += [h for pool in self._pools.values() for h in pool] + self._parsers
            handles = [h for h in handles if id(h) not in self._leased]
            busy = bool(self._leased)
            self._sessions.clear()
            self._pools.clear()
            self._parsers = []
        for handle in handles:
            handle.close()
        if not busy:
            self._root.close()
