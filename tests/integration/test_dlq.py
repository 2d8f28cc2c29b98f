"""Dead letters through the real broker: bad records of every kind go to `<topic>.dlq`, good ones are
processed, and one consumer keeps running through all of it (property-based, hypothesis)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.settings import KafkaSettings
from schemas.codec import AvroCodec
from schemas.models import model_for
from schemas.topics import DEVICE_SAMPLES
from streams.consume import (
    HEADER_ERROR_CLASS,
    HEADER_SCHEMA_FINGERPRINT,
    HEADER_SOURCE_OFFSET,
    HEADER_SOURCE_PARTITION,
    HEADER_SOURCE_TOPIC,
    ConsumerLoop,
    Received,
)
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

CODEC = AvroCodec()
SUBJECT = DEVICE_SAMPLES.subject

# -- what gets thrown at the consumer ---------------------------------------------------------

ratio = st.one_of(st.none(), st.floats(0, 1))
device = st.fixed_dictionaries(
    {
        "uuid": st.text(min_size=1, max_size=12).map(lambda s: f"GPU-{s}"),
        "index": st.one_of(st.none(), st.integers(0, 15)),
        "sm_active_ratio": ratio,
        "gr_engine_active_ratio": ratio,
        "tensor_active_ratio": ratio,
        "gpu_util_pct": st.one_of(st.none(), st.floats(0, 100)),
        "fb_used_mib": st.one_of(st.none(), st.floats(0, 200_000)),
        "power_w": st.one_of(st.none(), st.floats(0, 1500)),
        "xid_last": st.one_of(st.none(), st.integers(0, 200)),
    }
)


def _full(record: dict[str, Any]) -> dict[str, Any]:
    return model_for(SUBJECT).model_validate(record).model_dump()


good_scrape = st.builds(
    lambda cluster, node, ts, devices: _full(
        {
            "cluster": cluster,
            "node": node,
            "ts_ms": ts,
            "source": "dcgm-exporter",
            "mapping_version": "m1",
            "devices": devices,
        }
    ),
    st.text(min_size=1, max_size=8),
    st.text(min_size=1, max_size=8),
    st.integers(0, 2**42),
    st.lists(device, max_size=8),
)


def _break_rule(scrape: dict[str, Any], how: int) -> dict[str, Any]:
    """A record that encodes and decodes fine but breaks a model rule."""
    bad = {**scrape, "devices": [dict(d) for d in scrape["devices"]]}
    if how == 0 or not bad["devices"]:
        bad["cluster"] = ""
    elif how == 1:
        bad["devices"][0]["sm_active_ratio"] = 1.5
    elif how == 2:
        bad["devices"][0]["power_w"] = -3.0
    else:
        bad["ts_ms"] = -1
    return bad


GOOD, MALFORMED, INVALID = "good", "malformed", "invalid"

def items(codec: AvroCodec) -> st.SearchStrategy[tuple[str, bytes, Any]]:
    """(kind, value bytes, expected record or error class) for records written with `codec`'s framing."""
    enc = codec.encode
    alert = {"alert_id": "a", "kind": "IDLE_WARNING", "ts_ms": 1, "cluster": "c", "message": "m"}
    # Random bytes starting with 00 look Confluent-framed (an unknown id: UnknownSchema); those
    # naming a registered schema id (< 256 here) are left out, they could decode by chance.
    noise = st.binary(max_size=64).filter(lambda b: not b.startswith(b"\x00\x00\x00\x00"))
    return st.one_of(
        good_scrape.map(lambda r: (GOOD, enc(SUBJECT, r), r)),
        noise.map(lambda b: (MALFORMED, b, "MalformedRecord|UnknownSchema")),
        st.tuples(good_scrape, st.integers(1, 40)).map(
            lambda t: (MALFORMED, enc(SUBJECT, t[0])[: -t[1]], "MalformedRecord|UnknownSchema")
        ),
        good_scrape.map(lambda r: (MALFORMED, enc(SUBJECT, r) + b"\x01\x02", "MalformedRecord")),
        st.tuples(good_scrape, st.binary(min_size=8, max_size=8)).map(
            lambda t: (MALFORMED, b"\xc3\x01" + t[1] + CODEC.encode(SUBJECT, t[0])[10:], "UnknownSchema")
        ),
        st.tuples(good_scrape, st.integers(0, 3)).map(
            lambda t: (INVALID, enc(SUBJECT, _break_rule(*t)), "InvalidRecord")
        ),
        st.text(max_size=5).map(lambda c: (INVALID, enc("alerts", {**alert, "cluster": c}), "WrongSubject")),
    )


# -- the test ---------------------------------------------------------------------------------


def _dlq_reader(conf: dict[str, str], topic: str) -> Consumer:
    consumer = Consumer({**conf, "group.id": f"dlq-reader-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    return consumer


@pytest.mark.parametrize("wire", ["single-object", "confluent"])
def test_bad_records_go_to_the_dlq_and_the_consumer_keeps_running(
    kafka_config: dict[str, str], unique_topic: Callable[[str], str], wire: str
):
    # A unique topic prefix, so the topic is the catalogue's samples topic (the consumer knows its subject).
    registry = f"mock://dlq-{uuid.uuid4().hex}" if wire == "confluent" else None
    kafka = KafkaSettings(
        bootstrap_servers=kafka_config["bootstrap.servers"],
        topic_prefix=unique_topic("dlq") + ".",
        schema_registry_url=registry,
    )
    codec = AvroCodec.from_settings(kafka)  # one mock registry per URL in this process
    assert codec.wire_format == wire
    topic = kafka.topic(DEVICE_SAMPLES.name)
    admin = AdminClient(kafka_config)
    for future in admin.create_topics([NewTopic(topic, 3, 1), NewTopic(topic + ".dlq", 1, 1)]).values():
        future.result(timeout=30)

    publisher = RecordPublisher(kafka, **{"linger.ms": "1"})
    consumer = ConsumerLoop(
        kafka,
        f"worker-{uuid.uuid4().hex}",
        [topic],
        publisher=publisher,
        batch_max_records=100,
        batch_max_wait_s=0.2,
        config={"fetch.wait.max.ms": "50"},
    )
    producer = Producer({**kafka_config, "linger.ms": "1"})
    dlq_reader = _dlq_reader(kafka_config, topic + ".dlq")
    processed: dict[bytes, dict[str, Any]] = {}
    dead: dict[bytes, Any] = {}

    def take(batch: list[Received]) -> None:
        for received in batch:
            processed[received.source.key or b""] = received.record

    examples = 0

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(items=st.lists(items(codec), min_size=1, max_size=25))
    def run(items: list[tuple[str, bytes, Any]]) -> None:
        nonlocal examples
        examples += 1
        run_id = uuid.uuid4().hex[:8]
        delivered: dict[bytes, tuple[int, int]] = {}

        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            delivered[msg.key()] = (msg.partition(), msg.offset())

        keys = [f"{run_id}-{i}".encode() for i in range(len(items))]
        for key, (_, value, _) in zip(keys, items, strict=True):
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        assert producer.flush(30) == 0

        want_good = {k: it[2] for k, it in zip(keys, items, strict=True) if it[0] == GOOD}
        want_bad = {k: it for k, it in zip(keys, items, strict=True) if it[0] != GOOD}
        deadline = time.monotonic() + 60
        mine = lambda d: {k for k in d if k.startswith(run_id.encode())}  # noqa: E731
        seen = lambda: consumer.stats.decoded + consumer.stats.dead_lettered  # noqa: E731
        seen_before = seen()
        while seen() - seen_before < len(items):
            assert time.monotonic() < deadline, "consumer stopped making progress"
            consumer.step(take)  # dead letters delivered, then the batch committed
        assert mine(processed) == set(want_good)
        for key, record in want_good.items():
            assert processed[key] == record

        while len(mine(dead)) < len(want_bad):
            assert time.monotonic() < deadline, f"DLQ has {len(mine(dead))} of {len(want_bad)} bad records"
            for msg in dlq_reader.consume(100, timeout=0.2):
                assert msg.error() is None, msg.error()
                dead[msg.key()] = msg
        assert mine(dead) == set(want_bad)
        for key, (_, value, error_class) in want_bad.items():
            msg = dead[key]
            headers = dict(msg.headers())
            partition, offset = delivered[key]
            assert headers[HEADER_ERROR_CLASS].decode() in error_class.split("|"), (headers, value)
            assert headers[HEADER_SOURCE_TOPIC] == topic.encode()
            assert headers[HEADER_SOURCE_PARTITION] == str(partition).encode()
            assert headers[HEADER_SOURCE_OFFSET] == str(offset).encode()
            assert HEADER_SCHEMA_FINGERPRINT in headers
            assert msg.value()[:1] == (b"\x00" if wire == "confluent" else b"\xc3")
            envelope = codec.decode(msg.value(), expected_subject="deadletter").record
            assert envelope["value"] == value and envelope["key"] == key
            assert (envelope["source_partition"], envelope["source_offset"]) == (partition, offset)

    try:
        run()
        assert examples >= 10
        classes = {dict(m.headers())[HEADER_ERROR_CLASS].decode() for m in dead.values()}
        assert classes == {"MalformedRecord", "UnknownSchema", "InvalidRecord", "WrongSubject"}
        assert processed, "no good record was processed"
        # Still the same consumer, still running: one more good record goes straight through.
        last = _full({"cluster": "c", "node": "n", "ts_ms": 5, "source": "s", "mapping_version": "m", "devices": []})
        producer.produce(topic, key=b"last", value=codec.encode(SUBJECT, last))
        producer.flush(30)
        deadline = time.monotonic() + 30
        while b"last" not in processed and time.monotonic() < deadline:
            consumer.step(take)
        assert processed[b"last"] == last
    finally:
        consumer.close()
        dlq_reader.close()
        admin.delete_topics([topic, topic + ".dlq"])
