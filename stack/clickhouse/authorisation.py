"""Who is asking and what they may do: the user from the request's credentials, the settings a user
may send, and the statement judged on the engine's own parse of it (`access.denial`)."""

from __future__ import annotations

import base64
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stack.clickhouse import access
from stack.clickhouse.engine import Engine, Lease, QueryFailed
from stack.clickhouse.request import int_setting


@dataclass(frozen=True)
class User:
    name: str
    password: str = field(repr=False)
    readonly: int = 0


def authenticate(users: Mapping[str, User], headers: Any, params: dict[str, str]) -> User:
    """The user named by Basic auth, the `X-ClickHouse-User/Key` headers or the `user/password`
    parameters (in that order; `default` with no password when none is given)."""
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
    user = users.get(name)
    if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
        raise QueryFailed.make(
            516,
            "AUTHENTICATION_FAILED",
            f"{name}: Authentication failed: password is incorrect, or there is no user with such name",
        )
    return user


def requested_readonly(user: User, method: str, params: dict[str, str], settings: dict[str, str]) -> int:
    """The `readonly` level the request asks for (taken out of `settings`), after refusing a parser
    setting and an analyst's attempt to lower their level; a GET is at least `readonly = 2`."""
    if parser_setting := next((k for k in settings if k.lower() in access.PARSER_SETTINGS), None):
        raise QueryFailed.make(
            497, "ACCESS_DENIED", f"{user.name}: the setting {parser_setting} may not be changed on this server"
        )
    url_readonly = int_setting(settings.pop("readonly", "0"), "readonly")
    if user.readonly and "readonly" in params and url_readonly < user.readonly:
        raise QueryFailed.make(164, "READONLY", "Cannot modify 'readonly' setting in readonly mode")
    if method == "GET":
        url_readonly = max(url_readonly, 2)
    return url_readonly


def authorise(
    engine: Engine, lease: Lease, user: User, sql: str, binds: dict[str, str], infile: str | None = None
) -> None:
    """Refuse what `user` may not run, judged on the engine's own parse of the statement."""
    formatted, tree = engine.inspect(sql, binds)
    scope = access.Scope(
        role=access.Role.ANALYST if user.readonly else access.Role.WRITER,
        current_database=lease.handle.database,
        infile=infile,
        table_functions=engine.table_functions,
    )
    reason = access.denial(tree, scope, formatted)
    if reason is not None:
        raise QueryFailed.make(497, "ACCESS_DENIED", f"{user.name}: {reason}")
