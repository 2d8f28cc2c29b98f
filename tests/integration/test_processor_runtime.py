"""The processors runtime driven step by step in-process against the real broker: what it commits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer, TopicPartition
from test_processor_harness import create_topics, publish

from base.settings import KafkaSettings, Settings
from processors.runtime import ProcessorRuntime
from processors.testing import T0, job_event
from schemas.topics import JOB_EVENTS, job_key


def _until(cond: Callable[[], bool], step: Callable[[], object], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        step()


def _committed(bootstrap: str, group: str, topic: str) -> tuple[int, str | None]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=30)
        return tp.offset, tp.metadata
    finally:
        c.close()


def test_rekey_commit_follows_what_the_rekey_stage_read_not_the_job_stage(settings: Settings) -> None:
    """Both stages read the job events, each at its own pace. The rekey stage's commit (and the point up
    to which a restart would not publish again) must follow its own position: taken from the job
    stage, a restart skipped re-keying the job ends the job stage had read first."""
    prefix = f"rt-{uuid.uuid4().hex[:8]}."
    bootstrap = settings.kafka.bootstrap_servers
    create_topics(bootstrap, prefix, 1)
    events = [
        job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}),
        job_event("ENDED", "j1", T0 + 60_000),
        job_event("STARTED", "j2", T0 + 60_000, {"n1": ["GPU-a"]}),
        job_event("ENDED", "j2", T0 + 120_000),
    ]
    publish(bootstrap, prefix, [(JOB_EVENTS, job_key("c1", ev["job_id"]), ev) for ev in events])
    proc = settings.processor.model_copy(update={"group_id": prefix + "processors", "batch_size": 1})
    cfg = settings.model_copy(
        update={"kafka": KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix), "processor": proc}
    )
    rt = ProcessorRuntime(cfg, stages=("rekey", "job"))
    rekey, job = rt.rekey, rt.job
    assert rekey is not None and job is not None
    t_jobs = cfg.kafka.topic(JOB_EVENTS.name)
    try:
        rt.start()
        # The rekey stage reads j1's start and end (one record a poll); the job stage reads all four.
        _until(lambda: rt.pos.get(("rekey", t_jobs, 0), 0) >= 2, lambda: rekey.poll(0.2))
        _until(lambda: rt.pos.get(("job", t_jobs, 0), 0) >= 4, lambda: job.poll(0.2))
        assert rt.pos[("rekey", t_jobs, 0)] == 2
        rt.commit(force=True)  # asynchronous: it lands in a moment
        want = (2, '{"pb": 2}')
        _until(lambda: _committed(bootstrap, prefix + "processors.rekey", t_jobs) == want, lambda: time.sleep(0.1), 30)
    finally:
        for c in (rt.rekey_c, rt.job_c):
            if c is not None:
                c.close()
