"""Poison records on the hot topic, through the real broker and the real processors runtime: each one
lands in `telemetry.device-samples.v1.dlq` with its reason within seconds, the scrapes after it are
still processed, and the node stage's memory stays flat however many poison records it reads."""

from __future__ import annotations

import time
import tracemalloc
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from test_processor_harness import create_topics, publish

from base.settings import KafkaSettings, Settings
from processors.runtime import ProcessorRuntime
from processors.testing import T0, device, poison_scrapes, scrape
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, node_key
from streams.consume import HEADER_ERROR_CLASS, HEADER_ERROR_MESSAGE, HEADER_SOURCE_OFFSET

pytestmark = pytest.mark.integration

CODEC = AvroCodec()
SUBJECT = DEVICE_SAMPLES.subject
HEADER = b"\xc3\x01" + CODEC.fingerprint(SUBJECT)


POISON = {
    **poison_scrapes(HEADER, CODEC.encode(SUBJECT, scrape("n", T0, []))),
    "garbage": b"\xde\xad\xbe\xef" * 8,  # bytes in no framing at all
}


def _good(i: int) -> dict[str, Any]:
    return scrape("n1", T0 + i * 1000, [device(f"GPU-{d}", d, sm=0.5, util_pct=50.0) for d in range(8)])


def _runtime(settings: Settings, prefix: str) -> ProcessorRuntime:
    proc = settings.processor.model_copy(update={"group_id": prefix + "processors"})
    cfg = settings.model_copy(
        update={"kafka": KafkaSettings(bootstrap_servers=settings.kafka.bootstrap_servers, topic_prefix=prefix),
                "processor": proc}
    )
    return ProcessorRuntime(cfg, stages=("node",))


def _read_until(rt: ProcessorRuntime, offset: int, timeout_s: float) -> float:
    """Step the runtime until it has read the samples topic up to `offset`; the seconds it took."""
    t0 = time.monotonic()
    while rt.pos.get(("node", rt.t_samples, 0), 0) < offset:
        assert time.monotonic() - t0 < timeout_s, f"node stage stuck at {rt.pos.get(('node', rt.t_samples, 0))}"
        rt.step()
    rt.producer.flush(30)
    return time.monotonic() - t0


def _dead_letters(bootstrap: str, topic: str, want: int, timeout_s: float = 30) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            out.extend(m for m in c.consume(100, 0.5) if m.error() is None)
    finally:
        c.close()
    return out


def test_poison_records_are_dead_lettered_and_the_node_stage_goes_on(settings: Settings) -> None:
    prefix = f"poison-{uuid.uuid4().hex[:8]}."
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(bootstrap, prefix, 1)
    samples = prefix + DEVICE_SAMPLES.name
    raw = Producer({"bootstrap.servers": bootstrap})
    key = node_key("c1", "n1")

    # Round 1: each poison record between valid scrapes (offsets 0, 1=poison, 2, 3=poison, ...).
    order: list[str] = []
    for i, (name, body) in enumerate(POISON.items()):
        publish(bootstrap, prefix, [(DEVICE_SAMPLES, key, _good(i))])
        raw.produce(samples, key=key, value=body)
        raw.flush(30)
        order.append(name)
    publish(bootstrap, prefix, [(DEVICE_SAMPLES, key, _good(len(POISON)))])

    rt = _runtime(settings, prefix)
    try:
        rt.start()
        took = _read_until(rt, 2 * len(POISON) + 1, timeout_s=60)
        assert took < 15, f"{took:.1f} s to read {2 * len(POISON) + 1} records"
        letters = _dead_letters(bootstrap, samples + ".dlq", len(POISON))
        assert len(letters) == len(POISON)
        by_offset = {int(dict(m.headers())[HEADER_SOURCE_OFFSET]): m for m in letters}
        assert sorted(by_offset) == [1, 3, 5]
        for (_off, m), name in zip(sorted(by_offset.items()), order, strict=True):
            headers = dict(m.headers())
            assert headers[HEADER_ERROR_CLASS] == b"MalformedRecord", name
            assert headers[HEADER_ERROR_MESSAGE], name
            assert m.value() and CODEC.decode(m.value(), "deadletter").record["value"] == POISON[name]
        # every valid scrape around them was processed: 8 devices each
        assert rt.stats.scrapes == len(POISON) + 1
        assert rt.stats.samples == 8 * (len(POISON) + 1)
        assert rt.decoder.dead_lettered == len(POISON)

        # Round 2: 300 poison records (100 of each) among 300 valid scrapes; the node stage's Python heap
        # stays flat (the old decoder's first memory bomb alone asked for all the memory there was).
        n = 100
        bodies = list(POISON.values())
        for i in range(n):
            for j, body in enumerate(bodies):
                raw.produce(samples, key=key, value=body)
                raw.produce(samples, key=key, value=CODEC.encode(SUBJECT, _good(10 + 3 * i + j)))
            raw.poll(0)
        raw.flush(30)
        start = rt.pos[("node", rt.t_samples, 0)]
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            _read_until(rt, start + 6 * n, timeout_s=120)
            grown, peak = (v - base for v in tracemalloc.get_traced_memory())
        finally:
            tracemalloc.stop()
        assert rt.decoder.dead_lettered == len(POISON) + 3 * n
        assert rt.stats.scrapes == len(POISON) + 1 + 3 * n
        # 300 scrapes of 8 devices stay in the open windows (a few hundred KiB); a poison record adds nothing.
        assert peak < 8 * 1024 * 1024, f"peak {peak / 1024:.0f} KiB over the run"
        assert grown < 4 * 1024 * 1024, f"grew {grown / 1024:.0f} KiB"
        letters = _dead_letters(bootstrap, samples + ".dlq", len(POISON) + 3 * n)
        assert len(letters) == len(POISON) + 3 * n
    finally:
        if rt.node_c is not None:
            rt.node_c.close()
