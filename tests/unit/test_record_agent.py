"""The chat/reclaim agent (`schemas.agents.RecordAgent`) without a broker: each record decoded or
dead-lettered, the good ones handled in order, the dead letters delivered (the producer flushed) and only
then the batch acked, as `schemas.consume.ConsumerLoop` commits."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from base.settings import KafkaSettings
from schemas.agents import build_record_app
from schemas.codec import AvroCodec
from schemas.topics import ALERTS

ALERT: dict[str, Any] = {
    "alert_id": "a1", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "c1", "job_id": "j1",
    "node": "n1", "device_uuids": ["GPU-a"], "user": None, "team": None, "project": None, "idle_minutes": 45,
    "cost_so_far": None, "action": None, "action_at_ms": None, "dry_run": True, "message": "idle",
    "appeal_route": None, "emitted_ts_ms": None,
}  # fmt: skip


def _event(topic: str, offset: int, value: bytes) -> Any:
    msg = SimpleNamespace(topic=topic, partition=0, offset=offset, key=b"c1/j1", value=value, timestamp=1.5)
    return SimpleNamespace(message=msg)


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
    value = AvroCodec.from_settings(kafka).encode(ALERTS.subject, ALERT)
    try:
        asyncio.run(agent.process(Stream(), [_event(topic, 0, value)]))
    finally:
        agent.pool.shutdown()
    assert busy_when == [("handled", True), ("delivered", True), ("acked", True)]
    assert not agent.busy and agent.batches == 1


def test_the_lag_per_topic_is_the_high_watermarks_less_the_fetch_positions(tmp_path, monkeypatch) -> None:
    """Two partitions of alerts (one fetched to 7 of 10, one with no position yet: no lag known there) and one
    of appeals at its end; watermarks that never answer leave the gauges as they were."""
    from faust.types import TP

    kafka = KafkaSettings(topic_prefix="t.")
    alerts, appeals = kafka.topic(ALERTS.name), "t.appeals.v1"
    a0, a1, p0 = TP(alerts, 0), TP(alerts, 1), TP(appeals, 0)

    class Meter:
        def __init__(self) -> None:
            self.lags: list[tuple[str, str, int]] = []

        def set_lag(self, group: str, topic: str, lag: int) -> None:
            self.lags.append((group, topic, lag))

    class Consumer:
        answering = True

        def assignment(self) -> set[TP]:
            return {a0, a1, p0}

        async def highwaters(self, *tps: TP) -> dict[TP, int]:
            if not self.answering:
                await asyncio.sleep(3600)
            return {a0: 10, a1: 4, p0: 2}

        async def fetch_position(self, tp: TP) -> int | None:
            return {a0: 7, p0: 2}.get(tp)

    meter, consumer = Meter(), Consumer()
    _, agent = build_record_app(kafka, "g-chat", alerts, lambda r: None, datadir=str(tmp_path), meter=meter,
                                more={appeals: lambda r: None})  # fmt: skip
    agent.app = SimpleNamespace(consumer=consumer, conf=SimpleNamespace(id="g-chat"))  # type: ignore[assignment]
    try:
        asyncio.run(agent.refresh_lag())
        assert meter.lags == [("g-chat", alerts, 3), ("g-chat", appeals, 0)]
        consumer.answering, agent._next_lag = False, 0.0
        monkeypatch.setattr("schemas.agents.POSITION_WAIT_S", 0.05)
        asyncio.run(agent.refresh_lag())
        assert len(meter.lags) == 2
    finally:
        agent.pool.shutdown()
