"""Reservations in the browser (issue 19's reservations, `schemas/governance_reservations.py`): the same steps as
`gpuledger reserve create|approve|release` (`sinks/reserve_cli.py`), never a second copy of their rules.

- Shown: the reservations the steps on reservations.v1 describe (read whole and folded under the policy, as the
  commands do): operators see every one, a member their teams'.
- Requested: by a member of the team (or an operator), with `reserve create`'s fields; approved at once within
  the policy's automatic limits, else it waits for an operator.
- Approved, denied or released: by an operator only (the page's actions; 403 for anyone else). A denial is a
  RELEASED step by the operator with the note as its text (the contract has no separate refusal): the request
  stops holding capacity, and the audit trail says who and why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from base.errors import ConfigError
from web import params
from web.access import Forbidden, Viewer
from web.model import Column, Table

_RESERVATION_ID = re.compile(r"rsv-[0-9a-f]{10}")
_GENERATION = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_START = re.compile(r"now|[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2})?)?Z?")
_NODES = re.compile(r"[A-Za-z0-9._,-]{0,1000}")
_NUMBER = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?")
ACTIONS = ("approve", "deny", "release")

COLUMNS = (
    Column("reservation_id", "reservation"), Column("state", "state"), Column("cluster", "cluster"),
    Column("team", "team"), Column("generation", "generation"), Column("gpus", "GPUs", "int"),
    Column("start", "start (UTC)"), Column("end", "end (UTC)"), Column("requested_by", "requested by"),
    Column("approved_by", "approved by"), Column("on", "on engines"), Column("nodes", "nodes"),
    Column("reason", "reason"),
)  # fmt: skip


def may_operate(viewer: Viewer, policy: Any) -> bool:
    """An operator of the web (operator groups) or of the policy (`governance.operators`)."""
    return viewer.operator or viewer.user in policy.governance.operators


def table(name: str, title: str, reservations: Iterable[Any], note: str = "") -> Table:
    from schemas.governance_reservations import list_row

    ordered = sorted(reservations, key=lambda r: (r.start_ms, r.reservation_id))
    return Table(name, title, COLUMNS, [list_row(r) for r in ordered], note=note)


@dataclass
class ReservationService:
    """Requests and decides reservations for the web app: `read_events()` reads reservations.v1 whole,
    `publish(event)` publishes a step (keyed by its reservation) and waits for delivery."""

    policy: Any
    read_events: Callable[[], list[dict[str, Any]]]
    publish: Callable[[dict[str, Any]], None]

    def current(self) -> dict[str, Any]:
        from schemas.governance_reservations import fold

        return fold(self.read_events(), self.policy)[0]

    def visible(self, viewer: Viewer) -> list[Any]:
        return [r for r in self.current().values() if viewer.sees_team(r.team)]

    def request(self, viewer: Viewer, values: dict[str, str], default_cluster: str,
                now_ms: int) -> list[dict[str, Any]]:  # fmt: skip
        from schemas.governance_reservations import request_steps

        team = params.team(values.get("team"))
        if not (team in viewer.teams | viewer.leads or may_operate(viewer, self.policy)):
            raise Forbidden(f"{viewer.user} may not reserve for team {team}: {viewer.scope}")
        cluster = params.cluster(values.get("cluster") or default_cluster)
        generation = _match(_GENERATION, values.get("generation"), "the generation is a name like hopper")
        gpus = int(_match(re.compile(r"[0-9]{1,5}"), values.get("gpus"), "the number of GPUs is a whole number"))
        hours = float(_match(_NUMBER, values.get("hours"), "the hours are a number like 48 or 1.5"))
        start = _match(_START, values.get("start") or "now", "the start is now or a UTC time like 2026-12-03T08:00Z")
        nodes = _match(_NODES, values.get("nodes"), "nodes are names separated by commas")
        reason = params.reason(values.get("reason"))
        steps = _checked(lambda: request_steps(
            self.current(), self.policy, cluster=cluster, team=team, generation=generation, gpus=gpus, hours=hours,
            start=start, nodes=nodes, reason=reason, requester=viewer.user, now_ms=now_ms))  # fmt: skip
        self._publish(steps)
        return steps

    def act(self, viewer: Viewer, values: dict[str, str], now_ms: int) -> dict[str, Any]:
        """An operator approves, denies (releases a request, the note saying why) or releases a reservation."""
        from schemas.governance_reservations import step_event

        if not may_operate(viewer, self.policy):
            raise Forbidden(f"{viewer.user} may not approve, deny or release reservations (operators only)")
        rid = _match(_RESERVATION_ID, values.get("reservation_id"), "not a valid reservation id")
        action = values.get("action") or ""
        if action not in ACTIONS:
            raise params.BadRequest("approve, deny or release")
        if action == "approve":
            event = _checked(lambda: step_event("approve", self.current(), self.policy, rid, viewer.user, now_ms))
        else:
            note = params.reason(values.get("note"))
            why = f"denied: {note}" if action == "deny" else note
            existing = self.current()
            if action == "deny" and rid in existing and existing[rid].approved_by:
                raise params.BadRequest(f"reservation {rid} is already approved; release it instead")
            event = _checked(lambda: step_event("release", existing, self.policy, rid, viewer.user, now_ms,
                                                reason=why))  # fmt: skip
        self._publish([event])
        return event

    def _publish(self, events: list[dict[str, Any]]) -> None:
        from schemas.governance_reservations import check_steps

        _checked(lambda: check_steps(events))
        for event in events:
            self.publish(event)


def _match(pattern: re.Pattern[str], text: str | None, message: str) -> str:
    value = (text or "").strip()
    if not pattern.fullmatch(value):
        raise params.BadRequest(message)
    return value


def _checked(make: Callable[[], Any]) -> Any:
    """The rules' one-line refusal as a 400 naming it (their messages are meant for people)."""
    try:
        return make()
    except ConfigError as exc:
        text = str(exc).splitlines()[0][:300].replace("--hours", "the hours").replace("--reason", "the reason")
        raise params.BadRequest(text.replace("--start", "the start")) from None
