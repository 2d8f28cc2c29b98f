"""The chat/reclaim agent (`streams.agents.RecordAgent`) without a broker: each record decoded or
dead-lettered, the good ones handled in order, the dead letters delivered (the producer flushed) and only
then the batch acked, as `streams.consume.ConsumerLoop` commits; records admitted in offset order
(`streams.agents.InOrder`), a skip neither handled nor acked and its partition sought back; and the order check,
which takes the agent's lock every second, never counted as a batch in hand by the idle test. The consumer is a
stand-in holding the committed offsets and recording seeks."""

from __future__ import annotations

import asyncio
import contextvars
import time
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from unit.test_agents_in_order import Consumer

from base.settings import KafkaSettings
from schemas.codec import AvroCodec
from schemas.topics import ALERTS
from streams.agents import InOrder, RecordAgent, build_record_app, drained

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


def _chat_agent(tmp_path: Any) -> tuple[KafkaSettings, str, list[Any], Any, RecordAgent]:
    """A record agent on alerts.v1 (topic prefix `t.`) whose handler notes each record it handles in the trail."""
    kafka = KafkaSettings(topic_prefix="t.")
    topic = kafka.topic(ALERTS.name)
    trail: list[Any] = []
    app, agent = build_record_app(
        kafka, "g-chat", topic, lambda r: trail.append(("handled", r["alert_id"])), datadir=str(tmp_path)
    )
    return kafka, topic, trail, app, agent


def test_a_batch_is_handled_dead_lettered_delivered_then_acked(tmp_path) -> None:
    kafka, topic, trail, app, agent = _chat_agent(tmp_path)

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
    """`busy` (read by the idle test, `streams.agents.drained`) from a batch's arrival until it is acked."""
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
        monkeypatch.setattr("streams.agents.POSITION_WAIT_S", 0.05)
        asyncio.run(agent.refresh_lag())
        assert len(meter.lags) == 2
    finally:
        agent.pool.shutdown()


def test_a_skipped_record_is_neither_handled_nor_acked_and_comes_again(tmp_path) -> None:
    """faust delivers offsets 5-6, then 9 (7 and 8 dropped): 9 waits, unhandled and unacked, the partition is
    sought back to 7, the agent counts as busy (input still to come), and 7-9 are handled once they come."""
    kafka, topic, trail, app, agent = _chat_agent(tmp_path)

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
        assert agent.order is not None
        await agent.order.check([TP(topic, 0)])
        assert not agent.busy

    try:
        asyncio.run(scenario())
    finally:
        agent.pool.shutdown()
    handled = [t[1] for t in trail if t[0] == "handled"]
    acked = [t[1] for t in trail if t[0] == "acked"]
    assert handled == ["a5", "a6", "a7", "a8", "a9"] and acked == [5, 6, 7, 8, 9]


CHECK_EVERY_S = 0.2  # the order check's timer (1 s in the product, `RESEEK_AFTER_S`), scaled down
CHECK_CALL_S = 0.5  # each position the check asks, waiting behind the consumer thread's fetch
ENDS_CALL_S = 0.4  # the high watermarks the idle test asks: longer than the check's timer sleeps
IN_CHECK: contextvars.ContextVar[bool] = contextvars.ContextVar("in_check", default=False)


def test_the_order_check_holding_the_lock_never_keeps_the_agent_from_being_idle(tmp_path) -> None:
    """The chat worker's hang (`chat run --max-idle-s` never exited; "busy" with the lock held and nothing
    behind, after its last batch), driven deterministically. The order check takes the agent's lock every
    `RESEEK_AFTER_S` (`InOrder.keep_checked`) and holds it while it asks each partition's position; the idle test
    (`drained`) wants the agent not busy before and after it reads the high watermarks. Once one idle round takes
    longer than the check's timer sleeps, and the check longer than what is left of the round (each call of both
    waits in the consumer thread, behind faust's fetch: 1.5 s a fetch then), every round ends inside a check:
    with the lock counted as busy, never idle. The check reads no input: only a batch in hand, or a partition
    behind, is busy. Here two partitions at their end, nothing in hand, no input for 10 s: idle at once."""
    kafka = KafkaSettings(topic_prefix="t.")
    alerts, appeals = kafka.topic(ALERTS.name), "t.appeals.v1"
    tps = [TP(alerts, 0), TP(appeals, 0)]

    class SlowConsumer(Consumer):
        def assignment(self) -> set[TP]:
            return set(tps)

        async def fetch_position(self, tp: TP) -> int | None:
            if IN_CHECK.get():
                await asyncio.sleep(CHECK_CALL_S)
            return await super().fetch_position(tp)

        async def highwaters(self, *asked: TP) -> dict[TP, int]:
            await asyncio.sleep(ENDS_CALL_S)
            return {tp: 5 for tp in asked}

    consumer = SlowConsumer({tp: 5 for tp in tps})
    consumer.positions = {tp: 5 for tp in tps}
    _, agent = build_record_app(kafka, "g-chat", alerts, lambda r: None, datadir=str(tmp_path),
                                more={appeals: lambda r: None})  # fmt: skip
    checks: list[Any] = []
    fake = SimpleNamespace(consumer=consumer, rebalancing=False, conf=SimpleNamespace(id="g-chat"),
                           timer=lambda interval: checks.append)  # fmt: skip
    agent.app = fake  # type: ignore[assignment]
    agent.order = InOrder(fake)  # type: ignore[arg-type]
    agent.order.keep_checked(list(agent.handlers), agent.lock)  # the product's check, under the agent's lock
    (check,) = checks

    async def timer() -> None:  # as mode's timer: the next run one interval after the last one ended
        IN_CHECK.set(True)  # seen by the calls the check makes (`answered` runs each in a task of its own)
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            await check()

    async def scenario() -> tuple[bool, int]:
        agent.last_input = time.monotonic() - 10.0
        ticking = asyncio.create_task(timer())
        rounds = 0
        try:
            await asyncio.sleep(CHECK_EVERY_S + 0.05)  # a check under way: the lock is held
            assert agent.lock.locked()
            deadline = time.monotonic() + 3 * (CHECK_EVERY_S + 2 * CHECK_CALL_S)
            while time.monotonic() < deadline:
                rounds += 1
                if await drained(fake, agent, [alerts, appeals], 3.0, True):  # type: ignore[arg-type]
                    return True, rounds
                await asyncio.sleep(0.02)
            return False, rounds
        finally:
            ticking.cancel()

    try:
        idle, rounds = asyncio.run(scenario())
    finally:
        agent.pool.shutdown()
    assert idle, f"never idle in {rounds} rounds of the idle test while the order check came and went"
    assert not agent.order.behind
