"""The job stage's /metrics (processors.idle_agents.AgentsMeter): records read per topic, and a topic's lag only
once a high watermark of it is known (a lag of 0 would claim the stage is caught up)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from faust.types import TP

from base import metrics
from processors.idle_agents import AgentsMeter

DM = "t.usage.device-minutes.v1"
JOBS = "t.sched.job-events.v1"


def _events(tp: TP, offsets: range) -> list[Any]:
    return [SimpleNamespace(message=SimpleNamespace(topic=tp.topic, tp=tp, offset=o)) for o in offsets]


def _meter() -> AgentsMeter:
    meter = AgentsMeter("group", grace_ms=0)
    meter.m = metrics.PipelineCollector().component("agents")  # not the process's: the test's own
    return meter


def test_records_are_counted_per_topic_and_lag_is_the_sum_over_known_partitions() -> None:
    meter = _meter()
    high = {TP(DM, 0): 100, TP(DM, 1): 10}
    meter.read(_events(TP(DM, 0), range(0, 40)) + _events(TP(DM, 1), range(0, 10)), high.get)
    assert meter.m.records_in_ == {DM: 50}
    assert meter.m.lag_ == {("group", DM): 60}  # partition 0: 100 - 39 - 1; partition 1 caught up
    meter.read(_events(TP(DM, 0), range(40, 100)), high.get)
    assert meter.m.records_in_ == {DM: 110}
    assert meter.m.lag_ == {("group", DM): 0}


def test_a_topic_whose_high_watermark_is_unknown_has_no_lag_sample() -> None:
    meter = _meter()
    meter.read(_events(TP(JOBS, 0), range(5)), lambda _tp: None)
    assert meter.m.records_in_ == {JOBS: 5}
    assert meter.m.lag_ == {}  # unknown, not 0
    meter.read(_events(TP(JOBS, 0), range(5, 8)), lambda _tp: 20)
    assert meter.m.lag_ == {("group", JOBS): 12}
