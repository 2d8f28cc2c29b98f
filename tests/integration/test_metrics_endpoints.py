"""Each component's /metrics over HTTP, on a real broker (and the embedded ClickHouse for the sink).

A component runs as its own process, exactly as `gpuledger up` starts it (with metrics on any free
port, recorded in <state_dir>/metrics/<component>.port); the test feeds it records and scrapes the
endpoint until the counts match what was published, including one undecodable record that must show
up as a dead letter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from test_chargeback_ledger import CORRECTIONS, worked_ledger
from test_processor_harness import CLI, REPO, create_topics, publish, read_all, start_worker, worker_env
from test_sink_kafka import make_settings, publish_ledger

from base import metrics
from base.settings import Settings
from producers.simulator import SimConfig, simulate
from schemas import topics

pytestmark = pytest.mark.integration
P = metrics.PREFIX


def _port(state_dir: Path, component: str, proc: subprocess.Popen[bytes], log: Path) -> int:
    path = state_dir / "metrics" / f"{component}.port"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"no metrics port file for {component}: {log.read_text()[-3000:]}")


def _value(samples: list[metrics.Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def _scrape_until(url: str, done: Any, timeout_s: float = 40.0) -> list[metrics.Sample]:
    deadline = time.monotonic() + timeout_s
    samples: list[metrics.Sample] = []
    while time.monotonic() < deadline:
        samples = metrics.scrape(url)
        if done(samples):
            return samples
        time.sleep(0.3)
    return samples


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_processors_endpoint_counts_records_dead_letters_and_alerts(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"mx{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    records = list(simulate(SimConfig(seed=7, nodes=2, duration_s=1500)))
    sent = Counter(prefix + t.name for t, _, _ in records)
    publish(kafka_bootstrap, prefix, records)
    samples_topic = prefix + topics.DEVICE_SAMPLES.name
    bad = Producer({"bootstrap.servers": kafka_bootstrap})
    bad.produce(samples_topic, key=b"sim/garbage", value=b"\x00not avro")
    bad.flush(10)

    env = worker_env(
        kafka_bootstrap, prefix, tmp_path, IDLE__IDLE_AFTER_MIN_INTERACTIVE="3", IDLE__IDLE_AFTER_MIN_BATCH="3"
    )
    env["GPULEDGER_METRICS__BASE_PORT"] = "0"
    log = tmp_path / "worker.log"
    proc = start_worker(env, log=log)
    try:
        url = f"http://127.0.0.1:{_port(tmp_path, 'processors', proc, log)}/metrics"
        want_in = sent[samples_topic] + 1
        node_group = prefix + "processors.node"

        def done(s: list[metrics.Sample]) -> bool:
            return (
                _value(s, P + "records_in_total", component="processors", topic=samples_topic) == want_in
                and _value(s, P + "consumer_lag_records", group=node_group, topic=samples_topic) == 0
                and _value(s, P + "records_out_total", topic=prefix + topics.ALERTS.name) > 0
            )

        s = _scrape_until(url, done)
        assert _value(s, P + "records_in_total", topic=samples_topic) == want_in, log.read_text()[-2000:]
        for name in (topics.JOB_EVENTS.name, topics.INVENTORY.name):
            assert _value(s, P + "records_in_total", topic=prefix + name) >= sent[prefix + name]
        dlq = [x for x in s if x.name == P + "dead_letters_total"]
        assert [(x.labels["topic"], x.value) for x in dlq] == [(samples_topic, 1)], dlq
        assert dlq[0].labels["error_class"]  # the class from the dead letter's headers
        assert _value(s, P + "consumer_lag_records", group=node_group, topic=samples_topic) == 0
        assert _value(s, P + "records_out_total", topic=prefix + topics.DEVICE_MINUTES.name) > 0
        coverage = [x.value for x in s if x.name == P + "coverage_ratio" and x.labels["cluster"] == "sim"]
        assert coverage and 0 < coverage[0] <= 1
        assert any(x.name == "process_resident_memory_bytes" for x in s)
        # Every alert the processors emitted has one latency observation, and it is on the topic.
        time.sleep(1.5)  # the stats refresh runs once a second
        s = metrics.scrape(url)
        alerts_out = _value(s, P + "records_out_total", topic=prefix + topics.ALERTS.name)
        assert alerts_out > 0
        assert _value(s, P + "alert_latency_seconds_count") == alerts_out
        assert len(read_all(kafka_bootstrap, prefix + topics.ALERTS.name)) >= alerts_out
        summary = metrics.summarise(s)
        assert summary["dead_letters"] == 1 and summary["alert_latency_p99_s"] is not None
    finally:
        _stop(proc)


def test_sink_endpoint_counts_records_rows_and_dead_letters(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    settings: Settings = make_settings(kafka_bootstrap, clickhouse_server, clickhouse_database)
    n = publish_ledger(settings)
    dm_topic = settings.kafka.topic(topics.DEVICE_MINUTES.name)
    bad = Producer({"bootstrap.servers": kafka_bootstrap})
    bad.produce(dm_topic, key=b"c1/j1", value=b"\x00not avro")
    bad.flush(10)

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(
        {
            "GPULEDGER_CONFIG": str(tmp_path / "none.toml"),
            "GPULEDGER_STATE_DIR": str(tmp_path),
            "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
            "GPULEDGER_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
            "GPULEDGER_CLICKHOUSE__URL": settings.clickhouse.url,
            "GPULEDGER_CLICKHOUSE__DATABASE": settings.clickhouse.database,
            "GPULEDGER_CLICKHOUSE__PASSWORD": settings.clickhouse.password.get_secret_value(),
            "GPULEDGER_SINKS__GROUP_ID": settings.sinks.group_id,
            "GPULEDGER_SINKS__BATCH_MAX_WAIT_S": "0.3",
            "GPULEDGER_METRICS__BASE_PORT": "0",
        }
    )
    args = ["sink", "run", *(f"--topic={t.name}" for t in (topics.DEVICE_MINUTES, topics.CORRECTIONS, topics.ALERTS))]
    log = tmp_path / "sink.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, *args], env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{_port(tmp_path, 'sinks', proc, log)}/metrics"

        rows = len(worked_ledger()) + len(CORRECTIONS)

        def done(s: list[metrics.Sample]) -> bool:  # records are counted when read, rows once written
            return (
                _value(s, P + "records_in_total", component="sinks") == n + 1
                and _value(s, P + "consumer_lag_records", component="sinks") == 0
                and _value(s, P + "records_out_total", component="sinks") >= rows
            )

        s = _scrape_until(url, done)
        assert _value(s, P + "records_in_total", component="sinks") == n + 1, log.read_text()[-2000:]
        dlq = [x for x in s if x.name == P + "dead_letters_total"]
        assert [(x.labels["topic"], x.value) for x in dlq] == [(dm_topic, 1)], dlq
        assert _value(s, P + "consumer_lag_records", component="sinks", group=settings.sinks.group_id) == 0
        out = {x.labels["topic"]: x.value for x in s if x.name == P + "records_out_total"}  # rows per table
        assert out == {"device_minutes": len(worked_ledger()), "attribution_corrections": len(CORRECTIONS)}, out
    finally:
        _stop(proc)
