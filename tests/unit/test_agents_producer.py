"""Every faust app's producer (the job stage, chat run, reclaim run) is idempotent with acks=all, like every
producer of base/kafka.py (faust itself turns idempotence on only inside transactions). Checked on the aiokafka
producer faust would start."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from faust.types import TP
from faust.types.tuples import RecordMetadata

from base.errors import ServiceError
from base.settings import BrokerSettings, KafkaSettings, Settings
from processors.idle_agents import build_app
from streams.agents import IdempotentProducer, build_record_app, raw_topic


def _job_stage(tmp_path: Path) -> faust.App:
    return build_app(Settings(state_dir=tmp_path, broker=BrokerSettings(enabled=False)), partitions=4)


def _record_app(tmp_path: Path) -> faust.App:
    def handle(record: Any) -> None:
        return None

    app, _ = build_record_app(KafkaSettings(), "gpuledger.chat", "alerts.v1", handle, datadir=str(tmp_path))
    return app


@pytest.mark.parametrize("make", [_job_stage, _record_app], ids=["job-stage", "chat-or-reclaim"])
def test_the_agents_producer_is_idempotent_with_acks_all(tmp_path: Path, make: Any) -> None:
    async def built() -> AIOKafkaProducer:
        app = make(tmp_path)
        assert isinstance(app.producer, IdempotentProducer)
        return app.producer._new_producer()

    producer = asyncio.run(built())
    try:
        assert producer._txn_manager is not None  # aiokafka keeps the producer id and sequences there
        assert producer._sender._acks == -1  # "all": every in-sync replica
    finally:
        producer._closed = True  # never started: nothing to close


async def _one_sent(tmp_path: Path, release: asyncio.Event) -> tuple[IdempotentProducer, Any]:
    """The job stage's producer with faust's real buffer running, one record handed to `send_soon`; the
    transport below the buffer (not under test) holds the record until `release`, as a send waiting for
    metadata after a restart does."""
    app = _job_stage(tmp_path)
    producer = app.producer
    assert isinstance(producer, IdempotentProducer)

    async def send_waiting(fut: Any) -> None:
        await release.wait()

    producer.buffer._send_pending = send_waiting  # type: ignore[attr-defined]
    await producer.buffer.start()
    fut = raw_topic(app, "gpuledger.test.v1").as_future_message(key=b"k", value=b"v")
    producer.send_soon(fut)
    return producer, fut


def test_faust_flush_returns_with_a_record_not_delivered_and_delivered_does_not(tmp_path: Path) -> None:
    """faust's flush gives up once its buffer sent nothing for 0.1 s; `delivered` waits for the record itself,
    and raises past its limit."""

    async def scenario() -> None:
        producer, fut = await _one_sent(tmp_path, asyncio.Event())
        t0 = time.monotonic()
        await producer.flush()
        assert not fut.done() and time.monotonic() - t0 < 1.0  # flush returned, the record not delivered
        with pytest.raises(ServiceError, match="1 sent records not delivered"):
            await producer.delivered(timeout_s=0.5)
        assert producer.in_flight == {fut}
        await producer.buffer.stop()

    asyncio.run(scenario())


def test_delivered_returns_once_the_record_is_on_the_broker_and_raises_its_failure(tmp_path: Path) -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        loop = asyncio.get_running_loop()
        producer, fut = await _one_sent(tmp_path, release)
        loop.call_later(0.1, release.set)
        loop.call_later(0.3, fut.set_result, RecordMetadata("t", 0, TP("t", 0), 7, 0, 0))
        t0 = time.monotonic()
        await producer.delivered(timeout_s=5)
        assert time.monotonic() - t0 >= 0.25 and not producer.in_flight
        await producer.buffer.stop()
        producer2, fut2 = await _one_sent(tmp_path, release)
        loop.call_later(0.1, fut2.set_exception, KafkaError("leader not available"))
        with pytest.raises(KafkaError):
            await producer2.delivered(timeout_s=5)
        await producer2.buffer.stop()

    asyncio.run(scenario())
