"""What the stage drivers share: the context they run in (settings, topics, the one producer, positions,
decoding, counters) and the base driver (a consumer, its assignment callbacks, polling helpers)."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from base.kafka import is_fatal, new_admin, new_consumer
from base.settings import KafkaSettings, Settings
from base.shutdown import BoundedCall, StopSignal
from processors.dlq import Decoder
from processors.outputs import Outputs
from processors.positions import Positions, StateRecord, on_commit_result
from processors.recovery import ConsumerFailed
from processors.windows import Horizon
from schemas.codec import AvroCodec
from schemas.topics import (
    ALERTS,
    ALLOCATIONS,
    COVERAGE_MINUTES,
    DEVICE_MINUTES,
    DEVICE_SAMPLES,
    IDLE_STATE_TOPIC,
    INVENTORY,
    JOB_DEVICE_MINUTES,
    JOB_EVENTS,
    JOB_MINUTES,
    LATE_SAMPLES,
    RECLAIM_ACTIONS,
)
from streams.consume import DeadLetterSink

log = logging.getLogger("gpuledger.processors")

NEG_INF = -(2**62)

# A static member (`--instance`) keeps its session through a broker restart: once the client's session runs
# out it clears its member id, and the commits it still has queued for the coordinator go out with the
# empty id, which the broker answers with FENCED_INSTANCE_ID, a fatal error. A restarted instance takes
# its own place at once whatever the timeout; a dynamic member keeps 6 s, so a dead one is replaced fast.
STATIC_SESSION_TIMEOUT_MS = 45_000


@dataclass(slots=True)
class Stats:
    scrapes: int = 0
    samples: int = 0
    late_scrapes: int = 0
    dead_lettered: int = 0
    device_minutes: int = 0
    job_device_minutes: int = 0  # the job stage's bundles of them (`processors.job_rows`)
    job_minutes: int = 0
    coverage_minutes: int = 0
    alerts: int = 0
    actions: int = 0
    allocations: int = 0
    commits: int = 0
    lag_records: int = 0  # DEVICE_SAMPLES records (node scrapes) not yet read, assigned partitions
    first_sample_wall: float | None = None
    last_sample_wall: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if k != "extra"} | self.extra


@dataclass(frozen=True, slots=True)
class Topics:
    """The full names (with `kafka.topic_prefix`) of every topic the stages read or write."""

    samples: str
    allocs: str
    inventory: str
    jobs: str
    dm: str
    job_dm: str  # device-minutes bundled by job: the job stage's input
    jm: str
    cov: str
    alerts: str
    actions: str
    late: str
    state: str

    @classmethod
    def of(cls, k: KafkaSettings) -> Topics:
        return cls(
            samples=k.topic(DEVICE_SAMPLES.name),
            allocs=k.topic(ALLOCATIONS.name),
            inventory=k.topic(INVENTORY.name),
            jobs=k.topic(JOB_EVENTS.name),
            dm=k.topic(DEVICE_MINUTES.name),
            job_dm=k.topic(JOB_DEVICE_MINUTES.name),
            jm=k.topic(JOB_MINUTES.name),
            cov=k.topic(COVERAGE_MINUTES.name),
            alerts=k.topic(ALERTS.name),
            actions=k.topic(RECLAIM_ACTIONS.name),
            late=k.topic(LATE_SAMPLES.name),
            state=k.topic(IDLE_STATE_TOPIC),
        )


class StageContext:
    """What every driver shares with the loop. `stats` and `observer` are replaced when a runtime takes over
    from a failed one, so drivers read them here each time rather than keeping them."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Callable[[], float],
        shutdown: StopSignal,
        dead_letters: DeadLetterSink,
        commit_now: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.ps = settings.processor
        self.clock = clock
        self.shutdown = shutdown
        self.commit_now = commit_now  # every stage's commit, forced (on a revoke)
        self.topics = Topics.of(settings.kafka)
        self.codec = AvroCodec.from_settings(settings.kafka)
        self.outputs = Outputs(settings.kafka, self.codec, shutdown)
        self.positions = Positions()
        self.decoder = Decoder(self.codec, dead_letters, settings.kafka.topic_prefix, self.now_ms)
        self.stats = Stats()
        self.observer: Any = None  # base.metrics.ProcessorObserver while /metrics is served
        self.closing = False  # consumers are closing: a late assignment is not taken up

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def emit_alert(self, alert: dict[str, Any], key: bytes) -> None:
        alert["emitted_ts_ms"] = self.now_ms()
        self.outputs.send(self.topics.alerts, ALERTS.subject, key, alert)
        self.stats.alerts += 1
        if self.observer is not None:
            self.observer.alert(alert)


def coords(msg: Message) -> tuple[str, int, int]:
    """Topic, partition and offset of a consumed (non-error) message."""
    return cast(str, msg.topic()), cast(int, msg.partition()), cast(int, msg.offset())


def raise_if_fatal(stage: str, err: KafkaError) -> None:
    """A message-level client error: fatal ones end the consumer; the rest librdkafka retries itself."""
    if is_fatal(err):
        raise ConsumerFailed(stage, err.str())
    log.warning("%s consumer: %s", stage, err)


def consumer_overrides(group: str, instance: str | None) -> dict[str, Any]:
    """A stage consumer's settings beyond the factory's (which commits nothing itself, reads new groups
    from the earliest offset)."""
    conf: dict[str, Any] = {
        "enable.auto.offset.store": False,
        "partition.assignment.strategy": "range",  # co-partitioned topics: same partition numbers together
        "session.timeout.ms": STATIC_SESSION_TIMEOUT_MS if instance else 6000,
        "heartbeat.interval.ms": 1000,
        "fetch.queue.backoff.ms": 10,
        "enable.partition.eof": False,
        "on_commit": on_commit_result,
    }
    if instance:
        conf["group.instance.id"] = f"{group}.{instance}"  # static membership: a restart takes its place at once
    return conf


class LogEndProbe:
    """Asks a partition's leader for its log end without blocking the stage loop: `ask` sends the question
    (`AdminClient.list_offsets`), a later round reads the answer with `answer`. A cached log end is no
    proof: while a partition's leader is unreachable the consumer keeps the last one it fetched, and the
    partition looks read to its end."""

    def __init__(self, admin: Callable[[], AdminClient], timeout_s: float) -> None:
        self._admin = admin
        self.timeout_s = timeout_s
        self._asked: dict[tuple[str, int], tuple[Future[Any], float]] = {}

    def ask(self, topic: str, partition: int, now: float) -> None:
        """Send the question unless one for this partition is still out."""
        key = (topic, partition)
        if key in self._asked:
            return
        tp = TopicPartition(topic, partition)
        try:
            futures = self._admin().list_offsets({tp: OffsetSpec.latest()}, request_timeout=self.timeout_s)
        except (KafkaException, ValueError) as exc:
            failed: Future[Any] = Future()
            failed.set_exception(exc)
            futures = {tp: failed}
        self._asked[key] = (next(iter(futures.values())), now)

    def answer(self, topic: str, partition: int, now: float) -> tuple[float, int | None] | None:
        """None while the question is out; else (when it was asked, the log end or None where the broker
        did not say). An answer is given once: the next `ask` sends a new question."""
        key = (topic, partition)
        asked = self._asked.get(key)
        if asked is None:
            return None
        future, at = asked
        if not future.done():
            if now - at < self.timeout_s:
                return None
            del self._asked[key]
            return at, None
        del self._asked[key]
        try:
            return at, int(future.result().offset)
        except Exception:  # any failure (no leader, timeout, transport) is no answer: keep holding
            return at, None

    def forget(self, partition: int) -> None:
        for key in [k for k in self._asked if k[1] == partition]:
            del self._asked[key]


class StageDriver(ABC):
    """One stage's consumer: subscription, assignment callbacks, reading, and its part of every commit."""

    stage: ClassVar[str]

    def __init__(self, ctx: StageContext, instance: str | None) -> None:
        self.ctx = ctx
        group = f"{ctx.ps.group_id}.{self.stage}"
        # When the client last reported trouble reaching the brokers (an outage): the node stage's quiet-
        # partition rule counts quiet time only after it, as every partition was silent for the same reason.
        self.client_error_at = 0.0
        self.fatal_error: KafkaError | None = None
        self.consumer: Consumer = new_consumer(
            ctx.settings.kafka, group, error_cb=self._on_client_error, **consumer_overrides(group, instance)
        )
        self.assigned: list[TopicPartition] = []
        self._offsets_client: Consumer | None = None
        self._admin_client: AdminClient | None = None

    # -- what a stage says about itself
    @abstractmethod
    def topics(self) -> list[str]:
        """What the stage subscribes to."""

    @abstractmethod
    def assign(self, partitions: list[TopicPartition]) -> None:
        """Restore the state of newly assigned partitions (from the committed offsets and their metadata)."""

    @abstractmethod
    def drop(self, tp: TopicPartition) -> None:
        """Forget the state kept for a partition revoked or lost."""

    @abstractmethod
    def horizons(self) -> list[Horizon]:
        """The future horizon of every partition's stage object."""

    @abstractmethod
    def commit_offsets(self) -> list[TopicPartition]:
        """Per partition read since assignment: the first input record still needed (with metadata)."""

    def after_commit(self) -> None:
        """Called once this stage's offsets were handed to the consumer."""
        return None

    def take_states(self) -> list[StateRecord]:
        """Idle-state records to deliver before the offsets (none but the job stage's)."""
        return []

    def lost(self) -> None:
        """The group session ran out (after the partitions were dropped)."""
        return None

    # -- the group
    def subscribe(self) -> None:
        self.consumer.subscribe(
            self.topics(), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.ctx.closing:
            # A stop during start-up can land while the group still hands out partitions: taken up
            # inside close(), the assignment asked the closing client for its offsets and failed the exit.
            return
        self.assign(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not self.ctx.closing:  # closing: the last commit is made (or given up) already; close() must not wait
            self.ctx.commit_now()
        self.forget(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The session ran out (the coordinator was unreachable for session.timeout.ms, e.g. a broker
        restart): the assignment is gone, and nothing may be committed for it until the rejoin hands it
        back. The client has cleared its member id, and a commit carrying the empty id is refused with
        FENCED_INSTANCE_ID for a static member (`--instance`), a fatal error. The partitions' state is
        dropped; the new assignment restores it from the committed offsets, as a restart does."""
        log.warning(
            "%s consumer: group session lost (%d partitions): rejoining, resuming from the committed offsets",
            self.stage, len(partitions),
        )  # fmt: skip
        self.forget(partitions)
        self.assigned = []
        self.lost()

    def forget(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.ctx.positions.forget(self.stage, tp.topic, tp.partition)
            self.drop(tp)

    def resume(self, partitions: list[TopicPartition]) -> dict[tuple[str, int], TopicPartition]:
        """The committed offsets (and metadata) of newly assigned partitions, remembered as resume points."""
        return self.ctx.positions.resume(self.stage, self.consumer, partitions, self.ctx.shutdown)

    def observe_clock(self) -> None:
        """Every partition's horizon from the clock: done once a round, and at assignment, before the first
        record (a stage that saw no clock would follow its first event)."""
        now_ms = self.ctx.now_ms()
        for horizon in self.horizons():
            horizon.observe_clock(now_ms)

    def _on_client_error(self, err: KafkaError) -> None:
        self.client_error_at = time.monotonic()
        if is_fatal(err):
            self.fatal_error = err  # the next consume() raises it: the consumer must be rebuilt

    # -- reading
    def consume(self, wait_s: float) -> list[Message]:
        if self.fatal_error is not None:
            raise_if_fatal(self.stage, self.fatal_error)
        try:
            return self.consumer.consume(self.ctx.ps.batch_size, wait_s)
        except KafkaException as exc:
            raise ConsumerFailed(self.stage, str(exc)) from exc

    def records(self, msgs: list[Message]) -> Iterator[tuple[Message, str, int, int]]:
        """The records of a batch with their topic, partition and offset, each counted as read. A fatal
        client error ends the consumer (ConsumerFailed); librdkafka retries the others itself."""
        read = self.ctx.positions.read
        stage = self.stage
        for msg in msgs:
            err = msg.error()
            if err is not None:
                raise_if_fatal(stage, err)
                continue
            topic, p, off = coords(msg)
            read[(stage, topic, p)] = off + 1
            yield msg, topic, p, off

    def caught_up(self, topic: str, partition: int, fresh: bool = False) -> bool:
        """Read to the log end: by the watermarks the consumer last fetched, or asked of the broker now."""
        tp = TopicPartition(topic, partition)
        try:
            if fresh:
                lo, hi = self._offsets().get_watermark_offsets(tp, timeout=2)
            else:
                lo, hi = self.consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            return False
        if hi is None or hi < 0:
            return False
        pos = self.ctx.positions.next_offset(self.stage, topic, partition)
        return (lo if pos is None else pos) >= hi

    def read_position(self, topic: str, partition: int) -> int | None:
        """The next offset this stage reads in a partition (its low watermark before the first record)."""
        pos = self.ctx.positions.next_offset(self.stage, topic, partition)
        if pos is not None:
            return pos
        try:
            lo, _ = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
        except KafkaException:
            return None
        return None if lo is None or lo < 0 else int(lo)

    def all_caught_up(self) -> bool:
        return bool(self.assigned) and all(self.caught_up(tp.topic, tp.partition) for tp in self.assigned)

    def _offsets(self) -> Consumer:
        """A client used only for broker offset queries: on the stage consumer's own connection a query
        waits behind its long-polling fetch (up to fetch.wait.max.ms, 500 ms), which throttled the
        node loop to a few rounds a second."""
        if self._offsets_client is None:
            self._offsets_client = new_consumer(self.ctx.settings.kafka, f"{self.ctx.ps.group_id}.offsets")
        return self._offsets_client

    def admin(self) -> AdminClient:
        """An admin client for questions that must not wait on the loop (`LogEndProbe`)."""
        if self._admin_client is None:
            self._admin_client = new_admin(self.ctx.settings.kafka)
        return self._admin_client

    # -- the end
    def close_calls(self) -> list[BoundedCall[None]]:
        """Start closing this stage's clients, each on its own thread (the caller bounds the wait)."""
        calls = [BoundedCall(self.consumer.close, f"closing the {self.stage} consumer (and its last commit)")]
        if self._offsets_client is not None:
            calls.append(BoundedCall(self._offsets_client.close, "closing the offsets client"))
        return calls
