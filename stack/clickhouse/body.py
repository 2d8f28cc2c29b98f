"""Request bodies: Content-Length or chunked, content-encoded, multipart; and the insert pipe."""

from __future__ import annotations

import contextlib
import email.parser
import email.policy
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stack.clickhouse.codec import decoder_for
from stack.clickhouse.engine import QueryFailed

# Ends a Native/RowBinary stream with an error wherever it is cut: 0xFF bytes make an unterminated,
# oversized varint (a column count, a string length) and run past the end of any fixed-width value.
POISON = b"\xff" * 65536


class _BodyTooLarge(QueryFailed):
    pass


class Body:
    """The request body as raw chunks (Content-Length or chunked), then decoded chunks."""

    def __init__(self, rfile: Any, headers: Any, limit: int) -> None:
        self._rfile = rfile
        self._limit = limit
        self._chunked = "chunked" in (headers.get("Transfer-Encoding") or "").lower()
        length = headers.get("Content-Length")
        try:
            self._remaining = int(length) if length and not self._chunked else 0
        except ValueError:
            raise QueryFailed.make(36, "BAD_ARGUMENTS", f"Content-Length {length!r} is not a number") from None
        self._encoding = headers.get("Content-Encoding")
        self.raw_bytes = 0
        self.decoded_bytes = 0
        self.finished = not self._chunked and self._remaining == 0
        if not self._chunked and self._remaining > limit:
            raise self._too_large()

    def _too_large(self) -> QueryFailed:
        return _BodyTooLarge(
            290, "LIMIT_EXCEEDED",
            f"Code: 290. DB::Exception: Request body exceeds the server's limit of {self._limit} bytes. "
            "(LIMIT_EXCEEDED)",
        )

    def raw_chunks(self) -> Iterator[bytes]:
        if self._chunked:
            while True:
                line = self._rfile.readline(1024)
                if not line:
                    raise QueryFailed.make(33, "CANNOT_READ_ALL_DATA", "The chunked request body ended early")
                try:
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                except ValueError:
                    raise QueryFailed.make(33, "CANNOT_READ_ALL_DATA", "Malformed chunk size in the body") from None
                if size == 0:
                    while self._rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    self.finished = True
                    return
                self._count_raw(size)  # before reading: a declared size alone can exceed the limit
                while size > 0:  # a large chunk arrives in pieces, never allocated whole
                    data = self._rfile.read(min(size, 1 << 20))
                    if not data:
                        raise QueryFailed.make(33, "CANNOT_READ_ALL_DATA", "The chunked request body ended early")
                    size -= len(data)
                    yield data
                self._rfile.readline(16)
        else:
            while self._remaining > 0:
                data = self._rfile.read(min(self._remaining, 1 << 20))
                if not data:
                    raise QueryFailed.make(33, "CANNOT_READ_ALL_DATA", "The request body ended early")
                self._remaining -= len(data)
                self._count_raw(len(data))
                yield data
            self.finished = True

    def _count_raw(self, n: int) -> None:
        self.raw_bytes += n
        if self.raw_bytes > self._limit:
            raise self._too_large()

    def chunks(self) -> Iterator[bytes]:
        decoder = decoder_for(self._encoding)
        for raw in self.raw_chunks():
            for data in decoder.feed(raw):
                if data:
                    self.decoded_bytes += len(data)
                    if self.decoded_bytes > self._limit:
                        raise self._too_large()
                    yield data
        decoder.finish()

    def read_all(self, limit: int | None = None) -> bytes:
        """The whole decoded body; with `limit`, refused once it grows past that many bytes."""
        if limit is not None:
            self._limit = min(self._limit, limit)
        return b"".join(self.chunks())

    def drain(self, deadline_s: float = 10.0) -> bool:
        """Read and drop what is left so the connection can carry the next request."""
        if self.finished:
            return True
        stop = time.monotonic() + deadline_s
        try:
            if self._chunked:
                self._limit = 1 << 62
                for _ in self.raw_chunks():
                    if time.monotonic() > stop:
                        return False
            else:
                while self._remaining > 0:
                    data = self._rfile.read(min(self._remaining, 1 << 20))
                    if not data or time.monotonic() > stop:
                        return False
                    self._remaining -= len(data)
                self.finished = True
        except (OSError, ValueError, QueryFailed):
            return False
        return self.finished


def parse_multipart(content_type_header: str, body: bytes) -> dict[str, str]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type_header.encode("latin-1") + b"\r\n\r\n" + body
    )
    fields: dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if part.get_filename():
            raise QueryFailed.make(48, "NOT_IMPLEMENTED", "External data (file fields) is not supported")
        payload = part.get_payload(decode=True)
        if name:
            fields[str(name)] = payload.decode() if isinstance(payload, bytes) else str(payload or "")
    return fields


def open_pipe_writer(fifo: Path, reader: threading.Thread) -> int | None:
    """Open the write end once the engine has opened the read end; None if the engine gave up first."""
    delay = 0.0002
    while True:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            if not reader.is_alive():
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
            continue
        os.set_blocking(fd, True)
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        return fd


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
