"""Appeals (schemas/governance_appeals.py): who may file and decide, once, within the policy's limits; what a
sequence of steps means, forged or replayed steps included; the contract's bounds on a step. On the real broker
and ClickHouse with the statements: tests/integration/test_appeals_credit.py."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import ConfigError
from schemas.governance_appeals import (
    HOUR_MS,
    Subject,
    clean_text,
    decide_event,
    escalations,
    file_event,
    fold,
    parse_amount,
)
from schemas.models import validate
from schemas.policy import parse_policy

POLICY = parse_policy("""
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: research, priority: 100}]
governance:
  operators: [ops1, ops2]
  appeals: {deadline_hours: 72, window_days: 30, max_credit: "100.00", max_exemption_hours: 48}
teams:
  - {name: vision, members: [alice, bob]}
  - {name: nlp, members: [carol]}
""")
T0 = 1_790_000_000_000
SUBJECT = Subject("c1", "4242", "al-1", "alice", "vision", "p-v", "2026-09", T0)


def filed(**kw: Any) -> dict[str, Any]:
    return file_event({}, POLICY, kw.pop("subject", SUBJECT), kw.pop("by", "alice"), "lost 11 hours", T0 + HOUR_MS)


def test_filing_checks_who_when_and_one_open_appeal_per_alert() -> None:
    event = filed()
    assert event["deadline_ms"] == T0 + HOUR_MS + 72 * HOUR_MS and event["appeal_id"].startswith("ap-")
    validate("appeals", event)
    assert file_event({}, POLICY, SUBJECT, "bob", "same team", T0)["actor"] == "bob"  # a team member
    assert file_event({}, POLICY, SUBJECT, "ops2", "for her", T0)["actor"] == "ops2"  # an operator
    appeals, _ = fold([event], POLICY)
    for args, needle in (
        ((appeals, SUBJECT, "alice", "again"), "still open"),
        (({}, SUBJECT, "carol", "not mine"), "may not appeal job 4242"),
        (({}, SUBJECT, "alice", "   "), "--reason must not be empty"),
        (({}, SUBJECT, "alice", "x" * 2001), "at most 2000"),
        (({}, SUBJECT, "alice", "bell\x07"), "control characters"),
    ):
        with pytest.raises(ConfigError, match=needle):
            file_event(args[0], POLICY, args[1], args[2], args[3], T0)
    with pytest.raises(ConfigError, match="within 30 days"):
        file_event({}, POLICY, SUBJECT, "alice", "late", T0 + 31 * 24 * HOUR_MS)


def test_decided_once_by_a_decider_who_did_not_file_it() -> None:
    event = filed()
    appeals, _ = fold([event], POLICY)
    aid = event["appeal_id"]
    credit = decide_event(appeals, POLICY, aid, "ops1", "CREDIT", "checkpoint lost", T0 + 2 * HOUR_MS,
                          credit_cents=1500)  # fmt: skip
    validate("appeals", credit)
    for who, decision, kw, needle in (
        ("alice", "DENIED", {}, "may not decide appeals"),
        ("ops1", "CREDIT", {"credit_cents": 10_001}, "outside 0..100.00"),
        ("ops1", "CREDIT", {}, "needs --amount"),
        ("ops1", "EXEMPTION", {"exemption_hours": 49}, "at most 48 hours"),
    ):
        with pytest.raises(ConfigError, match=needle):
            decide_event(appeals, POLICY, aid, who, decision, "note", T0 + 3 * HOUR_MS, **kw)
    with pytest.raises(ConfigError, match="no appeal 'ap-nope'"):
        decide_event(appeals, POLICY, "ap-nope", "ops1", "DENIED", "n", T0)
    decided, ignored = fold([event, credit], POLICY)
    assert decided[aid].decision == "CREDIT" and decided[aid].credit_cents == 1500 and not ignored
    with pytest.raises(ConfigError, match="already decided \\(CREDIT by ops1\\)"):
        decide_event(decided, POLICY, aid, "ops2", "DENIED", "no", T0 + 4 * HOUR_MS)
    # An operator who filed an appeal does not decide it.
    own = file_event({}, POLICY, SUBJECT, "ops1", "mine", T0)
    with pytest.raises(ConfigError, match="filed appeal"):
        decide_event(fold([own], POLICY)[0], POLICY, own["appeal_id"], "ops1", "DENIED", "n", T0 + 1)


def test_forged_and_replayed_steps_change_nothing() -> None:
    event = filed()
    aid = event["appeal_id"]
    forged = {**event, "event_id": "forged", "event_type": "DECIDED", "actor": "alice", "decision": "CREDIT",
              "credit_cents": 9_999_999, "ts_ms": T0 + 2 * HOUR_MS, "deadline_ms": None}  # fmt: skip
    real = decide_event(fold([event], POLICY)[0], POLICY, aid, "ops1", "DENIED", "the job was idle", T0 + 3 * HOUR_MS)
    late = {**real, "event_id": "second", "actor": "ops2", "decision": "CREDIT", "credit_cents": 100,
            "ts_ms": T0 + 4 * HOUR_MS}  # fmt: skip
    appeals, ignored = fold([late, real, forged, event, real, event], POLICY)  # any order, repeats
    assert appeals[aid].decision == "DENIED" and appeals[aid].credit_cents is None
    assert [i.event_id for i in ignored] == ["forged", "second"]
    assert "may not decide" in ignored[0].why and "already decided" in ignored[1].why
    orphan = {**real, "appeal_id": "ap-unknown", "event_id": "o"}
    assert fold([orphan], POLICY)[1][0].why.startswith("DECIDED of unknown appeal")


def test_overdue_appeals_are_escalated_once() -> None:
    event = filed()
    appeals, _ = fold([event], POLICY)
    assert escalations(appeals, event["deadline_ms"] - 1) == []
    (esc,) = escalations(appeals, event["deadline_ms"])
    validate("appeals", esc)
    assert esc["event_type"] == "ESCALATED" and esc["actor"] == "gpuledger-appeals"
    assert escalations(appeals, event["deadline_ms"] + 999)[0]["event_id"] == esc["event_id"]  # idempotent
    escalated, _ = fold([event, esc], POLICY)
    assert escalated[event["appeal_id"]].state == "ESCALATED" and escalations(escalated, esc["ts_ms"] + 1) == []
    decided = decide_event(escalated, POLICY, event["appeal_id"], "ops1", "EXEMPTION", "ok", esc["ts_ms"] + 1,
                           exemption_hours=24)  # fmt: skip
    done, _ = fold([event, esc, decided], POLICY)
    assert done[event["appeal_id"]].state == "DECIDED"
    assert done[event["appeal_id"]].exemption_until_ms == esc["ts_ms"] + 1 + 24 * HOUR_MS


def test_amounts_and_texts_are_bounded() -> None:
    from decimal import Decimal

    assert parse_amount("12.34", Decimal("100")) == 1234
    for bad, needle in (("0", "positive"), ("-1", "positive"), ("1.234", "2 decimals"), ("NaN", "positive"),
                        ("1e400", "above"), ("ten", "money like"), ("100.01", "above")):  # fmt: skip
        with pytest.raises(ConfigError, match=needle):
            parse_amount(bad, Decimal("100"))
    assert clean_text("  keep\nlines\tand tabs ", "x") == "keep\nlines\tand tabs"
    from schemas.codec import InvalidRecord

    for change in ({"text": "x" * 2001}, {"actor": "a" * 257}, {"event_type": "DECIDED"},
                   {"decision": "CREDIT", "credit_cents": 0}):  # fmt: skip
        with pytest.raises(InvalidRecord):
            validate("appeals", {**filed(), **change})
