"""base.shutdown: the stop deadline, bounded waits, and signals seen while the main thread is blocked."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from confluent_kafka import Consumer

from base.shutdown import EXIT_DEADLINE, EXIT_RESERVE_S, BoundedCall, StopSignal, budget, flush_within


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_budget_is_the_cap_until_a_stop_then_what_is_left_of_the_deadline() -> None:
    clock = Clock()
    stop = StopSignal(15.0, clock=clock)
    assert stop.budget(30.0) == 30.0 and not stop()
    stop.request()
    assert stop() and stop.left() == 15.0
    assert stop.budget(30.0) == 15.0 - EXIT_RESERVE_S
    assert stop.budget(30.0, keep=4.0) == 15.0 - EXIT_RESERVE_S - 4.0
    assert stop.budget(5.0) == 5.0
    clock.now += 12.0  # a second request does not move the deadline
    stop.request()
    assert stop.budget(30.0) == 1.0
    clock.now += 10.0
    assert stop.budget(30.0) == 0.0
    assert budget(lambda: True, 30.0) == 30.0  # a plain stop function has no deadline


def test_a_bounded_call_is_given_up_at_its_bound_and_at_the_stop_budget() -> None:
    release = threading.Event()
    call = BoundedCall(lambda: release.wait(30), "a commit to a frozen broker")
    t0 = time.monotonic()
    assert call.wait(0.3) is False and not call.done
    assert 0.25 < time.monotonic() - t0 < 2.0
    stop = StopSignal(EXIT_RESERVE_S + 0.3)
    stop.request()
    t0 = time.monotonic()
    assert call.wait(60.0, stop) is False  # the stop's budget, not the 60 s asked
    assert time.monotonic() - t0 < 2.0
    release.set()
    assert call.wait(5.0) is True and call.result() is True

    def fails() -> None:
        raise RuntimeError("broker said no")

    failed = BoundedCall(fails, "x")
    assert failed.wait(5.0)
    with pytest.raises(RuntimeError, match="broker said no"):
        failed.result()


class StuckProducer:
    """Never delivers: flush returns the records still queued after each wait."""

    def __init__(self) -> None:
        self.waited = 0.0

    def flush(self, timeout: float) -> int:
        time.sleep(timeout)
        self.waited += timeout
        return 3


def test_flush_within_waits_in_slices_and_a_stop_cuts_it_short() -> None:
    producer = StuckProducer()
    assert flush_within(producer, 0.6) == 3
    assert 0.55 < producer.waited < 1.2
    stop = StopSignal(EXIT_RESERVE_S + 0.2)
    stuck = StuckProducer()
    t0 = time.monotonic()
    threading.Timer(0.1, stop.request).start()  # a stop arrives while the flush waits
    assert flush_within(stuck, 30.0, stop) == 3
    assert time.monotonic() - t0 < 2.0


def _blocked_main_thread(seconds: float) -> None:
    """What a Kafka client call does to signals: the main thread waits in C, and a Python signal
    handler runs only when the call returns (unlike time.sleep or a lock, which run it at once)."""
    consumer = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "shutdown-test", "log_level": 0})
    try:
        consumer.consume(1, seconds)
    finally:
        consumer.close()


def test_a_signal_is_seen_while_the_main_thread_is_blocked_and_a_second_one_exits() -> None:
    exits: list[int] = []
    seen = threading.Event()
    stop = StopSignal(30.0, on_stop=seen.set, exit_now=exits.append)
    with stop:
        t0 = time.monotonic()
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        _blocked_main_thread(1.5)
        assert seen.is_set() and stop.requested
        # Seen by the watcher thread at once, not when the main thread came back.
        assert stop.left() < 30.0 - (time.monotonic() - t0) + 0.9
        assert exits == [128 + signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is not stop._handler  # the previous handlers are back


def test_the_deadline_ends_a_stop_that_overruns_it() -> None:
    exits: list[int] = []
    with StopSignal(0.3, exit_now=exits.append) as stop:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        _blocked_main_thread(1.0)
        assert stop.requested
        assert exits == [EXIT_DEADLINE]
    exits.clear()
    with StopSignal(0.3, exit_now=exits.append) as stop:  # finished in time: the watchdog stands down
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 2
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.finished()
        time.sleep(0.6)
    assert exits == []


def test_leave_returns_when_nothing_was_abandoned_and_ends_the_process_when_a_client_call_was() -> None:
    exits: list[int] = []
    stop = StopSignal(30.0, exit_now=exits.append)
    stop.leave()
    assert exits == []  # a normal exit: nothing is left running in a client
    stop.request("test")
    stop.abandon("closing the node consumer")
    stop.leave()
    assert exits == [0]  # a close still runs on a helper thread: no interpreter finalization under it
