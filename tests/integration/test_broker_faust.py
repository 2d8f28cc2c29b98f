"""A minimal faust app (kafka:// transport, aiokafka) on the real broker, on the project's clients.

One worker run consumes a topic, counts per key in a table (changelog: a compacted topic) and
writes results out; it stops cleanly (offsets committed). A second run resumes from the committed
offset, recovers the table from its changelog, and processes only what came after.

The app reads as the project's agents do (`streams/agents.py`): the project's producer and
consumer (`use_project_clients`), in-order admission (`InOrder`) with its periodic check
(`keep_checked`, as the job stage; here with no lock around it), and acks only for what was
admitted. Each piece answers a loss this test saw in a CI run: on bare faust the second run wrote
"e" but never "d"; without the check it wrote "d" and never "e" within 60 s, no skip logged (the
pattern of a record faust drops at a partition's end, which no later record shows). The second run
also proves where `InOrder` starts a partition: at the group's committed offset as the broker holds
it; faust's own record of it came too late there, and the second run read "a" and "b" again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

pytestmark = pytest.mark.integration

APP = """
import faust

from streams.agents import InOrder, use_project_clients

app = faust.App(
    {app_id!r},
    broker="kafka://{bootstrap}",
    store="memory://",
    web_enabled=False,
    broker_session_timeout=6,
    producer_linger=0.02,
    broker_commit_every=1,
    broker_commit_interval=0.2,
    topic_partitions=1,
    topic_replication_factor=1,
    consumer_auto_offset_reset="earliest",
)
use_project_clients(app)
source = app.topic({source!r}, key_type=str, value_type=str)
sink = app.topic({sink!r}, key_type=str)
counts = app.Table("counts", default=int)
order = InOrder(app)
order.keep_checked({{{source!r}}})

@app.agent(source)
async def count(stream):
    manual = stream.noack()  # only what was admitted is acked: a skipped record is read again
    async for event in manual.events():
        for admitted in await order.admit([event]):
            counts[admitted.key] += 1
            await sink.send(key=admitted.key, value={{"value": admitted.value, "count": counts[admitted.key]}})
            await manual.ack(admitted)

if __name__ == "__main__":
    app.main()
"""


def _read(conf: dict[str, str], topic: str, n: int, timeout: float = 60.0) -> list[dict]:
    consumer = Consumer({**conf, "group.id": f"check-{time.monotonic_ns()}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(json.loads(msg.value()))
    finally:
        consumer.close()
    return out


class Worker:
    def __init__(self, app_file: Path, log: Path):
        self.app_file, self.log = app_file, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.app_file), "worker", "--without-web", "-l", "warn"],
                cwd=self.app_file.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"faust worker did not stop on SIGTERM; log: {self.log.read_text()[-2000:]}")


def test_faust_group_commit_resume_and_table_changelog(kafka_config, unique_topic, tmp_path):
    app_id, source, sink = unique_topic("faustapp"), unique_topic("in"), unique_topic("out")
    app_file = tmp_path / "faust_app.py"
    app_file.write_text(
        APP.format(app_id=app_id, bootstrap=kafka_config["bootstrap.servers"], source=source, sink=sink)
    )
    producer = Producer(kafka_config)

    def produce(values: list[str]) -> None:
        for v in values:
            producer.produce(source, key=b'"k"', value=json.dumps(v).encode())
        assert producer.flush(30) == 0

    produce(["a", "b", "c"])
    worker = Worker(app_file, tmp_path / "worker.log")
    worker.start()
    try:
        first = _read(kafka_config, sink, 3)
        assert [r["value"] for r in first] == ["a", "b", "c"], worker.log.read_text()[-3000:]
        assert [r["count"] for r in first] == [1, 2, 3]
    finally:
        worker.stop()

    admin = AdminClient(kafka_config)
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(app_id)])
    committed = {(tp.topic, tp.partition): tp.offset for tp in offsets[app_id].result(timeout=10).topic_partitions}
    assert committed[(source, 0)] == 3

    # The table's changelog is a compacted topic.
    changelog = f"{app_id}-counts-changelog"
    res = ConfigResource(ConfigResource.Type.TOPIC, changelog)
    assert admin.describe_configs([res])[res].result(timeout=10)["cleanup.policy"].value == "compact"

    produce(["d", "e"])
    worker.start()
    try:
        both = _read(kafka_config, sink, 5)
    finally:
        worker.stop()
    assert [r["value"] for r in both] == ["a", "b", "c", "d", "e"], worker.log.read_text()[-3000:]
    # Counts go on from 3: the table was recovered from its changelog, nothing was reprocessed.
    assert [r["count"] for r in both[3:]] == [4, 5]

    consumer = Consumer({**kafka_config, "group.id": app_id})
    assert consumer.committed([TopicPartition(source, 0)], timeout=10)[0].offset == 5
    consumer.close()
