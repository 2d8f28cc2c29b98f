"""Processors as several processes (issue 21): a node stage whose job events another process re-keys waits
for that process, through the group's commits on the real broker, before it closes a minute."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from test_processor_harness import create_topics, publish

from base.kafka import watermarks
from base.settings import KafkaSettings, Settings
from processors.runtime import ProcessorRuntime
from processors.testing import T0, device, job_event, scrape
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_MINUTES, DEVICE_SAMPLES, JOB_EVENTS, job_key, node_key


def _step_until(cond: Callable[[], bool], rt: ProcessorRuntime, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        rt.step()


def _step_for(rt: ProcessorRuntime, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rt.step()


def _device_minutes(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex[:6]}"})
    try:
        lo, hi = watermarks(c, TopicPartition(topic, 0))
        c.assign([TopicPartition(topic, 0, lo)])
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + 30
        while len(out) < hi - lo and time.monotonic() < deadline:
            out += [AvroCodec().decode(m.value()).record for m in c.consume(100, 0.5) if m.error() is None]
        return out
    finally:
        c.close()


def test_a_node_stage_waits_for_job_events_another_process_has_not_rekeyed(settings: Settings) -> None:
    """The node stage runs alone here (`--stage node`), as with processor.instances > 1 the rekey stage of
    another process holds the job events. The job starts at T0 and the samples run 150 s past it: a node stage
    that did not wait would close minute T0 with its seconds unallocated."""
    prefix = f"inst-{uuid.uuid4().hex[:8]}."
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(bootstrap, prefix, 1)
    proc = settings.processor.model_copy(update={"group_id": prefix + "processors", "realtime": False})
    cfg = settings.model_copy(
        update={"kafka": KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix), "processor": proc}
    )
    publish(bootstrap, prefix, [(JOB_EVENTS, job_key("c1", "j1"), job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}))])
    samples = [scrape("n1", T0 + s * 1000, [device("GPU-a", 0, sm=0.5, util_pct=50.0)]) for s in range(150)]
    publish(bootstrap, prefix, [(DEVICE_SAMPLES, node_key("c1", "n1"), r) for r in samples])

    node = ProcessorRuntime(cfg, stages=("node",))
    rekey = ProcessorRuntime(cfg, stages=("rekey",))
    t_samples = cfg.kafka.topic(DEVICE_SAMPLES.name)
    try:
        node.start()
        _step_until(lambda: node.pos.get(("node", t_samples, 0), 0) >= len(samples), node)
        _step_for(node, 4.0)  # past the quiet-partition spell: nothing but the job events holds the minute
        assert node.stats.device_minutes == 0, "a minute closed while its job events were unread"

        rekey.start()
        t_jobs = cfg.kafka.topic(JOB_EVENTS.name)
        _step_until(lambda: rekey.pos.get(("rekey", t_jobs, 0), 0) >= 1, rekey)
        rekey.commit(force=True)  # the other process's commit: what the node stage waits for
        _step_until(lambda: node.stats.device_minutes >= 2, node, timeout_s=30)
        node.commit(force=True)
        rows = _device_minutes(bootstrap, cfg.kafka.topic(DEVICE_MINUTES.name))
        first = [r for r in rows if r["minute_start_ms"] == T0]
        assert [(r["job_id"], r["allocated_s"]) for r in first] == [("j1", 60)], first
    finally:
        for rt in (node, rekey):
            for c in (rt.rekey_c, rt.node_c):
                if c is not None:
                    c.close()
