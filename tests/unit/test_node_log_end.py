"""The node stage's quiet-partition rule follows the others' event time only once the partition's leader,
asked after the partition went quiet, said it is read to its end (`NodeWatermarks._at_log_end`). The
leader is stood in for by futures this test settles; the stage's cached log end is what it must not
trust (a dead leader leaves it stale)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processors.drivers.base import LogEndProbe
from processors.drivers.node import NodeWatermarks

SAMPLES = "device-samples"


class Leader:
    """A stand-in admin client: every `list_offsets` question stays out until the test answers it."""

    def __init__(self) -> None:
        self.questions: list[Future[Any]] = []

    def list_offsets(self, request: dict[TopicPartition, Any], request_timeout: float) -> dict[TopicPartition, Any]:
        assert [(tp.topic, tp.partition) for tp in request] == [(SAMPLES, 0)]
        fut: Future[Any] = Future()
        self.questions.append(fut)
        return {tp: fut for tp in request}

    def says_end(self, offset: int) -> None:
        self.questions[-1].set_result(SimpleNamespace(offset=offset))

    def fails(self) -> None:
        self.questions[-1].set_exception(KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)))


def _watermarks(leader: Leader, read: list[int]) -> NodeWatermarks:
    node = SimpleNamespace(
        ctx=SimpleNamespace(topics=SimpleNamespace(samples=SAMPLES, jobs="jobs"), ps=SimpleNamespace(group_id="g")),
        admin=lambda: leader,
        read_position=lambda topic, p: read[0],
    )
    return NodeWatermarks(node, None)  # type: ignore[arg-type]


def test_a_quiet_partition_follows_only_after_its_leader_says_it_is_read_to_its_end() -> None:
    leader, read = Leader(), [10]
    wm = _watermarks(leader, read)
    assert not wm._at_log_end(0, since=1.0, mono=5.0)  # asked now, answered later
    assert len(leader.questions) == 1
    assert not wm._at_log_end(0, since=1.0, mono=5.1)  # still out: no second question
    assert len(leader.questions) == 1
    leader.says_end(10)
    assert wm._at_log_end(0, since=1.0, mono=5.2)
    assert wm._at_log_end(0, since=1.0, mono=9.0)  # remembered while nothing new was read
    # a record read after the answer: the next quiet spell needs a new answer
    assert not wm._at_log_end(0, since=6.0, mono=9.0)
    assert len(leader.questions) == 2


def test_a_leader_that_fails_or_shows_unread_records_restarts_the_quiet_wait() -> None:
    leader, read = Leader(), [10]
    wm = _watermarks(leader, read)
    assert not wm._at_log_end(0, since=1.0, mono=5.0)
    leader.fails()  # no leader: the partition's producers may hold records for it
    assert not wm._at_log_end(0, since=1.0, mono=5.5)
    assert wm.unconfirmed_at[0] == 5.5
    assert not wm._at_log_end(0, since=5.5, mono=8.0)
    leader.says_end(14)  # the new leader has records the stage has not read
    assert not wm._at_log_end(0, since=5.5, mono=8.2)
    assert wm.unconfirmed_at[0] == 8.2
    read[0] = 14
    assert not wm._at_log_end(0, since=8.2, mono=10.5)
    leader.says_end(14)
    assert wm._at_log_end(0, since=8.2, mono=10.6)


def test_an_unanswered_question_times_out_as_no_answer() -> None:
    leader = Leader()
    probe = LogEndProbe(lambda: leader, timeout_s=5.0)  # type: ignore[arg-type,return-value]
    probe.ask(SAMPLES, 0, now=1.0)
    assert probe.answer(SAMPLES, 0, now=5.9) is None
    assert probe.answer(SAMPLES, 0, now=6.0) == (1.0, None)
    assert probe.answer(SAMPLES, 0, now=6.1) is None  # given once
    probe.ask(SAMPLES, 0, now=7.0)
    assert len(leader.questions) == 2
    probe.forget(0)
    assert probe.answer(SAMPLES, 0, now=7.1) is None
