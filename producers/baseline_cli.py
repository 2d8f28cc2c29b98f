"""The attribution baseline's record, written by `gpuledger policy apply` (issue 38; `docs/policy.md` "The
attribution baseline"): read attribution.baseline.v1 whole, decide under the applied policy what the baseline in
force must be (`schemas/governance_baseline.py`), and publish the one event that makes it so, or nothing when it
already is (the same policy applied again). Also `gpuledger policy baseline`: the events and the one in force.

Called after the engine step succeeded: a policy that was not applied sets no baseline. The engine step does not
depend on this one, so tests exercise it without a live engine (`record_baseline`).
"""

from __future__ import annotations

import datetime as dt
import getpass
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for
from base.errors import ConfigError, ContractError, ServiceError
from base.settings import Settings
from schemas.governance_baseline import (
    RECORD_KEY,
    Baseline,
    attribution_mode,
    baseline_event,
    decide,
    in_force,
    policy_sha256,
)
from schemas.policy import Policy

READ_TIMEOUT_S = 10.0
# A policy in grace with no date can only clear a baseline: a broker that does not answer soon is a warning then.
CLEAR_ONLY_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Recorded:
    """What an apply did to the baseline: `written` the event published (None: none needed), `before` and
    `after` the baseline in force either side of it."""

    written: dict[str, Any] | None
    before: Baseline | None
    after: Baseline | None
    unread: str | None = None  # why the topic was not read (only where the policy could not set a baseline)

    def text(self) -> str:
        if self.unread is not None:
            return f"attribution baseline not checked ({self.unread}): a baseline recorded before stays in force"
        if self.written is None:
            if self.after is None:
                return "attribution baseline: none (attribution is not strict and the policy states no date)"
            return f"{self.after.text()}: unchanged"
        if self.after is None:
            return "attribution baseline: cleared (the policy is back in grace and states no date)"
        return f"{self.after.text()}: recorded" + (f", was {self.before.day.isoformat()}" if self.before else "")


def baseline_events(settings: Settings, timeout_s: float = READ_TIMEOUT_S) -> list[dict[str, Any]]:
    """Every event of attribution.baseline.v1 (a record that does not decode stops the apply: the baseline in force
    would be a guess)."""
    from schemas.topics import ATTRIBUTION_BASELINE
    from streams.eventlog import read_events

    events, unreadable = read_events(settings.kafka, ATTRIBUTION_BASELINE, timeout_s=timeout_s)
    if unreadable:
        bad = unreadable[0]
        raise ServiceError(f"{ATTRIBUTION_BASELINE.name} partition {bad.partition} offset {bad.offset} not read: "
                           f"{bad.why}")  # fmt: skip
    return events


def record_baseline(settings: Settings, policy: Policy, *, engine: str | None, now_ms: int,
                    actor: str) -> Recorded:  # fmt: skip
    """Publish the baseline event the applied `policy` needs, if any (idempotent: nothing when it is in force)."""
    from schemas.models import validate
    from schemas.topics import ATTRIBUTION_BASELINE
    from streams.publish import RecordPublisher

    mode = attribution_mode(policy.attribution, settings.scheduler.mode)
    may_set = policy.attribution.baseline is not None or mode == "strict"
    try:
        events = baseline_events(settings, READ_TIMEOUT_S if may_set else CLEAR_ONLY_TIMEOUT_S)
    except ServiceError as exc:
        if may_set:
            raise ServiceError(f"the policy is applied but its attribution baseline is not recorded ({exc}): run "
                               "`policy apply` again once the broker answers") from exc  # fmt: skip
        return Recorded(None, None, None, unread=str(exc)[:300])
    before = in_force(events)
    decision = decide(policy.attribution, mode, before, now_ms)
    if decision is None:
        return Recorded(None, before, before)
    event = baseline_event(decision, mode=mode, now_ms=now_ms, actor=actor, cluster=settings.cluster, engine=engine,
                           policy_hash=policy_sha256(policy))  # fmt: skip
    try:
        validate(ATTRIBUTION_BASELINE.subject, event)
    except ContractError as exc:
        raise ConfigError(str(exc).splitlines()[0][:300]) from exc
    pub = RecordPublisher(settings.kafka)
    pub.publish(ATTRIBUTION_BASELINE, RECORD_KEY, event)
    pub.flush()
    return Recorded(event, before, in_force([*events, event]))


def record_applied(policy: Policy, engine: str, state_dir: Path | None) -> None:
    """`policy apply`'s last step: the baseline recorded, one line on stdout."""
    recorded = record_baseline(settings_for(state_dir), policy, engine=engine, now_ms=time.time_ns() // 1_000_000,
                               actor=getpass.getuser())  # fmt: skip
    # stdout: what is in force; the engine's "applied" line stays the last but for this. No baseline: a note.
    typer.echo(recorded.text(), err=recorded.after is None and recorded.written is None)




def policy_baseline(state_dir: Path | None = STATE_DIR_OPTION) -> None:
    """The attribution baseline in force and every event that set or cleared it (read from the topic)."""
    events = sorted(baseline_events(settings_for(state_dir)), key=lambda e: (int(e["ts_ms"]), str(e["event_id"])))
    for e in events:
        when = dt.datetime.fromtimestamp(int(e["ts_ms"]) / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        day = "" if e["baseline_start_ms"] is None else dt.datetime.fromtimestamp(
            int(e["baseline_start_ms"]) / 1000, dt.UTC).date().isoformat()  # fmt: skip
        typer.echo(f"{when}  {e['event_type']:<7} {day or '-':<10}  {e['source']} ({e['attribution_mode']}) by "
                   f"{e['actor']} on {e['engine'] or '-'}/{e['cluster']}  policy {str(e['policy_sha256'])[:12]}")
    current = in_force(events)
    typer.echo(current.text() + ": in force" if current else "attribution baseline: none recorded")
