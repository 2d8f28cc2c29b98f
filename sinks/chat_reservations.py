"""Reservation steps in chat (issue 41 item 4): the chat worker's third input, `reservations.v1`.

- A warning that a reservation sits idle (IDLE_WARNED) and its early release for idleness (RELEASED by the
  reservation service) go to the team's route (its channel, else the default), so the team hears that its GPUs are
  about to go, and that they went, and what the statement will say. A release by a person, and every other step,
  is not posted: the person who released it knows.
- Only the reservation service's own steps are posted (actor `gpuledger-reservations`): the service wrote them
  under the policy's idle rule (sinks/reserve_cli.py `reconcile_once`), with the producers' login.

Once per step, across restarts, as for alerts and appeal steps: each delivery is journalled in `chat_deliveries`
under the step's event_id (sinks/chat.py `ChatJournal`), the dedupe is seeded from that journal at start, and each
post carries the event_id as its `Idempotency-Key`.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from schemas.governance_reservations import SERVICE_ACTOR
from sinks.chat import Delivery, StepNotifier, resolve

log = logging.getLogger(__name__)
POSTED = ("IDLE_WARNED", "RELEASED")


def _when(ms: int | None) -> str:
    return "-" if ms is None else dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def render_step(event: dict[str, Any]) -> tuple[str, str]:
    """Title and body of an idle warning or an early release: which GPUs, whose, why, and what it means."""
    rid, team = event["reservation_id"], event["team"]
    gpus = f"{event['gpus']} {event['generation']} GPUs"
    window = f"reserved: {gpus} for team {team}, {_when(event['start_ms'])} to {_when(event['end_ms'])}"
    if event["event_type"] == "IDLE_WARNED":
        title = f"[gpuledger] Reservation {rid} idle: {event['text']} (team {team}, {gpus})"
        means = (
            "it is released early if the team's jobs do not use them before the policy's idle limit; until "
            "then it is charged on the team's statement as reserved capacity"
        )
    else:
        title = f"[gpuledger] Reservation {rid} released early: {event['text']} (team {team}, {gpus})"
        means = (
            f"the GPUs are free for others since {_when(event['ts_ms'])}; the team's statement charges the "
            "reservation up to then, not to its end"
        )
    return title, "\n".join([window, f"what happened: {event['text']} ({_when(event['ts_ms'])})",
                             f"what it means: {means}"])  # fmt: skip


class ReservationNotifier(StepNotifier):
    """Posts the reservation service's idle steps to the team's route; `handle` returns what happened."""

    def handle(self, event: dict[str, Any]) -> Delivery:
        event_id = str(event.get("event_id") or "")
        unposted = self._unposted(event, POSTED if event.get("actor") == SERVICE_ACTOR else ())
        if unposted is not None:
            return unposted
        dest = resolve({"team": event.get("team")}, self._chat)
        if dest is None:
            log.warning("no chat route for reservation %s (%s)", event.get("reservation_id"), event["event_type"])
            return Delivery(event_id, "no-route")
        title, body = render_step(event)
        return self._post(event_id, dest, title, body)
