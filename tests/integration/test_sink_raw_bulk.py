"""Raw samples in bulk (`sinks/bulk_samples.py`, migration 030) on the embedded ClickHouse and a real broker.

ClickHouse's own Avro reader decodes the container the sink builds; what it stores must be what the row path
(fastavro, the contract's model, `sinks.rows`) stores, and every record the row path would dead-letter must fail
the bulk insert, so the batch goes record by record. The refused values are derived from the model's rules, so
a rule added to `schemas.models` fails here until migration 030's view checks it too.
"""

from __future__ import annotations

import math
import types
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from annotated_types import Ge, Le, MinLen
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_interop import InteropJava

from base.settings import ClickHouseSettings, KafkaSettings, SinksSettings
from processors.testing import device, job_event, scrape
from schemas import topics
from schemas.codec import SINGLE_OBJECT_HEADER_LEN, AvroCodec, ContractError
from schemas.models import model_for, validate
from schemas.topics import node_key
from sinks.bulk_samples import SYNC_LEN, WRAPPER_NAME, RawSampleBulk, container, container_header, wrapper_schema
from sinks.consumer import LedgerSink
from sinks.db import connect, migrate
from sinks.rows import SINKS
from sinks.seconds_kept import SecondsKept
from sinks.writer import LedgerWriter, Origin, Pending
from streams.consume import HEADER_ERROR_CLASS, SourceRecord
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
SUBJECT = topics.DEVICE_SAMPLES.subject
TOPIC = topics.DEVICE_SAMPLES.name
NOW_MS = 1_796_000_000_000  # recent enough for raw_samples' TTL
CODEC = AvroCodec()


def varied_scrapes() -> list[dict[str, Any]]:
    """Scrapes with what the columns can hold: nulls, MIG instances, pods, Slurm jobs, extremes, unicode."""
    out = []
    for i in range(12):
        devices = [
            device(f"GPU-{i}-{g}", g, sm=(g / 7 if g % 3 else None), gr=0.5, util_pct=100.0 * (g % 2),
                   fb_mib=(None if g == 5 else 1024.0 * g), power_w=(0.0 if g == 2 else 312.5),
                   mig=(g if i % 4 == 1 else None))
            for g in range(8)
        ]  # fmt: skip
        devices[1].update(pod=f"train-{i}", namespace="ml", container="worker", temperature_c=-3.5, xid_last=79)
        devices[2].update(hpc_job=str(1000 + i), mig_profile="1g.10gb", pci_bus_id="00000000:3B:00.0",
                          sm_occupancy_ratio=1.0, tensor_active_ratio=0.0, dram_active_ratio=0.25, fb_free_mib=0.0,
                          mem_copy_util_pct=12.5, pcie_tx_bytes_per_s=1e9, pcie_rx_bytes_per_s=0.0)  # fmt: skip
        devices[3].update(model=None, index=None)
        rec = scrape(f"nöde-{i}", NOW_MS + 1000 * i, devices, cluster="c1" if i % 2 else "kube-east")
        rec["exporter_version"] = None if i % 3 == 0 else "3.4.0"
        out.append(rec)
    out.append(scrape("empty-node", NOW_MS, []))  # no devices: no row either way
    return out


def _rules(annotation: Any) -> tuple[Any, list[Any]]:
    """(the base type, its constraints) of a model field's annotation (Optional and Annotated unwrapped)."""
    found: list[Any] = []
    while True:
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        elif typing.get_origin(annotation) is typing.Annotated:
            base, *meta = typing.get_args(annotation)
            for m in meta:
                found.extend(getattr(m, "metadata", [m]))
            annotation = base
        else:
            return annotation, found


def broken_values() -> Iterator[tuple[str, str, Any]]:
    """(where: "scrape" or "device", field, a value the model refuses), for every rule the model has."""
    model = model_for(SUBJECT)
    device_model = typing.get_args(model.model_fields["devices"].annotation)[0]
    for where, fields in (("scrape", model.model_fields), ("device", device_model.model_fields)):
        for name, info in fields.items():
            base, rules = _rules(info.annotation)
            rules += list(info.metadata)
            for rule in rules:
                if isinstance(rule, MinLen):
                    yield where, name, ""
                elif isinstance(rule, Ge):
                    yield where, name, base(rule.ge) - 1
                elif isinstance(rule, Le):
                    yield where, name, base(rule.le) + 1
            if base is float and rules:
                yield where, name, math.nan


def _bad_cases() -> list[Any]:
    cases = []
    for where, name, value in broken_values():
        cases.append(pytest.param(("value", where, name, value), id=f"{where}.{name}={value!r}"))
    for kind in ("truncated", "trailing-bytes", "bad-utf8", "empty-scrape-bad-cluster"):
        cases.append(pytest.param((kind,), id=kind))
    return cases


def encoded(rec: dict[str, Any]) -> bytes:
    return CODEC.encode(SUBJECT, rec)


def broken(case: tuple[Any, ...]) -> bytes:
    good = varied_scrapes()[1]
    kind = case[0]
    if kind == "value":
        _, where, name, value = case
        target = good if where == "scrape" else good["devices"][4]
        target[name] = value
        return encoded(good)
    if kind == "truncated":
        return encoded(good)[:-2]
    if kind == "trailing-bytes":
        return encoded(good) + b"\x02\x00"
    if kind == "bad-utf8":
        good["devices"][0]["pod"] = "PODMARK"
        data = encoded(good)
        return data.replace(b"PODMARK", b"POD\xff\xfeRK")
    assert kind == "empty-scrape-bad-cluster"
    return encoded(scrape("n", NOW_MS, [], cluster=""))


def sources(values: list[bytes], topic: str = TOPIC) -> list[SourceRecord]:
    return [SourceRecord(topic, 0, i, b"k", v) for i, v in enumerate(values)]


def table(client: Any) -> list[tuple[Any, ...]]:
    rows = client.query("SELECT * FROM raw_samples ORDER BY cluster, node, device_uuid, ts_ms").result_rows
    return [tuple(round(v, 9) if isinstance(v, float) else v for v in row) for row in rows]


def test_clickhouse_reading_the_container_stores_what_the_row_path_stores(
    ledger_database: tuple[Any, ClickHouseSettings], clickhouse_server: Any
) -> None:
    client, ch = ledger_database
    values = [encoded(r) for r in varied_scrapes()]
    bulk = RawSampleBulk(client, CODEC, TOPIC)
    assert bulk(sources(values)) == []
    assert bulk.stats.records == len(values) and bulk.stats.fell_back == 0
    via_bulk = table(client)

    other = "test_" + uuid.uuid4().hex[:16]
    admin = clickhouse_server.client()
    admin.command(f"CREATE DATABASE {other}")
    try:
        ch_rows = ch.model_copy(update={"database": other})
        row_client = connect(ch_rows)
        migrate(row_client, ch_rows)
        spec = SINKS[TOPIC][0]
        pending = []
        for i, v in enumerate(values):
            decoded = CODEC.decode(v, SUBJECT)
            validate(SUBJECT, decoded.record)
            pending += [Pending(spec, row, Origin(TOPIC, 0, i)) for row in spec.rows(decoded.record)]
        LedgerWriter(row_client).write(pending)
        via_rows = table(row_client)
        row_client.close()
    finally:
        admin.command(f"DROP DATABASE IF EXISTS {other} SYNC")
        admin.close()
    assert len(via_rows) == 12 * 8
    assert bulk.stats.rows == len(via_rows)
    assert via_bulk == via_rows


def test_the_reference_avro_library_reads_the_container(interop_java: InteropJava, tmp_path: Path) -> None:
    """Apache Avro Java's DataFileStream reads the container we hand ClickHouse: one block a scrape, its sync
    marker, head and tail the insert's number, and each scrape, written again by GenericDatumWriter, the very
    bytes of the record's body."""
    bodies = [encoded(r)[SINGLE_OBJECT_HEADER_LEN:] for r in varied_scrapes()]
    sync, nonce = bytes(range(SYNC_LEN)), 0x5EED_F00D_CAFE
    path = tmp_path / "bulk.avro"
    path.write_bytes(container(container_header(wrapper_schema(), sync), sync, bodies, nonce))
    out = interop_java.run("ocf", "--input", str(path), "--field", "scrape")
    assert (out["schema"], out["codec"], out["blocks"]) == (WRAPPER_NAME, "null", len(bodies))
    assert [r["head"] for r in out["records"]] == [r["tail"] for r in out["records"]] == [nonce] * len(bodies)
    assert [bytes.fromhex(r["scrape_hex"]) for r in out["records"]] == bodies


@pytest.mark.parametrize("case", _bad_cases())
def test_a_record_the_row_path_refuses_fails_the_bulk_insert(ledger_database: tuple[Any, ClickHouseSettings],
                                                             case: tuple[Any, ...]) -> None:  # fmt: skip
    client, _ = ledger_database
    bad = broken(case)
    with pytest.raises(ContractError):  # the row path dead-letters it
        validate(SUBJECT, CODEC.decode(bad, SUBJECT).record)
    good = [encoded(r) for r in varied_scrapes()[:4]]
    batch = sources([*good[:2], bad, *good[2:]])
    bulk = RawSampleBulk(client, CODEC, TOPIC)
    assert bulk(batch) == batch  # all of it, record by record
    assert bulk.stats.fell_back == 1 and bulk.stats.records == 0
    stored = client.query("SELECT count() FROM raw_samples").result_rows[0][0]
    assert stored in (0, 2 * 8)  # nothing, or a block before the bad one (the row path writes the same rows again)


def test_other_framings_and_topics_are_left_to_the_row_path(ledger_database: tuple[Any, ClickHouseSettings]) -> None:
    client, _ = ledger_database
    good = encoded(varied_scrapes()[2])
    legacy = good[:2] + good[2:10][::-1] + good[10:]  # the big-endian fingerprint older writers used
    confluent = b"\x00\x00\x00\x00\x07" + good[10:]
    other_topic = sources([good], topic="another.topic")
    batch = [*sources([legacy, confluent, b""]), *other_topic, *sources([good])]
    bulk = RawSampleBulk(client, CODEC, TOPIC)
    assert bulk(batch) == batch[:4]
    assert bulk.stats.records == 1
    assert client.query("SELECT count() FROM raw_samples").result_rows[0][0] == 8


def test_confluent_framing_through_the_registry_lands_in_bulk_too(
    ledger_database: tuple[Any, ClickHouseSettings], registry_url: str
) -> None:
    client, _ = ledger_database
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", topic_prefix=f"r{uuid.uuid4().hex[:8]}.",
                          schema_registry_url=registry_url)  # fmt: skip
    codec = AvroCodec.from_settings(kafka)
    scrapes = varied_scrapes()[:6]
    values = [codec.encode(SUBJECT, r) for r in scrapes]
    assert all(v[:1] == b"\x00" for v in values)  # what a stack with a registry writes
    event = job_event("STARTED", "j1", NOW_MS, {"n1": ["GPU-1"]})
    other = codec.encode(topics.JOB_EVENTS.subject, event)  # another subject's id on the samples topic
    batch = sources([*values, other])
    bulk = RawSampleBulk(client, codec, TOPIC)
    assert bulk(batch) == batch[-1:]
    assert bulk.stats.records == 6 and bulk.stats.fell_back == 0
    assert client.query("SELECT count() FROM raw_samples").result_rows[0][0] == 6 * 8


def test_the_sink_lands_samples_in_bulk_and_dead_letters_the_bad_one_with_its_reason(
    kafka_bootstrap: str, ledger_database: tuple[Any, ClickHouseSettings]
) -> None:
    client, ch = ledger_database
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + TOPIC, prefix + topics.DEVICE_SAMPLES.dlq]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
    cfg = SinksSettings(group_id=f"sink-{uuid.uuid4().hex[:6]}", batch_max_records=500, batch_max_wait_s=0.3)
    pub = RecordPublisher(kafka)
    scrapes = varied_scrapes()[:12]
    for rec in scrapes:
        pub.publish(topics.DEVICE_SAMPLES, node_key(rec["cluster"], rec["node"]), rec)
    pub.flush()

    def run() -> Any:
        sink = LedgerSink(kafka, cfg, LedgerWriter(connect(ch)), topics=[TOPIC], kept=SecondsKept())  # every second
        assert sink._bulk is not None
        stats = sink.run(lambda: False, max_idle_s=4.0)
        return stats, sink._bulk.stats

    stats, bulk = run()
    assert (bulk.records, bulk.fell_back) == (12, 0) == (stats.bulk_records, stats.bulk_refused)
    assert stats.rows_inserted == 12 * 8 and stats.dead_lettered == 0

    later = [dict(r, ts_ms=r["ts_ms"] + 60_000) for r in scrapes[:3]]
    later[1]["devices"][0]["power_w"] = -1.0
    for rec in later:
        pub.publish(topics.DEVICE_SAMPLES, node_key(rec["cluster"], rec["node"]), rec)
    pub.flush()
    stats, bulk = run()
    assert bulk.records == 0 and bulk.fell_back >= 1
    assert stats.dead_lettered == 1 and stats.rows_inserted == 2 * 8
    assert client.query("SELECT count() FROM raw_samples FINAL").result_rows[0][0] == 14 * 8

    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([prefix + topics.DEVICE_SAMPLES.dlq])
    got = []
    for _ in range(100):
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append(dict(msg.headers() or []))
        if got:
            break
    consumer.close()
    assert len(got) == 1
    assert got[0][HEADER_ERROR_CLASS] == b"InvalidRecord"
