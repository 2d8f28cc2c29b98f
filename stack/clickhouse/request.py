"""Reading a request: the statement, its `param_*` binds, the per-query settings in the URL, and for
`INSERT ... FORMAT X` where the insert's data starts (the data itself is left in the body)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from stack.clickhouse import sqltext
from stack.clickhouse.body import Body, parse_multipart
from stack.clickhouse.engine import QueryFailed

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


@dataclass
class Parsed:
    """What a request asks for, once its text is read."""

    sql: str = ""
    insert: sqltext.InsertWithData | None = None
    data_head: bytes = b""  # the first bytes of an insert's data
    data_rest: Iterator[bytes] | None = None


def binds_of(fields: dict[str, str]) -> dict[str, str]:
    """The `param_*` fields, without their prefix."""
    return {k[6:]: v for k, v in fields.items() if k.startswith("param_")}


def url_settings(params: dict[str, str]) -> dict[str, str]:
    """The per-query settings: every URL parameter that is neither transport nor a bind."""
    return {k: v for k, v in params.items() if k not in TRANSPORT_PARAMS and not k.startswith("param_")}


class StatementReader:
    """Reads the statement of a request out of the URL and the body, within `max_query_bytes` for a
    request without insert data."""

    def __init__(self, max_query_bytes: int) -> None:
        self.max_query_bytes = max_query_bytes

    def read(self, params: dict[str, str], ctype: str, body: Body) -> tuple[Parsed, dict[str, str]]:
        """The statement (and where an insert's data starts) and the binds, from a form or plain text."""
        binds = binds_of(params)
        if ctype.lower().startswith("multipart/form-data"):
            fields = parse_multipart(ctype, body.read_all(self.max_query_bytes))
            binds.update(binds_of(fields))
            return Parsed(sql=fields.get("query", params.get("query", ""))), binds
        return self.parse_text(params.get("query"), body), binds

    def parse_text(self, query_param: str | None, body: Body) -> Parsed:
        """Find the statement, and for `INSERT ... FORMAT X` where its data starts."""
        chunks = body.chunks()
        if query_param is not None:
            insert = sqltext.split_insert(query_param) if sqltext.leading_keyword(query_param) == "INSERT" else None
            if insert is not None:
                inline = query_param[insert.data_offset :].encode()
                return Parsed(sql=query_param, insert=insert, data_head=inline, data_rest=chunks)
            rest = self.read_query(b"", chunks)
            return Parsed(sql=query_param + ("\n" + text_of(rest) if rest else ""))
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
        return Parsed(sql=text_of(self.read_query(bytes(head), iter(()) if exhausted else chunks)))

    def read_query(self, head: bytes, chunks: Iterator[bytes]) -> bytes:
        """The rest of a request without insert data, up to the server's (small) limit for one."""
        limit = self.max_query_bytes
        data = bytearray(head)
        for chunk in itertools.chain([b""], chunks):
            data.extend(chunk)
            if len(data) > limit:
                raise QueryFailed.make(
                    290, "LIMIT_EXCEEDED",
                    f"A query without insert data may be at most {limit} bytes (the statement and its binds); "
                    "send data as INSERT ... FORMAT with the rows in the body",
                )
        return bytes(data)


def text_of(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise QueryFailed.make(36, "BAD_ARGUMENTS", f"The query is not valid UTF-8: {exc}") from None


def float_param(value: str, name: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise QueryFailed.make(36, "BAD_ARGUMENTS", f"{name} must be a number, not {value!r}") from None


def int_setting(value: str, name: str) -> int:
    try:
        return int(value or 0)
    except ValueError:
        raise QueryFailed.make(36, "BAD_ARGUMENTS", f"Setting {name} must be an integer, not {value!r}") from None
