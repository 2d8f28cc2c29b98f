"""The team page's statement lines scoped to its team (sinks/statement_store.py, `team=`): for every team, exactly
the lines of the unscoped `pending_lines` (the open month's page) and `adjustments_since` (the closed month's)
that name it, in the same order, with the same cents, read from the jobs that touch the team only.

The case that needs the scope to be by job, not by line: after March closes, a job frozen under team A gets
late minutes attributed to team B, and a correction moves it to another project. Its adjustment lines name
the correction on both sides, because the job's frozen line (team A) shows the correction is new; B's side read
from B's lines alone would have no frozen line for the job, and call its line late data.
"""

from __future__ import annotations

from typing import Any

import pytest
from fixtures_web import PERIOD, SMALL, run_cli, small_ledger

from base.settings import ClickHouseSettings
from producers.corrections import correction_record
from producers.simulator import expected_ledger
from schemas import topics

pytestmark = pytest.mark.integration
__all__ = ["small_ledger"]
NEXT = "2026-04"


def late_minute(row: dict[str, Any], team: str, start_ms: int) -> dict[str, Any]:
    """A device-minute of the job in `row` on a device it did not have, attributed to `team`."""
    return {
        **row, "device_uuid": "GPU-late-scope", "mig_instance_id": None, "minute_start_ms": start_ms, "team": team,
        "unallocated_s": 0, "allocated_s": 60, "active_s": 60, "starved_s": 0, "idle_s": 0, "dark_s": 0,
        "sm_weighted_s": 30.0, "sample_count": 60, "activity_mean_ratio": None, "activity_max_ratio": None,
        "fb_used_mib_max": None, "power_w_mean": None,
    }  # fmt: skip


def test_a_teams_pending_lines_are_the_unscoped_ones_of_its_jobs(small_ledger: ClickHouseSettings) -> None:
    from sinks.db import connect
    from sinks.rows import SINKS
    from sinks.statement_store import StatementStore, adjustments_since, pending_lines
    from sinks.writer import LedgerWriter, Origin, Pending

    ch = small_ledger
    ledger = expected_ledger(SMALL)
    job = max(ledger.values(), key=lambda j: j.allocated_s)
    team_a = job.team
    team_b = next(j.team for j in sorted(ledger.values(), key=lambda j: j.job_id) if j.team != team_a)
    run_cli(ch, "period", "close", PERIOD, "--by", "finance-tester")

    # After the close: late minutes of the job attributed to team B, and a correction of its project.
    writer = connect(ch)
    cols = ("cluster", "node", "minute_start_ms", "model", "generation", "job_id", "user", "project", "team",
            "cost_centre", "preemptible", "pricing_tier", "mapping_version", "classifier_version")  # fmt: skip
    found = writer.query(f"SELECT {', '.join(cols)} FROM device_minutes WHERE job_id = {{j:String}} "
                         "ORDER BY minute_start_ms LIMIT 1", parameters={"j": job.job_id}).result_rows  # fmt: skip
    first = dict(zip(cols, found[0], strict=True))
    (spec,) = SINKS[topics.DEVICE_MINUTES.name]
    late = [late_minute(first, team_b, first["minute_start_ms"] + i * 60_000) for i in range(5)]
    target = "infra-bench" if job.project != "infra-bench" else "asr"
    record = correction_record("sim", job.job_id, target, "late relabel", "tester", job.project, 1_900_000_000_000)
    (fix,) = SINKS["attribution.corrections.v1"]
    pending = [Pending(spec, row, Origin("late", 0, i)) for i, r in enumerate(late) for row in spec.rows(r)]
    pending += [Pending(fix, row, Origin("c", 0, 0)) for row in fix.rows(record)]
    written = LedgerWriter(writer).write(pending)
    assert not written.rejected, written.rejected[:3]
    writer.close()

    store = StatementStore(connect(ch, analyst=True))
    everyone = pending_lines(store, NEXT)
    teams = {line.team for line in everyone}
    assert {team_a, team_b} <= teams
    since = adjustments_since(store, PERIOD)  # the closed month's page: its changes since the close
    assert {w for w, _ in since} == {"open"} and {line for _, line in since} == set(everyone)  # none posted yet
    for team in sorted(teams):
        scoped = pending_lines(store, NEXT, team=team)
        assert scoped == [line for line in everyone if line.team == team], team
        assert adjustments_since(store, PERIOD, team) == [(w, line) for w, line in since if line.team == team], team
    # The moved job on both sides, each naming the correction (B's from A's frozen line of the job).
    ref = record["correction_id"]
    for team in (team_a, team_b):
        mine = [line for line in pending_lines(store, NEXT, team=team) if line.job_id == job.job_id]
        assert mine and {(line.cause_kind, line.cause_ref) for line in mine} == {("correction", ref)}
    b_side = [line for line in everyone if line.job_id == job.job_id and line.team == team_b]
    assert [line.allocated_s for line in b_side] == [300]
    # The reads are the team's jobs, not the month's: fewer segments and frozen lines than the whole month.
    assert len(store.segments(PERIOD, team_b)) < len(store.segments(PERIOD))
    assert len(store.frozen_lines(PERIOD, team_b)) < len(store.frozen_lines(PERIOD))


def test_a_teams_closed_statement_read_alone_is_its_line_of_every_teams(small_ledger: ClickHouseSettings) -> None:
    """`StatementStore.statements(period, team, lines=...)`: the team page reads its team's statement alone, and
    of its lines only those that are not usage (or none): the same statement as the unscoped read's, less the
    lines left out."""
    from dataclasses import replace

    from sinks.db import connect
    from sinks.statement_store import StatementStore

    run_cli(small_ledger, "period", "close", PERIOD, "--by", "finance-tester")
    store = StatementStore(connect(small_ledger, analyst=True))
    everyone = store.statements(PERIOD)
    assert len(everyone) > 1 and all(s.lines for s in everyone)
    for whole in everyone:
        assert store.statements(PERIOD, whole.team) == [whole]
        (other,) = store.statements(PERIOD, whole.team, lines="other")
        assert other == replace(whole, lines=tuple(line for line in whole.lines if line.kind != "usage"))
        (bare,) = store.statements(PERIOD, whole.team, lines="none")
        assert bare == replace(whole, lines=()) and bare.quality is not None
    assert store.statements(PERIOD, "no-such-team") == []
    assert store.frozen_quality(PERIOD) is not None
