"""Reservation steps in chat (sinks/chat_reservations.py) without a broker: the service's idle warning and early
release go to the team's route once each; a release by a person and the other steps are not posted."""

from __future__ import annotations

from typing import Any

from base.settings import ChatRoute, ChatSettings
from schemas.governance_reservations import HOUR_MS, MINUTE_MS, due, fold, release_event, request_events
from schemas.policy import parse_policy
from sinks.chat_reservations import ReservationNotifier

T0 = 1_796_000_000_000
POLICY = parse_policy("""
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: research, priority: 100}]
governance:
  operators: [ops1]
  reservations: {auto_approve_gpus: 2, auto_approve_hours: 24, idle_warn_minutes: 3, idle_release_minutes: 5}
teams: [{name: vision, members: [alice], quota: {hopper: 2}}]
""")
VISION, OPS = "json://127.0.0.1:9/vision", "json://127.0.0.1:9/ops"


def idle_steps() -> tuple[list[dict[str, Any]], str]:
    steps = request_events({}, POLICY, cluster="c1", team="vision", generation="hopper", gpus=2, nodes=[],
                           start_ms=T0, end_ms=T0 + HOUR_MS, reason="launch", requester="alice", now_ms=T0)
    rid = steps[0]["reservation_id"]
    warned = due(fold(steps, POLICY)[0], T0 + 4 * MINUTE_MS, (), {rid: 3}, POLICY).events
    released = due(fold([*steps, *warned], POLICY)[0], T0 + 6 * MINUTE_MS, (), {rid: 5}, POLICY).events
    return [*steps, *warned, *released], rid


def test_the_idle_warning_and_the_early_release_go_to_the_teams_route_once() -> None:
    sent: list[tuple[str, str, str]] = []
    chat = ChatSettings(teams={"vision": ChatRoute(url=VISION, channel="#vision")}, default=ChatRoute(url=OPS))
    notifier = ReservationNotifier(chat, sender=lambda url, title, body: sent.append((url, title, body)) is None)
    steps, rid = idle_steps()
    statuses = [(e["event_type"], notifier.handle(e).status) for e in steps]
    assert statuses == [("REQUESTED", "skipped-kind"), ("APPROVED", "skipped-kind"), ("IDLE_WARNED", "sent"),
                        ("RELEASED", "sent")]  # fmt: skip
    assert [url.split("?")[0].split("#")[0] for url, _, _ in sent] == [VISION, VISION]
    assert sent[0][1] == f"[gpuledger] Reservation {rid} idle: its GPUs idle for 3 min (team vision, 2 hopper GPUs)"
    assert sent[1][1] == f"[gpuledger] Reservation {rid} released early: idle 5 min: released early (team vision, " \
                         "2 hopper GPUs)"  # fmt: skip
    assert "the team's statement charges the reservation up to then, not to its end" in sent[1][2]
    assert notifier.handle(steps[3]).status == "duplicate"  # redelivered: posted once
    again = ReservationNotifier(chat, sender=lambda *a: sent.append(a) is None,
                                already_sent=[steps[2]["event_id"], steps[3]["event_id"]])  # fmt: skip
    assert [again.handle(e).status for e in steps[2:]] == ["duplicate", "duplicate"]  # across a restart
    assert len(sent) == 2


def test_a_release_by_a_person_is_not_posted_and_without_a_route_nothing_is() -> None:
    sent: list[Any] = []
    steps, rid = idle_steps()
    by_alice = release_event(fold(steps[:2], POLICY)[0], POLICY, rid, "alice", T0 + MINUTE_MS)
    chat = ChatSettings(teams={"vision": ChatRoute(url=VISION)})
    notifier = ReservationNotifier(chat, sender=lambda *a: sent.append(a) is None)
    assert notifier.handle(by_alice).status == "skipped-kind" and sent == []
    nowhere = ReservationNotifier(ChatSettings(), sender=lambda *a: sent.append(a) is None)
    assert nowhere.handle(steps[2]).status == "no-route" and sent == []
