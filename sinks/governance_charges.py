"""Credits (appeals granted as credit) and reservation charges, as `sinks.statements.Charge` items, read from
ClickHouse: what `period close` routes onto statements. The stable entry point for readers such as the team
page; the work is in `sinks/governance.py`. Without a policy no decision can be judged, so there are none."""

from __future__ import annotations

from typing import Any

from schemas.policy import Policy
from sinks.statements import Charge


def charges(client: Any, policy: Policy | None = None, now_ms: int | None = None) -> list[Charge]:
    """Reservation lines count what has passed by `now_ms` (default: the wall clock)."""
    import time

    from sinks.governance import charges as judged

    return judged(client, policy, time.time_ns() // 1_000_000 if now_ms is None else now_ms)
