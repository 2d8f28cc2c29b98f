"""`processors.whatif.run_classes` is the classifier's own answer for every job-minute: it reads signs only."""

from __future__ import annotations

import random
from typing import Any

from processors.classify import JobMinuteClass, classify_job_minute
from processors.whatif import RUN_CODES, run_classes


def test_run_classes_agree_with_the_classifier_on_any_seconds() -> None:
    table = run_classes()
    rng = random.Random(43)
    for _ in range(20_000):
        active, starved, idle = (rng.choice((0, 0, rng.randint(1, 60 * 64))) for _ in range(3))
        bits = (active > 0) * 4 + (starved > 0) * 2 + (idle > 0)
        cls = classify_job_minute(active, starved, idle)
        assert table[bits] == RUN_CODES[cls], (active, starved, idle)
    assert set(table) == set(RUN_CODES.values()) == {RUN_CODES[c] for c in JobMinuteClass}


def test_a_reservation_the_proposal_refuses_is_listed_with_the_rules_words() -> None:
    from producers.simulator.org import sim_policy_text
    from schemas.governance_reservations import fold, request_events
    from schemas.policy import parse_policy
    from sinks.whatif import month_bounds, reservations_changed

    in_force = parse_policy(sim_policy_text())
    rules = in_force.governance.reservations.model_copy(update={"max_hours": 2})
    governance = in_force.governance.model_copy(update={"reservations": rules})
    proposal = in_force.model_copy(update={"governance": governance})
    team = next(t for t in in_force.teams if t.members and t.quota)
    gen = next(iter(team.quota))
    start, end = month_bounds("2026-03")
    events: list[dict[str, object]] = []
    for hours, now in ((4, start + 3_600_000), (1, start + 7 * 3_600_000)):
        held, _ = fold(events, in_force)
        events += request_events(held, in_force, cluster="sim", team=team.name, generation=gen, gpus=1, nodes=(),
                                 start_ms=now, end_ms=now + hours * 3_600_000, reason="bench",
                                 requester=team.members[0], now_ms=now)  # fmt: skip
    rows = reservations_changed(events, in_force, proposal, start, end)
    assert len(rows) == 1 and rows[0]["whatif"] == "refused" and rows[0]["team"] == team.name
    assert "at most 2 hours" in rows[0]["why"]
    assert reservations_changed(events, in_force, in_force, start, end) == []  # in force: nothing changes


def _with_idle(policy: Any, warn: int | None, release: int | None) -> Any:
    rules = policy.governance.reservations.model_copy(update={"idle_warn_minutes": warn,
                                                              "idle_release_minutes": release})  # fmt: skip
    return policy.model_copy(update={"governance": policy.governance.model_copy(update={"reservations": rules})})


def test_reservations_released_for_idleness_are_replayed_by_the_services_own_rule() -> None:
    """The live service (`due` every 30 s over `idle_minutes_at`) warns and releases a reservation whose team
    stopped computing; a proposal with other idle limits replays those steps with the same two functions, at the
    first moment a pass could take them; the limits in force keep the steps the service took."""
    from producers.simulator.org import sim_policy_text
    from schemas.governance_reservations import (
        MINUTE_MS,
        SERVICE_ACTOR,
        due,
        fold,
        idle_minutes_at,
        request_events,
    )
    from schemas.policy import parse_policy
    from sinks.whatif import month_bounds, replay_idle, reservations_changed

    in_force = _with_idle(parse_policy(sim_policy_text()), 30, 60)
    team = next(t for t in in_force.teams if t.members and t.quota)
    gen = next(iter(team.quota))
    start, end = month_bounds("2026-03")
    begin = start + 3_600_000
    events: list[dict[str, Any]] = request_events({}, in_force, cluster="sim", team=team.name, generation=gen, gpus=1,
                                                  nodes=(), start_ms=begin, end_ms=begin + 4 * 3_600_000,
                                                  reason="bench", requester=team.members[0], now_ms=begin)  # fmt: skip
    computed = [begin + i * MINUTE_MS for i in range(20)]  # then idle
    rid = str(events[0]["reservation_id"])
    now = begin + 7_000  # the live service: a pass every 30 s, the minutes seen once they have ended
    while now < begin + 3 * 3_600_000:
        held, _ = fold(events, in_force)
        seen = [m for m in computed if m + MINUTE_MS <= now]
        idle = idle_minutes_at(held[rid], seen[-1] if seen else None, now)
        events += due(held, now, (), {rid: idle}, in_force).events
        now += 30_000
    idle_kinds = ("IDLE_WARNED", "RELEASED")
    live = {e["event_type"]: int(e["ts_ms"]) for e in events if e["event_type"] in idle_kinds}
    assert {e["actor"] for e in events if e["event_type"] in idle_kinds} == {SERVICE_ACTOR}
    idle_from = computed[-1] + MINUTE_MS
    assert idle_from + 30 * MINUTE_MS <= live["IDLE_WARNED"] < idle_from + 30 * MINUTE_MS + 30_000
    assert idle_from + 60 * MINUTE_MS <= live["RELEASED"] < idle_from + 60 * MINUTE_MS + 30_000

    # the same limits replayed: the service's steps at the earliest moment a pass could take them
    again = {e["event_type"]: int(e["ts_ms"]) for e in replay_idle(events, in_force, {rid: computed}, end)
             if e["event_type"] in idle_kinds}  # fmt: skip
    assert again == {"IDLE_WARNED": idle_from + 30 * MINUTE_MS, "RELEASED": idle_from + 60 * MINUTE_MS}
    assert reservations_changed(events, in_force, in_force, start, end, {rid: computed}) == []  # steps kept

    sooner = _with_idle(in_force, 10, 45)
    [row] = reservations_changed(events, in_force, sooner, start, end, {rid: computed})
    assert row["actual"] == "released" and row["end_utc"] == "2026-03-01 02:20"  # 01:00, 20 min computed, 60 idle
    assert row["whatif"] == "released until 2026-03-01 02:05" and row["why"] == "idle 45 min: released early"
    [row] = reservations_changed(events, in_force, _with_idle(in_force, None, None), start, end, {rid: computed})
    assert row["whatif"] == "approved until 2026-03-01 05:00" and row["why"] == ""  # held to its end
    # computing again before the proposal's limit is reached: not released
    busy = computed + [idle_from + 40 * MINUTE_MS + i * MINUTE_MS for i in range(200)]
    [row] = reservations_changed(events, in_force, _with_idle(in_force, 30, 45), start, end, {rid: busy})
    assert row["whatif"] == "approved until 2026-03-01 05:00"


def test_the_month_and_its_lookback_are_read_one_partition_each() -> None:
    """`minutes_between`: a branch per calendar month the window touches, each naming the partition id that
    `PARTITION BY toYYYYMM(day)` gives it (the lookback of March 2026 starts on 29 January)."""
    from sinks.whatif import LOOKBACK_MS, minutes_between, month_bounds

    start, end = month_bounds("2026-03")
    params: dict[str, Any] = {"from": start - LOOKBACK_MS, "end": end}
    sql = minutes_between(params, "from", "end")
    assert sorted(v for k, v in params.items() if "_partition_" in k) == ["202601", "202602", "202603"]
    assert sql.count("FINAL") == 3 and sql.count("UNION ALL") == 2
    params = {"start": start, "end": end}
    minutes_between(params, "start", "end")
    assert [v for k, v in params.items() if "_partition_" in k] == ["202603"]
