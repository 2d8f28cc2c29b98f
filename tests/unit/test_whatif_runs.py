"""`processors.whatif.run_classes` is the classifier's own answer for every job-minute: it reads signs only."""

from __future__ import annotations

import random

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
