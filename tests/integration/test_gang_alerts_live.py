"""A Kubernetes gang warned once and reclaimed once, through the real parts (issue 18): the job stage
(`processors run --stage job`) judges each pod of gang `kueue:ml/wl` on its own and emits its alerts and
action; `sink run` writes the job events, job-minutes, alerts and actions into ClickHouse; `chat run` posts to
the local webhook receiver (apprise, real HTTP); `reclaim run` plans the actions (dry run).

Pod p0 is idle from its start; p1 computes for two minutes, then is idle. Each pod gets its warning, notice
and action from the processors, but people get one warning naming the gang, when p1 (the last) is warned, and
one reclaim notice when p1's grace is over; the executor skips p0's action (p1's grace is not over then) and
plans p1's, the gang's one reclaim. The chat and the executor run after the sink wrote everything, so each
alert and action is judged against the gang as it was when it was made, not as the warehouse holds it now. The
team page's read, as the analyst, shows the gang as one open warning between p1's warning and its action."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures_cli import run_gpuledger
from fixtures_web import cli_env
from test_processor_harness import REPO, create_topics, publish, start_worker, wait, worker_env

from base.settings import ClickHouseSettings
from processors.testing import T0, job_event, job_rows
from schemas.topics import ALERTS, JOB_DEVICE_MINUTES, JOB_EVENTS, JOB_MINUTES, RECLAIM_ACTIONS, job_key
from sinks.chat import WebhookReceiver
from sinks.db import connect, migrate
from web.model import open_warnings
from web.queries import Warehouse

pytestmark = pytest.mark.integration
GANG = "kueue:ml/wl"
MIN = 60_000
PODS = {"ml/p0": ("n1", ["GPU-p0a", "GPU-p0b"]), "ml/p1": ("n2", ["GPU-p1a", "GPU-p1b"])}
MINUTES = 9


def _row(job: str, node: str, dev: str, m: int, busy: bool) -> dict[str, Any]:
    """A DeviceMinute as the node stage writes it."""
    return {
        "cluster": "c1", "node": node, "device_uuid": dev, "mig_instance_id": None, "minute_start_ms": T0 + m * MIN,
        "model": "NVIDIA H100 80GB HBM3", "generation": "hopper", "job_id": job, "user": "ana", "project": "proj-a",
        "team": "vision", "cost_centre": "cc-1", "preemptible": False, "pricing_tier": "on-prem", "unallocated_s": 0,
        "allocated_s": 60, "active_s": 60 if busy else 0, "starved_s": 0, "idle_s": 0 if busy else 60, "dark_s": 0,
        "sm_weighted_s": 45.0 if busy else 0.0, "sample_count": 60, "activity_mean_ratio": 0.75 if busy else 0.0,
        "activity_max_ratio": 0.9 if busy else 0.0, "fb_used_mib_max": 1024.0, "power_w_mean": 100.0,
        "mapping_version": "dcgm-3.x/1", "classifier_version": "c1",
    }  # fmt: skip


def test_a_gang_is_warned_once_and_reclaimed_once_end_to_end(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    prefix = f"gang{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    records: list[Any] = []
    for job, (node, devs) in PODS.items():
        ev = {**job_event("STARTED", job, T0, {node: devs}), "scheduler": "KUEUE", "gang_id": GANG, "gang_size": 4}
        records.append((JOB_EVENTS, job_key("c1", job), ev))
    for m in range(MINUTES):
        for job, (node, devs) in PODS.items():
            busy = job == "ml/p1" and m < 2
            rows = [_row(job, node, d, m, busy) for d in devs]
            records.append((JOB_DEVICE_MINUTES, job_key("c1", job), job_rows(rows)))
    publish(kafka_bootstrap, prefix, records)

    policy = {"idle__idle_after_min_batch": "3", "idle__grace_min": "2", "commit_interval_ms": "500"}
    env = worker_env(kafka_bootstrap, prefix, tmp_path, **policy)
    log = tmp_path / "job.log"
    worker = start_worker(env, "--stage", "job", "--exit-when-idle", "3", log=log)
    assert wait(worker, 300) == 0, log.read_text()[-3000:]

    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    receiver = WebhookReceiver(port=0).start()
    route = f"json://127.0.0.1:{receiver.port}/v"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
        **cli_env(ch),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
        "GPULEDGER_SINKS__GROUP_ID": prefix + "sinks",
        "GPULEDGER_SINKS__CHAT__TEAMS": json.dumps({"vision": {"url": route, "channel": "#vision-gpu"}}),
    }
    try:
        topics = [f"--topic={t.name}" for t in (JOB_EVENTS, JOB_MINUTES, ALERTS, RECLAIM_ACTIONS)]
        sink = ["sink", "run", *topics, "--max-idle-s", "5"]
        for args in (sink, ["chat", "run", "--max-idle-s", "3"], ["reclaim", "run", "--max-idle-s", "3"]):
            proc = run_gpuledger(args, env, timeout=240, cwd=REPO)
            assert proc.returncode == 0, proc.stderr[-3000:]
        alerts = client.query("SELECT job_id, kind, ts_ms - {t0:Int64} FROM alerts FINAL ORDER BY ts_ms, job_id",
                              parameters={"t0": T0}).result_rows  # fmt: skip
        assert alerts == [("ml/p0", "IDLE_WARNING", 3 * MIN), ("ml/p0", "RECLAIM_NOTICE", 5 * MIN),
                          ("ml/p1", "IDLE_WARNING", 5 * MIN), ("ml/p1", "RECLAIM_NOTICE", 7 * MIN)]  # fmt: skip

        posts = [item["body"] for item in receiver.received]
        assert [p["title"] for p in posts] == [
            f"[gpuledger] Idle GPUs: action pending: gang {GANG} on c1",
            f"[gpuledger] GPUs being reclaimed: gang {GANG} on c1",
        ]
        warning = posts[0]["message"]
        for needle in ("gang members: 2 pod(s) ml/p0, ml/p1", "4 device(s) GPU-p0a, GPU-p0b, GPU-p1a, GPU-p1b",
                       "idle for 3 min", "next: CANCEL at 2026-03-02 11:27 UTC", "channel: #vision-gpu"):  # fmt: skip
            assert needle in warning, (needle, warning)
        journal = client.query("SELECT status, count() FROM chat_deliveries FINAL GROUP BY status ORDER BY status"
                               ).result_rows  # fmt: skip
        assert journal == [("gang-held", 1), ("sent", 5)]  # p0's notice held; 2 posts, and the 3 pod alerts in them

        outcomes = client.query("SELECT job_id, status, detail FROM action_outcomes FINAL WHERE step <= 1 "
                                "ORDER BY job_id, step").result_rows  # fmt: skip
        assert [(j, s) for j, s, _ in outcomes] == [("ml/p0", "skipped"), ("ml/p1", "planned")]
        assert outcomes[0][2] == f"re-check: gang-not-due: gang {GANG}: member ml/p1: idle, its grace not over yet"

        # The team page (as the analyst reads it): between p1's warning and its action, one line, the gang's
        wh = Warehouse(connect(ch, analyst=True))
        alerts = wh.team_alerts("vision", T0)
        keys = sorted({(a.cluster, a.job_id) for a in alerts})
        gangs = wh.gangs(keys)
        assert gangs == {("c1", GANG): {"ml/p0": "STARTED", "ml/p1": "STARTED"}}
        before = [a for a in alerts if a.ts_ms <= T0 + 6 * MIN]
        [line] = open_warnings(before, wh.job_states(keys), T0 + 6 * MIN, gangs)
        assert (line["job_id"], line["due"], line["warned_at"]) == (GANG, "in 1 min", "2026-03-02 11:25 UTC")
        assert open_warnings(alerts, wh.job_states(keys), T0 + 8 * MIN, gangs) == []  # reclaimed
    finally:
        receiver.stop()
        client.close()
