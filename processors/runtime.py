"""The Kafka runtime of the processors: thin confluent-kafka loops around the pure stages.

Design (see docs/benchmarks.md "Processors" for the figures):
- Hot path on confluent-kafka consumers, not faust agents: a faust table write costs ~100 us per
  event, a plain loop ~2.6 us. State is plain Python in the stage objects.
- Exactness without a state store: offsets are committed only up to the first input record still
  needed by something not yet emitted (an open window, a live job's allocation, a job-minute still
  waiting for devices). Before a commit every output is flushed. After a crash the stages replay from
  the committed offsets and re-emit byte-identical rollups (idempotent sinks keep one copy). The
  node stage stores in the commit metadata which minutes are closed and at which input offset each
  recent one closed, so a replayed sample of an emitted minute is neither counted twice nor lost.
- The job stage keeps each job's idle state machine in a compacted internal topic
  (`processors.idle-state.v1`, JSON), written after the outputs it reflects are delivered and before
  the offsets are committed; a replayed minute at or before the stored `last_minute_ms` is skipped.
- Watermark per node partition: its own latest sample time (held while allocations or job events are
  unread); once the partition has been quiet for QUIET_PARTITION_S, the latest event time across every
  assigned partition (so a node whose exporter died still gets its minutes closed as dark); in
  real-time mode never behind the wall clock once caught up. Following the others only when quiet
  matters in event time: a replay runs through minutes in milliseconds, so a partition whose records
  reach the broker a moment after another's would otherwise see its minutes closed before they land.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpuledger.errors import ServiceError
from gpuledger.kafka import PRODUCER_DEFAULTS
from gpuledger.settings import Settings
from processors.attribution import MINUTE_MS
from processors.dlq import Decoder
from processors.fastdecode import FlatDecoder, ScrapeDecoder, UnsupportedSchema
from processors.idle import IdleState
from processors.stages import JobOutputs, JobPartition, NodeOutputs, NodePartition, RekeyStage
from processors.windows import Admit
from schemas import load_schema
from schemas.codec import SINGLE_OBJECT_MAGIC, AvroCodec
from schemas.topics import (
    ALERTS,
    ALLOCATIONS,
    COVERAGE_MINUTES,
    DEVICE_MINUTES,
    DEVICE_SAMPLES,
    INVENTORY,
    JOB_EVENTS,
    JOB_MINUTES,
    LATE_SAMPLES,
    RECLAIM_ACTIONS,
    job_key,
    node_key,
)

log = logging.getLogger("gpuledger.processors")

IDLE_STATE_TOPIC = "processors.idle-state.v1"
STAGES = ("rekey", "node", "job")
NEG_INF = -(2**62)
IDLE_WAIT_S = 0.01  # the longest a poll waits for a batch while the round has read little
QUIET_PARTITION_S = 2.0  # a samples partition with nothing new this long follows the others' event time


@dataclass(slots=True)
class Stats:
    scrapes: int = 0
    samples: int = 0
    late_scrapes: int = 0
    dead_lettered: int = 0
    device_minutes: int = 0
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


def _busy_last(row: dict[str, Any]) -> tuple[int, bool]:
    return row["minute_start_ms"], bool(row["active_s"] or row["starved_s"])


def _coords(msg: Message) -> tuple[str, int, int]:
    """Topic, partition and offset of a consumed (non-error) message."""
    return cast(str, msg.topic()), cast(int, msg.partition()), cast(int, msg.offset())


def _consumer_conf(settings: Settings, group: str, instance: str | None) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **settings.kafka.client_config(),
        "group.id": group,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "range",  # co-partitioned topics: same partition numbers together
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "fetch.queue.backoff.ms": 10,
        "enable.partition.eof": False,
    }
    if instance:
        conf["group.instance.id"] = f"{group}.{instance}"  # static membership: a restart takes its place at once
    return conf


class ProcessorRuntime:
    """One process running some or all stages. `run()` loops until stopped (or idle, for finite inputs)."""

    def __init__(
        self,
        settings: Settings,
        *,
        stages: tuple[str, ...] = STAGES,
        instance: str | None = None,
        exit_when_idle_s: float | None = None,
        clock: Callable[[], float] = time.time,
        stats_path: Path | None = None,
    ) -> None:
        self.stats_path = stats_path
        self.settings = settings
        self.ps = settings.processor
        self.stages = tuple(s for s in STAGES if s in stages)
        self.clock = clock
        self.exit_when_idle_s = exit_when_idle_s
        self.codec = AvroCodec.from_settings(settings.kafka)
        k = settings.kafka
        self.t_samples = k.topic(DEVICE_SAMPLES.name)
        self.t_allocs = k.topic(ALLOCATIONS.name)
        self.t_inventory = k.topic(INVENTORY.name)
        self.t_jobs = k.topic(JOB_EVENTS.name)
        self.t_dm = k.topic(DEVICE_MINUTES.name)
        self.t_jm = k.topic(JOB_MINUTES.name)
        self.t_cov = k.topic(COVERAGE_MINUTES.name)
        self.t_alerts = k.topic(ALERTS.name)
        self.t_actions = k.topic(RECLAIM_ACTIONS.name)
        self.t_late = k.topic(LATE_SAMPLES.name)
        self.t_state = k.topic(IDLE_STATE_TOPIC)
        self.producer = Producer({**PRODUCER_DEFAULTS, **k.client_config(), "linger.ms": "5"})
        self._delivery_errors: list[str] = []
        # Allocations partition -> offset after the last allocation this process re-keyed (from delivery
        # reports): the node stage holds its watermark until it has read them, so a job event re-keyed
        # after the samples it bounds cannot miss their window (the rekey hop is not source lateness).
        self.allocs_sent: dict[int, int] = {}
        self._allocs_in_flight = 0  # re-keyed allocations produced, delivery not yet reported
        # Job events not yet read by the rekey stage (fresh broker watermarks, checked at most every
        # 0.2 s): allocations may still be missing, so node windows wait (e.g. after a broker restart
        # the samples consumer can reconnect and race ahead of the job-events one).
        self._jobs_checked = 0.0
        self._jobs_lagging = False
        self._offsets_client: Consumer | None = None
        self._node_w: dict[int, int] = {}  # node partition -> the watermark it last advanced to
        self._samples_read_at: dict[int, float] = {}  # node partition -> when it last gave a sample (monotonic)
        self.decoder = Decoder(self.codec, self, k.topic_prefix, lambda: int(self.clock() * 1000))
        try:
            self.fast_scrapes: ScrapeDecoder | None = ScrapeDecoder(load_schema(DEVICE_SAMPLES.subject))
        except UnsupportedSchema as exc:
            log.warning("lean scrape decoder unavailable (%s): using the general codec", exc)
            self.fast_scrapes = None
        try:
            self.fast_rows: FlatDecoder | None = FlatDecoder(load_schema(DEVICE_MINUTES.subject))
        except UnsupportedSchema as exc:
            log.warning("lean device-minute decoder unavailable (%s): using the general codec", exc)
            self.fast_rows = None
        self.stats = Stats()
        self.observer: Any = None  # gpuledger.metrics.ProcessorObserver while /metrics is served (run)
        self._stop = False
        self._closing = False  # consumers are closing: a late assignment is not taken up
        gid = self.ps.group_id
        self.rekey_c = Consumer(_consumer_conf(settings, f"{gid}.rekey", instance)) if "rekey" in self.stages else None
        self.node_c = Consumer(_consumer_conf(settings, f"{gid}.node", instance)) if "node" in self.stages else None
        self.job_c = Consumer(_consumer_conf(settings, f"{gid}.job", instance)) if "job" in self.stages else None
        self.rekey: dict[int, RekeyStage] = {}
        self.nodes: dict[int, NodePartition] = {}
        self.jobs: dict[int, JobPartition] = {}
        # Next offset per (stage, topic, partition): the rekey and job stages both read JOB_EVENTS, each
        # from its own position (one shared entry let the job stage's position stand for the rekey's).
        self.pos: dict[tuple[str, str, int], int] = {}
        self.start_pos: dict[tuple[str, str, int], int | None] = {}  # committed offset at assignment
        self.assigned: dict[str, list[TopicPartition]] = {"rekey": [], "node": [], "job": []}
        self.state_dirty: dict[int, dict[str, IdleState | None]] = {}
        self.rekey_ready = self.rekey_c is None
        self._last_commit = 0.0
        self._last_msg = self.clock()
        self._drained = False

    # ------------------------------------------------------------------ wiring
    def _send_raw(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        while True:
            try:
                self.producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=on_delivery or self._on_delivery
                )
                return
            except BufferError:
                self.producer.poll(0.05)

    def publish_raw(
        self, topic_name: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]] | None = None
    ) -> None:
        """Dead-letter sink for `gpuledger.consumer` (delivered before the next offset commit)."""
        self._send_raw(topic_name, key, value or b"", headers)

    def _send_allocation(self, key: bytes, value: bytes) -> None:
        def delivered(err: Any, msg: Any) -> None:
            self._allocs_in_flight -= 1
            self._on_delivery(err, msg)
            if err is None:
                _, p, off = _coords(msg)
                self.allocs_sent[p] = max(self.allocs_sent.get(p, 0), off + 1)

        self._send_raw(self.t_allocs, key, value, on_delivery=delivered)
        self._allocs_in_flight += 1

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self._delivery_errors.append(f"{msg.topic()}: {err}")

    def _send(self, topic: str, subject: str, key: bytes, record: dict[str, Any]) -> None:
        self._send_raw(topic, key, self.codec.encode(subject, record))

    def ensure_internal_topics(self) -> None:
        """The idle-state topic: compacted, co-partitioned with the job-keyed topics."""
        admin = AdminClient(dict(self.settings.kafka.client_config()))
        md = admin.list_topics(timeout=10)
        if self.t_state in md.topics:
            self._wait_for_leaders(admin, self.t_state)
            return
        dm = md.topics.get(self.t_dm)
        parts = len(dm.partitions) if dm is not None and dm.partitions else DEVICE_MINUTES.partitions
        fut = admin.create_topics(
            [
                NewTopic(
                    self.t_state,
                    parts,
                    1,
                    config={"cleanup.policy": "compact,delete", "retention.ms": str(30 * 24 * 3600 * 1000)},
                )
            ]
        )
        try:
            fut[self.t_state].result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ServiceError(f"cannot create {self.t_state}: {exc}") from exc
        self._wait_for_leaders(admin, self.t_state)

    @staticmethod
    def _wait_for_leaders(admin: AdminClient, topic: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            md = admin.list_topics(topic, timeout=10).topics.get(topic)
            parts = md.partitions.values() if md is not None and md.error is None else ()
            if parts and all(p.leader >= 0 and p.error is None for p in parts):
                return
            time.sleep(0.2)
        raise ServiceError(f"topic {topic} has no leader after {timeout_s:.0f} s")

    def start(self) -> None:
        if self.job_c is not None:
            self.ensure_internal_topics()
        if self.rekey_c is not None:
            self.rekey_c.subscribe([self.t_jobs], on_assign=self._on_assign, on_revoke=self._on_revoke)
        if self.node_c is not None:
            self.node_c.subscribe(
                [self.t_samples, self.t_allocs, self.t_inventory], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        if self.job_c is not None:
            self.job_c.subscribe([self.t_dm, self.t_jobs], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _stage_of(self, consumer: Consumer) -> str:
        return "rekey" if consumer is self.rekey_c else "node" if consumer is self.node_c else "job"

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.commit(force=True)
        stage = self._stage_of(consumer)
        for tp in partitions:
            self.pos.pop((stage, tp.topic, tp.partition), None)
            if consumer is self.rekey_c:
                self.rekey.pop(tp.partition, None)
            elif consumer is self.node_c and tp.topic == self.t_samples:
                self.nodes.pop(tp.partition, None)
            elif consumer is self.job_c and tp.topic == self.t_dm:
                self.jobs.pop(tp.partition, None)

    def _remember_start(self, consumer: Consumer, partitions: list[TopicPartition]) -> dict[tuple[str, int], Any]:
        """Committed offsets (and metadata) of newly assigned partitions: where reading resumes."""
        if not partitions:
            return {}
        asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        out: dict[tuple[str, int], Any] = {}
        stage = self._stage_of(consumer)
        for c in consumer.committed(asked, timeout=30):
            key = (c.topic, int(c.partition))
            self.start_pos[(stage, *key)] = c.offset if c.offset >= 0 else None
            out[key] = c
        return out

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._closing:
            # A stop during start-up can land while the group still hands out partitions: taken up
            # inside close(), the assignment asked the closing client for its offsets and failed the exit.
            return
        stage = self._stage_of(consumer)
        if stage == "rekey":
            self._on_assign_rekey(consumer, partitions)
        elif stage == "node":
            self._on_assign_node(consumer, partitions)
        else:
            self._on_assign_job(consumer, partitions)

    def _on_assign_rekey(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = self._remember_start(consumer, partitions)
        for tp in partitions:
            c = committed.get((tp.topic, tp.partition))
            self.rekey[tp.partition] = RekeyStage.restore(c.metadata if c is not None and c.offset >= 0 else None)
        self.assigned["rekey"] = list(partitions)
        self.rekey_ready = False

    def _on_assign_node(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        committed = self._remember_start(consumer, [tp for tp in partitions if tp.topic != self.t_inventory])
        for tp in partitions:
            if tp.topic == self.t_samples:
                part = NodePartition(self.ps)
                c = committed.get((tp.topic, tp.partition))
                if c is not None and c.offset >= 0:
                    part.restore(c.metadata)
                    part.samples_next_offset = c.offset
                self.nodes[tp.partition] = part
                self._samples_read_at[tp.partition] = time.monotonic()
            elif tp.topic == self.t_inventory:
                tp.offset = OFFSET_BEGINNING  # compacted: always read whole
                self.start_pos[("node", tp.topic, tp.partition)] = None
        self.assigned["node"] = list(partitions)
        consumer.assign(partitions)

    def _on_assign_job(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._remember_start(consumer, partitions)
        parts = sorted({tp.partition for tp in partitions if tp.topic == self.t_dm})
        for p in parts:
            self.jobs[p] = JobPartition(self.ps)
        for p, jkey, state in self._read_states(parts):
            if p in self.jobs:
                if state is not None and state.get("forgotten"):
                    self.jobs[p].table.mark_forgotten(jkey, 0)
                    self.jobs[p].restore_state(jkey, None)
                else:
                    self.jobs[p].restore_state(jkey, None if state is None else IdleState.from_json(state))
        self.assigned["job"] = list(partitions)
        consumer.assign(partitions)

    def _read_states(self, parts: list[int]) -> list[tuple[int, str, dict[str, Any] | None]]:
        """Read the compacted idle-state partitions to their end (latest value per job wins)."""
        if not parts:
            return []
        conf = {
            **self.settings.kafka.client_config(),
            "group.id": f"{self.ps.group_id}.state-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
        reader = Consumer(conf)
        try:
            ends: dict[int, int] = {}
            tps = []
            for p in parts:
                lo, hi = self._watermarks(reader, TopicPartition(self.t_state, p))
                if hi > lo:
                    ends[p] = hi
                    tps.append(TopicPartition(self.t_state, p, lo))
            latest: dict[tuple[int, str], dict[str, Any] | None] = {}
            if tps:
                reader.assign(tps)
                deadline = time.monotonic() + 60
                while ends and time.monotonic() < deadline:
                    for msg in reader.consume(500, 0.5):
                        if msg.error():
                            continue
                        _, p, off = _coords(msg)
                        key = (msg.key() or b"").decode()
                        value = msg.value()
                        latest[(p, key)] = None if value is None else json.loads(value)
                        if off + 1 >= ends.get(p, 0):
                            ends.pop(p, None)
            return [(p, k, v) for (p, k), v in sorted(latest.items())]
        finally:
            reader.close()

    @staticmethod
    def _watermarks(consumer: Consumer, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
        """Low and high offsets from the broker, retrying while leadership settles."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                lo, hi = consumer.get_watermark_offsets(tp, timeout=10)
                return int(lo), int(hi)
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise ServiceError(f"cannot read offsets of {tp.topic}[{tp.partition}]: {exc}") from exc
                time.sleep(0.2)

    # ------------------------------------------------------------------ helpers
    def _read_to(self, stage: str, topic: str, partition: int) -> int | None:
        """The next offset `stage` reads (None: nothing committed, the consumer starts at the earliest)."""
        key = (stage, topic, partition)
        return self.pos.get(key, self.start_pos.get(key))

    def _caught_up(self, consumer: Consumer, topic: str, partition: int, fresh: bool = False) -> bool:
        """Read to the log end: by the watermarks the consumer last fetched, or asked of the broker now."""
        tp = TopicPartition(topic, partition)
        try:
            if fresh:
                lo, hi = self._offsets_c().get_watermark_offsets(tp, timeout=2)
            else:
                lo, hi = consumer.get_watermark_offsets(tp, cached=True)
        except KafkaException:
            return False
        if hi is None or hi < 0:
            return False
        pos = self._read_to(self._stage_of(consumer), topic, partition)
        return (lo if pos is None else pos) >= hi

    def _all_caught_up(self, consumer: Consumer | None, stage: str) -> bool:
        if consumer is None:
            return True
        tps = self.assigned[stage]
        if not tps:
            return False
        return all(self._caught_up(consumer, tp.topic, tp.partition) for tp in tps)

    # ------------------------------------------------------------------ stages
    def _poll_rekey(self, wait_s: float) -> int:
        assert self.rekey_c is not None
        msgs = self.rekey_c.consume(self.ps.batch_size, wait_s if self.rekey_ready else 0.0)
        routed = False
        for msg in msgs:
            if msg.error():
                log.warning("rekey consumer: %s", msg.error())
                continue
            topic, p, off = _coords(msg)
            self.pos[("rekey", topic, p)] = off + 1
            ev = self.decoder.decode(msg, JOB_EVENTS.subject)
            stage = self.rekey.get(p)
            if ev is None or stage is None:
                continue
            for nk in stage.route(ev, off):
                self._send_allocation(nk.encode(), msg.value() or b"")
                routed = True
        if routed:
            # Serve delivery reports without waiting for them: until an allocation is delivered (and so
            # in allocs_sent) it counts as in flight and node windows wait for it. A synchronous flush
            # here stalled the loop once per re-keyed batch (10,000 GPUs fell 48 s behind at 0.1 core).
            self.producer.poll(0)
        if not self.rekey_ready and self._all_caught_up(self.rekey_c, "rekey"):
            self.producer.flush(30)
            self.rekey_ready = True
        return len(msgs)

    def _poll_node(self, wait_s: float) -> int:
        assert self.node_c is not None
        msgs = self.node_c.consume(self.ps.batch_size, wait_s)
        decode = self.codec.decode
        samples_subject = DEVICE_SAMPLES.subject
        # Fast path for the hot topic: current single-object framing read straight with fastavro
        # (anything else, older writers or Confluent framing included, goes through the codec).
        header = SINGLE_OBJECT_MAGIC + self.codec.fingerprint(samples_subject)
        fast = self.fast_scrapes
        if msgs and self.stats.first_sample_wall is None:
            self.stats.first_sample_wall = self.clock()
        read_at = self._samples_read_at
        now = time.monotonic()
        for msg in msgs:
            if msg.error():
                log.warning("node consumer: %s", msg.error())
                continue
            topic, p, off = _coords(msg)
            self.pos[("node", topic, p)] = off + 1
            part = self.nodes.get(p)
            if part is None:
                continue
            if topic == self.t_samples:
                value = msg.value() or b""
                try:
                    scrape: dict[str, Any]
                    if fast is not None and value[:10] == header:
                        scrape = fast.decode(value, 10)
                    else:
                        scrape = decode(value, samples_subject).record
                except Exception:
                    self.decoder.decode(msg, samples_subject)  # dead-letters it with the reason
                    continue
                verdict = part.on_scrape(scrape, off)
                read_at[p] = now
                self.stats.scrapes += 1
                self.stats.samples += len(scrape["devices"])
                self.stats.last_sample_wall = self.clock()
                if verdict is Admit.LATE:
                    self.stats.late_scrapes += 1
                    self._send_raw(self.t_late, msg.key(), msg.value() or b"")
            elif topic == self.t_allocs:
                ev = self.decoder.decode(msg, JOB_EVENTS.subject)
                if ev is not None:
                    key = (msg.key() or b"").decode()
                    part.on_allocation(key, ev, off)
                    self.stats.allocations += 1
            elif topic == self.t_inventory:
                inv = self.decoder.decode(msg, INVENTORY.subject)
                if inv is not None:
                    part.on_inventory(inv)
        return len(msgs)

    def _jobs_lagging_now(self, fresh: bool = False) -> bool:
        if self.rekey_c is None:
            return False
        now = time.monotonic()
        if not fresh and now - self._jobs_checked < 0.2:
            return self._jobs_lagging
        self._jobs_checked = now
        self._jobs_lagging = not all(
            self._caught_up(self.rekey_c, tp.topic, tp.partition, fresh=True) for tp in self.assigned["rekey"]
        )
        return self._jobs_lagging

    def _offsets_c(self) -> Consumer:
        """A client used only for broker offset queries: on the rekey consumer's own connection a query
        waits behind its long-polling fetch (up to fetch.wait.max.ms, 500 ms), which throttled the
        node loop to a few rounds a second."""
        if self._offsets_client is None:
            self._offsets_client = Consumer(
                {**self.settings.kafka.client_config(), "group.id": f"{self.ps.group_id}.offsets"}
            )
        return self._offsets_client

    def _node_watermarks(self, drain_to: int | None) -> dict[int, tuple[int, int]]:
        """Partition -> (window watermark, coverage clock)."""
        assert self.node_c is not None
        global_max = max(
            (t for part in self.nodes.values() for t in (part.max_sample_ts, part.max_alloc_ts) if t is not None),
            default=NEG_INF,
        )
        wall = int(self.clock() * 1000) if self.ps.realtime else NEG_INF
        mono = time.monotonic()
        candidates: dict[int, tuple[int, int]] = {}
        for p, part in self.nodes.items():
            own = NEG_INF if part.max_sample_ts is None else part.max_sample_ts
            if not self._caught_up(self.node_c, self.t_inventory, p):
                candidates[p] = (NEG_INF, NEG_INF)  # rows carry inventory facts (model, generation): read it first
            elif not self._caught_up(self.node_c, self.t_samples, p):
                candidates[p] = (own, own)
            else:
                quiet = mono - self._samples_read_at.get(p, 0.0) >= QUIET_PARTITION_S
                w = max(global_max if quiet else own, wall)
                candidates[p] = (w if drain_to is None else max(w, drain_to), w)
        jobs_lagging = self._jobs_lagging_now()
        # A watermark about to close a minute asks the broker afresh whether job events are unread.
        grace = self.ps.grace_ms
        closing = any(
            (w - grace) // MINUTE_MS > (self._node_w.get(p, NEG_INF) - grace) // MINUTE_MS
            for p, (w, _) in candidates.items()
            if w > NEG_INF
        )
        if closing and not jobs_lagging:
            jobs_lagging = self._jobs_lagging_now(fresh=True)
        out: dict[int, tuple[int, int]] = {}
        for p, cand in candidates.items():
            read = self._read_to("node", self.t_allocs, p)
            allocs_behind = (
                jobs_lagging
                or self._allocs_in_flight > 0
                or (read or 0) < self.allocs_sent.get(p, 0)  # re-keyed and not yet delivered, or not read back
                or not self._caught_up(self.node_c, self.t_allocs, p)
            )
            # Hold while allocations are unread: they are few, so this is brief. Their event times are
            # no watermark: the rekey stage interleaves several job-event partitions (and replays after a
            # restart), so an older job end can still be unread behind a newer event.
            out[p] = (NEG_INF, NEG_INF) if allocs_behind else cand
        return out

    def _advance_nodes(self, drain_to: int | None = None) -> None:
        closed: list[NodeOutputs] = []
        ticks: list[tuple[NodePartition, int]] = []
        for p, (w, now) in self._node_watermarks(drain_to).items():
            part = self.nodes[p]
            if w <= NEG_INF:
                continue
            self._node_w[p] = max(w, self._node_w.get(p, NEG_INF))
            out = part.advance(w)
            if out.device_minutes or out.coverage_minutes:
                closed.append(out)
            ticks.append((part, now))
        rows = [row for out in closed for row in out.device_minutes]
        # Rows of devices that did not compute go out first (minute by minute): idle alerts wait for
        # them, while busy rows only feed rollups. Encoding 100k rows takes seconds at the top of a minute.
        rows.sort(key=_busy_last)
        for row in rows:
            jid = row["job_id"]
            key = job_key(row["cluster"], jid) if jid is not None else node_key(row["cluster"], row["node"])
            self._send(self.t_dm, DEVICE_MINUTES.subject, key, row)
        self.stats.device_minutes += len(rows)
        for out in closed:
            for cov in out.coverage_minutes:
                self._send(self.t_cov, COVERAGE_MINUTES.subject, node_key(cov["cluster"], cov["node"]), cov)
            self.stats.coverage_minutes += len(out.coverage_minutes)
            if self.observer is not None and out.coverage_minutes:
                self.observer.coverage(out.coverage_minutes)
        for part, now in ticks:
            for alert in part.tick(now):
                self._emit_alert(alert, node_key(alert["cluster"], alert["node"] or ""))

    def _emit_alert(self, alert: dict[str, Any], key: bytes) -> None:
        alert["emitted_ts_ms"] = int(self.clock() * 1000)
        self._send(self.t_alerts, ALERTS.subject, key, alert)
        self.stats.alerts += 1
        if self.observer is not None:
            self.observer.alert(alert)

    def _poll_job(self, wait_s: float) -> int:
        assert self.job_c is not None
        msgs = self.job_c.consume(self.ps.batch_size, wait_s)
        dm_header = SINGLE_OBJECT_MAGIC + self.codec.fingerprint(DEVICE_MINUTES.subject)
        for msg in msgs:
            if msg.error():
                log.warning("job consumer: %s", msg.error())
                continue
            topic, p, off = _coords(msg)
            self.pos[("job", topic, p)] = off + 1
            part = self.jobs.get(p)
            if part is None:
                continue
            if topic == self.t_dm:
                value = msg.value() or b""
                row: dict[str, Any] | None = None
                if self.fast_rows is not None and value[:10] == dm_header:
                    try:
                        row = self.fast_rows.decode(value, 10)
                    except (ValueError, IndexError):
                        row = None
                if row is None:
                    row = self.decoder.decode(msg, DEVICE_MINUTES.subject)
                if row is not None:
                    part.on_device_minute(row, off)
            elif topic == self.t_jobs:
                ev = self.decoder.decode(msg, JOB_EVENTS.subject)
                if ev is not None:
                    part.on_job_event(ev, off)
        return len(msgs)

    def _advance_jobs(self) -> None:
        wall = int(self.clock() * 1000) if self.ps.realtime else NEG_INF
        for p, part in self.jobs.items():
            self._job_outputs(p, part.drain())
            now = max(wall, (part.max_ts or NEG_INF) + MINUTE_MS)
            self._job_outputs(p, part.tick(now))

    def _job_outputs(self, p: int, out: JobOutputs) -> None:
        for jm in out.job_minutes:
            self._send(self.t_jm, JOB_MINUTES.subject, job_key(jm["cluster"], jm["job_id"]), jm)
        for alert in out.alerts:
            self._emit_alert(alert, job_key(alert["cluster"], alert["job_id"]))
        for action in out.actions:
            self._send(self.t_actions, RECLAIM_ACTIONS.subject, job_key(action["cluster"], action["job_id"]), action)
        self.stats.job_minutes += len(out.job_minutes)
        self.stats.actions += len(out.actions)
        if out.states:
            self.state_dirty.setdefault(p, {}).update(out.states)

    # ------------------------------------------------------------------ durability
    def _flush(self) -> None:
        remaining = self.producer.flush(30)
        if remaining:
            raise ServiceError(f"{remaining} output records not delivered within 30 s")
        if self._delivery_errors:
            errors, self._delivery_errors = self._delivery_errors, []
            raise ServiceError(f"{len(errors)} output records failed delivery, first: {errors[0]}")

    def commit(self, force: bool = False) -> None:
        """Flush outputs, then the idle states they imply, then commit what is no longer needed."""
        now = self.clock()
        if not force and (now - self._last_commit) * 1000 < self.ps.commit_interval_ms:
            return
        self._last_commit = now
        self._flush()
        if self.state_dirty:
            dirty, self.state_dirty = self.state_dirty, {}
            for p, states in dirty.items():
                for jkey, st in states.items():
                    key = jkey.encode()
                    value = json.dumps({"forgotten": True}) if st is None else json.dumps(st.to_json(), sort_keys=True)
                    self.producer.produce(
                        self.t_state, value=value.encode(), key=key, partition=p, on_delivery=self._on_delivery
                    )
            self._flush()
        if self.rekey_c is not None:
            offs = []
            for p, stage in self.rekey.items():
                read = self.pos.get(("rekey", self.t_jobs, p))
                if read is not None:
                    meta = stage.metadata(read)
                    offs.append(TopicPartition(self.t_jobs, p, stage.commit_offset(read), metadata=meta))
            self._commit(self.rekey_c, offs)
        if self.node_c is not None:
            offs = []
            for p, part in self.nodes.items():
                if ("node", self.t_samples, p) in self.pos:
                    offs.append(
                        TopicPartition(self.t_samples, p, part.samples_commit_offset(), metadata=part.metadata())
                    )
                if ("node", self.t_allocs, p) in self.pos:
                    offs.append(TopicPartition(self.t_allocs, p, part.allocs_commit_offset()))
            self._commit(self.node_c, offs)
            for p, part in self.nodes.items():
                if ("node", self.t_samples, p) in self.pos:
                    part.committed(part.samples_commit_offset())
        if self.job_c is not None:
            offs = []
            for p, jpart in self.jobs.items():
                if ("job", self.t_dm, p) in self.pos:
                    offs.append(TopicPartition(self.t_dm, p, jpart.rows_commit_offset()))
                if ("job", self.t_jobs, p) in self.pos:
                    offs.append(TopicPartition(self.t_jobs, p, jpart.events_commit_offset()))
            self._commit(self.job_c, offs)
        self.stats.commits += 1

    @staticmethod
    def _commit(consumer: Consumer, offsets: list[TopicPartition]) -> None:
        if not offsets:
            return
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("commit failed (will retry at the next interval): %s", exc)

    # ------------------------------------------------------------------ loop
    def stop(self, *_: object) -> None:
        self._stop = True

    def step(self) -> int:
        """One round over every stage. Returns the number of input records read.

        A poll waits for a batch (it returns early once one is there) only while the round has read
        little: never on the job-events topic beside other stages (it is idle most of the time, and a
        10 ms wait there each round took a sixth of the node loop at 100k samples/s), and at low rates
        the node and job polls batch what arrives in their wait instead of spinning."""
        n = 0
        few = self.ps.batch_size // 10
        if self.rekey_c is not None:
            alone = self.node_c is None and self.job_c is None
            n += self._poll_rekey(IDLE_WAIT_S if alone else 0.0)
        if self.node_c is not None and self.rekey_ready:
            n += self._poll_node(IDLE_WAIT_S if n < few else 0.0)
            self._advance_nodes()
        if self.job_c is not None:
            n += self._poll_job(IDLE_WAIT_S if n < few else 0.0)
            self._advance_jobs()
        self.producer.poll(0)
        self.commit()
        return n

    def _idle_done(self, n: int) -> bool:
        """For finite inputs: once everything is read and quiet, close the last minutes, then stop."""
        now = self.clock()
        if n:
            self._last_msg = now
            return False
        if self.exit_when_idle_s is None or now - self._last_msg < self.exit_when_idle_s:
            return False
        if not (
            self.rekey_ready
            and self._all_caught_up(self.rekey_c, "rekey")
            and self._all_caught_up(self.node_c, "node")
            and self._all_caught_up(self.job_c, "job")
        ):
            return False
        if not self._drained and self.node_c is not None:
            self._drained = True
            last = max(
                (t for part in self.nodes.values() for t in (part.max_sample_ts, part.max_alloc_ts) if t is not None),
                default=None,
            )
            if last is not None:
                self._advance_nodes(drain_to=last - last % MINUTE_MS + 2 * MINUTE_MS + self.ps.grace_ms)
            self.commit(force=True)
            self._last_msg = now
            return False
        return True

    def _write_stats(self) -> None:
        if self.node_c is not None:
            lag = 0
            for p in self.nodes:
                try:
                    _, hi = self.node_c.get_watermark_offsets(TopicPartition(self.t_samples, p), cached=True)
                except KafkaException:
                    continue
                pos = self._read_to("node", self.t_samples, p) or 0
                if hi is not None and hi >= 0:
                    lag += max(0, hi - pos)
            self.stats.lag_records = lag
        self.stats.extra["late_samples_total"] = sum(p.windows.late_count for p in self.nodes.values())
        late_events = sum(p.late_allocations for p in self.nodes.values())
        before = self.stats.extra.get("late_job_events_total", 0)
        if late_events > before:
            job, ts, closed = max(
                (p.last_late_allocation for p in self.nodes.values() if p.last_late_allocation), key=lambda x: x[1]
            )
            log.warning(
                "%d job event(s) arrived after the minute they bound had closed (latest: %s at %d ms, minutes "
                "closed up to %d ms): applied from arrival, closed minutes keep their attribution; raise "
                "processor.grace_ms if the scheduler's events are routinely this late",
                late_events - before, job, ts, closed,
            )
        self.stats.extra["late_job_events_total"] = late_events
        self.stats.extra["tracked_devices"] = sum(p.coverage.tracked_devices() for p in self.nodes.values())
        if self.observer is not None:
            self.observer.refresh()
        if self.stats_path is not None:
            tmp = self.stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.stats.as_dict(), sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.stats_path)

    def run(self) -> Stats:
        self.start()
        from gpuledger.metrics import instrument_processor

        self.observer = instrument_processor(self)  # /metrics of this process (docs/operations.md)
        signal.signal(signal.SIGTERM, self.stop)
        t0 = time.monotonic()
        last_log = last_stats = t0
        try:
            while not self._stop:
                n = self.step()
                if self._idle_done(n):
                    break
                if time.monotonic() - last_stats > 1:
                    last_stats = time.monotonic()
                    self._write_stats()
                if time.monotonic() - last_log > 10:
                    last_log = time.monotonic()
                    log.info("processors: %s", self.stats.as_dict())
            self._advance_jobs()
            self.commit(force=True)
            self._write_stats()
        finally:
            self._closing = True  # see _on_assign
            for c in (self.rekey_c, self.node_c, self.job_c, self._offsets_client):
                if c is not None:
                    try:
                        c.close()
                    except Exception as exc:  # leaving the group is best effort
                        log.warning("closing a consumer: %s", exc)
        self.stats.dead_lettered = self.decoder.dead_lettered
        self.stats.extra["wall_s"] = round(time.monotonic() - t0, 3)
        if self.stats_path is not None:
            self.stats_path.write_text(json.dumps(self.stats.as_dict(), sort_keys=True), encoding="utf-8")
        return self.stats
