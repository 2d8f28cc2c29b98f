"""The policy watch (issue 41 item 1): every configured engine diffed against the policy on an interval, drift
published as an alert (alerts.v1, kind POLICY_DRIFT, each differing line in `drift_lines`) and its end as
POLICY_DRIFT_CLEARED, so chat hears of it and the fleet page shows it until it is gone.

The diff is `policy diff`'s own (producers/policy_engine.engine_diff); this module only decides when to speak:

    (unknown) --drift--> DRIFTED(lines) --same lines--> (nothing)
        |                    |  \\--other lines--> DRIFTED(new lines): a new POLICY_DRIFT
        |                    \\--no drift--> CLEAN: POLICY_DRIFT_CLEARED
        \\--no drift--> CLEAN: POLICY_DRIFT_CLEARED (after a restart the fleet page must not keep a drift that went
                               away while the watch was down)

One alert per drift: the alert id is the engine and a hash of its lines, so a restart that finds the same drift
publishes the same id (chat and the alerts table de-duplicate by it). An engine that cannot be read keeps its state
and is logged; "could not ask" is not "no drift".
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from producers.policy_engine import EngineDiff

log = logging.getLogger("gpuledger.policy.watch")

DRIFT, CLEARED = "POLICY_DRIFT", "POLICY_DRIFT_CLEARED"
MAX_LINES = 200  # lines carried in one alert; the message says how many more
MAX_LINE_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Seen:
    """What the watch last said about one engine: its drift lines (empty: clean) and the alert that said it."""

    lines: tuple[str, ...]
    alert_id: str


State = Mapping[str, Seen]  # engine -> last word


def drift_id(cluster: str, engine: str, lines: tuple[str, ...]) -> str:
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return f"policy-drift/{cluster}/{engine}/{digest}"


def _alert(kind: str, alert_id: str, cluster: str, engine: str, lines: tuple[str, ...], message: str,
           now_ms: int) -> dict[str, Any]:  # fmt: skip
    return {
        "alert_id": alert_id, "kind": kind, "ts_ms": now_ms, "cluster": cluster, "job_id": None, "node": None,
        "device_uuids": [], "user": None, "team": None, "project": None, "idle_minutes": None,
        "cost_so_far": None, "action": f"gpuledger policy apply --engine {engine}" if kind == DRIFT else None,
        "action_at_ms": None, "dry_run": False, "message": message, "appeal_route": None, "emitted_ts_ms": now_ms,
        "engine": engine, "drift_lines": [line[:MAX_LINE_CHARS] for line in lines[:MAX_LINES]],
    }  # fmt: skip


def step(state: State, cluster: str, diff: EngineDiff, now_ms: int) -> tuple[dict[str, Seen], list[dict[str, Any]]]:
    """One engine's diff -> the new state and the alerts to publish (pure)."""
    engine, lines = diff.engine, diff.drift
    before = state.get(engine)
    out = dict(state)
    if lines:
        if before is not None and before.lines == lines:
            return out, []
        alert_id = drift_id(cluster, engine, lines)
        more = f" (the first {MAX_LINES} below)" if len(lines) > MAX_LINES else ""
        message = (f"{engine} on {cluster} differs from the policy in {len(lines)} place(s){more}; "
                   f"`gpuledger policy apply --engine {engine}` brings it back:\n" + "\n".join(lines[:MAX_LINES]))
        out[engine] = Seen(lines, alert_id)
        return out, [_alert(DRIFT, alert_id, cluster, engine, lines, message, now_ms)]
    if before is not None and not before.lines:
        return out, []
    # Cleared: after a drift this watch saw, or on the first pass (a drift may have gone while it was down).
    cleared_id = (before.alert_id if before is not None else f"policy-drift/{cluster}/{engine}/start-{now_ms}")
    alert_id = cleared_id.replace("policy-drift/", "policy-drift-cleared/", 1)
    message = f"{engine} on {cluster} matches the policy" + (
        f" again (drift {before.alert_id} is gone)" if before is not None else "")
    out[engine] = Seen((), alert_id)
    return out, [_alert(CLEARED, alert_id, cluster, engine, (), message, now_ms)]


Differ = Callable[[str], EngineDiff]  # engine -> its diff now; raises ServiceError/ConfigError when unreadable
Publish = Callable[[dict[str, Any]], None]


def one_pass(state: State, cluster: str, engines: tuple[str, ...], differ: Differ, publish: Publish,
             now_ms: int) -> dict[str, Seen]:  # fmt: skip
    """Diff each engine, publish what changed; an engine that cannot be read is logged and keeps its state."""
    from base.errors import GpuledgerError

    current = dict(state)
    for engine in engines:
        try:
            diff = differ(engine)
        except GpuledgerError as exc:
            log.warning("policy watch: %s not read: %s", engine, exc)
            continue
        current, alerts = step(current, cluster, diff, now_ms)
        for alert in alerts:
            publish(alert)
            log.info("policy watch: %s %s (%d line(s))", alert["kind"], alert["alert_id"], len(alert["drift_lines"]))
    return current


def run(cluster: str, engines: tuple[str, ...], differ: Differ, publish: Publish, flush: Callable[[], None],
        should_stop: Callable[[], bool], interval_s: float, clock_ms: Callable[[], int],
        max_passes: int | None = None) -> dict[str, Seen]:  # fmt: skip
    """Pass after pass every `interval_s` (measured from each pass's start) until `should_stop()`; each pass's
    alerts are flushed before the next (a broker away fails the pass: it is logged and the next one tries again,
    with the state of the last pass that was delivered)."""
    import time

    from base.errors import GpuledgerError

    state: dict[str, Seen] = {}
    passes = 0
    while not should_stop() and (max_passes is None or passes < max_passes):
        started = time.monotonic()
        try:
            new = one_pass(state, cluster, engines, differ, publish, clock_ms())
            flush()
            state = new
        except GpuledgerError as exc:
            log.warning("policy watch: pass not delivered: %s", exc)
        passes += 1
        while not should_stop() and time.monotonic() < started + interval_s and (
                max_passes is None or passes < max_passes):  # fmt: skip
            time.sleep(min(0.2, interval_s))
    return state
