"""Running an authenticated request's statement on its lease and answering it: inserts with data
(`InsertRunner`) and every other statement, buffered or streamed (`QueryRunner`)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stack.clickhouse import native, sqltext
from stack.clickhouse.authorisation import User, authorise
from stack.clickhouse.body import POISON, open_pipe_writer, write_all
from stack.clickhouse.engine import Engine, Handle, Lease, Outcome, QueryFailed
from stack.clickhouse.request import Parsed
from stack.clickhouse.response import (
    PLAIN_TEXT,
    ResponseWriter,
    common_headers,
    content_type,
    exception_frame,
)

log = logging.getLogger(__name__)

# Formats streamed into the engine through a pipe (see `InsertRunner.run`).
PIPED_FORMATS = frozenset({"Native", "RowBinary", "RowBinaryWithNames", "RowBinaryWithNamesAndTypes"})


class InsertRunner:
    """`INSERT ... FORMAT X` with the rows in the body. `body_received` is called once the whole body
    has been read (the server's read deadline ends there)."""

    def __init__(
        self, engine: Engine, spool_dir: Path, response: ResponseWriter, body_received: Callable[[], None]
    ) -> None:
        self._engine = engine
        self._spool_dir = spool_dir
        self._response = response
        self._body_received = body_received

    def run(self, lease: Lease, user: User, parsed: Parsed, binds: dict[str, str], query_id: str, tz: str) -> None:
        """Run `INSERT ... FROM INFILE` on the body, so the engine reports constraint and view failures.

        Binary row/block formats stream through a named pipe, so receiving overlaps ingesting: if the
        body fails (too large, cut off, undecodable) the pipe gets bytes that cannot parse as a block,
        so the statement fails rather than committing a truncated insert; if the engine fails first,
        the rest of the body is dropped and the engine's error is the answer. Text formats (where any
        bytes may parse as a row) and seekable formats (Parquet, ORC) are spooled to a file first.
        """
        assert parsed.insert is not None
        started, cpu = time.perf_counter(), time.thread_time()
        piped = parsed.insert.fmt in PIPED_FORMATS
        target = self._spool_dir / f"insert-{uuid.uuid4().hex}.{'pipe' if piped else 'data'}"
        statement = parsed.insert.from_infile(str(target))
        # The statement that runs is the one judged: the client's target text is inside it.
        authorise(self._engine, lease, user, statement, binds, infile=str(target))
        if piped:
            outcome = self._piped(lease, parsed, binds, query_id, target, statement)
        else:
            outcome = self._spooled(lease, parsed, binds, target, statement)
        log.debug(
            "insert %s (%s) took %.1f ms, %.1f ms CPU in the request thread", query_id, parsed.insert.fmt,
            (time.perf_counter() - started) * 1e3, (time.thread_time() - cpu) * 1e3,
        )
        headers = common_headers(query_id, tz)
        headers["X-ClickHouse-Summary"] = json.dumps(outcome.summary())
        headers["Content-Type"] = PLAIN_TEXT
        self._response.send(200, headers, b"")

    def _spooled(self, lease: Lease, parsed: Parsed, binds: dict[str, str], spool: Path, statement: str) -> Outcome:
        fd = os.open(spool, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb", buffering=0) as out:
                write_all(out.fileno(), parsed.data_head)
                for chunk in parsed.data_rest or ():
                    write_all(out.fileno(), chunk)
            self._body_received()
            return lease.handle.execute(statement, "TabSeparated", binds)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(spool)

    def _piped(
        self, lease: Lease, parsed: Parsed, binds: dict[str, str], query_id: str, fifo: Path, statement: str
    ) -> Outcome:
        os.mkfifo(fifo, 0o600)
        result: dict[str, Any] = {}

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
            self._body_received()
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


class QueryRunner:
    """Every statement other than an insert with data: streamed in chunks where the statement and the
    format allow it, otherwise run to the end and sent with its summary."""

    def __init__(self, engine: Engine, response: ResponseWriter) -> None:
        self._engine = engine
        self._response = response

    def run(
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
        headers = common_headers(query_id, tz)
        headers["X-ClickHouse-Summary"] = json.dumps(_summary(outcome, data))
        headers["Content-Type"] = content_type(fmt) if produces_result else PLAIN_TEXT
        if produces_result or data:
            headers["X-ClickHouse-Format"] = fmt
        self._response.send(200, headers, data)

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
                    columns = self._engine.describe_aside(handle, sql, binds)
                    if columns and any(t.startswith("DateTime(") for _, t in columns):
                        types = [t for _, t in columns]
            tag = secrets.token_hex(8)
            headers = common_headers(query_id, tz)
            headers["Content-Type"] = content_type(fmt)
            headers["X-ClickHouse-Format"] = fmt
            headers["X-ClickHouse-Exception-Tag"] = tag
            headers["Transfer-Encoding"] = "chunked"
            self._response.send_head(200, headers)
            try:
                if first is not None:
                    self._response.write_chunk(_retype(first, types))
                for chunk in chunks:
                    self._response.write_chunk(_retype(chunk, types))
            except QueryFailed as exc:
                self._response.write_chunk(exception_frame(tag, f"{exc} (version {self._engine.version})"))
            self._response.end_chunks()
        finally:
            stream.cancel()


def _summary(outcome: Outcome, data: bytes) -> dict[str, str]:
    summary = outcome.summary()
    summary["result_bytes"] = str(len(data))
    return summary


def _retype(chunk: bytes, types: list[str] | None) -> bytes:
    if types is None:
        return chunk
    try:
        return native.retype_blocks(chunk, types)
    except native.NativeLayoutUnknown:
        return chunk
