"""What `raw_samples` keeps (`clickhouse.raw_samples_kept`, issue 44 item 3) and the dispute's drill-down under each
choice, on the embedded ClickHouse and a real broker.

One node's scrapes (2 devices, 30 seconds from a whole minute, each sent 0.2 s after it was taken, as a live
producer sends it) go through the product's sink (`LedgerSink`, bulk path on) into a fresh database per choice:
- every second: all 60 rows; `report seconds`' reader returns them from the warehouse;
- sampled, one in 10: the scrapes of seconds 0, 10 and 20 (6 rows), the others consumed and counted;
- minutes: no row, the topic not read at all, and the reader returns all 60 rows from Kafka: the same rows the
  warehouse would hold (the sink's own mapping), found among another node's scrapes and ended by a record stamped
  past the span.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from base.errors import ServiceError
from base.kafka import new_producer
from base.settings import ClickHouseSettings, KafkaSettings, Settings, SinksSettings
from processors.testing import device, job_event, scrape
from schemas import topics
from schemas.codec import AvroCodec
from schemas.records import NodeScrape
from schemas.topics import job_key, node_key
from sinks import reports
from sinks.consumer import LedgerSink
from sinks.db import connect
from sinks.rows import RAW_SAMPLE_COLUMNS, raw_sample_rows
from sinks.seconds import SECOND_COLUMNS, device_seconds, from_kafka
from sinks.seconds_kept import SecondsKept
from sinks.writer import LedgerWriter

pytestmark = pytest.mark.integration
START_MS = (int(time.time()) // 60 - 90) * 60_000  # a whole minute 90 minutes ago: inside raw_samples' TTL
SPAN_S = 30


def _scrape(node: str, second: int) -> dict[str, Any]:
    return scrape(node, START_MS + 1000 * second,
                  [device(f"GPU-{node}-{g}", g, sm=0.25 * g + second % 30 / 100, fb_mib=1024.0,
                          power_w=100.0 + second % 30)
                   for g in range(2)])  # fmt: skip


def _rows(scrapes: list[dict[str, Any]], device_uuid: str | None = None) -> list[dict[str, Any]]:
    out = [dict(zip(RAW_SAMPLE_COLUMNS, r, strict=True)) for s in scrapes for r in raw_sample_rows(
        NodeScrape.from_avro(s))]  # fmt: skip
    out = [{c: r[c] for c in SECOND_COLUMNS} for r in out if device_uuid in (None, r["device_uuid"])]
    return sorted(out, key=lambda r: (r["device_uuid"], r["ts_ms"]))


def _plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: round(v, 9) if isinstance(v, float) else v for k, v in r.items()} for r in rows]


@pytest.fixture(scope="module")
def produced(kafka_bootstrap: str) -> Iterator[tuple[KafkaSettings, list[dict[str, Any]]]]:
    """The topics under a prefix of their own; n1's 30 scrapes, n2's beside them, a job event, and one n1 scrape
    sent 10 minutes later (the Kafka reader stops there; not a kept second)."""
    prefix = f"k{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + t for t in (topics.DEVICE_SAMPLES.name, topics.DEVICE_SAMPLES.dlq, topics.JOB_EVENTS.name,
                                  topics.JOB_EVENTS.dlq)]  # fmt: skip
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
    codec = AvroCodec()
    producer = new_producer(kafka)
    n1 = [_scrape("n1", s) for s in range(SPAN_S)]
    sent = [(s, t) for s in range(SPAN_S) for t in (n1[s], _scrape("n2", s))] + [(605, _scrape("n1", 605))]
    for second, rec in sent:  # stamped as a live producer stamps them: when sent, just after the scrape
        producer.produce(kafka.topic(topics.DEVICE_SAMPLES.name), codec.encode(topics.DEVICE_SAMPLES.subject, rec),
                         node_key("c1", rec["node"]), timestamp=START_MS + 1000 * second + 200)  # fmt: skip
    event = job_event("STARTED", "j1", START_MS, {"n1": ["GPU-n1-0", "GPU-n1-1"]})
    producer.produce(kafka.topic(topics.JOB_EVENTS.name), codec.encode(topics.JOB_EVENTS.subject, event),
                     job_key("c1", "j1"))  # fmt: skip
    assert producer.flush(30) == 0
    del producer  # destroyed now, not left reconnecting after the broker stops
    yield kafka, n1


def _sink(kafka: KafkaSettings, ch: ClickHouseSettings, kept: SecondsKept, names: list[str]) -> Any:
    cfg = SinksSettings(group_id=f"sink-{uuid.uuid4().hex[:6]}", batch_max_records=500, batch_max_wait_s=0.3)
    sink = LedgerSink(kafka, cfg, LedgerWriter(connect(ch)), topics=names, kept=kept)
    try:
        return sink, sink.run(lambda: False, max_idle_s=3.0)
    finally:
        sink.close()


@pytest.mark.parametrize("mode", ["every_second", "sampled", "minutes"])
def test_raw_samples_keep_what_the_setting_says_and_the_seconds_are_found(
    mode: str, produced: tuple[KafkaSettings, list[dict[str, Any]]], ledger_database: tuple[Any, ClickHouseSettings]
) -> None:
    kafka, n1 = produced
    client, ch = ledger_database
    ch = ch.model_copy(update={"raw_samples_kept": mode})
    kept = SecondsKept.of(ch)
    sink, stats = _sink(kafka, ch, kept, [topics.DEVICE_SAMPLES.name, topics.JOB_EVENTS.name])
    stored = client.query("SELECT count() FROM raw_samples FINAL").result_rows[0][0]
    assert client.query("SELECT count() FROM job_events").result_rows[0][0] == 1  # the rest of the sink still lands
    scrapes = 2 * SPAN_S + 1  # n1, n2, the late one
    if mode == "every_second":
        assert (stored, stats.samples_not_kept) == (2 * scrapes, 0)
    elif mode == "sampled":
        assert (stored, stats.samples_not_kept) == (2 * 2 * 3, scrapes - 2 * 3)  # seconds 0, 10, 20 of n1 and n2
        assert stats.bulk_records == 2 * 3  # the kept ones went in bulk, the others were taken before it
    else:
        assert stored == 0 and stats.samples_not_kept == 0
        assert kafka.topic(topics.DEVICE_SAMPLES.name) not in sink._routes  # not read at all
        with pytest.raises(ServiceError, match="raw samples are not kept"):
            _sink(kafka, ch, kept, [topics.DEVICE_SAMPLES.name])

    end_ms = START_MS + 60_000
    found = device_seconds(kept, lambda: connect(ch), kafka, "c1", "n1", START_MS, end_ms)
    wanted = _rows([s for s in n1 if kept.keeps(s["ts_ms"])] if mode == "sampled" else n1)
    assert found.source == ("kafka" if mode == "minutes" else "warehouse")
    assert _plain(found.rows) == _plain(wanted)
    one = device_seconds(kept, lambda: connect(ch), kafka, "c1", "n1", START_MS + 5000, START_MS + 8000, "GPU-n1-1")
    assert _plain(one.rows) == _plain(_rows(n1[5:8], "GPU-n1-1") if mode != "sampled" else [])

    if mode == "sampled":  # every second still in Kafka's retention, on request
        every = device_seconds(kept, lambda: connect(ch), kafka, "c1", "n1", START_MS, end_ms, from_kafka_=True)
        assert every.source == "kafka" and _plain(every.rows) == _plain(_rows(n1))
    if mode == "minutes":  # read from Kafka: n2's records on the way skipped, stopped at the one sent 10 min later
        rows, scanned = from_kafka(kafka, "c1", "n1", START_MS, end_ms)
        assert len(rows) == 2 * SPAN_S and SPAN_S <= scanned <= 2 * SPAN_S

    # what `gpuledger report seconds` shows (the analyst's client for the warehouse)
    settings = Settings(kafka=kafka, clickhouse=ch)
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(START_MS / 1000))
    shown = reports.seconds(settings, "c1", "n1", start, 1, "GPU-n1-0")
    assert _plain(shown.rows) == _plain([r for r in wanted if r["device_uuid"] == "GPU-n1-0"])
    where = {"every_second": "from the warehouse (raw_samples), which keeps every second",
             "sampled": "from the warehouse (raw_samples), which keeps one second in 10",
             "minutes": "from Kafka"}[mode]  # fmt: skip
    assert where in str(shown.under[0])
