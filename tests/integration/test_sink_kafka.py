"""Kafka -> ClickHouse sink against a real broker and the embedded ClickHouse server.

Replaying the same offsets (a new consumer group reads everything again) and re-emitted windows
(the same records published again) change no total; a row ClickHouse refuses and bytes that are
not a record go to `<topic>.dlq` with the reason; everything else lands.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from contract_records import job_event
from fixtures_cli import fake_slurm_tools
from test_chargeback_ledger import CORRECTIONS, EXPECTED_TOTAL, worked_ledger

from base.settings import ClickHouseSettings, KafkaSettings, Settings, SinksSettings
from schemas import topics
from schemas.codec import AvroCodec
from schemas.topics import job_key
from sinks import chargeback as cb
from sinks.consumer import LedgerSink
from sinks.db import connect, migrate
from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from streams.consume import HEADER_ERROR_CLASS, HEADER_ERROR_MESSAGE
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
SINK_TOPICS = (topics.DEVICE_MINUTES, topics.CORRECTIONS, topics.ALERTS)


def make_settings(kafka_bootstrap: str, server: Any, database: str, **sinks: Any) -> Settings:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + t.name + suffix for t in SINK_TOPICS for suffix in ("", ".dlq")]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    ch = ClickHouseSettings(
        url=server.url, database=database, password=server.password, analyst_password=server.analyst_password
    )
    client = connect(ch)
    migrate(client, ch)
    client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
    client.close()
    sink_cfg = {"group_id": f"sink-{uuid.uuid4().hex[:6]}", "batch_max_records": 200, "batch_max_wait_s": 0.3,
                "retry_initial_s": 0.2, "retry_max_s": 1.0, **sinks}  # fmt: skip
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
        clickhouse=ch,
        sinks=SinksSettings(**sink_cfg),
    )


def publish_ledger(settings: Settings, extra: list[tuple[Any, bytes, dict[str, Any]]] = ()) -> int:  # type: ignore[assignment]
    pub = RecordPublisher(settings.kafka)
    n = 0
    for rec in worked_ledger():
        pub.publish(topics.DEVICE_MINUTES, job_key(rec["cluster"], rec["job_id"] or ""), rec)
        n += 1
    for rec in CORRECTIONS:
        pub.publish(topics.CORRECTIONS, job_key(rec["cluster"], rec["job_id"]), rec)
        n += 1
    for topic, key, rec in extra:
        pub.publish(topic, key, rec)
        n += 1
    pub.flush()
    return n


def run_sink(settings: Settings, group_id: str | None = None) -> Any:
    sinks = settings.sinks.model_copy(update={"group_id": group_id or settings.sinks.group_id})
    client = connect(settings.clickhouse)
    sink = LedgerSink(settings.kafka, sinks, LedgerWriter(client), topics=[t.name for t in SINK_TOPICS])
    stats = sink.run(lambda: False, max_idle_s=4.0)
    client.close()
    return stats


def totals(settings: Settings) -> tuple[int, int, Decimal]:
    client = connect(settings.clickhouse)
    rows, alloc = client.query("SELECT count(), sum(allocated_s) FROM device_minutes FINAL").result_rows[0]
    daily = client.query("SELECT sum(allocated_s) FROM usage_daily").result_rows[0][0]
    assert daily == alloc, "the daily rollup must equal the deduplicated minutes"
    charge = cb.chargeback(client, "2026-11", "team").total.charge
    client.close()
    return int(rows), int(alloc), charge


def dead_letters(settings: Settings, topic: topics.Topic, expect: int) -> list[tuple[dict[str, Any], dict[str, bytes]]]:
    consumer = Consumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([settings.kafka.topic(topic.dlq)])
    codec = AvroCodec()
    out = []
    for _ in range(40):
        for msg in consumer.consume(10, timeout=0.5):
            if msg.error() is None:
                out.append((codec.decode(msg.value()).record, dict(msg.headers() or [])))
        if len(out) >= expect:
            break
    consumer.close()
    return out


def test_replay_and_reemit_change_no_total_and_rejects_go_to_the_dlq(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str
) -> None:
    settings = make_settings(kafka_bootstrap, clickhouse_server, clickhouse_database)
    misaligned = {**worked_ledger()[0], "minute_start_ms": worked_ledger()[0]["minute_start_ms"] + 30_000}
    alert = {
        "alert_id": "a-1", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "c1", "job_id": "j1",
        "node": "n1", "device_uuids": ["GPU-b"], "user": "alice", "team": "vision", "project": "p-vision",
        "idle_minutes": 20, "cost_so_far": 0.54, "action": "SUSPEND", "action_at_ms": 1_795_000_600_000,
        "dry_run": True, "message": "GPU-b idle", "appeal_route": None, "emitted_ts_ms": None,
    }  # fmt: skip
    published = publish_ledger(
        settings, [(topics.DEVICE_MINUTES, b"c1/j1", misaligned), (topics.ALERTS, b"c1/j1", alert)]
    )
    # Bytes that are no record at all, straight onto the topic.
    pub = RecordPublisher(settings.kafka)
    pub.publish_raw(settings.kafka.topic(topics.DEVICE_MINUTES.name), b"c1/j1", b"not avro")
    pub.flush()

    first = run_sink(settings)
    assert first.records == published + 1
    assert first.dead_lettered == 2, [
        h for t in SINK_TOPICS for _, h in dead_letters(settings, t, 1 if t is topics.DEVICE_MINUTES else 0)
    ]
    expected_rows = len(worked_ledger())
    expected_alloc = sum(r["allocated_s"] for r in worked_ledger())
    assert totals(settings) == (expected_rows, expected_alloc, Decimal(EXPECTED_TOTAL))

    letters = dead_letters(settings, topics.DEVICE_MINUTES, 2)
    classes = sorted(h[HEADER_ERROR_CLASS].decode() for _, h in letters)
    assert classes == ["MalformedRecord", "RowRejected"]
    rejected = next((r, h) for r, h in letters if h[HEADER_ERROR_CLASS] == b"RowRejected")
    assert "VIOLATED_CONSTRAINT" in rejected[1][HEADER_ERROR_MESSAGE].decode()
    assert "minute_aligned" in rejected[0]["error_message"]
    assert rejected[0]["source_topic"] == settings.kafka.topic(topics.DEVICE_MINUTES.name)

    # Replay every offset (a fresh group) and re-emit the whole ledger: no total moves.
    replay = run_sink(settings, group_id=settings.sinks.group_id + "-replay")
    assert replay.records == published + 1 and replay.rows_inserted >= 0
    publish_ledger(settings)
    reemit = run_sink(settings)
    assert reemit.duplicates_skipped == expected_rows
    assert totals(settings) == (expected_rows, expected_alloc, Decimal(EXPECTED_TOTAL))

    client = connect(settings.clickhouse)
    assert client.query("SELECT count() FROM alerts FINAL").result_rows[0][0] == 1
    assert client.query("SELECT count() FROM attribution_corrections FINAL").result_rows[0][0] == 2
    client.close()


def test_reclaim_run_consumes_actions_and_runs_each_once(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Any
) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    settings = make_settings(kafka_bootstrap, clickhouse_server, clickhouse_database)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    name = settings.kafka.topic(topics.RECLAIM_ACTIONS.name)
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
    bindir, calls = fake_slurm_tools(tmp_path)
    # Both jobs still hold their devices and sat idle in their latest minute, as the executor re-checks
    # in ClickHouse before it acts.
    t0 = 1_794_990_000_000
    writer = connect(settings.clickhouse)
    migrate(writer, settings.clickhouse)
    job_events, _ = SINKS[topics.JOB_EVENTS.name]
    started = [job_event("STARTED", t0, job_id=job) for job in ("501", "502")]
    pending = [Pending(job_events, row, Origin("e", 0, i)) for i, r in enumerate(started) for row in job_events.rows(r)]
    assert not LedgerWriter(writer).write(pending).rejected
    writer.insert(
        "job_minutes", [["c1", job, t0 + 60_000, 1, 60, 0, 0, 60, 0, 0.0, 60] for job in ("501", "502")],
        column_names=["cluster", "job_id", "minute_start_ms", "device_count", "allocated_s", "active_s", "starved_s",
                      "idle_s", "dark_s", "sm_weighted_s", "sample_count"],
    )  # fmt: skip
    writer.close()
    pub = RecordPublisher(settings.kafka)
    base = {"ts_ms": 1_795_000_000_000, "cluster": "c1", "scheduler": "SLURM", "reason": "idle 60 min",
            "device_uuids": ["GPU-a"], "user": "alice", "project": "p-vision"}  # fmt: skip
    live = {**base, "action_id": "act-live", "job_id": "501", "action": "REQUEUE", "dry_run": False}
    dry = {**base, "action_id": "act-dry", "job_id": "502", "action": "CANCEL", "dry_run": True}
    for rec in (live, dry, live):  # the live action is delivered twice
        pub.publish(topics.RECLAIM_ACTIONS, job_key("c1", rec["job_id"]), rec)
    pub.flush()
    ch = settings.clickhouse
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "GPULEDGER_CONFIG": str(Path(__file__).resolve().parents[1] / "no-such-gpuledger.toml"),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
        "GPULEDGER_CLICKHOUSE__URL": ch.url,
        "GPULEDGER_CLICKHOUSE__DATABASE": ch.database,
        "GPULEDGER_CLICKHOUSE__PASSWORD": ch.password.get_secret_value(),
    }
    for group in ("reclaim-a", "reclaim-b"):  # the second run replays the topic from the start
        proc = subprocess.run(
            [sys.executable, "-c", "from gpuledger.cli import main; main()", "reclaim", "run", "--execute",
             "--max-idle-s", "3"],
            env={**env, "GPULEDGER_SINKS__GROUP_ID": group}, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    # once (the restart count read first: what a requeue in doubt is judged by); the dry-run action never ran
    assert calls.read_text().splitlines() == ["scontrol show job -o 501", "scontrol requeuehold 501"]
    client = connect(ch)
    rows = client.query(
        "SELECT action_id, step, status FROM action_outcomes FINAL ORDER BY action_id, step"
    ).result_rows
    assert rows == [("act-dry", 1, "planned"), ("act-live", 0, "started"), ("act-live", 1, "ok")]
    client.close()
