"""A gang is judged whole (issue 18), against the embedded ClickHouse: job events, job-minutes and alerts as the
sinks store them. Pods p0 and p1 of gang `kueue:ml/wl` (and the Workload's own events, same gang id, no devices).

Reclaim: p0 idle. While p1 is busy, p0's action is skipped naming p1; once p1 is idle too but its grace is not
over, it is skipped again; once p1's reclaim notice is out the gang may be reclaimed; a pod in no gang is judged
alone. Chat: the pods' alerts, made by the processors' idle state machine and written by the alerts sink, reach
the local webhook receiver (apprise, real HTTP) as one warning naming the gang, posted when the last pod is
warned; each pod's alert is journalled as delivered in it, so an appeal of one is answered in the gang's post."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from contract_records import job_event
from fixtures_clickhouse import write_job_events

from base.processor_settings import IdlePolicy
from base.settings import ChatRoute, ChatSettings
from processors.attribution import JobInfo
from processors.idle import IdleState, new_state, step
from schemas import topics
from sinks.chat import ChatNotifier, WebhookReceiver, delivered_post, record_delivery
from sinks.gang import ClickHouseGangs
from sinks.reclaim import ClickHouseJobState, ClickHouseRecorder, ReclaimExecutor
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

pytestmark = pytest.mark.integration
MINUTE_COLUMNS = ("cluster", "job_id", "minute_start_ms", "device_count", "allocated_s", "active_s", "starved_s",
                  "idle_s", "dark_s", "sm_weighted_s", "sample_count")  # fmt: skip
T0 = 1_793_491_200_000
GANG = "kueue:ml/wl"


@pytest.fixture
def client(ledger_client: Any) -> Any:
    return ledger_client


def _minutes(client: Any, job: str, minute: int, active: int, idle: int) -> None:
    client.insert("job_minutes", [["c1", job, T0 + minute * 60_000, 2, active + idle, active, 0, idle, 0, 0.0, 2]],
                  column_names=list(MINUTE_COLUMNS))  # fmt: skip


def kube(kind: str, job: str, ts: int, **kw: Any) -> dict[str, Any]:
    return job_event(kind, ts, job_id=job, scheduler="KUEUE", gang_id=GANG, event_id=f"{job}-{kind}-{ts}", **kw)


def test_a_gang_is_reclaimed_only_when_every_member_is_idle(client: Any) -> None:
    write_job_events(client, [
        kube("SUBMITTED", "ml/wl", T0, allocations=[]), kube("UPDATED", "ml/wl", T0, allocations=[]),
        kube("STARTED", "ml/p0", T0), kube("STARTED", "ml/p1", T0),
        job_event("STARTED", T0, job_id="ml/solo", scheduler="KUBERNETES", event_id="solo"),
    ])  # fmt: skip
    for m in range(3):
        _minutes(client, "ml/p0", m, 0, 120)
        _minutes(client, "ml/solo", m, 0, 120)
        _minutes(client, "ml/p1", m, 120 if m == 2 else 0, 0 if m == 2 else 120)  # p1 woke up in minute 2
    state = ClickHouseJobState(client)
    gang = ClickHouseGangs(client, state)
    assert gang.members("c1", "ml/p0") == (GANG, ["ml/p0", "ml/p1"])  # the Workload's own events hold nothing
    ex = ReclaimExecutor(ClickHouseRecorder(client), dry_run=True, job_state=state, gang_check=gang)

    def act(job: str, n: int) -> list[tuple[str, str]]:
        action = {"action_id": f"a{n}", "cluster": "c1", "job_id": job, "scheduler": "KUEUE", "action": "SUSPEND",
                  "dry_run": True, "ts_ms": T0 + n * 60_000}  # fmt: skip
        return [(o.status, o.detail) for o in ex.execute(action)]

    [(status, detail)] = act("ml/p0", 1)
    assert status == "skipped" and detail.startswith(f"re-check: gang-busy: gang {GANG}: member ml/p1: busy")
    assert act("ml/solo", 2)[0][0] == "planned"  # no gang: judged alone
    _minutes(client, "ml/p1", 3, 0, 120)  # p1 idle again, its own grace not over
    [(status, detail)] = act("ml/p0", 3)
    assert status == "skipped"
    assert detail == f"re-check: gang-not-due: gang {GANG}: member ml/p1: idle, its grace not over yet"
    _alerts(client, [{"alert_id": "n1", "kind": "RECLAIM_NOTICE", "ts_ms": T0 + 4 * 60_000, "job_id": "ml/p1"}])
    assert act("ml/p0", 4) == [("planned", "dry-run: not executed")]
    assert ex.skipped == {"gang-busy": 1, "gang-not-due": 1}


def _alerts(client: Any, records: Sequence[dict[str, Any]]) -> None:
    spec = SINKS[topics.ALERTS.name][0]
    full = [{"cluster": "c1", "node": None, "device_uuids": [], "user": "ana", "team": "vision", "project": "det",
             "idle_minutes": 0, "cost_so_far": None, "action": None, "action_at_ms": None, "dry_run": True,
             "message": "", "appeal_route": None, "emitted_ts_ms": None, **r} for r in records]  # fmt: skip
    pending = [Pending(spec, row, Origin("a", 0, i)) for i, r in enumerate(full) for row in spec.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected


def test_the_chat_posts_one_warning_naming_the_gang_when_its_last_pod_is_idle(client: Any) -> None:
    write_job_events(client, [kube("STARTED", "ml/p0", T0), kube("STARTED", "ml/p1", T0)])
    policy = IdlePolicy(idle_after_min_batch=3, grace_min=2)
    pods: dict[str, IdleState] = {j: new_state(JobInfo(cluster="c1", job_id=j, scheduler="KUEUE", user="ana",
                                                       team="vision", project="det"), (f"GPU-{j[-1]}",))
                                  for j in ("ml/p0", "ml/p1")}  # fmt: skip

    def minute(job: str, m: int) -> dict[str, Any] | None:
        jm = {"minute_start_ms": T0 + m * 60_000, "allocated_s": 60, "active_s": 0, "starved_s": 0, "idle_s": 60}
        pods[job], outs = step(pods[job], jm, policy)
        alerts = [o.record for o in outs if o.kind == "alert"]
        return alerts[0] if alerts else None

    receiver = WebhookReceiver(port=0).start()
    try:
        chat = ChatSettings(default=ChatRoute(url=f"json://127.0.0.1:{receiver.port}/gpu", channel="#gpu"))
        notifier = ChatNotifier(chat, clock_ms=lambda: T0, gangs=ClickHouseGangs(client).alert)
        journal = []
        for m in range(5):  # p1 idle from minute 2 on: its warning comes two minutes after p0's
            for job in ("ml/p0", "ml/p1"):
                alert = minute(job, m) if job == "ml/p0" or m >= 2 else None
                if alert is None:
                    continue
                if job == "ml/p0":
                    _alerts(client, [alert])  # the alerts sink wrote it before the chat read it; p1's, not yet
                delivery = notifier.handle(alert)
                record_delivery(client, delivery, T0 + m * 60_000)
                journal.append((job, alert["kind"], delivery.status))
        assert journal == [("ml/p0", "IDLE_WARNING", "gang-held"),  # p1 is busy: nothing is posted
                           ("ml/p0", "RECLAIM_NOTICE", "gang-held"),  # p0's grace is over, not p1's
                           ("ml/p1", "IDLE_WARNING", "sent")]  # fmt: skip
        [post] = receiver.received
        body = post["body"]
        assert body["title"] == "[gpuledger] Idle GPUs: action pending: gang kueue:ml/wl on c1"
        assert "gang members: 2 pod(s) ml/p0, ml/p1" in body["message"]
        assert "next: CANCEL at 2026-11-01 00:07 UTC" in body["message"] and "GPU-0, GPU-1" in body["message"]
        posted = client.query("SELECT alert_id, reply_to FROM chat_deliveries FINAL WHERE status = 'sent' "
                              "ORDER BY reply_to").result_rows  # fmt: skip
        gang_id = next(a for a, r in posted if r == "")  # each pod's warning went out in the gang's post
        assert len(posted) == 3 and sorted(r for _, r in posted) == ["", gang_id, gang_id]
        assert all(delivered_post(client, a) == delivered_post(client, gang_id) for a, _ in posted)
    finally:
        receiver.stop()
