"""A gang is judged whole before reclaim (issue 18), against the embedded ClickHouse: job events and
job-minutes as the sinks store them. Pods p0 and p1 of gang `kueue:ml/wl` (and the Workload's own events,
same gang id, no devices); p0 idle. While p1 is busy, p0's action is skipped naming p1; once p1 is idle too
the gang may be reclaimed; a pod in no gang is judged alone."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from contract_records import job_event

from base.settings import ClickHouseSettings
from schemas import topics
from sinks.db import connect, migrate
from sinks.gang import ClickHouseGang
from sinks.reclaim import ClickHouseJobState, ClickHouseRecorder, ReclaimExecutor
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

pytestmark = pytest.mark.integration
MINUTE_COLUMNS = ("cluster", "job_id", "minute_start_ms", "device_count", "allocated_s", "active_s", "starved_s",
                  "idle_s", "dark_s", "sm_weighted_s", "sample_count")  # fmt: skip
T0 = 1_793_491_200_000
GANG = "kueue:ml/wl"


@pytest.fixture
def client(clickhouse_server: Any, clickhouse_database: str) -> Any:
    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password)  # fmt: skip
    c = connect(ch)
    migrate(c, ch)
    yield c
    c.close()


def _events(client: Any, records: Sequence[dict[str, Any]]) -> None:
    events, _ = SINKS[topics.JOB_EVENTS.name]
    pending = [Pending(events, row, Origin("e", 0, i)) for i, r in enumerate(records) for row in events.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected


def _minutes(client: Any, job: str, minute: int, active: int, idle: int) -> None:
    client.insert("job_minutes", [["c1", job, T0 + minute * 60_000, 2, active + idle, active, 0, idle, 0, 0.0, 2]],
                  column_names=list(MINUTE_COLUMNS))  # fmt: skip


def kube(kind: str, job: str, ts: int, **kw: Any) -> dict[str, Any]:
    return job_event(kind, ts, job_id=job, scheduler="KUEUE", gang_id=GANG, event_id=f"{job}-{kind}-{ts}", **kw)


def test_a_gang_is_reclaimed_only_when_every_member_is_idle(client: Any) -> None:
    _events(client, [
        kube("SUBMITTED", "ml/wl", T0, allocations=[]), kube("UPDATED", "ml/wl", T0, allocations=[]),
        kube("STARTED", "ml/p0", T0), kube("STARTED", "ml/p1", T0),
        job_event("STARTED", T0, job_id="ml/solo", scheduler="KUBERNETES", event_id="solo"),
    ])  # fmt: skip
    for m in range(3):
        _minutes(client, "ml/p0", m, 0, 120)
        _minutes(client, "ml/solo", m, 0, 120)
        _minutes(client, "ml/p1", m, 120 if m == 2 else 0, 0 if m == 2 else 120)  # p1 woke up in minute 2
    state = ClickHouseJobState(client)
    gang = ClickHouseGang(client, state)
    assert gang.members("c1", "ml/p0") == (GANG, ["ml/p0", "ml/p1"])  # the Workload's own events hold nothing
    ex = ReclaimExecutor(ClickHouseRecorder(client), dry_run=True, job_state=state, gang_check=gang)

    def act(job: str, n: int) -> list[tuple[str, str]]:
        action = {"action_id": f"a{n}", "cluster": "c1", "job_id": job, "scheduler": "KUEUE", "action": "SUSPEND",
                  "dry_run": True}  # fmt: skip
        return [(o.status, o.detail) for o in ex.execute(action)]

    [(status, detail)] = act("ml/p0", 1)
    assert status == "skipped" and detail.startswith(f"re-check: gang-busy: gang {GANG}: member ml/p1: busy")
    assert act("ml/solo", 2)[0][0] == "planned"  # no gang: judged alone
    _minutes(client, "ml/p1", 3, 0, 120)  # p1 idle again
    assert act("ml/p0", 3) == [("planned", "dry-run: not executed")]
    assert ex.skipped == {"gang-busy": 1}
