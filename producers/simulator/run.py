"""Publishing a simulation: as fast as possible, or paced to the wall clock."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from base.errors import NotDelivered
from producers.simulator.model import SimConfig
from producers.simulator.stream import simulate
from schemas.topics import Topic

# A producer keeps order per partition only: one partition's batch can linger (behind a slow broker, or a
# partition leader that moves) while later records of the others go out first. Published faster than real
# time, seconds of wall time are minutes of cluster time, and a record that far behind the others arrives
# after the processors' grace closed its minute. So no record is handed over more than AHEAD_MS of cluster
# time past the oldest one not yet known delivered: a flush, waiting for the broker, comes first.
AHEAD_MS = 5_000
log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...


class WithinGrace:
    """Publishes through `publisher`, flushing before a record AHEAD_MS past the oldest unflushed one."""

    def __init__(self, publisher: Publisher) -> None:
        self.publisher = publisher
        self._oldest_unflushed_ms: int | None = None

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        ts_ms: int = record["ts_ms"]
        if self._oldest_unflushed_ms is not None and ts_ms >= self._oldest_unflushed_ms + AHEAD_MS:
            self.flush()
        if self._oldest_unflushed_ms is None or ts_ms < self._oldest_unflushed_ms:
            self._oldest_unflushed_ms = ts_ms
        self.publisher.publish(topic, key, record)

    def flush(self) -> None:
        """Until every record is delivered: a broker away for a while (restarting, electing leaders) is waited
        for, saying so; a record the broker refused is an error."""
        while True:
            try:
                self.publisher.flush()
                break
            except NotDelivered as exc:
                log.warning("waiting for the broker: %s", exc)
        self._oldest_unflushed_ms = None


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
    resume_s: int = 0,
    on_flushed: Callable[[int], None] | None = None,
) -> RunStats:
    """Publish every record of the run. Real time: the records of second t go out at start + t.

    With `backfill_s`, real time runs that many seconds behind the start: the first `backfill_s`
    seconds of cluster time go out at once (history to look at), the rest at the wall clock's pace.
    With `resume_s`, the first `resume_s` seconds of the plan are not published (a restarted run continues,
    producers/simulator/position.py). With `on_flushed`, each chunk is flushed and then reported by the
    event time published through (epoch ms).
    """
    stats = RunStats()
    began = clock()
    base_s = config.start_ms / 1000
    ordered = WithinGrace(publisher)
    resume_ms = config.start_ms + resume_s * 1000
    for chunk_start in range(0, config.duration_s, chunk_s):
        if chunk_start + chunk_s <= resume_s:
            continue
        for topic, key, record in simulate(config, start_s=chunk_start, end_s=chunk_start + chunk_s):
            if record["ts_ms"] < resume_ms:
                continue
            if realtime:
                due = record["ts_ms"] / 1000 - base_s + began - backfill_s
                delay = due - clock()
                if delay > 0:
                    sleep(delay)
            ordered.publish(topic, key, record)
            stats.records[topic.name] = stats.records.get(topic.name, 0) + 1
        if on_flushed is not None:
            ordered.flush()
            on_flushed(config.start_ms + min(chunk_start + chunk_s, config.duration_s) * 1000)
        if progress is not None:
            progress(min(chunk_start + chunk_s, config.duration_s), stats)
    ordered.flush()
    stats.wall_s = clock() - began
    return stats
