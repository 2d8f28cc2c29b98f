"""Every faust app's producer (the job stage, chat run, reclaim run) is idempotent with acks=all, like every
producer of base/kafka.py (faust itself turns idempotence on only inside transactions). Checked on the aiokafka
producer faust would start."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import faust
import pytest
from aiokafka import AIOKafkaProducer

from base.settings import BrokerSettings, KafkaSettings, Settings
from processors.idle_agents import build_app
from schemas.agents import IdempotentProducer, build_record_app


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
