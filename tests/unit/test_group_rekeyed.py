"""A node stage whose job events other processes re-key (`GroupRekeyed`) may close a minute only once the group's
commits, asked after the close was wanted, cover every job-events partition's log end. The broker is stood in for
by futures this test settles (the real broker: tests/integration/test_processors_instances.py)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from processors.drivers.rekey import GroupRekeyed, published_below

JOBS = "sched.job-events.v1"


class Broker:
    """A stand-in admin client: each question stays out until the test answers it."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.ends: list[dict[TopicPartition, Future[Any]]] = []
        self.commits: list[Future[Any]] = []

    def list_topics(self, topic: str, timeout: float) -> Any:
        meta = SimpleNamespace(error=None, partitions=dict.fromkeys(range(self.partitions)))
        return SimpleNamespace(topics={topic: meta})

    def list_offsets(self, request: dict[TopicPartition, Any], request_timeout: float) -> dict[TopicPartition, Any]:
        self.ends.append({tp: Future() for tp in request})
        return self.ends[-1]

    def list_consumer_group_offsets(self, request: list[Any], request_timeout: float) -> dict[str, Future[Any]]:
        assert request[0].group_id == "g.rekey"
        self.commits.append(Future())
        return {"g.rekey": self.commits[-1]}

    def answer(self, ends: dict[int, int], commits: dict[int, tuple[int, str | None]]) -> None:
        for tp, fut in self.ends[-1].items():
            fut.set_result(SimpleNamespace(offset=ends[tp.partition]))
        tps = [SimpleNamespace(partition=p, offset=off, metadata=meta) for p, (off, meta) in commits.items()]
        self.commits[-1].set_result(SimpleNamespace(topic_partitions=tps))


def test_only_the_partitions_other_processes_hold_are_asked_about() -> None:
    broker = Broker(4)
    group = GroupRekeyed(lambda: broker, "g.rekey", JOBS, 5.0)  # type: ignore[arg-type, return-value]
    assert group.others({0, 2}) == {1, 3}
    assert group.rekeyed(frozenset(), since=1.0, now=1.0)  # this process holds them all: no question
    assert broker.ends == []


def test_a_close_waits_for_commits_that_cover_the_log_end_asked_after_it_was_wanted() -> None:
    broker = Broker(2)
    group = GroupRekeyed(lambda: broker, "g.rekey", JOBS, 5.0)  # type: ignore[arg-type, return-value]
    both = frozenset({0, 1})
    assert not group.rekeyed(both, since=1.0, now=1.0)  # asked now, answered later
    assert not group.rekeyed(both, since=1.0, now=1.1)  # still out: no second question
    assert len(broker.ends) == 1
    # partition 1 has events the group has not re-keyed: the committed offset is the oldest running job's first
    # event, `pb` how far they were re-keyed and delivered
    broker.answer({0: 7, 1: 9}, {0: (3, '{"pb": 7}'), 1: (3, '{"pb": 8}')})
    assert not group.rekeyed(both, since=1.0, now=1.2)
    assert group.behind == {1: (8, 9)}
    broker.answer({0: 7, 1: 9}, {0: (3, '{"pb": 7}'), 1: (3, '{"pb": 9}')})
    assert group.rekeyed(both, since=1.0, now=1.3)
    assert group.rekeyed(both, since=1.2, now=1.4)  # that answer was asked at 1.2: good for a close wanted then
    assert not group.rekeyed(both, since=1.5, now=1.5)  # a later close needs a later answer
    assert len(broker.ends) == 3


def test_no_commit_or_no_answer_holds() -> None:
    broker = Broker(1)
    group = GroupRekeyed(lambda: broker, "g.rekey", JOBS, 5.0)  # type: ignore[arg-type, return-value]
    one = frozenset({0})
    assert not group.rekeyed(one, since=0.0, now=0.0)
    broker.answer({0: 1}, {0: (-1001, None)})  # nobody re-keyed partition 0, which has an event
    assert not group.rekeyed(one, since=0.0, now=0.1)
    broker.commits[-1].set_exception(KafkaException(KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE)))
    for fut in broker.ends[-1].values():
        fut.set_result(SimpleNamespace(offset=0))
    assert not group.rekeyed(one, since=0.0, now=0.2)  # no answer is no proof, even of an empty log
    assert len(broker.ends) == 3
    assert not group.rekeyed(one, since=0.0, now=9.0)  # that one went unanswered past the timeout: asked again
    assert len(broker.ends) == 4


def test_the_commit_metadata_is_read_defensively() -> None:
    assert published_below('{"pb": 12}', 3) == 12
    assert published_below(None, 3) == 0 and published_below('{"pb": 12}', -1001) == 0
    assert published_below("not json", 3) == 0 and published_below("[1]", 3) == 0
