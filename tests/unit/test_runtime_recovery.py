"""Recovery of the processors from a failed consumer (processors.recovery.run_recovering), without a broker:
the policy's backoff and give-up, and the loop that replaces a failed runtime by a fresh one."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError

from base.errors import ServiceError
from base.shutdown import StopSignal
from processors.drivers.base import Stats, raise_if_fatal
from processors.recovery import RECOVERIES, ConsumerFailed, RecoveryPolicy, run_recovering


def test_policy_backs_off_and_gives_up_within_the_window() -> None:
    p = RecoveryPolicy(max_failures=4, window_s=100.0, backoff_s=1.0, max_backoff_s=3.0)
    assert p.delay([10.0], 10.0) == 1.0
    assert p.delay([10.0, 11.0], 11.0) == 2.0
    assert p.delay([10.0, 11.0, 12.0], 12.0) == 3.0  # capped
    assert p.delay([10.0, 11.0, 12.0, 13.0], 13.0) is None  # the 4th within 100 s
    # Failures older than the window no longer count: a rare failure is always recovered from.
    assert p.delay([10.0, 11.0, 12.0, 200.0], 200.0) == 1.0


class FakeRuntime:
    """Each run takes the next outcome of the shared script: a stage name fails it, None returns."""

    def __init__(self, script: list[str | None], built: list[FakeRuntime]) -> None:
        self.script = script
        self.stats = Stats()
        self.released = False
        self.carried_from: FakeRuntime | None = None
        built.append(self)

    def run(self) -> Stats:
        outcome = self.script.pop(0)
        if outcome is not None:
            raise ConsumerFailed(outcome, "Fatal error: Broker: Static consumer fenced")
        return self.stats

    def release(self) -> None:
        self.released = True

    def carry_from(self, old: FakeRuntime) -> None:
        self.carried_from = old
        self.stats = old.stats


def _recover(script: list[str | None], policy: RecoveryPolicy) -> tuple[list[FakeRuntime], Stats | None, Any]:
    built: list[FakeRuntime] = []
    stop = StopSignal(name="test")

    def build(shutdown: StopSignal) -> Any:
        assert shutdown is stop
        return FakeRuntime(script, built)

    try:
        stats = run_recovering(build, stop, policy, clock=lambda: 0.0)
    except ServiceError as exc:
        return built, None, exc
    return built, stats, None


def _recoveries(stage: str) -> float:
    return RECOVERIES.labels(stage=stage)._value.get()


def test_a_failed_runtime_is_replaced_by_a_fresh_one_that_carries_its_counters() -> None:
    before = _recoveries("node")
    built, stats, error = _recover(["node", "node", None], RecoveryPolicy(backoff_s=0.0))
    assert error is None
    assert len(built) == 3  # two rebuilds
    assert [r.released for r in built] == [True, True, False]
    assert built[1].carried_from is built[0] and built[2].carried_from is built[1]
    assert stats is built[0].stats  # one set of counters for the process
    assert _recoveries("node") == before + 2


def test_the_process_gives_up_after_max_failures_within_the_window() -> None:
    built, stats, error = _recover(["job"] * 3, RecoveryPolicy(max_failures=3, backoff_s=0.0))
    assert stats is None and len(built) == 3
    assert isinstance(error, ServiceError)
    assert "\n" not in str(error)  # the CLI prints it as one line
    assert str(error).startswith("processors: job consumer failed: Fatal error")
    assert "3 consumer failures within 600 s, giving up" in str(error)


def test_a_stop_during_the_backoff_ends_the_run() -> None:
    built: list[FakeRuntime] = []
    stop = StopSignal(name="test")

    def build(shutdown: StopSignal) -> Any:
        rt = FakeRuntime(["rekey"], built)
        rt.release = lambda: stop.request("test stop")  # type: ignore[method-assign]
        return rt

    stats = run_recovering(build, stop, RecoveryPolicy(backoff_s=60.0), clock=lambda: 0.0)
    assert stats is built[0].stats and len(built) == 1


@pytest.mark.parametrize(
    ("error", "fatal"),
    [
        (KafkaError(KafkaError._FATAL, "Fatal error: Broker: Static consumer fenced"), True),
        (KafkaError(KafkaError.FENCED_INSTANCE_ID, "fenced", fatal=True), True),
        (KafkaError(KafkaError._TRANSPORT, "broker down"), False),
    ],
)
def test_fatal_message_errors_end_the_consumer(error: KafkaError, fatal: bool) -> None:
    if fatal:
        with pytest.raises(ConsumerFailed) as info:
            raise_if_fatal("node", error)
        assert info.value.stage == "node"
    else:
        raise_if_fatal("node", error)  # logged; librdkafka retries on its own
