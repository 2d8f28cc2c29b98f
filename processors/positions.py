"""Where each stage stands on its input, what it may commit, and the commit protocol.

Each stage object answers which input record it still needs (`*_commit_offset` in processors/stages.py);
this module owns the rest of "what commits when" (docs/architecture.md):

- `Positions`: per (stage, topic, partition) the next offset read, and the committed offset the stage
  resumed from. The rekey and job stages both read the job events, each at its own pace, so the stage
  is part of the key. Only a partition read from since its assignment is ever committed.
- `CommitProtocol`: every `commit_interval_ms`, on a revoke and at a stop: (1) every output delivered,
  (2) the idle states those outputs imply, delivered, (3) the offsets, asynchronously, per stage. A
  delivery that fails or runs out of time raises before any offset is sent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from base.errors import ServiceError
from base.kafka import is_fatal
from processors.recovery import ConsumerFailed

log = logging.getLogger("gpuledger.processors")

Key = tuple[str, str, int]  # (stage, topic, partition)
COMMITTED_READ_S = 30.0  # the longest the committed offsets of an assignment may take to read


class CommittedReader(Protocol):
    def committed(self, partitions: list[TopicPartition], timeout: float = ...) -> list[TopicPartition]: ...


class Positions:
    """What each stage has consumed, and where it resumed (the group's committed offset at assignment)."""

    def __init__(self) -> None:
        self.read: dict[Key, int] = {}  # the next offset to read; set by the first record read after assignment
        self.resumed: dict[Key, int | None] = {}  # None: nothing committed, the consumer starts at the earliest

    def next_offset(self, stage: str, topic: str, partition: int) -> int | None:
        """The next offset `stage` reads (None: nothing read, nothing committed)."""
        key = (stage, topic, partition)
        return self.read.get(key, self.resumed.get(key))

    def committable(self, stage: str, topic: str, partitions: Iterable[int]) -> list[tuple[int, int]]:
        """(partition, next offset read) for those `stage` has read from since their assignment: the only
        ones a commit names (one read from nothing yet has nothing new to say)."""
        read = self.read
        return [(p, read[(stage, topic, p)]) for p in partitions if (stage, topic, p) in read]

    def forget(self, stage: str, topic: str, partition: int) -> None:
        """A partition revoked or lost: nothing is committed for it until it is assigned and read again."""
        self.read.pop((stage, topic, partition), None)

    def resume(
        self, stage: str, consumer: CommittedReader, partitions: Sequence[TopicPartition], stopped: Callable[[], bool]
    ) -> dict[tuple[str, int], TopicPartition]:
        """The committed offsets (and metadata) of newly assigned partitions: where reading resumes."""
        if not partitions:
            return {}
        asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        deadline = time.monotonic() + COMMITTED_READ_S
        while True:  # short tries, so that a stop is not held up by a coordinator that is loading or gone
            try:
                found = consumer.committed(asked, timeout=2)
                break
            except KafkaException as exc:
                if stopped() or time.monotonic() > deadline:
                    raise ServiceError(f"cannot read the {stage} stage's committed offsets: {exc}") from exc
                time.sleep(0.2)  # an error can come back at once (no coordinator yet): do not spin
        out: dict[tuple[str, int], TopicPartition] = {}
        for c in found:
            key = (c.topic, int(c.partition))
            self.resumed[(stage, *key)] = c.offset if c.offset >= 0 else None
            out[key] = c
        return out


# ---------------------------------------------------------------------------------------------------
# The commit protocol


class CommitConsumer(Protocol):
    def memberid(self) -> str | None: ...
    def commit(self, *, offsets: list[TopicPartition], asynchronous: Literal[True]) -> None: ...


class Delivery(Protocol):
    """The producer side of a commit (processors.outputs.Outputs)."""

    def flush(self) -> None: ...
    def send_to_partition(self, topic: str, key: bytes, value: bytes, partition: int) -> None: ...


@dataclass(frozen=True, slots=True)
class StateRecord:
    """One record of the idle-state topic: partition p holds the jobs of input partition p."""

    partition: int
    key: bytes
    value: bytes


class Committing(Protocol):
    """A stage as the commit protocol sees it (processors.drivers)."""

    @property
    def stage(self) -> str: ...
    @property
    def consumer(self) -> CommitConsumer: ...
    def take_states(self) -> list[StateRecord]: ...
    def commit_offsets(self) -> list[TopicPartition]: ...
    def after_commit(self) -> None: ...


def on_commit_result(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """The outcome of an asynchronous commit (served by consume() and close()): a failed one is only
    logged, since the next interval commits every stage's offsets again."""
    if err is not None:
        log.warning("commit failed (will retry at the next interval): %s", err)


class CommitProtocol:
    """Outputs, then idle states, then offsets; at most once per interval unless forced."""

    def __init__(
        self, outputs: Delivery, state_topic: str, interval_ms: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.outputs = outputs
        self.state_topic = state_topic
        self.interval_ms = interval_ms
        self.clock = clock
        self._last = 0.0

    def commit(self, stages: Sequence[Committing], force: bool = False) -> bool:
        """Commit every stage if the interval has passed (or `force`); True when it did."""
        now = self.clock()
        if not force and (now - self._last) * 1000 < self.interval_ms:
            return False
        self._last = now
        self.outputs.flush()  # 1. what the offsets below stand for is delivered (or this raises)
        states = [record for s in stages for record in s.take_states()]
        if states:  # 2. after the outputs they reflect, before the offsets that would skip their input
            for r in states:
                self.outputs.send_to_partition(self.state_topic, r.key, r.value, r.partition)
            self.outputs.flush()
        for s in stages:  # 3. offsets
            self.send(s.stage, s.consumer, s.commit_offsets())
            s.after_commit()
        return True

    @staticmethod
    def send(stage: str, consumer: CommitConsumer, offsets: list[TopicPartition]) -> None:
        """An asynchronous commit (its outcome comes to `on_commit_result`). A synchronous one waits for the
        coordinator without a bound (minutes when the broker is frozen or its coordinator still loads
        after a restart), and while it waits every other call on that consumer waits too, a stop
        included. Commits are sent in order; the consumer's close waits for the last ones (bounded).

        Nothing is sent while the consumer has no member id: its session ran out and it is rejoining,
        and the broker fences a static member's commit that carries no id (a fatal error)."""
        if not offsets or not consumer.memberid():
            return
        try:
            consumer.commit(offsets=offsets, asynchronous=True)
        except KafkaException as exc:
            err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if err is not None and is_fatal(err):
                raise ConsumerFailed(stage, err.str()) from exc
            log.warning("commit failed (will retry at the next interval): %s", exc)
