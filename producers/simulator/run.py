"""Publishing a simulation: as fast as possible, or paced to the wall clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from producers.simulator.model import SimConfig
from producers.simulator.stream import simulate
from schemas.topics import Topic


class Publisher(Protocol):
    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...


@dataclass(slots=True)
class RunStats:
    records: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0


def run(
    config: SimConfig,
    publisher: Publisher,
    *,
    realtime: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    chunk_s: int = 60,
    progress: Callable[[int, RunStats], None] | None = None,
    backfill_s: int = 0,
) -> RunStats:
    """Publish every record of the run. Real time: the records of second t go out at start + t.

    With `backfill_s`, real time runs that many seconds behind the start: the first `backfill_s`
    seconds of cluster time go out at once (history to look at), the rest at the wall clock's pace.
    """
    stats = RunStats()
    began = clock()
    base_s = config.start_ms / 1000
    for chunk_start in range(0, config.duration_s, chunk_s):
        for topic, key, record in simulate(config, start_s=chunk_start, end_s=chunk_start + chunk_s):
            if realtime:
                due = record["ts_ms"] / 1000 - base_s + began - backfill_s
                delay = due - clock()
                if delay > 0:
                    sleep(delay)
            publisher.publish(topic, key, record)
            stats.records[topic.name] = stats.records.get(topic.name, 0) + 1
        if progress is not None:
            progress(min(chunk_start + chunk_s, config.duration_s), stats)
    publisher.flush()
    stats.wall_s = clock() - began
    return stats
