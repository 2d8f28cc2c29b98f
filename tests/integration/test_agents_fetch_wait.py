"""The agents' aiokafka consumer, as aiokafka starts it against the broker, asks the broker to hold a fetch at most
`streams.agents.FETCH_MAX_WAIT_MS` (faust builds it with 1,500 ms). What is checked is aiokafka's own fetcher, made
by its `start()`: the value set on the consumer before it is the one aiokafka reads there."""

from __future__ import annotations

import asyncio
from typing import Any

from base.settings import Settings
from processors.idle_agents import build_app
from streams.agents import FETCH_MAX_WAIT_MS, GaplessConsumer


def test_the_started_fetcher_asks_the_broker_for_a_short_hold(settings: Settings) -> None:
    async def scenario() -> int:
        app = build_app(settings, partitions=4)
        consumer = app.consumer
        assert isinstance(consumer, GaplessConsumer)
        thread: Any = consumer._new_consumer_thread()
        client = thread._create_worker_consumer(app.transport)
        await client.start()  # connects to the broker and makes its fetcher
        try:
            return int(client._fetcher._fetch_max_wait_ms)
        finally:
            await client.stop()

    assert asyncio.run(scenario()) == FETCH_MAX_WAIT_MS < 1500
