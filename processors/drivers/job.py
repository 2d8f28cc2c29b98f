"""The job stage's driver: device-minutes (bundled by job, `processors.job_rows`) and job events (both
keyed by job) into job-minutes, and each job's idle state machine into alerts and reclaim actions (`JobPartition`).

The idle states live in a compacted internal topic (`processors.idle-state.v1`, `stages.encode_job_state`:
JSON of `IdleState`, or a forgotten job's tombstone `{"ended_ms": ..., "forgotten": true}`), partition p for
input partition p: written at each commit after the outputs they reflect and before the offsets
(`take_states`), read to its end at each assignment. A replayed device-minute at or before a state's
`last_minute_ms` is skipped, so no alert or action is decided twice.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from base.errors import ServiceError
from base.kafka import new_admin, read_to_end
from processors.dlq import FutureTimestamp
from processors.drivers.base import NEG_INF, StageContext, StageDriver
from processors.job_rows import JobRows
from processors.positions import StateRecord
from processors.stages import JobOutputs, JobPartition, JobState, decode_job_state, encode_job_state
from processors.windows import MINUTE_MS, Horizon
from schemas.topics import JOB_DEVICE_MINUTES, JOB_EVENTS, JOB_MINUTES, RECLAIM_ACTIONS, job_key

log = logging.getLogger("gpuledger.processors")

STATE_RETENTION_MS = 30 * 24 * 3600 * 1000


def _wait_for_leaders(admin: AdminClient, topic: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        parts = md.partitions.values() if md is not None and md.error is None else ()
        if parts and all(p.leader >= 0 and p.error is None for p in parts):
            return
        time.sleep(0.2)
    raise ServiceError(f"topic {topic} has no leader after {timeout_s:.0f} s")


class JobDriver(StageDriver):
    """Reads device-minutes and job events (co-partitioned), writes job-minutes, idle alerts, reclaim
    actions and the idle states."""

    stage = "job"

    def __init__(self, ctx: StageContext, instance: str | None) -> None:
        super().__init__(ctx, instance)
        self.parts: dict[int, JobPartition] = {}
        self.dirty: dict[int, dict[str, JobState]] = {}  # states changed since the last commit
        self.rows = JobRows(ctx.decoder)

    def topics(self) -> list[str]:
        t = self.ctx.topics
        return [t.job_dm, t.jobs]

    def ensure_state_topic(self) -> None:
        """The idle-state topic: compacted, co-partitioned with the job-keyed topics."""
        t = self.ctx.topics
        admin = new_admin(self.ctx.settings.kafka)
        md = admin.list_topics(timeout=10)
        if t.state not in md.topics:
            dm = md.topics.get(t.job_dm)
            parts = len(dm.partitions) if dm is not None and dm.partitions else JOB_DEVICE_MINUTES.partitions
            kafka = self.ctx.settings.kafka
            config = {
                "cleanup.policy": "compact,delete",
                "retention.ms": str(STATE_RETENTION_MS),
                "min.insync.replicas": str(kafka.topic_min_insync()),
            }
            fut = admin.create_topics([NewTopic(t.state, parts, kafka.topic_replication, config=config)])
            try:
                fut[t.state].result(timeout=30)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise ServiceError(f"cannot create {t.state}: {exc}") from exc
        _wait_for_leaders(admin, t.state)

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.resume(partitions)
        parts = sorted({tp.partition for tp in partitions if tp.topic == self.ctx.topics.job_dm})
        for p in parts:
            self.parts[p] = JobPartition(self.ctx.ps)
        for p, jkey, state in self._read_states(parts):
            if p in self.parts:
                self.parts[p].restore_state(jkey, state)
        self.assigned = list(partitions)
        self.consumer.assign(partitions)
        self.observe_clock()

    def _read_states(self, parts: list[int]) -> list[tuple[int, str, JobState | None]]:
        """The idle-state partitions read to their end: the latest state per job, by partition and job."""
        if not parts:
            return []
        ctx = self.ctx
        group = f"{ctx.ps.group_id}.state-reader"
        table = read_to_end(ctx.settings.kafka, group, ctx.topics.state, parts, stopped=ctx.shutdown)
        return [(p, key.decode(), decode_job_state(v)) for (p, key), v in sorted(table.items())]

    def drop(self, tp: TopicPartition) -> None:
        if tp.topic == self.ctx.topics.job_dm:
            self.parts.pop(tp.partition, None)

    def horizons(self) -> list[Horizon]:
        return [j.horizon for j in self.parts.values()]

    # -- reading
    def poll(self, wait_s: float) -> int:
        """Read a batch into the partitions' tables; the number of records read."""
        ctx = self.ctx
        t, decoder = ctx.topics, ctx.decoder
        msgs = self.consume(wait_s)
        for msg, topic, p, off in self.records(msgs):
            part = self.parts.get(p)
            if part is None:
                continue
            if topic == t.job_dm:
                rows = self.rows.decode(msg)
                beyond = part.on_job_rows(rows, off) if rows is not None else None
                if beyond is not None:
                    decoder.refuse(msg, JOB_DEVICE_MINUTES.subject, FutureTimestamp(part.horizon.reason(beyond)))
            elif topic == t.jobs:
                ev = decoder.decode(msg, JOB_EVENTS.subject)
                if ev is not None and not part.on_job_event(ev, off):
                    decoder.refuse(msg, JOB_EVENTS.subject, FutureTimestamp(part.horizon.reason(ev["ts_ms"])))
        return len(msgs)

    # -- emitting
    def advance(self) -> None:
        """Job-minutes whose devices have all reported, then the idle clocks' tick."""
        wall = self.ctx.now_ms() if self.ctx.ps.realtime else NEG_INF
        for p, part in self.parts.items():
            self._emit(p, part.drain())
            now = max(wall, (part.max_ts or NEG_INF) + MINUTE_MS)
            self._emit(p, part.tick(now))

    def _emit(self, p: int, out: JobOutputs) -> None:
        ctx = self.ctx
        t, outputs, stats = ctx.topics, ctx.outputs, ctx.stats
        for jm in out.job_minutes:
            outputs.send(t.jm, JOB_MINUTES.subject, job_key(jm["cluster"], jm["job_id"]), jm)
        for alert in out.alerts:
            ctx.emit_alert(alert, job_key(alert["cluster"], alert["job_id"]))
        for action in out.actions:
            outputs.send(t.actions, RECLAIM_ACTIONS.subject, job_key(action["cluster"], action["job_id"]), action)
        stats.job_minutes += len(out.job_minutes)
        stats.actions += len(out.actions)
        if out.states:
            self.dirty.setdefault(p, {}).update(out.states)

    # -- commits
    def take_states(self) -> list[StateRecord]:
        dirty, self.dirty = self.dirty, {}
        records = []
        for p, states in dirty.items():
            for jkey, st in states.items():
                records.append(StateRecord(p, jkey.encode(), encode_job_state(st)))
        return records

    def commit_offsets(self) -> list[TopicPartition]:
        """Device-minute bundles: the lowest offset of one still waiting for its job-minute; job events: the
        oldest offset of an allocation still live."""
        t, positions = self.ctx.topics, self.ctx.positions
        offsets = []
        for p, _ in positions.committable(self.stage, t.job_dm, self.parts):
            offsets.append(TopicPartition(t.job_dm, p, self.parts[p].rows_commit_offset()))
        for p, _ in positions.committable(self.stage, t.jobs, self.parts):
            offsets.append(TopicPartition(t.jobs, p, self.parts[p].events_commit_offset()))
        return offsets
