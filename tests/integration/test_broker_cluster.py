"""The replicated local broker (issue 21): three KRaft nodes on loopback from the project's launcher.

- `gpuledger topics apply` against three nodes: every topic (and its .dlq) has three replicas, all in
  sync, and `min.insync.replicas` 2, as the broker itself describes them (AdminClient).
- One node killed -9 while the project's producer (`base.kafka.new_producer`: acks=all, idempotent)
  writes and a consumer reads, then started again: every record delivered and read exactly once, in
  order per partition; the restarted node rejoins every ISR.
- `gpuledger up` with `broker.nodes = 3` starts the three nodes as components, its `topics` step replicates
  every topic on three (min ISR 2) with nothing else set, and `down` stops them.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from fixtures_cli import run_gpuledger

from base.kafka import new_consumer, new_producer, watermarks
from base.settings import KafkaSettings, Settings
from schemas.topics import DEVICE_SAMPLES, all_topics
from stack import broker
from streams.topics_admin import BrokerTopics, desired_topics, plan

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

KAFKA_VERSION = Settings().broker.kafka_version


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[broker.LocalCluster]:
    root = tmp_path_factory.mktemp("kafka-cluster")
    cfgs = broker.cluster_on_free_ports(root, KAFKA_VERSION, heap="384m")
    with broker.LocalCluster(cfgs, logs=root) as c:
        yield c


def _kafka(c: broker.LocalCluster, prefix: str) -> KafkaSettings:
    # As `Settings` derives them for `broker.nodes = 3` (tests/unit/test_broker.py).
    return KafkaSettings(bootstrap_servers=c.bootstrap, topic_prefix=prefix, replication_factor=3)


def _apply(kafka: KafkaSettings) -> None:
    topics = BrokerTopics(kafka, timeout_s=30)
    wanted = desired_topics(kafka)
    plans = plan(wanted, topics.state(w.name for w in wanted))
    topics.apply(plans)
    assert not [p.error for p in plans if p.error]
    assert topics.wait_until_visible(plans)


def _isr_full(admin: AdminClient, topic: str, replicas: int = 3) -> bool:
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return all(len(p.replicas) == replicas and len(p.isrs) == replicas for p in md.partitions.values())


def test_topics_apply_replicates_every_topic_on_three_nodes(cluster: broker.LocalCluster) -> None:
    prefix = f"rep-{uuid.uuid4().hex[:6]}."
    kafka = _kafka(cluster, prefix)
    _apply(kafka)
    admin = AdminClient(cluster.client_config())
    names = [prefix + t.name for t in all_topics()]
    assert any(n.endswith(".dlq") for n in names)  # the catalogue and every .dlq
    md = admin.list_topics(timeout=10)
    assert set(md.brokers) == {1, 2, 3}
    deadline = time.monotonic() + 60
    while not all(_isr_full(admin, n) for n in names) and time.monotonic() < deadline:
        time.sleep(0.5)
    for name in names:
        topic = md.topics[name]
        for p in topic.partitions.values():
            assert sorted(p.replicas) == [1, 2, 3], (name, p.id, p.replicas)
        assert _isr_full(admin, name), name
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
    for resource, fut in futures.items():
        entries = fut.result(timeout=30)
        assert entries["min.insync.replicas"].value == "2", resource.name
    # The broker's own internal topic (group offsets) is replicated too: a dead node loses no commit.
    offsets = admin.list_topics("__consumer_offsets", timeout=10).topics.get("__consumer_offsets")
    if offsets is not None and offsets.error is None:  # created at the first group's first request
        assert all(len(p.replicas) == 3 for p in offsets.partitions.values())
    # A second apply finds everything in sync: replication and min ISR are not drift.
    topics = BrokerTopics(kafka, timeout_s=30)
    again = plan(desired_topics(kafka), topics.state(names))
    assert all(p.in_sync for p in again), [(p.name, p.changes, p.drift) for p in again if not p.in_sync]


class _Reader(threading.Thread):
    """Reads `topic` from the start in its own group until told to stop; keeps (partition, value)."""

    def __init__(self, kafka: KafkaSettings, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = new_consumer(kafka, f"reader-{uuid.uuid4().hex[:6]}")
        self.consumer.subscribe([topic])
        self.seen: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for msg in self.consumer.consume(500, 0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() != KafkaError._PARTITION_EOF and err.fatal():
                            self.errors.append(str(err))
                        continue
                    self.seen.append((int(msg.partition() or 0), int(msg.value() or b"-1")))
        finally:
            self.consumer.close()


def test_one_node_killed_9_and_restarted_while_producing_and_consuming(cluster: broker.LocalCluster) -> None:
    prefix = f"kill-{uuid.uuid4().hex[:6]}."
    kafka = _kafka(cluster, prefix)
    _apply(kafka)
    topic = kafka.topic(DEVICE_SAMPLES.name)
    admin = AdminClient(cluster.client_config())
    total = 30_000
    producer = new_producer(kafka)  # the project's one producer: acks=all, idempotent
    assert producer is not None
    delivered: list[tuple[int, int]] = []
    failed: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            delivered.append((int(msg.partition() or 0), int(msg.value() or b"-1")))

    reader = _Reader(kafka, topic)
    reader.start()
    # The node leading partition 0 when writing starts: killing it moves leadership mid-write.
    victim = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    assert victim in cluster.nodes
    killed_at = restarted_at = -1
    t0 = time.monotonic()
    for i in range(total):
        producer.produce(topic, key=f"sim/node-{i % 40}".encode(), value=str(i).encode(), on_delivery=on_delivery)
        producer.poll(0)
        if i % 500 == 499:
            time.sleep(0.05)  # ~10k records/s: the writes span the kill and the restart
        if i == total // 3:
            cluster.kill(victim)
            killed_at = i
        if i == 2 * total // 3:
            # Down long enough for the controller to fence it (broker session timeout, 9 s).
            time.sleep(max(0.0, 12 - (time.monotonic() - t0)))
            cluster.start_node(victim)
            restarted_at = i
    assert producer.flush(120) == 0
    assert killed_at > 0 and restarted_at > killed_at
    assert failed == []
    assert sorted(v for _, v in delivered) == list(range(total))  # each delivered once, none lost
    deadline = time.monotonic() + 120
    while len(reader.seen) < total and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)  # a duplicate would arrive after the last original: give it the time to show
    reader.stop.set()
    reader.join(30)
    values = [v for _, v in reader.seen]
    assert reader.errors == []
    assert len(values) == total, f"read {len(values)} of {total}"
    assert sorted(values) == list(range(total))  # nothing lost, nothing duplicated
    # Per key (hence per partition) in the order produced: idempotence kept the order through the retries.
    by_partition: dict[int, list[int]] = {}
    for p, v in reader.seen:
        by_partition.setdefault(p, []).append(v)
    assert all(vs == sorted(vs) for vs in by_partition.values())
    # The broker's own log has each record once as well (high watermarks sum to the count).
    assert sum(watermarks(new_consumer(kafka, "wm"), tp)[1] for tp in _partitions(admin, topic)) == total
    # The restarted node catches up and rejoins every ISR.
    deadline = time.monotonic() + 120
    while not _isr_full(admin, topic) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _isr_full(admin, topic)


def _partitions(admin: AdminClient, topic: str) -> list[object]:
    from confluent_kafka import TopicPartition

    return [TopicPartition(topic, p) for p in admin.list_topics(topic, timeout=10).topics[topic].partitions]


def test_up_with_three_nodes_starts_and_stops_the_cluster(tmp_path: Path) -> None:
    port = broker.free_ports(1)[0]
    # Nodes at port, port+10, port+20 (controllers +1): find a base whose six ports are free.
    for _ in range(20):
        ports = [port + 10 * k + d for k in range(3) for d in (0, 1)]
        try:
            for p in ports:
                broker.check_port_free("127.0.0.1", p)
            break
        except Exception:
            port = broker.free_ports(1)[0]
    env = {
        **os.environ,
        "GPULEDGER_BROKER__NODES": "3",
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(port + 1),
        "GPULEDGER_BROKER__HEAP": "384m",
    }
    env.pop("GPULEDGER_KAFKA__BOOTSTRAP_SERVERS", None)
    state = tmp_path / "state"
    try:
        up = run_gpuledger(["up", "--state-dir", str(state), "--only", "broker,broker-2,broker-3,topics"], env, 300)
        assert up.returncode == 0, up.stdout + up.stderr
        bootstrap = ",".join(f"127.0.0.1:{port + 10 * k}" for k in range(3))
        assert broker.live_brokers({"bootstrap.servers": bootstrap}, timeout=10) == {1, 2, 3}
        # `topics`, with nothing but broker.nodes = 3 set, replicated every topic on the three nodes.
        admin = AdminClient({"bootstrap.servers": bootstrap})
        md = admin.list_topics(timeout=10).topics
        names = [t.name for t in all_topics()]
        assert set(names) <= set(md)
        assert {len(p.replicas) for n in names for p in md[n].partitions.values()} == {3}
        futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names])
        assert {f.result(timeout=30)["min.insync.replicas"].value for f in futures.values()} == {"2"}
        for k in (1, 2, 3):
            props = (state / "kafka-cluster" / f"node-{k}" / "server.properties").read_text()
            assert f"node.id={k}\n" in props
            voters = ",".join(f"{j}@127.0.0.1:{port + 10 * (j - 1) + 1}" for j in (1, 2, 3))
            assert f"controller.quorum.voters={voters}\n" in props
        cluster_id = (state / "kafka-cluster" / broker.CLUSTER_ID_FILE).read_text().strip()
        for k in (1, 2, 3):
            meta = (state / "kafka-cluster" / f"node-{k}" / "data" / broker.META_PROPERTIES).read_text()
            assert f"cluster.id={cluster_id}" in meta
        status = run_gpuledger(["status", "--state-dir", str(state), "--json"], env, 120)
        assert '"broker-3"' in status.stdout
    finally:
        down = run_gpuledger(["down", "--state-dir", str(state)], env, 180)
    assert down.returncode == 0, down.stdout + down.stderr
    for name in ("broker", "broker-2", "broker-3"):
        assert name in down.stdout
    assert broker.live_brokers({"bootstrap.servers": f"127.0.0.1:{port}"}, timeout=3) == set()
