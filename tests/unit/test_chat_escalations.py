"""Escalation steps in chat (sinks/chat_escalations.py) without a broker: asked, granted, denied, lapsed and ended go
to the job's team route once each, with what they mean; a step the rules do not count is not posted, nor anything
without a policy or a route. The live path: tests/integration/test_chat_webhook.py."""

from __future__ import annotations

from typing import Any

from base.settings import ChatRoute, ChatSettings
from schemas.governance_escalations import Job, applied_event, ask_event, decide_event, due, fold, reverted_event
from schemas.policy import parse_policy
from sinks.chat_escalations import EscalationBook, EscalationNotifier

T0 = 1_796_000_000_000
HOUR = 3_600_000
POLICY = parse_policy("""
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: production, priority: 1000}, {name: std, priority: 100}]
governance:
  operators: [ops1]
  escalations: {tier: production, deciders: [boss], decide_within_hours: 4, max_hours: 8}
teams: [{name: vision, slurm_account: acct-vision, members: [alice]}]
""")
JOB = Job("c1", "4242", "alice", "acct-vision", 2)  # on Slurm the ledger may know the account only
VISION, OPS = "json://127.0.0.1:9/vision", "json://127.0.0.1:9/ops"
CHAT = ChatSettings(teams={"vision": ChatRoute(url=VISION, channel="#vision")}, default=ChatRoute(url=OPS))


def granted_and_ended() -> list[dict[str, Any]]:
    asked = ask_event({}, POLICY, JOB, "alice", 2, "paper deadline", T0)
    eid = asked["escalation_id"]
    granted = decide_event(fold([asked], POLICY)[0], POLICY, eid, "boss", True, "go", T0 + 60_000)
    esc = fold([asked, granted], POLICY)[0][eid]
    applied = applied_event(esc, "SLURM", "std", T0 + 90_000, "raised to production (was std)")
    raised = fold([asked, granted, applied], POLICY)[0][eid]
    ended = reverted_event(raised, int(granted["until_ms"]), "fell back to std: scontrol update jobid=4242 QOS=std")
    return [asked, granted, applied, ended]


def notifier(events: list[dict[str, Any]], chat: ChatSettings = CHAT,
             **kw: Any) -> tuple[EscalationNotifier, list[tuple[str, str, str]]]:  # fmt: skip
    sent: list[tuple[str, str, str]] = []
    book = EscalationBook(lambda: events, POLICY)

    def send(url: str, title: str, body: str) -> bool:
        sent.append((url, title, body))
        return True

    return EscalationNotifier(chat, book=book, policy=POLICY, sender=send, **kw), sent


def test_asked_granted_and_ended_go_to_the_teams_channel_once_each() -> None:
    steps = granted_and_ended()
    eid = steps[0]["escalation_id"]
    n, sent = notifier(steps)
    assert [(e["event_type"], n.handle(e).status) for e in steps] == [
        ("REQUESTED", "sent"), ("GRANTED", "sent"), ("APPLIED", "skipped-kind"), ("REVERTED", "sent")]  # fmt: skip
    # the account the ledger knows is the policy's team vision: its route, not the default
    assert [url.split("?")[0].split("#")[0] for url, _, _ in sent] == [VISION] * 3
    (_, asked_t, asked_b), (_, granted_t, granted_b), (_, ended_t, ended_b) = sent
    assert asked_t == f"[gpuledger] Escalation {eid} asked: job 4242 on c1 to production for 2 h"
    assert "asked by alice at 2026-11-30T" in asked_b and ": paper deadline" in asked_b
    assert f"(boss): gpuledger escalate decide {eid} --grant|--deny" in asked_b and "/escalations" in asked_b
    assert "owner: user alice, team vision, 2 GPUs" in asked_b
    until = steps[1]["until_ms"]
    assert until == T0 + 60_000 + 2 * HOUR
    assert granted_t.startswith(f"[gpuledger] Escalation {eid} granted: job 4242 on c1 runs at production until ")
    assert "granted by boss: go" in granted_b
    assert ended_t == f"[gpuledger] Escalation {eid} ended: job 4242 on c1"
    assert "fell back to std: scontrol update jobid=4242 QOS=std" in ended_b
    assert n.handle(steps[1]).status == "duplicate"  # redelivered: posted once
    again, resent = notifier(steps, already_sent=[e["event_id"] for e in steps])
    assert [again.handle(e).status for e in steps] == ["duplicate", "duplicate", "skipped-kind", "duplicate"]
    assert resent == []  # across a restart (the journal's ids)


def test_denied_and_lapsed_say_the_job_keeps_its_priority() -> None:
    asked = ask_event({}, POLICY, JOB, "alice", 2, "demo", T0)
    denied = decide_event(fold([asked], POLICY)[0], POLICY, asked["escalation_id"], "boss", False, "not now", T0 + 1)
    n, sent = notifier([asked, denied])
    assert n.handle(denied).status == "sent"
    assert "denied by boss: not now" in sent[0][2] and "the job keeps its priority" in sent[0][2]
    other = ask_event({}, POLICY, Job("c1", "77", "alice", "vision", 1), "alice", 1, "x", T0)
    (lapsed,) = due(fold([other], POLICY)[0], T0 + 4 * HOUR).lapsed
    n, sent = notifier([other, lapsed])
    assert n.handle(lapsed).status == "sent"
    assert "lapsed: job 77 on c1, undecided past its deadline" in sent[0][1]


def test_a_step_the_rules_refuse_is_not_posted_nor_anything_without_a_policy_or_route() -> None:
    asked = ask_event({}, POLICY, JOB, "alice", 2, "demo", T0)
    # a grant written past the commands by someone who may not decide
    granted = decide_event(fold([asked], POLICY)[0], POLICY, asked["escalation_id"], "boss", True, "ok", T0 + 1)
    forged = {**granted, "actor": "alice", "event_id": "forged"}
    n, sent = notifier([asked, forged])
    assert n.handle(forged).status == "refused" and sent == []
    blind = EscalationNotifier(CHAT, book=None, policy=None, sender=lambda *a: sent.append(a) is None)
    assert blind.handle(asked).status == "no-policy" and sent == []
    n, sent = notifier([asked], chat=ChatSettings())
    assert n.handle(asked).status == "no-route" and sent == []
