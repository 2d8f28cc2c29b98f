"""What the processors consume and what they commit, and in which order (processors/positions.py).

No broker: the consumer is a stand-in that records what it is asked to commit, the producer side a
stand-in that records flushes and idle-state records. The stages are stand-ins too, except where the
offset a stage still needs is the point (the re-key stage's, with its metadata). The same rules run on
the real broker in tests/integration/test_processor_runtime.py and the fault suite.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from base.errors import ServiceError
from processors.positions import CommitProtocol, Positions, StateRecord, on_commit_result
from processors.recovery import ConsumerFailed
from processors.stages import RekeyStage
from processors.testing import T0, job_event

JOBS = "sched.job-events.v1"
SAMPLES = "telemetry.device-samples.v1"
STATE = "processors.idle-state.v1"
INTERVAL_MS = 1000


class FakeConsumer:
    """The calls a commit makes: memberid() and commit(offsets=..., asynchronous=True)."""

    def __init__(self, log: list[Any], stage: str) -> None:
        self.log = log
        self.stage = stage
        self.member: str | None = "member-1"
        self.raise_next: KafkaException | None = None
        self.commits: list[list[tuple[str, int, int, str | None]]] = []

    def memberid(self) -> str | None:
        return self.member

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        assert asynchronous is True  # a synchronous commit waits on the coordinator without a bound
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        sent = [(tp.topic, tp.partition, tp.offset, tp.metadata) for tp in offsets]
        self.commits.append(sent)
        self.log.append(("commit", self.stage, sent))

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        raise NotImplementedError


class FakeOutputs:
    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.failing_flushes: set[int] = set()  # which flush calls (1-based) find records undelivered
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        self.log.append("flush")
        if self.flushes in self.failing_flushes:
            raise ServiceError("3 output records not delivered in time: no commit")

    def send_to_partition(self, topic: str, key: bytes, value: bytes, partition: int) -> None:
        self.log.append(("state", topic, partition, key))


class FakeStage:
    """A stage that still needs `needed[p]` on `topic` (stage objects answer that in processors/stages.py)."""

    def __init__(self, name: str, topic: str, positions: Positions, log: list[Any], needed: dict[int, int]) -> None:
        self.name = name
        self.topic = topic
        self.positions = positions
        self.log = log
        self.needed = needed
        self.fake = FakeConsumer(log, name)
        self.states: list[StateRecord] = []

    @property
    def stage(self) -> str:
        return self.name

    @property
    def consumer(self) -> FakeConsumer:
        return self.fake

    def take_states(self) -> list[StateRecord]:
        states, self.states = self.states, []
        return states

    def commit_offsets(self) -> list[TopicPartition]:
        ready = self.positions.committable(self.name, self.topic, self.needed)
        return [TopicPartition(self.topic, p, self.needed[p]) for p, _ in ready]

    def after_commit(self) -> None:
        self.log.append(("after_commit", self.name))


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _setup(*needed: tuple[str, str, dict[int, int]]) -> tuple[CommitProtocol, FakeOutputs, list[FakeStage], Clock]:
    log: list[Any] = []
    positions = Positions()
    stages = [FakeStage(name, topic, positions, log, need) for name, topic, need in needed]
    for s in stages:
        for p, off in s.needed.items():
            positions.read[(s.name, s.topic, p)] = off + 10  # read further than still needed
    outputs = FakeOutputs(log)
    clock = Clock()
    return CommitProtocol(outputs, STATE, INTERVAL_MS, clock), outputs, stages, clock


# ---------------------------------------------------------------------------------------------------
# Positions


def test_a_partition_is_committable_only_once_read_from_since_its_assignment() -> None:
    pos = Positions()
    pos.resumed[("node", SAMPLES, 0)] = 5  # the group's committed offset at assignment
    pos.resumed[("node", SAMPLES, 1)] = None  # nothing committed: the consumer starts at the earliest
    assert pos.committable("node", SAMPLES, [0, 1]) == []
    assert pos.next_offset("node", SAMPLES, 0) == 5 and pos.next_offset("node", SAMPLES, 1) is None
    pos.read[("node", SAMPLES, 0)] = 9
    assert pos.committable("node", SAMPLES, [0, 1]) == [(0, 9)]
    assert pos.next_offset("node", SAMPLES, 0) == 9
    # Revoked or lost: nothing is committed for it until it is assigned and read again.
    pos.forget("node", SAMPLES, 0)
    assert pos.committable("node", SAMPLES, [0, 1]) == []


def test_two_stages_on_one_topic_commit_from_their_own_positions() -> None:
    """The rekey and job stages both read the job events. The rekey stage's commit (and its metadata: up
    to where a restart does not publish again) follows its own position, never the job stage's."""
    pos = Positions()
    pos.read[("rekey", JOBS, 0)] = 3
    pos.read[("job", JOBS, 0)] = 40
    stage = RekeyStage()
    stage.route(job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]}), 0)
    stage.route(job_event("STARTED", "j2", T0, {"n2": ["GPU-b"]}), 1)
    stage.route(job_event("ENDED", "j2", T0 + 60_000), 2)
    ((p, read),) = pos.committable("rekey", JOBS, [0])
    assert (p, read) == (0, 3)
    # j1 still runs: its first event is still needed (a replay relearns its nodes), and every event
    # below the position read was re-keyed, so the replay publishes none of them again.
    assert stage.commit_offset(read) == 0
    assert json.loads(stage.metadata(read)) == {"pb": 3}


class _CommittedReads:
    def __init__(self, answers: list[list[TopicPartition] | KafkaException]) -> None:
        self.answers = answers
        self.asked: list[list[tuple[str, int]]] = []

    def committed(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        self.asked.append([(tp.topic, tp.partition) for tp in partitions])
        answer = self.answers.pop(0)
        if isinstance(answer, KafkaException):
            raise answer
        return answer


WAIT_COORD = KafkaException(KafkaError(KafkaError._WAIT_COORD, "Waiting for coordinator"))


def test_resume_remembers_the_committed_offsets_retrying_a_coordinator_not_there_yet() -> None:
    pos = Positions()
    found = [TopicPartition(SAMPLES, 0, -1001), TopicPartition(SAMPLES, 1, 7, metadata='{"nc": 60000}')]
    reader = _CommittedReads([WAIT_COORD, found])
    got = pos.resume("node", reader, [TopicPartition(SAMPLES, 0), TopicPartition(SAMPLES, 1)], lambda: False)
    assert len(reader.asked) == 2
    assert pos.resumed == {("node", SAMPLES, 0): None, ("node", SAMPLES, 1): 7}
    assert got[(SAMPLES, 1)].metadata == '{"nc": 60000}'
    assert pos.committable("node", SAMPLES, [0, 1]) == []  # resumed is not read


def test_resume_gives_up_at_once_when_stopping() -> None:
    reader = _CommittedReads([WAIT_COORD])
    with pytest.raises(ServiceError, match="cannot read the job stage's committed offsets"):
        Positions().resume("job", reader, [TopicPartition(JOBS, 0)], lambda: True)


# ---------------------------------------------------------------------------------------------------
# The commit protocol


def test_outputs_are_delivered_before_any_offset_is_sent_stage_by_stage() -> None:
    protocol, _, stages, _ = _setup(("rekey", JOBS, {0: 4}), ("node", SAMPLES, {0: 7, 1: 9}))
    assert protocol.commit(stages)
    log = stages[0].log
    assert log == [
        "flush",
        ("commit", "rekey", [(JOBS, 0, 4, None)]),
        ("after_commit", "rekey"),
        ("commit", "node", [(SAMPLES, 0, 7, None), (SAMPLES, 1, 9, None)]),
        ("after_commit", "node"),
    ]


def test_commits_wait_for_the_interval_unless_forced() -> None:
    protocol, _, stages, clock = _setup(("node", SAMPLES, {0: 7}))
    assert protocol.commit(stages)
    clock.t += 0.5
    assert not protocol.commit(stages)
    assert protocol.commit(stages, force=True)  # a revoke, a stop
    clock.t += 0.999
    assert not protocol.commit(stages)  # the interval counts from the forced one
    clock.t += 0.001
    assert protocol.commit(stages)
    assert len(stages[0].fake.commits) == 3


def test_undelivered_outputs_mean_no_offsets_and_the_idle_states_wait() -> None:
    protocol, outputs, stages, clock = _setup(("job", JOBS, {0: 3}))
    stages[0].states = [StateRecord(0, b"c1/j1", b"{}")]
    outputs.failing_flushes = {1}
    with pytest.raises(ServiceError, match="not delivered"):
        protocol.commit(stages)
    assert stages[0].fake.commits == []
    # The states were not written ahead of the outputs they reflect: they go with the next commit.
    clock.t += 1
    assert protocol.commit(stages)
    assert stages[0].log[1:] == [
        "flush",
        ("state", STATE, 0, b"c1/j1"),
        "flush",
        ("commit", "job", [(JOBS, 0, 3, None)]),
        ("after_commit", "job"),
    ]


def test_idle_states_are_delivered_after_the_outputs_and_before_the_offsets() -> None:
    protocol, outputs, stages, _ = _setup(("rekey", JOBS, {0: 2}), ("job", JOBS, {1: 5}))
    stages[1].states = [StateRecord(1, b"c1/j1", b'{"a": 1}'), StateRecord(1, b"c1/j2", b'{"forgotten": true}')]
    outputs.failing_flushes = {2}  # the states' own flush
    with pytest.raises(ServiceError):
        protocol.commit(stages, force=True)
    assert stages[0].log == ["flush", ("state", STATE, 1, b"c1/j1"), ("state", STATE, 1, b"c1/j2"), "flush"]
    assert stages[0].fake.commits == stages[1].fake.commits == []  # no offset without its states


def test_without_idle_states_one_flush_is_enough() -> None:
    protocol, outputs, stages, _ = _setup(("node", SAMPLES, {0: 1}))
    protocol.commit(stages)
    assert outputs.flushes == 1


def test_no_commit_while_the_session_is_lost_and_the_next_one_catches_up() -> None:
    """A consumer without a member id is rejoining: the broker fences a static member's commit that
    carries no id (a fatal error), so none is sent; the next interval sends the offsets as they are."""
    protocol, _, stages, clock = _setup(("node", SAMPLES, {0: 7}))
    fake = stages[0].fake
    fake.member = ""
    assert protocol.commit(stages)
    assert fake.commits == []
    fake.member = "member-2"
    stages[0].needed[0] = 8
    clock.t += 1
    protocol.commit(stages)
    assert fake.commits == [[(SAMPLES, 0, 8, None)]]


def test_nothing_is_sent_for_a_stage_with_nothing_to_commit() -> None:
    protocol, _, stages, _ = _setup(("node", SAMPLES, {}))
    protocol.commit(stages)
    assert stages[0].fake.commits == []


def test_a_failed_commit_is_logged_and_sent_again_at_the_next_interval(caplog: pytest.LogCaptureFixture) -> None:
    protocol, _, stages, clock = _setup(("job", JOBS, {0: 3}))
    fake = stages[0].fake
    fake.raise_next = WAIT_COORD
    with caplog.at_level(logging.WARNING, logger="gpuledger.processors"):
        assert protocol.commit(stages)  # not raised: the loop goes on
    assert fake.commits == [] and "will retry at the next interval" in caplog.text
    clock.t += 1
    protocol.commit(stages)
    assert fake.commits == [[(JOBS, 0, 3, None)]]


def test_a_failed_asynchronous_commit_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuledger.processors"):
        on_commit_result(KafkaError(KafkaError.REQUEST_TIMED_OUT, "timed out"), [TopicPartition(JOBS, 0, 3)])
        on_commit_result(None, [TopicPartition(JOBS, 0, 3)])
    assert len(caplog.records) == 1 and "will retry at the next interval" in caplog.text


def test_a_fatal_commit_error_ends_the_consumer_and_commits_no_later_stage() -> None:
    protocol, _, stages, _ = _setup(("rekey", JOBS, {0: 2}), ("node", SAMPLES, {0: 7}))
    stages[0].fake.raise_next = KafkaException(KafkaError(KafkaError._FATAL, "Fatal error: fenced"))
    with pytest.raises(ConsumerFailed) as info:
        protocol.commit(stages)
    assert info.value.stage == "rekey"
    assert stages[1].fake.commits == []
