"""Real-time runs with a backfill publish their history at once, then follow the wall clock."""

from dataclasses import replace
from typing import Any

from producers.simulator import SimConfig
from producers.simulator.run import run
from schemas.topics import Topic


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0
        self.slept = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept += s
        self.now += s


class _Sink:
    def __init__(self, clock: _Clock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, int]] = []

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        self.sent.append((self.clock.now, record["ts_ms"]))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def test_backfill_goes_out_at_once_then_real_time() -> None:
    clock = _Clock()
    cfg = replace(SimConfig(nodes=1, duration_s=180), start_ms=int(clock.now * 1000) - 120_000)
    sink = _Sink(clock)
    run(cfg, sink, realtime=True, clock=clock.time, sleep=clock.sleep, backfill_s=120)
    history = [wall for wall, ts in sink.sent if ts < cfg.start_ms + 120_000]
    live = [(wall, ts) for wall, ts in sink.sent if ts >= cfg.start_ms + 120_000]
    assert history and all(wall == 1_000_000.0 for wall in history)  # no waiting for the past
    assert live and all(wall >= ts / 1000 for wall, ts in live)  # never ahead of the wall clock
    assert 55 <= clock.slept <= 61  # the last minute was paced
