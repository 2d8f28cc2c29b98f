"""Records round-trip through the real broker with confluent-kafka; a compacted topic compacts."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

pytestmark = pytest.mark.integration


def _consume_all(conf: dict[str, str], topic: str, expected: int, timeout: float = 30.0) -> list[tuple]:
    consumer = Consumer(
        {
            **conf,
            "group.id": f"reader-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": "false",
            "fetch.queue.backoff.ms": "10",
        }
    )
    consumer.subscribe([topic])
    out: list[tuple] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers()))
    finally:
        consumer.close()
    return out


def test_round_trip_keys_values_headers_and_order(kafka_config, new_topic):
    topic = new_topic("roundtrip", partitions=3)
    producer = Producer({**kafka_config, "linger.ms": "5", "enable.idempotence": "true"})
    sent = {}
    for i in range(300):
        key = f"node-{i % 7}".encode()
        producer.produce(topic, key=key, value=f"v{i}".encode(), headers=[("seq", str(i).encode())])
        sent.setdefault(key, []).append(f"v{i}".encode())
    assert producer.flush(30) == 0

    got = _consume_all(kafka_config, topic, 300)
    assert len(got) == 300
    by_key: dict[bytes, list[bytes]] = {}
    partition_of: dict[bytes, set[int]] = {}
    for partition, _, key, value, headers in sorted(got, key=lambda r: (r[0], r[1])):
        by_key.setdefault(key, []).append(value)
        partition_of.setdefault(key, set()).add(partition)
        assert dict(headers)["seq"] == value[1:]
    # Same key, same partition, order kept within it.
    assert by_key == sent
    assert all(len(p) == 1 for p in partition_of.values())


def _take(consumer: Consumer, n: int, timeout_s: float = 30) -> tuple[list[bytes], Message | None]:
    """Up to `n` values read within `timeout_s`, and the last message read."""
    values: list[bytes] = []
    last = None
    deadline = time.monotonic() + timeout_s
    while len(values) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            values.append(msg.value())
            last = msg
    return values, last


def test_committed_offset_resumes_consumer_group(kafka_config, new_topic):
    topic = new_topic("resume")
    producer = Producer(kafka_config)
    for i in range(10):
        producer.produce(topic, value=str(i).encode())
    producer.flush(30)

    group = f"g-{topic}"
    conf = {**kafka_config, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": "false"}
    first = Consumer(conf)
    first.subscribe([topic])
    seen, last = _take(first, 4)
    if len(seen) == 4:
        first.commit(message=last, asynchronous=False)
    first.close()
    assert seen == [b"0", b"1", b"2", b"3"]

    second = Consumer(conf)
    second.subscribe([topic])
    rest, _ = _take(second, 6)
    committed = second.committed([TopicPartition(topic, 0)], timeout=10)
    second.close()
    assert rest == [str(i).encode() for i in range(4, 10)]
    assert committed[0].offset == 4


def test_compacted_topic_keeps_latest_value_per_key(kafka_config, new_topic):
    topic = new_topic(
        "compacted",
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
        },
    )
    admin = AdminClient(kafka_config)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["cleanup.policy"].value == "compact"

    producer = Producer(kafka_config)
    for round_ in range(5):
        for key in ("a", "b", "c"):
            producer.produce(topic, key=key.encode(), value=f"{key}{round_}".encode())
        producer.flush(30)
        time.sleep(0.2)  # segment.ms passes: the next write rolls a segment, the old one is cleanable

    # The cleaner runs every second; wait until the superseded values are gone.
    deadline = time.monotonic() + 60
    while True:
        producer.produce(topic, key=b"roll", value=b"x")  # keeps rolling the active segment
        producer.flush(30)
        records = _consume_all(kafka_config, topic, 10_000, timeout=3)
        latest = {k: v for _, _, k, v, _ in records}
        abc = [(k, v) for _, _, k, v, _ in records if k in (b"a", b"b", b"c")]
        if len(abc) == 3 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {k: latest[k] for k in (b"a", b"b", b"c")} == {b"a": b"a4", b"b": b"b4", b"c": b"c4"}
    assert len(abc) == 3, f"not compacted: {abc}"
