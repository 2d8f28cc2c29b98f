"""The chat/reclaim agent (`schemas.agents.RecordAgent`) without a broker: each record decoded or
dead-lettered, the good ones handled in order, the dead letters delivered (the producer flushed) and only
then the batch acked, as `schemas.consume.ConsumerLoop` commits; records admitted in offset order
(`schemas.agents.InOrder`), a skip neither handled nor acked and its partition sought back. The consumer is a
stand-in holding the committed offsets and recording seeks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from unit.test_agents_in_order import Consumer

from base.settings import KafkaSettings
from schemas.agents import InOrder, RecordAgent, build_record_app
from schemas.codec import AvroCodec
from schemas.topics import ALERTS

ALERT: dict[str, Any] = {
    "alert_id": "a1", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "c1", "job_id": "j1",
    "node": "n1", "device_uuids": ["GPU-a"], "user": None, "team": None, "project": None, "idle_minutes": 45,
    "cost_so_far": None, "action": None, "action_at_ms": None, "dry_run": True, "message": "idle",
    "appeal_route": None, "emitted_ts_ms": None,
}  # fmt: skip


def _event(topic: str, offset: int, value: bytes) -> Any:
    msg = SimpleNamespace(topic=topic, partition=0, offset=offset, key=b"c1/j1", value=value, timestamp=1.5,
                          tp=TP(topic, 0))  # fmt: skip
    return SimpleNamespace(message=msg)


def _read_from(agent: RecordAgent, topic: str, committed: int) -> Consumer:
    consumer = Consumer({TP(topic, 0): committed})
    agent.order = InOrder(SimpleNamespace(consumer=consumer))  # type: ignore[arg-type]
    return consumer


def test_a_batch_is_handled_dead_lettered_delivered_then_acked(tmp_path) -> None:
    kafka = KafkaSettings(topic_prefix="t.")
    topic = kafka.topic(ALERTS.name)
    trail: list[Any] = []
    app, agent = build_record_app(
        kafka, "g-chat", topic, lambda r: trail.append(("handled", r["alert_id"])), datadir=str(tmp_path)
    )

    class Producer:
        async def delivered(self) -> None:
            trail.append("delivered")

    class Stream:
        async def ack(self, event: Any) -> None:
            trail.append(("acked", event.message.offset))

    class DeadLetters:
        def publish_raw(self, topic_name: str, key: Any, value: Any, headers: Any = None) -> None:
            trail.append(("dlq", topic_name, dict(headers)["dlq.source.offset"]))

    app._producer = Producer()  # faust's producer property reads it
    agent.dead_letters = DeadLetters()
    _read_from(agent, topic, 0)
    value = AvroCodec.from_settings(kafka).encode(ALERTS.subject, ALERT)
    events = [_event(topic, 0, value), _event(topic, 1, b"not avro"), _event(topic, 2, value)]
    try:
        asyncio.run(agent.process(Stream(), events))
    finally:
        agent.pool.shutdown()
    assert trail == [
        ("handled", "a1"), ("dlq", "t.alerts.v1.dlq", b"1"), ("handled", "a1"), "delivered",
        ("acked", 0), ("acked", 1), ("acked", 2),
    ]  # fmt: skip
    assert (agent.stats.handled, agent.stats.dead_lettered, agent.stats.batches) == (2, 1, 1)


def test_the_agent_is_busy_while_a_batch_is_in_hand(tmp_path) -> None:
    """`busy` (read by the idle test, `schemas.agents.drained`) from a batch's arrival until it is acked."""
    kafka = KafkaSettings(topic_prefix="t.")
    topic = kafka.topic(ALERTS.name)
    busy_when: list[tuple[str, bool]] = []
    app, agent = build_record_app(
        kafka, "g-chat", topic, lambda r: busy_when.append(("handled", agent.busy)), datadir=str(tmp_path)
    )

    class Producer:
        async def delivered(self) -> None:
            busy_when.append(("delivered", agent.busy))

    class Stream:
        async def ack(self, event: Any) -> None:
            busy_when.append(("acked", agent.busy))

    app._producer = Producer()
    _read_from(agent, topic, 0)
    value = AvroCodec.from_settings(kafka).encode(ALERTS.subject, ALERT)
    try:
        asyncio.run(agent.process(Stream(), [_event(topic, 0, value)]))
    finally:
        agent.pool.shutdown()
    assert busy_when == [("handled", True), ("delivered", True), ("acked", True)]
    assert not agent.busy and agent.batches == 1


def test_a_skipped_record_is_neither_handled_nor_acked_and_comes_again(tmp_path) -> None:
    """faust delivers offsets 5-6, then 9 (7 and 8 dropped): 9 waits, unhandled and unacked, the partition is
    sought back to 7, the agent counts as busy (input still to come), and 7-9 are handled once they come."""
    kafka = KafkaSettings(topic_prefix="t.")
    topic = kafka.topic(ALERTS.name)
    trail: list[Any] = []
    app, agent = build_record_app(
        kafka, "g-chat", topic, lambda r: trail.append(("handled", r["alert_id"])), datadir=str(tmp_path)
    )

    class Producer:
        async def delivered(self) -> None:
            pass

    class Stream:
        async def ack(self, event: Any) -> None:
            trail.append(("acked", event.message.offset))

    app._producer = Producer()
    consumer = _read_from(agent, topic, 5)
    codec = AvroCodec.from_settings(kafka)

    def at(offset: int) -> Any:
        return _event(topic, offset, codec.encode(ALERTS.subject, {**ALERT, "alert_id": f"a{offset}"}))

    async def scenario() -> None:
        await agent.process(Stream(), [at(5), at(6)])
        await agent.process(Stream(), [at(9)])
        assert consumer.seeks == [{TP(topic, 0): 7}]
        assert agent.busy  # behind: the idle test must not call the input over
        await agent.process(Stream(), [at(6), at(7), at(8), at(9)])  # after the seek; 6 again is dropped
        consumer.positions[TP(topic, 0)] = 10
        await agent.check_order([TP(topic, 0)])
        assert not agent.busy

    try:
        asyncio.run(scenario())
    finally:
        agent.pool.shutdown()
    handled = [t[1] for t in trail if t[0] == "handled"]
    acked = [t[1] for t in trail if t[0] == "acked"]
    assert handled == ["a5", "a6", "a7", "a8", "a9"] and acked == [5, 6, 7, 8, 9]
