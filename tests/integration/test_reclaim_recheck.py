"""The reclaim executor's re-check against the embedded ClickHouse: job events and job-minutes as the
sinks store them, read back by `ClickHouseJobState` and decided by `recheck`."""

from __future__ import annotations

from typing import Any

import pytest
from contract_records import job_event
from fixtures_clickhouse import write_job_events

from sinks.reclaim import ClickHouseJobState, ClickHouseRecorder, JobNow, ReclaimExecutor

pytestmark = pytest.mark.integration
MINUTE_COLUMNS = ("cluster", "job_id", "minute_start_ms", "device_count", "allocated_s", "active_s", "starved_s",
                  "idle_s", "dark_s", "sm_weighted_s", "sample_count")  # fmt: skip


@pytest.fixture
def client(ledger_client: Any) -> Any:
    return ledger_client


def _minute(job: str, minute_ms: int, active: int, idle: int) -> list[Any]:
    return ["c1", job, minute_ms, 2, active + idle, active, 0, idle, 0, 0.0, 2]


def test_recheck_reads_allocation_and_latest_minute(client: Any) -> None:
    t0 = 1_793_491_200_000
    write_job_events(client, [
        job_event("STARTED", t0, job_id="idle"), job_event("STARTED", t0, job_id="ended"),
        job_event("ENDED", t0 + 300_000, job_id="ended"), job_event("STARTED", t0, job_id="woke"),
        job_event("STARTED", t0, job_id="resumed"), job_event("SUSPENDED", t0 + 60_000, job_id="resumed"),
        job_event("RESUMED", t0 + 120_000, job_id="resumed"),
    ])  # fmt: skip
    rows = [_minute(job, t0 + i * 60_000, 0, 120) for job in ("idle", "ended", "woke", "resumed") for i in range(4)]
    rows.append(_minute("woke", t0 + 4 * 60_000, 90, 30))  # its latest minute computed
    client.insert("job_minutes", rows, column_names=list(MINUTE_COLUMNS))

    state = ClickHouseJobState(client)
    assert state("c1", "idle") == JobNow(t0, None, t0 + 180_000, (0, 0, 120))
    assert state("c1", "ended") == JobNow(t0, t0 + 300_000, t0 + 180_000, (0, 0, 120))
    assert state("c1", "resumed").last_open_ms == t0 + 120_000
    assert state("c1", "nobody") == JobNow(None, None, None, None)

    jobs = ("idle", "ended", "woke", "resumed", "nobody")
    slurm_ids = {str(4200 + i): job for i, job in enumerate(jobs)}  # a Slurm action names a numeric job id
    ex = ReclaimExecutor(ClickHouseRecorder(client), dry_run=True, job_state=lambda c, j: state(c, slurm_ids[j]))
    statuses = {}
    for i, job in enumerate(jobs):
        action = {"action_id": f"a{i}", "cluster": "c1", "job_id": str(4200 + i), "scheduler": "SLURM",
                  "action": "CANCEL", "dry_run": True}  # fmt: skip
        statuses[job] = [(o.status, o.detail) for o in ex.execute(action)]
    assert statuses["idle"] == [("planned", "dry-run: not executed")]
    assert statuses["resumed"] == [("planned", "dry-run: not executed")]
    assert [s[0] for s in statuses["ended"] + statuses["woke"] + statuses["nobody"]] == ["skipped"] * 3
    assert ex.skipped == {"ended": 1, "busy": 1, "not-allocated": 1}
    recorded = client.query("SELECT action_id, status FROM action_outcomes FINAL ORDER BY action_id").result_rows
    assert recorded == [("a0", "planned"), ("a1", "skipped"), ("a2", "skipped"), ("a3", "planned"), ("a4", "skipped")]
