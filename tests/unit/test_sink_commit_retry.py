"""An idle sink makes the group hold the offset after the last record it handled: a commit that
failed, whose outcome never came, that an older one overtook, or that failed for one partition only,
is made again; the client's position is never committed.

The bookkeeping is the consumer loop's (`streams.consume.ConsumerLoop`, which the chat and reclaim
workers run too); it is driven here through the sink. The consumer is a stand-in (what is tested is
the loop's bookkeeping of its own commits, not Kafka); the sink heals its commits on the real broker
in the fault suite's broker-restart test.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

import streams.consume
from base.settings import KafkaSettings, SinksSettings
from sinks.consumer import LedgerSink

TOPIC = "usage.device-minutes.v1"
INVALID = -1001  # nothing handled on this partition yet


class FakeConsumer:
    def __init__(self, positions: dict[int, int]) -> None:
        self.positions = positions  # partition -> the offset after the last record handled (assigned: keys)
        self.commits: list[list[tuple[int, int]]] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in self.positions]

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous
        self.commits.append(sorted((tp.partition, tp.offset) for tp in offsets))

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        return []

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _no_idle_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams.consume, "IDLE_COMMIT_INTERVAL_S", 0.0)


def _sink(positions: dict[int, int]) -> tuple[LedgerSink, FakeConsumer]:
    sink = LedgerSink(KafkaSettings(bootstrap_servers="127.0.0.1:1"), SinksSettings(), writer=None, topics=[TOPIC])  # type: ignore[arg-type]
    fake = FakeConsumer(positions)
    sink.loop.consumer.close()
    sink.loop.consumer = fake
    # What the loop handled (its batches record it): the offset after each partition's last record.
    sink.loop._landed = {(TOPIC, p): o for p, o in positions.items() if o >= 0}
    return sink, fake


def _tp(partition: int, offset: int, error: KafkaError | None = None) -> Any:
    if error is None:
        return TopicPartition(TOPIC, partition, offset)
    # confluent-kafka sets a partition's error itself; its constructor takes none
    return SimpleNamespace(topic=TOPIC, partition=partition, offset=offset, error=error)


WAIT_COORD = KafkaError(KafkaError._WAIT_COORD, "Waiting for coordinator")


def test_a_failed_commit_is_made_again_when_idle() -> None:
    sink, fake = _sink({0: 10})
    sink.loop._commit_async([_tp(0, 10)])
    sink.loop._on_commit(WAIT_COORD, [_tp(0, 10)])
    assert sink.step() == 0
    assert fake.commits[-1] == [(0, 10)]
    sink.loop._on_commit(None, [_tp(0, 10)])
    assert sink.step() == 0 and len(fake.commits) == 2  # held: nothing more to do
    assert sink.stats.commits_failed == 1


def test_a_commit_whose_outcome_never_came_is_made_again() -> None:
    sink, fake = _sink({0: 10})
    sink.loop._commit_async([_tp(0, 10)])  # no callback ever
    assert sink.step() == 0
    assert fake.commits == [[(0, 10)], [(0, 10)]]


def test_an_older_commit_that_lands_last_is_overwritten_with_what_was_handled() -> None:
    sink, fake = _sink({0: 20})
    sink.loop._commit_async([_tp(0, 10)])
    sink.loop._commit_async([_tp(0, 20)])
    sink.loop._on_commit(None, [_tp(0, 20)])
    assert sink.step() == 0 and len(fake.commits) == 2  # the group holds 20
    sink.loop._on_commit(None, [_tp(0, 10)])  # the older one landed after it: the group went back to 10
    assert sink.step() == 0
    assert fake.commits[-1] == [(0, 20)]


def test_a_commit_that_failed_for_one_partition_only_is_made_again_for_it() -> None:
    sink, fake = _sink({0: 5, 1: 7})
    sink.loop._commit_async([_tp(0, 5), _tp(1, 7)])
    sink.loop._on_commit(None, [_tp(0, 5), _tp(1, 7, KafkaError(KafkaError.REQUEST_TIMED_OUT))])
    assert sink.step() == 0
    assert fake.commits[-1] == [(1, 7)]
    assert sink.stats.commits_failed == 1


def test_only_owned_partitions_with_handled_records_are_committed() -> None:
    sink, fake = _sink({0: 5, 2: INVALID})
    sink.loop._on_commit(WAIT_COORD, [_tp(1, 7), _tp(0, 5)])  # partition 1 went to another owner
    assert sink.step() == 0
    assert fake.commits == [[(0, 5)]]


def test_the_client_position_beyond_what_was_handled_is_never_committed() -> None:
    sink, fake = _sink({0: 5})
    fake.positions[0] = 50  # the client read further than was handled (a batch abandoned); no position() here:
    # a loop that asked the client for its position would fail on this stand-in
    sink.loop._on_commit(WAIT_COORD, [_tp(0, 5)])
    assert sink.step() == 0
    assert fake.commits == [[(0, 5)]]
