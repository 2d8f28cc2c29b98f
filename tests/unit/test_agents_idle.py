"""The idle test of the faust workers (`streams.agents.drained`, `serve_app`'s readiness) without a broker:
`--exit-when-idle` (job stage) and `--max-idle-s` (chat, reclaim) stop only once the input was read to its
end and processed, and quiet counts only from when the app is started, assigned and not rebalancing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, NamedTuple

from streams.agents import drained, serve_app


class TP(NamedTuple):
    topic: str
    partition: int


@dataclass
class Clock:
    last_input: float
    batches: int = 0
    busy: bool = False
    order: Any = field(default_factory=lambda: SimpleNamespace(next_offset={}, behind=set()))  # what `InOrder` admitted


class Consumer:
    """The part of faust's consumer the idle test reads; `during_read` runs while a position is read."""

    def __init__(self, ends: dict[TP, int], positions: dict[TP, int | None]) -> None:
        self.ends = ends
        self.positions = positions
        self.assigned = set(ends)
        self.during_read: Callable[[], None] = lambda: None

    def assignment(self) -> set[TP]:
        return self.assigned

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.ends[tp] for tp in tps}

    async def fetch_position(self, tp: TP) -> int | None:
        self.during_read()
        return self.positions[tp]


T0, T1 = TP("t.alerts.v1", 0), TP("t.alerts.v1", 1)


def _app(positions: dict[TP, int | None] | None = None) -> Any:
    ends = {T0: 10, T1: 4}
    return SimpleNamespace(consumer=Consumer(ends, dict(ends) if positions is None else positions), rebalancing=False)


def _drained(app: Any, clock: Clock, quiet_s: float = 1.0, ready: bool = True) -> bool:
    return asyncio.run(drained(app, clock, ["t.alerts.v1"], quiet_s, ready))


def test_read_to_the_end_and_quiet_long_enough_is_idle() -> None:
    clock = Clock(last_input=time.monotonic() - 5)
    assert _drained(_app(), clock)
    assert not _drained(_app(), clock, quiet_s=10)  # quiet, but not long enough
    assert not _drained(_app({T0: 10, T1: 3}), clock)  # a partition not fetched to its end
    assert not _drained(_app({T0: 10, T1: None}), clock)  # a partition without a position yet
    clock.order.next_offset = {(T1.topic, T1.partition): 4}  # ... but all of it admitted before: at its end
    assert _drained(_app({T0: 10, T1: None}), clock)
    clock.order.next_offset = {(T1.topic, T1.partition): 3}
    assert not _drained(_app({T0: 10, T1: None}), clock)


def test_records_fetched_but_not_admitted_are_input_still_to_come() -> None:
    """After a seek back faust fetches the partition to its end again (the fetch position at the high watermark)
    while those records wait in its buffer, not admitted yet. A fault-suite run stopped there, 1.2 s after the
    seek, and the final life lost its last job-minutes: an agent that admits in order is at its end only once
    what it admitted reaches the high watermark."""
    clock = Clock(last_input=time.monotonic() - 5)
    clock.order.next_offset = {(T0.topic, T0.partition): 10, (T1.topic, T1.partition): 2}
    assert not _drained(_app(), clock)  # T1 fetched to 4, admitted to 2
    clock.order.next_offset[(T1.topic, T1.partition)] = 4
    assert _drained(_app(), clock)


def test_starting_joining_or_rebalancing_is_not_quiet() -> None:
    """While not ready the quiet clock is held at now: a start or a join that took longer than the quiet
    time does not count as quiet input (the fault suite's final agents run once stopped with input unread)."""
    clock = Clock(last_input=time.monotonic() - 60)
    before = time.monotonic()
    assert not _drained(_app(), clock, ready=False)
    assert clock.last_input >= before
    assert not _drained(_app(), clock)  # ready now, but quiet only since it became ready


def test_a_batch_in_hand_is_not_idle() -> None:
    clock = Clock(last_input=time.monotonic() - 5, busy=True)
    assert not _drained(_app(), clock)


def test_a_batch_that_arrives_or_ends_while_the_ends_are_read_is_not_idle() -> None:
    """Fetched is not processed: positions at the ends while a batch came (or was still being finished)
    means input may still be in hand."""
    for during in ("arrives", "ends"):
        app = _app()
        clock = Clock(last_input=time.monotonic() - 5)

        def batch(during: str = during, clock: Clock = clock) -> None:
            if during == "arrives":
                clock.last_input = time.monotonic()
            else:
                clock.batches += 1

        app.consumer.during_read = batch
        assert not _drained(app, clock), during


class FakeApp:
    """Just what `serve_app` drives: a start that waits for `go`, a consumer, the health flags."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.consumer = Consumer({T0: 1}, {T0: 1})
        self.consumer.assigned = set()
        self.rebalancing = False
        self.crashed = False
        self.should_stop = False
        self.crash_reason: BaseException | None = None
        self.in_worker = False
        self.conf = SimpleNamespace(id="g-test")
        self.stopped = False

    async def start(self) -> None:
        await self.go.wait()

    async def stop(self) -> None:
        self.stopped = True


def test_serve_app_calls_the_idle_test_ready_only_once_started_assigned_and_not_rebalancing() -> None:
    seen: list[bool] = []

    async def main() -> BaseException | None:
        app = FakeApp()

        async def idle(ready: bool) -> bool:
            seen.append(ready)
            n = len(seen)
            if n == 3:
                app.go.set()  # started, not assigned yet
            elif n == 6:
                app.consumer.assigned = {T0}
                app.rebalancing = True
            elif n == 9:
                app.rebalancing = False
            return ready

        crashed = await serve_app(app, lambda: False, idle=idle)  # type: ignore[arg-type]
        assert app.stopped and app.in_worker
        return crashed

    assert asyncio.run(main()) is None
    assert seen[-1] is True and not any(seen[:-1])
    assert len(seen) >= 10  # starting, then started but unassigned, then rebalancing: never ready before
