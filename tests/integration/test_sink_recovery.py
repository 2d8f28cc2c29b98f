"""Crash and outage: kill the sink (SIGKILL) mid-batch, restart it, stop ClickHouse while records
keep arriving, bring it back, then replay every offset: the totals equal one clean pass.

The outage lasts GPULEDGER_TEST_CLICKHOUSE_OUTAGE_S seconds: 60 in the full run the issue asks
for (`GPULEDGER_TEST_CLICKHOUSE_OUTAGE_S=60 pytest ...`), 15 by default to keep the default run
short on a shared 2-core machine. The mechanism is the same: the sink pauses, retries with
backoff, keeps its group membership and resumes when the server answers again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_clickhouse import server_env, start_server, stop_server, wait_for

from base.settings import ClickHouseSettings, KafkaSettings
from schemas import topics
from schemas.topics import job_key
from sinks.db import connect, migrate
from stack.broker import free_ports
from streams.publish import RecordPublisher

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
OUTAGE_S = float(os.environ.get("GPULEDGER_TEST_CLICKHOUSE_OUTAGE_S", "15"))
MINUTE0 = 1_793_491_200_000  # 2026-11-01T00:00Z


def record(gpu: int, minute: int) -> dict[str, Any]:
    idle = 7 if minute % 5 == 0 else 0
    return {
        "cluster": "c1", "node": f"n{gpu // 8}", "device_uuid": f"GPU-{gpu:03d}", "mig_instance_id": None,
        "minute_start_ms": MINUTE0 + minute * 60_000, "model": "H100", "generation": "hopper",
        "job_id": f"job-{gpu}", "user": f"u{gpu % 3}", "project": f"p{gpu % 2}", "team": f"t{gpu % 2}",
        "cost_centre": "CC-1", "preemptible": gpu % 4 == 0, "pricing_tier": "on-prem", "unallocated_s": 0,
        "allocated_s": 60, "active_s": 60 - idle, "starved_s": 0, "idle_s": idle, "dark_s": 0,
        "sm_weighted_s": 30.0, "sample_count": 60, "activity_mean_ratio": 0.5, "activity_max_ratio": 0.9,
        "fb_used_mib_max": 4096.0, "power_w_mean": 400.0, "mapping_version": "m1", "classifier_version": "c1",
    }  # fmt: skip


def publish(kafka: KafkaSettings, minutes: range, gpus: int = 16) -> int:
    pub = RecordPublisher(kafka)
    n = 0
    for minute in minutes:
        for gpu in range(gpus):
            pub.publish(topics.DEVICE_MINUTES, job_key("c1", f"job-{gpu}"), record(gpu, minute))
            n += 1
    pub.flush()
    return n


def start_sink(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-c", "from gpuledger.cli import main; main()", "sink", "run",
           "--topic", topics.DEVICE_MINUTES.name, *extra]  # fmt: skip
    with log.open("ab") as fh:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)


def test_kill_restart_outage_and_replay_keep_totals(kafka_bootstrap: str, tmp_path: Path) -> None:
    port = free_ports(1)[0]
    data = tmp_path / "ch" / "data"
    data.parent.mkdir()
    server = start_server(data, port=port)
    prefix = f"r{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + topics.DEVICE_MINUTES.name, prefix + topics.DEVICE_MINUTES.dlq]
    for fut in admin.create_topics([NewTopic(n, 3, 1) for n in names]).values():
        fut.result(timeout=30)
    ch = ClickHouseSettings(url=server.url, database="recovery", password=server.password)
    client = connect(ch)
    migrate(client, ch)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
    env = server_env(
        GPULEDGER_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
        GPULEDGER_KAFKA__TOPIC_PREFIX=prefix,
        GPULEDGER_CLICKHOUSE__URL=server.url,
        GPULEDGER_CLICKHOUSE__DATABASE="recovery",
        GPULEDGER_SINKS__GROUP_ID="recovery-sink",
        GPULEDGER_SINKS__BATCH_MAX_RECORDS="400",
        GPULEDGER_SINKS__BATCH_MAX_WAIT_S="0.2",
        GPULEDGER_SINKS__RETRY_INITIAL_S="0.5",
        GPULEDGER_SINKS__RETRY_MAX_S="4",
    )
    log = tmp_path / "sink.log"

    def stored() -> int:
        try:
            return int(client.query("SELECT count() FROM device_minutes").result_rows[0][0])
        except Exception:
            return -1

    total = publish(kafka, range(0, 600))  # 9,600 device-minutes
    sink = start_sink(env, log)
    try:
        # SIGKILL the sink once it has landed some batches but not all: a batch is in flight.
        assert wait_for(lambda: 0 < stored() < total, timeout_s=120, interval_s=0.02), log.read_text()
        sink.send_signal(signal.SIGKILL)
        sink.wait(30)
        partial = stored()
        assert partial < total
        sink = start_sink(env, log)
        assert wait_for(lambda: stored() == total, timeout_s=180), log.read_text()

        # ClickHouse goes away while records keep arriving.
        stop_server(server)
        more = publish(kafka, range(600, 700))
        time.sleep(OUTAGE_S)
        assert sink.poll() is None, "the sink must wait for ClickHouse, not exit"
        server = start_server(data, port=port)
        assert wait_for(lambda: stored() == total + more, timeout_s=120), log.read_text()
        assert "ClickHouse unavailable, retrying" in log.read_text()
    finally:
        sink.send_signal(signal.SIGTERM)
        sink.wait(60)

    # Replay every offset from the start under a new group: nothing changes.
    replay_env = {**env, "GPULEDGER_SINKS__GROUP_ID": "recovery-replay"}
    replay = start_sink(replay_env, log, "--max-idle-s", "5")
    assert replay.wait(180) == 0, log.read_text()

    client = connect(ch)
    rows, alloc, idle = client.query(
        "SELECT count(), sum(allocated_s), sum(idle_s) FROM device_minutes FINAL"
    ).result_rows[0]
    daily_alloc, daily_idle, daily_minutes = client.query(
        "SELECT sum(allocated_s), sum(idle_s), sum(device_minutes) FROM usage_daily"
    ).result_rows[0]
    n = total + more
    expected_idle = sum(7 for m in range(700) if m % 5 == 0) * 16
    assert (rows, alloc, idle) == (n, 60 * n, expected_idle)
    assert (daily_alloc, daily_idle, daily_minutes) == (60 * n, expected_idle, n)  # rollups exact too
    client.close()
    stop_server(server)
