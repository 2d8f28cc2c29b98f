"""Job identity survives id reuse, on the embedded ClickHouse: job 7 of cluster c1 is three jobs (the scheduler
was reinstalled twice and counted from 1 again), told apart by their submit times. Two of them ran on one day
for one user and project, so one usage_daily row holds both; `report explain` still gives each its own line,
identified by its start, with its own GPU-seconds and charge, and the month's totals are what they were.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from contract_records import job_event
from test_chargeback_ledger import device_minute, ledger_settings, ms, run_cli  # noqa: F401  (fixture)

from base.settings import ClickHouseSettings
from schemas import topics
from sinks import chargeback as cb
from sinks.db import connect
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

# life: job id, user, team, project, cost centre, submit, start, end, device, class, minutes
LIVES = [
    ("7", "alice", "vision", "p-vision", "CC-100", "2026-11-10T08:00", "2026-11-10T09:00", "2026-11-10T10:00",
     "GPU-a", "active", 60),
    ("7", "alice", "vision", "p-vision", "CC-100", "2026-11-10T10:10", "2026-11-10T10:30", "2026-11-10T11:00",
     "GPU-a", "idle", 30),  # the same day, user and project: one usage_daily row with the life before
    ("7", "bob", "nlp", "p-nlp", "CC-200", "2026-11-19T22:00", "2026-11-19T23:30", "2026-11-20T00:15",
     "GPU-b", "starved", 45),  # its second day (no life started on it) is read from usage_daily
    ("8", "alice", "vision", "p-vision", "CC-100", "2026-11-10T08:00", "2026-11-10T12:00", "2026-11-10T12:20",
     "GPU-b", "active", 20),  # an id used once
]  # fmt: skip


def rows_of(life: tuple[Any, ...]) -> list[dict[str, Any]]:
    job, user, team, project, cc, _submit, start, _end, uuid, cls, count = life
    out = []
    for i in range(count):
        row = device_minute(None, "n1", uuid, ms(start) + i * 60_000, cls)
        row.update(job_id=job, user=user, team=team, project=project, cost_centre=cc, unallocated_s=0,
                   allocated_s=60, sample_count=0 if cls == "dark" else 60, **{f"{cls}_s": 60})  # fmt: skip
        out.append(row)
    return out


def write(ch: ClickHouseSettings, *, events: bool = True, lives_order: list[int] | None = None) -> None:
    """The lives' device-minutes and job events, in one insert; with `lives_order`, each life's events in an insert
    of their own, in that order, after the minutes."""
    (dm,) = SINKS[topics.DEVICE_MINUTES.name]
    ev_spec, _identities = SINKS[topics.JOB_EVENTS.name]
    pending = [Pending(dm, row, Origin("m", 0, i)) for i, r in enumerate(r for life in LIVES for r in rows_of(life))
               for row in dm.rows(r)]  # fmt: skip
    if events and lives_order is None:
        pending += [p for n in range(len(LIVES)) for p in _life_events(ev_spec, n)]
    inserts = [pending] + [_life_events(ev_spec, n) for n in (lives_order or ()) if events]
    client = connect(ch)
    try:
        for batch in inserts:
            assert not LedgerWriter(client).write(batch).rejected
    finally:
        client.close()


def _life_events(ev_spec: Any, n: int) -> list[Pending]:
    job, user, _team, project, _cc, submit, start, end, uuid, _cls, _minutes = LIVES[n]
    alloc = [{"node": "n1", "devices": [{"index": 0, "uuid": uuid, "mig_instance_id": None, "mig_profile": None}]}]
    common = {"job_id": job, "user": user, "project": project, "submit_ts_ms": ms(submit), "allocations": alloc}
    started = job_event("STARTED", ms(start), event_id=f"start-{n}", start_ts_ms=ms(start), **common)
    ended = job_event("ENDED", ms(end), event_id=f"end-{n}", start_ts_ms=ms(start), end_ts_ms=ms(end), **common)
    return [Pending(ev_spec, row, Origin("e", 0, 2 * n + k)) for k, ev in enumerate((started, ended))
            for row in ev_spec.rows(ev)]  # fmt: skip


def explain(ch: ClickHouseSettings, project: str) -> list[tuple[Any, ...]]:
    rows = json.loads(run_cli(ch, "report", "explain", "--project", project, "--period", "2026-11", "--format", "json"))
    return [(r["job_id"], r["job_start"], r["allocated_s"], r["active_s"], r["idle_s"], r["starved_s"], r["charge"])
            for r in rows]  # fmt: skip


# By hand (hopper on-prem 1.631018 $/GPU-h before 11-16, 1.667768 from 11-16):
#   7 @ 11-10 09:00  3600 s active x 1.631018 = 1.631018 -> 1.63
#   7 @ 11-10 10:30  1800 s idle   x 1.631018 = 0.815509 -> 0.82
#   8 @ 11-10 12:00  1200 s active x 1.631018 = 0.543673 -> 0.54
#   7 @ 11-19 23:30  2700 s starved x 1.667768 = 1.250826 -> 1.25
#   p-vision 6600 s = 2.990200 -> 2.99; p-nlp 1.25; month 4.24
EXPECTED_VISION = [
    ("7", "2026-11-10T09:00:00Z", 3600, 3600, 0, 0, "1.63"),
    ("7", "2026-11-10T10:30:00Z", 1800, 0, 1800, 0, "0.82"),
    ("8", "2026-11-10T12:00:00Z", 1200, 1200, 0, 0, "0.54"),
]
EXPECTED_NLP = [("7", "2026-11-19T23:30:00Z", 2700, 0, 0, 2700, "1.25")]


def test_two_jobs_sharing_an_id_are_two_explain_lines_and_totals_are_unchanged(
    ledger_settings: ClickHouseSettings,  # noqa: F811
) -> None:
    ch = ledger_settings
    write(ch)
    assert explain(ch, "p-vision") == EXPECTED_VISION
    assert explain(ch, "p-nlp") == EXPECTED_NLP
    by_project = {r["line"]: r for r in json.loads(run_cli(ch, "report", "chargeback", "--period", "2026-11",
                                                           "--by", "project", "--format", "json"))}  # fmt: skip
    assert {k: (v["charge"], v["allocated_gpu_h"], v["jobs"]) for k, v in by_project.items()} == {
        "p-nlp": ("1.25", "0.7500", 1),
        "p-vision": ("2.99", "1.8333", 3),
        "TOTAL": ("4.24", "2.5833", 4),
    }  # three jobs on p-vision (two of them id 7), four in all
    analyst = connect(ch, analyst=True)
    try:
        # Every priced second is the stored seconds: the lives split the rows, they never add or drop any.
        priced = analyst.query("SELECT sum(allocated_s), sum(idle_s), sum(device_minutes) FROM v_usage_priced")
        stored = analyst.query("SELECT sum(allocated_s), sum(idle_s), sum(device_minutes) FROM usage_daily")
        lives = analyst.query("SELECT job_id, job_start_ms FROM v_job_lives ORDER BY job_id, job_start_ms")
        shared = analyst.query("SELECT job_id, toString(day) FROM v_job_days_shared ORDER BY day")
    finally:
        analyst.close()
    assert priced.result_rows == stored.result_rows == [(9300, 1800, 155)]
    assert lives.result_rows == [("7", ms(s)) for s in ("2026-11-10T09:00", "2026-11-10T10:30", "2026-11-19T23:30")] + [
        ("8", ms("2026-11-10T12:00"))
    ]
    # The days a later life of id 7 started on: read from device-minutes; 11-20 (life 3's last) from usage_daily.
    assert shared.result_rows == [("7", "2026-11-10"), ("7", "2026-11-19")]


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [2, 3, 1, 0]], ids=["in-order", "latest-life-first"])
def test_lives_of_an_id_in_inserts_of_their_own_are_told_apart_the_same(
    ledger_settings: ClickHouseSettings, order: list[int]  # noqa: F811
) -> None:
    """Migration 029: only ids with two or more started lives (`job_ids_reused`, fed on insert) take the ASOF path.
    Each life's events in an insert of its own, in either order, mark id 7 as one insert holding both lives does;
    the explain lines are the by-hand ones above."""
    ch = ledger_settings
    write(ch, lives_order=order)
    assert explain(ch, "p-vision") == EXPECTED_VISION
    assert explain(ch, "p-nlp") == EXPECTED_NLP
    analyst = connect(ch, analyst=True)
    try:
        reused = analyst.query("SELECT DISTINCT job_id FROM job_ids_reused").result_rows
    finally:
        analyst.close()
    assert reused == [("7",)]


def test_usage_whose_job_events_never_arrived_is_one_line_of_unknown_start(
    ledger_settings: ClickHouseSettings,  # noqa: F811
) -> None:
    ch = ledger_settings
    write(ch, events=False)
    # Without job events nothing tells the lives apart: one line per id and attributes, as before, start unknown.
    assert explain(ch, "p-vision") == [("7", "", 5400, 3600, 1800, 0, "2.45"), ("8", "", 1200, 1200, 0, 0, "0.54")]
    analyst = connect(ch, analyst=True)
    try:
        assert cb.explain(analyst, "2026-11", "p-nlp")[0]["job_start"] == ""
    finally:
        analyst.close()


# 023's v_job_lives, grouping every job event: what migration 027's rollup must give.
LIVES_FROM_EVENTS = """
SELECT cluster, job_id, submit_ms, job_start_ms, job_last_ms,
       row_number() OVER (PARTITION BY cluster, job_id ORDER BY job_start_ms, submit_ms) > 1 AS later
FROM (SELECT cluster, job_id, ifNull(submit_ts_ms, toInt64(0)) AS submit_ms,
             minIf(ifNull(start_ts_ms, ts_ms), event_type = 'STARTED') AS job_start_ms,
             max(greatest(ts_ms, ifNull(end_ts_ms, ts_ms))) AS job_last_ms
      FROM job_events GROUP BY cluster, job_id, submit_ms HAVING countIf(event_type = 'STARTED') > 0)
ORDER BY cluster, job_id, submit_ms
"""


def test_job_lives_from_the_rollup_equal_the_grouping_of_every_event(
    ledger_settings: ClickHouseSettings,  # noqa: F811
) -> None:
    """Migration 027: lives are read from `job_lives`, fed on each insert. A life whose ENDED, SUBMITTED and
    STARTED come in separate inserts (the first two without a STARTED, whose blocks hold no start) keeps its
    earliest STARTED's start; a life that never started is no life; a replayed STARTED changes nothing."""
    ch = ledger_settings
    write(ch)
    ev_spec, _identities = SINKS[topics.JOB_EVENTS.name]
    common = {"job_id": "9", "user": "carol", "project": "p-nlp", "submit_ts_ms": ms("2026-11-21T08:00")}
    inserts = [
        [job_event("ENDED", ms("2026-11-21T11:00"), event_id="9-end", end_ts_ms=ms("2026-11-21T11:00"), **common)],
        [job_event("SUBMITTED", ms("2026-11-21T08:00"), event_id="9-submit", **common)],
        [job_event("STARTED", ms("2026-11-21T09:00"), event_id="9-start", start_ts_ms=ms("2026-11-21T09:00"),
                   **common)],
        [job_event("STARTED", ms("2026-11-21T09:00"), event_id="9-start", start_ts_ms=ms("2026-11-21T09:00"),
                   **common)],  # the same event again (a replay)
        [job_event("SUBMITTED", ms("2026-11-22T08:00"), event_id="10-submit", job_id="10", user="carol",
                   project="p-nlp", submit_ts_ms=ms("2026-11-22T08:00"))],  # never started
    ]
    client = connect(ch)
    try:
        for n, events in enumerate(inserts):
            pending = [Pending(ev_spec, row, Origin("x", 0, n)) for ev in events for row in ev_spec.rows(ev)]
            assert not LedgerWriter(client).write(pending).rejected
    finally:
        client.close()
    analyst = connect(ch, analyst=True)
    try:
        lives = analyst.query("SELECT * FROM v_job_lives ORDER BY cluster, job_id, submit_ms").result_rows
        expected = analyst.query(LIVES_FROM_EVENTS).result_rows
    finally:
        analyst.close()
    assert lives == expected
    assert len(lives) == len(LIVES) + 1  # the four lives of the ledger and job 9's; job 10 never started
    nine = [life for life in lives if life[1] == "9"]
    assert [(life[3], life[4], life[5]) for life in nine] == [(ms("2026-11-21T09:00"), ms("2026-11-21T11:00"), False)]
