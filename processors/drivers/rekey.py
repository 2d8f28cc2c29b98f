"""The re-key stage's driver: job events (keyed by job) republished onto the allocations topic, once per
node they touch, so that a node's samples and allocations meet in one partition (`RekeyStage`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from processors.dlq import FutureTimestamp
from processors.drivers.base import StageContext, StageDriver, coords
from processors.stages import RekeyStage
from processors.windows import Horizon
from schemas.topics import JOB_EVENTS

log = logging.getLogger("gpuledger.processors")

LAG_CHECK_S = 0.2  # the longest the broker's answer to "job events unread?" is reused
SAY_WHY_S = 30.0  # a node stage held by another process's unread job events says so at most this often


class RekeyDriver(StageDriver):
    """Reads `sched.job-events.v1`, writes `sched.allocations.v1`; tells the node stage whether allocations
    may still be missing (unread job events, re-keyed allocations not yet delivered)."""

    stage = "rekey"

    def __init__(self, ctx: StageContext, instance: str | None) -> None:
        super().__init__(ctx, instance)
        self.parts: dict[int, RekeyStage] = {}
        # Read to the end of its assignment and delivered: until then the node stage does not read (its
        # windows would close before the allocations that bound them are out).
        self.ready = False
        # Allocations partition -> offset after the last allocation this process re-keyed (from delivery
        # reports): the node stage holds its watermark until it has read them, so a job event re-keyed
        # after the samples it bounds cannot miss their window (the rekey hop is not source lateness).
        self.allocs_sent: dict[int, int] = {}
        self.allocs_in_flight = 0  # re-keyed allocations produced, delivery not yet reported
        # Job events not yet read (fresh broker watermarks, checked at most every LAG_CHECK_S): allocations
        # may still be missing, so node windows wait (e.g. after a broker restart the samples consumer
        # can reconnect and race ahead of the job-events one).
        self._lag_checked = 0.0
        self._lagging = False

    def topics(self) -> list[str]:
        return [self.ctx.topics.jobs]

    def assign(self, partitions: list[TopicPartition]) -> None:
        committed = self.resume(partitions)
        ps = self.ctx.ps
        for tp in partitions:
            c = committed.get((tp.topic, tp.partition))
            meta = c.metadata if c is not None and c.offset >= 0 else None
            self.parts[tp.partition] = RekeyStage.restore(meta, Horizon(ps.max_future_ms, not ps.realtime))
        self.assigned = list(partitions)
        self.ready = False
        self.observe_clock()

    def drop(self, tp: TopicPartition) -> None:
        self.parts.pop(tp.partition, None)

    def lost(self) -> None:
        self.ready = False

    def horizons(self) -> list[Horizon]:
        return [s.horizon for s in self.parts.values()]

    def poll(self, wait_s: float) -> int:
        """Read a batch and re-key it; the number of records read. Waits only once ready (catching up,
        the loop must come back to deliver and report readiness)."""
        ctx = self.ctx
        decoder = ctx.decoder
        msgs = self.consume(wait_s if self.ready else 0.0)
        routed = False
        for msg, _topic, p, off in self.records(msgs):
            ev = decoder.decode(msg, JOB_EVENTS.subject)
            stage = self.parts.get(p)
            if ev is None or stage is None:
                continue
            routes = stage.route(ev, off)
            if routes is None:  # beyond the horizon: the job stage refuses it too
                decoder.refuse(msg, JOB_EVENTS.subject, FutureTimestamp(stage.horizon.reason(ev["ts_ms"])))
                continue
            for nk in routes:
                self._send_allocation(nk.encode(), msg.value() or b"")
                routed = True
        if routed:
            # Serve delivery reports without waiting for them: until an allocation is delivered (and so
            # in allocs_sent) it counts as in flight and node windows wait for it. A synchronous flush
            # here stalled the loop once per re-keyed batch (10,000 GPUs fell 48 s behind at 0.1 core).
            ctx.outputs.poll()
        if not self.ready and self.all_caught_up():
            ctx.outputs.drain()
            self.ready = True
        return len(msgs)

    def _send_allocation(self, key: bytes, value: bytes) -> None:
        outputs = self.ctx.outputs

        def delivered(err: Any, msg: Any) -> None:
            self.allocs_in_flight -= 1
            outputs.on_delivery(err, msg)
            if err is None:
                _, p, off = coords(msg)
                self.allocs_sent[p] = max(self.allocs_sent.get(p, 0), off + 1)

        outputs.send_raw(self.ctx.topics.allocs, key, value, on_delivery=delivered)
        self.allocs_in_flight += 1

    def lagging(self, fresh: bool = False) -> bool:
        """Job events assigned here and not read yet, by the broker's watermarks (asked again only after
        LAG_CHECK_S unless `fresh`)."""
        now = time.monotonic()
        if not fresh and now - self._lag_checked < LAG_CHECK_S:
            return self._lagging
        self._lag_checked = now
        self._lagging = not all(self.caught_up(tp.topic, tp.partition, fresh=True) for tp in self.assigned)
        return self._lagging

    def commit_offsets(self) -> list[TopicPartition]:
        """The first event of the oldest job still running, with how far events were re-keyed and
        delivered (`{"pb": n}`): a replay relearns running jobs' nodes without publishing them twice."""
        topic = self.ctx.topics.jobs
        offsets = []
        for p, read in self.ctx.positions.committable(self.stage, topic, self.parts):
            stage = self.parts[p]
            offsets.append(TopicPartition(topic, p, stage.commit_offset(read), metadata=stage.metadata(read)))
        return offsets


def published_below(metadata: str | None, offset: int) -> int:
    """How far a partition's job events were re-keyed and delivered, by its committed offset and metadata
    (`RekeyStage.metadata`); metadata that does not parse counts as nothing re-keyed (the node stage holds)."""
    if offset < 0:
        return 0
    try:
        return RekeyStage.published(metadata)
    except (ValueError, TypeError, AttributeError):
        return 0


class GroupRekeyed:
    """Whether the re-keying stages of the other processes of the group have re-keyed and delivered every job
    event in the log, so a node stage may close a minute: each job-events partition's committed `pb` (its
    group's commit, made only after the allocations it covers were delivered) against the partition's log end,
    both asked of the broker without blocking the loop (`rekeyed` sends the question, a later call reads the
    answer). The partitions the process's own rekey stage holds are judged in process, faster (`RekeyDriver`)."""

    def __init__(self, admin: Callable[[], AdminClient], group: str, topic: str, timeout_s: float) -> None:
        self._admin = admin
        self.group = group
        self.topic = topic
        self.timeout_s = timeout_s
        self._partitions: frozenset[int] | None = None
        self._asked: tuple[float, frozenset[int], dict[Any, Future[Any]], Future[Any]] | None = None
        self.confirmed_at = float("-inf")  # when the last question that found them all re-keyed was asked
        self.confirmed_for: frozenset[int] = frozenset()
        self.behind: dict[int, tuple[int, int]] = {}  # partition -> (re-keyed below, log end), last answer
        self._said_at = float("-inf")

    def others(self, local: set[int]) -> frozenset[int]:
        """The job-events partitions not held by this process's rekey stage (all of them without one)."""
        if self._partitions is None:
            meta = self._admin().list_topics(self.topic, timeout=self.timeout_s).topics.get(self.topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise KafkaException(f"no metadata for {self.topic}")
            self._partitions = frozenset(meta.partitions)
        return self._partitions - local

    def rekeyed(self, partitions: frozenset[int], since: float, now: float) -> bool:
        """True once a question asked at or after `since` found every one of `partitions` re-keyed to its log end."""
        if not partitions or self._confirmed(partitions, since):
            return True
        self._collect(now)
        if self._confirmed(partitions, since):
            return True
        if self._asked is None:
            self._ask(partitions, now)
        elif now - self._said_at >= SAY_WHY_S and self.behind:
            self._said_at = now
            log.info("minutes wait for job events another process has not re-keyed yet (partition: re-keyed "
                     "below, log end): %s", dict(sorted(self.behind.items())))  # fmt: skip
        return False

    def _confirmed(self, partitions: frozenset[int], since: float) -> bool:
        return self.confirmed_at >= since and partitions <= self.confirmed_for

    def _ask(self, partitions: frozenset[int], now: float) -> None:
        admin = self._admin()
        tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        try:
            # Log ends first: a commit read after them that covers them covers every event they count.
            ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, request_timeout=self.timeout_s)
            (group,) = admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(self.group, tps)], request_timeout=self.timeout_s
            ).values()
        except (KafkaException, ValueError) as exc:
            log.debug("asking how far the group re-keyed job events: %s", exc)
            return
        self._asked = (now, partitions, ends, group)

    def _collect(self, now: float) -> None:
        if self._asked is None:
            return
        at, partitions, ends, group = self._asked
        if not (group.done() and all(f.done() for f in ends.values())):
            if now - at >= self.timeout_s:
                self._asked = None  # no answer in time: ask again
            return
        self._asked = None
        try:
            end = {tp.partition: int(f.result().offset) for tp, f in ends.items()}
            done = {tp.partition: published_below(tp.metadata, tp.offset) for tp in group.result().topic_partitions}
        except Exception as exc:  # any failure (no leader, no coordinator, timeout) is no answer: keep holding
            log.debug("how far the group re-keyed job events: no answer (%s)", exc)
            return
        self.behind = {p: (done.get(p, 0), e) for p, e in end.items() if done.get(p, 0) < e}
        if not self.behind:  # the log ends were asked for exactly `partitions`
            self.confirmed_at, self.confirmed_for = at, partitions
