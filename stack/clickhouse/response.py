"""Writing responses as a ClickHouse server does: status from the error code, the `X-ClickHouse-*`
headers, keep-alive or close, chunked streams with mid-stream errors framed by an exception tag."""

from __future__ import annotations

import contextlib
import threading
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from stack.clickhouse.engine import QueryFailed

if TYPE_CHECKING:
    from stack.clickhouse.body import Body

DISPLAY_NAME = "gpuledger-embedded"
PLAIN_TEXT = "text/plain; charset=UTF-8"

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
    return PLAIN_TEXT


def common_headers(query_id: str, tz: str) -> dict[str, str]:
    return {
        "X-ClickHouse-Server-Display-Name": DISPLAY_NAME,
        "X-ClickHouse-Query-Id": query_id,
        "X-ClickHouse-Timezone": tz,
    }


def exception_frame(tag: str, message: str) -> bytes:
    """A mid-stream error, framed so a client that knows the tag can tell it from the data."""
    raw = message.encode()
    return (
        b"__exception__\r\n" + tag.encode() + b"\r\n" + raw + b"\n"
        + str(len(raw)).encode() + b" " + tag.encode() + b"\r\n__exception__\r\n"
    )  # fmt: skip


class ResponseWriter:
    """Writes one connection's responses. Closing is the handler's `close_connection`: set by the
    request (`Connection: close`, HTTP/1.0), by a body left unread, or when the server is stopping."""

    def __init__(self, handler: BaseHTTPRequestHandler, keepalive_timeout_s: float, stopping: threading.Event) -> None:
        self._handler = handler
        self._keepalive_s = int(keepalive_timeout_s)
        self._stopping = stopping

    def _head_bytes(self, status: int, headers: dict[str, str]) -> bytes:
        handler = self._handler
        lines = [f"HTTP/1.1 {status} {handler.responses.get(status, ('',))[0]}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if handler.close_connection or self._stopping.is_set():
            handler.close_connection = True
            lines.append("Connection: close")
        else:
            lines.append(f"Keep-Alive: timeout={self._keepalive_s}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send_head(self, status: int, headers: dict[str, str]) -> None:
        """The status line and headers only (a chunked stream follows)."""
        self._handler.wfile.write(self._head_bytes(status, headers))

    def send(self, status: int, headers: dict[str, str], data: bytes, head_only: bool = False) -> None:
        headers["Content-Length"] = str(len(data))
        head = self._head_bytes(status, headers)
        wfile = self._handler.wfile
        if head_only or not data:
            wfile.write(head)
        elif len(data) < 65536:
            wfile.write(head + data)
        else:
            wfile.write(head)
            wfile.write(data)

    def write_chunk(self, data: bytes) -> None:
        if data:
            self._handler.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")

    def end_chunks(self) -> None:
        self._handler.wfile.write(b"0\r\n\r\n")

    def fail(self, exc: QueryFailed, query_id: str, body: Body | None, version: str) -> None:
        """An error response; the connection closes unless the rest of the request body could be read."""
        if body is None or not body.drain():
            self._handler.close_connection = True
        message = f"{exc} (version {version})\n".encode()
        headers = {
            "X-ClickHouse-Server-Display-Name": DISPLAY_NAME,
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Exception-Code": str(exc.code),
            "Content-Type": PLAIN_TEXT,
        }
        with contextlib.suppress(OSError):
            self.send(http_status(exc.code), headers, message)
