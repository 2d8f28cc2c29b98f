"""The attribution baseline (issue 38): the day from which every job had to name its project. Pure: events, the
policy's attribution rules, the mode and `now_ms` in; the baseline in force, or the one event to write, out. At the
contracts layer for the reason of `schemas/governance_reservations.py`: `policy apply` (which writes the events) and
the reports (which read them back from ClickHouse) must read them alike.

Which day: the policy's own `attribution.baseline` when it states one (source POLICY_DATE); else, once attribution
is strict (the policy's `attribution.mode`, else the scheduler settings' mode), the day a policy was first applied
strict (STRICT_MODE). A policy back in grace with no date clears it (CLEARED): attribution is no longer required.

In force: the latest event by `ts_ms` (ties: the larger `event_id`), SET giving its day, CLEARED none. So a later
policy that moves the date writes a new event that wins; re-applying the same policy writes nothing (`decide`
returns None when the baseline it implies is already the one in force), and a strict policy re-applied on a later
day keeps the first day.
"""

from __future__ import annotations

import calendar
import datetime as dt
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.policy import AttributionRules, Policy

DAY_MS = 24 * 3600 * 1000
RECORD_KEY = b"baseline"  # one organisation-wide fact: one key, so its events stay in order on one partition


@dataclass(frozen=True, slots=True)
class Baseline:
    """The baseline in force: its day and the event that set it."""

    day: dt.date
    source: str  # POLICY_DATE or STRICT_MODE
    recorded_ms: int  # when the policy that set it was applied
    actor: str
    event_id: str

    @property
    def start_ms(self) -> int:
        return day_start_ms(self.day)

    def text(self) -> str:
        how = "the policy's date" if self.source == "POLICY_DATE" else "attribution turned strict"
        recorded = dt.datetime.fromtimestamp(self.recorded_ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"attribution baseline {self.day.isoformat()} ({how}; recorded {recorded} by {self.actor})"


@dataclass(frozen=True, slots=True)
class Decision:
    """What `policy apply` must record: SET a day (from `source`), or CLEAR the baseline."""

    event_type: str  # SET or CLEARED
    source: str  # POLICY_DATE, STRICT_MODE or GRACE_MODE
    day: dt.date | None


def day_start_ms(day: dt.date) -> int:
    """The first millisecond of `day`, UTC."""
    return calendar.timegm((day.year, day.month, day.day, 0, 0, 0)) * 1000


def day_of(ms: int) -> dt.date:
    """The UTC day of an epoch-millisecond time."""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).date()


def in_force(events: Iterable[Mapping[str, Any]]) -> Baseline | None:
    """The baseline the latest event leaves in force (None: none recorded, or the latest cleared it)."""
    latest = max(events, key=lambda e: (int(e["ts_ms"]), str(e["event_id"])), default=None)
    if latest is None or latest["event_type"] != "SET" or latest.get("baseline_start_ms") is None:
        return None
    return Baseline(day_of(int(latest["baseline_start_ms"])), str(latest["source"]), int(latest["ts_ms"]),
                    str(latest["actor"]), str(latest["event_id"]))  # fmt: skip


def attribution_mode(rules: AttributionRules, settings_mode: str) -> str:
    """The mode in force at an apply: the policy's when it states one, else the scheduler settings'."""
    return rules.mode or settings_mode


def decide(rules: AttributionRules, mode: str, current: Baseline | None, now_ms: int) -> Decision | None:
    """The event an apply must write so that the baseline in force is the one the policy implies; None when it
    already is (the same policy applied again)."""
    if rules.baseline is not None:
        if current is not None and current.day == rules.baseline:
            return None  # the same day, however it was first recorded
        return Decision("SET", "POLICY_DATE", rules.baseline)
    if mode == "strict":
        # The first strict apply's day stays: a later apply of a strict policy is not a new start.
        return None if current is not None else Decision("SET", "STRICT_MODE", day_of(now_ms))
    return Decision("CLEARED", "GRACE_MODE", None) if current is not None else None


def policy_sha256(policy: Policy) -> str:
    """The applied policy's canonical content hash (its parsed model as JSON: comments and layout do not count)."""
    return hashlib.sha256(policy.model_dump_json().encode()).hexdigest()


def baseline_event(decision: Decision, *, mode: str, now_ms: int, actor: str, cluster: str, engine: str | None,
                   policy_hash: str) -> dict[str, Any]:  # fmt: skip
    """The `attribution.baseline` record of a decision; its id is the sha256 of every other field."""
    event: dict[str, Any] = {
        "event_type": decision.event_type,
        "ts_ms": now_ms,
        "actor": actor,
        "baseline_start_ms": None if decision.day is None else day_start_ms(decision.day),
        "source": decision.source,
        "attribution_mode": mode.upper(),
        "engine": engine,
        "cluster": cluster,
        "policy_sha256": policy_hash,
    }
    event_id = hashlib.sha256(json.dumps(event, sort_keys=True).encode()).hexdigest()[:32]
    return {"event_id": event_id, **event}
