"""The sinks' commands' way into the warehouse: a client from the settings, ClickHouse errors as one line, the
wall clock in epoch milliseconds, and the two writes a command asks for by name (`db migrate`, `ratecard load`).

Every command module of this folder (`sinks/*cli.py`) and the what-if command reach ClickHouse through here.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from base.errors import ServiceError
from base.settings import Settings

if TYPE_CHECKING:
    from sinks.db import Upgrade
    from sinks.ratecard import RateCard

# Server errors that mean the schema is not there yet.
_MISSING = ("UNKNOWN_TABLE", "UNKNOWN_DATABASE", "UNKNOWN_FUNCTION")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def client(settings: Settings, *, analyst: bool = False) -> Any:
    """A ClickHouse client of the settings (`analyst`: the read-only login the reports use)."""
    from sinks.db import connect

    return connect(settings.clickhouse, analyst=analyst)


@contextlib.contextmanager
def warehouse_errors() -> Iterator[None]:
    """ClickHouse errors as one line (e.g. an unknown table: run `gpuledger db migrate`)."""
    from clickhouse_connect.driver.exceptions import ClickHouseError

    try:
        yield
    except ClickHouseError as exc:
        text = " ".join(str(exc).split())
        start = text.find("Code: ")
        text = text[start:] if start >= 0 else text
        text = text.split(" (version ")[0]
        hint = " (run `gpuledger db migrate`?)" if any(name in text for name in _MISSING) else ""
        raise ServiceError(f"ClickHouse: {text[:400]}{hint}") from None


def migrate(settings: Settings) -> Upgrade:
    """`gpuledger db migrate`: the migrations not applied yet, then the views folder (safe to repeat)."""
    from sinks.db import upgrade

    db = client(settings)
    with warehouse_errors():
        return upgrade(db, settings.clickhouse, clock_ms=now_ms)


def rate_card(settings: Settings, card: Path | None) -> RateCard:
    """The rate card of `--card`, else the settings' (then the shipped card), with the policy's discount."""
    from sinks.ratecard import load_card

    return load_card(card or settings.sinks.ratecard_path, settings.policy_path)


def load_rate_card(settings: Settings, card: Path | None) -> tuple[RateCard, int]:
    """`gpuledger ratecard load`: the card's rates into ClickHouse (a new load replaces the previous card);
    (the card, how many rates)."""
    from sinks.ratecard import RATE_CARD_COLUMNS, rate_card_rows

    rc = rate_card(settings, card)
    rows = rate_card_rows(rc, now_ms())
    with warehouse_errors():
        client(settings).insert("rate_card", rows, column_names=RATE_CARD_COLUMNS)
    return rc, len(rows)
