"""Which attribution baseline is in force, and what `policy apply` records (schemas/governance_baseline.py): pure."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from schemas.governance_baseline import (
    Decision,
    attribution_mode,
    baseline_event,
    day_start_ms,
    decide,
    in_force,
    policy_sha256,
)
from schemas.models import validate
from schemas.policy import AttributionRules, PolicyError, parse_policy

EXAMPLE = (Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml").read_text(encoding="utf-8")
MAR1 = dt.date(2026, 3, 1)
NOON_MAR_10 = day_start_ms(dt.date(2026, 3, 10)) + 12 * 3600 * 1000


def event(decision: Decision, ts_ms: int, mode: str = "strict") -> dict[str, object]:
    return baseline_event(decision, mode=mode, now_ms=ts_ms, actor="ops1", cluster="c1", engine="slurm",
                          policy_hash="0" * 64)  # fmt: skip


def test_a_strict_policy_sets_the_day_it_is_first_applied_and_reapplying_writes_nothing() -> None:
    rules = AttributionRules(mode="strict")
    first = decide(rules, "strict", None, NOON_MAR_10)
    assert first == Decision("SET", "STRICT_MODE", dt.date(2026, 3, 10))
    events = [event(first, NOON_MAR_10)]
    current = in_force(events)
    assert current is not None and current.day == dt.date(2026, 3, 10) and current.source == "STRICT_MODE"
    assert current.start_ms == day_start_ms(dt.date(2026, 3, 10))
    # The same policy, applied again a week later: the first day stays, nothing is written.
    assert decide(rules, "strict", current, NOON_MAR_10 + 7 * 86_400_000) is None


def test_the_mode_from_the_settings_counts_when_the_policy_states_none() -> None:
    assert decide(AttributionRules(), "grace", None, NOON_MAR_10) is None
    assert decide(AttributionRules(), "strict", None, NOON_MAR_10) == Decision("SET", "STRICT_MODE",
                                                                                  dt.date(2026, 3, 10))


def test_a_policy_date_wins_and_a_later_policy_that_moves_it_writes_a_new_event_that_is_in_force() -> None:
    strict = event(Decision("SET", "STRICT_MODE", dt.date(2026, 3, 10)), NOON_MAR_10)
    current = in_force([strict])
    dated = decide(AttributionRules(baseline=MAR1), "grace", current, NOON_MAR_10 + 1000)
    assert dated == Decision("SET", "POLICY_DATE", MAR1)
    moved = event(dated, NOON_MAR_10 + 1000, "grace")
    now = in_force([moved, strict])  # the order given does not matter: the latest by ts_ms is in force
    assert now is not None and now.day == MAR1 and now.source == "POLICY_DATE"
    assert decide(AttributionRules(baseline=MAR1), "strict", now, NOON_MAR_10 + 2000) is None  # same day: nothing


def test_back_to_grace_without_a_date_clears_it_and_nothing_more() -> None:
    current = in_force([event(Decision("SET", "POLICY_DATE", MAR1), NOON_MAR_10)])
    rules = AttributionRules(mode="grace")
    cleared = decide(rules, attribution_mode(rules, "strict"), current, NOON_MAR_10 + 1)  # the policy's mode wins
    assert cleared == Decision("CLEARED", "GRACE_MODE", None)
    assert in_force([event(Decision("SET", "POLICY_DATE", MAR1), NOON_MAR_10), event(cleared, NOON_MAR_10 + 1)]) is None
    assert decide(AttributionRules(mode="grace"), "grace", None, NOON_MAR_10) is None
    assert in_force([]) is None


def test_ties_in_time_are_broken_by_event_id_so_every_reader_agrees() -> None:
    a = event(Decision("SET", "POLICY_DATE", MAR1), NOON_MAR_10)
    b = event(Decision("SET", "POLICY_DATE", dt.date(2026, 4, 1)), NOON_MAR_10)
    winner = max((a, b), key=lambda e: str(e["event_id"]))
    assert in_force([a, b]) == in_force([b, a]) and in_force([a, b]).event_id == winner["event_id"]  # type: ignore


def test_the_event_is_a_valid_contract_record_with_a_deterministic_id() -> None:
    e = event(Decision("SET", "STRICT_MODE", dt.date(2026, 3, 10)), NOON_MAR_10)
    validate("attribution.baseline", e)
    assert e["baseline_start_ms"] == day_start_ms(dt.date(2026, 3, 10)) and e["attribution_mode"] == "STRICT"
    assert e == event(Decision("SET", "STRICT_MODE", dt.date(2026, 3, 10)), NOON_MAR_10)
    assert e["event_id"] != event(Decision("SET", "STRICT_MODE", dt.date(2026, 3, 10)), NOON_MAR_10 + 1)["event_id"]
    validate("attribution.baseline", event(Decision("CLEARED", "GRACE_MODE", None), NOON_MAR_10, "grace"))


def test_the_policy_hash_ignores_layout_and_comments() -> None:
    a = parse_policy(EXAMPLE + "attribution: {mode: strict}\n")
    b = parse_policy(EXAMPLE + "# the baseline\nattribution:\n  mode: strict\n")
    assert policy_sha256(a) == policy_sha256(b) != policy_sha256(parse_policy(EXAMPLE))


@pytest.mark.parametrize(("text", "problem"), [
    ("attribution: {baseline: 2026-13-01}", "attribution.baseline: Input should be a valid date"),
    ("attribution: {baseline: 1700000000}", "attribution.baseline: Value error, a day as YYYY-MM-DD"),
    ("attribution: {baseline: 2026-03-01T10:00:00}", "attribution.baseline: Value error, a day as YYYY-MM-DD"),
    ("attribution: {baseline: 1999-12-31}", "attribution.baseline 1999-12-31 is outside 2000-01-01..2100-12-31"),
    ("attribution: {mode: lax}", "attribution.mode: Input should be 'grace' or 'strict'"),
    ("attribution: {since: 2026-03-01}", "attribution.since: Extra inputs are not permitted"),
])  # fmt: skip
def test_a_bad_attribution_section_is_one_line_with_its_file_and_line(text: str, problem: str) -> None:
    line = EXAMPLE.count("\n") + 2
    with pytest.raises(PolicyError) as caught:
        parse_policy(EXAMPLE + "\n" + text + "\n", "policy.yaml")
    assert len(caught.value.problems) == 1
    assert caught.value.problems[0].startswith(f"policy.yaml:{line}: {problem}"), caught.value.problems


def test_a_stated_day_parses_as_yaml_or_quoted_text() -> None:
    assert parse_policy(EXAMPLE + "attribution: {baseline: 2026-03-01}\n").attribution.baseline == MAR1
    assert parse_policy(EXAMPLE + "attribution: {baseline: '2026-03-01'}\n").attribution.baseline == MAR1
    assert parse_policy(EXAMPLE).attribution == AttributionRules()
