"""The job stage (job-minutes, the per-job idle state machine, alerts, reclaim actions) as a faust app.

An alternative to the job stage of `processors/runtime.py`, written to find out whether faust can run
it under the same guarantees (issue 16, item 8). It reuses the pure stage (`processors.stages.JobPartition`
over `processors.idle`) and only adapts it to faust:

- One agent reads the node stage's device-minutes bundled by job (`processors.job-device-minutes.v1`,
  `processors.job_rows`) and `sched.job-events.v1` (both keyed `cluster/job_id`, co-partitioned), in
  batches (`noack_take`), one `JobPartition` per source partition.
- The idle states live in a faust Table whose changelog is the state topic (`processors.idle-state.v1`
  by default): keys `cluster/job_id` as UTF-8, values the same JSON the runtime writes
  (`stages.encode_job_state`: `IdleState.to_json` or `{"ended_ms": ..., "forgotten": true}`), partitioned
  by Kafka's murmur2 of the key (`use_partitioner`), i.e. the source partition. Faust recovers it at
  assignment; a `JobPartition` is restored from it lazily.
- Outputs are the runtime's, byte for byte but `emitted_ts_ms` (the wall clock, as in the runtime):
  job-minutes, alerts, actions, Avro through `schemas.codec.AvroCodec`, keyed by job.

Exactness, the runtime's commit protocol mapped onto faust's at-least-once commit:
1. a batch's outputs are flushed (delivered) before the states they imply are written to the Table;
2. events are acked only below the stage's commit offsets (`rows_commit_offset`, `events_commit_offset`:
   a device-minute still waiting for the rest of its job-minute, or a live allocation, stays unacked, so
   a restart replays it), after the Table writes;
3. the changelog writes are delivered too before the acks: faust's commit does not flush its producer (it
   only publishes what was attached to the committed events, and nothing is attached here), and faust's own
   `flush` is no proof of delivery (`streams.agents.IdempotentProducer.delivered` is).
A crash therefore replays exactly the input not reflected in delivered output and state, and a replayed
device-minute at or before a job's `last_minute_ms` is skipped, as in the runtime.

Appeals (issue 19), only with a policy (`policy_path`: who may decide): the agent also reads `appeals.v1` (keyed
by job, like its input), folds each job's appeal steps under the policy (`schemas.governance_appeals.fold`, so a
step the rules refuse grants nothing) and puts the job's granted exemptions into its idle state at once
(`JobPartition.grant`), written to the Table like any state change, so a restart restores them before the
first minute. Appeal events are never acked: a restart reads the topic again from its start (appeals are few),
which is what lets a decision meet its filing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from confluent_kafka.admin import AdminClient
from faust.streams import _current_event
from mode import CrashingSupervisor
from mode.signals import BaseSignalT

from base import metrics
from base.settings import KafkaSettings, Settings
from base.shutdown import StopSignal
from processors.dlq import Decoder, FutureTimestamp
from processors.idle import IdleState, granted_exemptions
from processors.job_rows import JobRows
from processors.pipeline import partition_of
from processors.recovery import RecoveryPolicy
from processors.runtime import IDLE_STATE_TOPIC
from processors.stages import JobOutputs, JobPartition, JobState, decode_job_state, encode_job_state
from processors.windows import MINUTE_MS
from schemas.codec import AvroCodec
from schemas.governance_appeals import fold
from schemas.policy import Policy
from schemas.topics import (
    ALERTS,
    APPEALS,
    JOB_DEVICE_MINUTES,
    JOB_EVENTS,
    JOB_MINUTES,
    RECLAIM_ACTIONS,
    job_key,
    qualified_job,
)
from streams.agents import (
    AppFailed,
    FaustDeadLetters,
    InOrder,
    broker_options,
    delivered,
    drained,
    raw_topic,
    run_loop,
    run_replacing,
    serve_app,
    use_project_clients,
)

log = logging.getLogger("gpuledger.processors.idle_agents")

NEG_INF = -(2**62)
TAKE_WITHIN_S = 0.05  # the longest a batch waits to fill


def app_id(settings: Settings) -> str:
    """The faust app id: its consumer group (under the processors' group prefix, so the same ACL covers it)."""
    return f"{settings.processor.group_id}.job-agents"


def source_partitions(kafka: KafkaSettings) -> int:
    """Partitions of the job stage's device-minutes topic (the state topic has as many)."""
    md = AdminClient(dict(kafka.client_config())).list_topics(kafka.topic(JOB_DEVICE_MINUTES.name), timeout=30)
    topic = md.topics.get(kafka.topic(JOB_DEVICE_MINUTES.name))
    if topic is None or topic.error is not None or not topic.partitions:
        return JOB_DEVICE_MINUTES.partitions
    return len(topic.partitions)


@dataclass(slots=True)
class AgentStats:
    events: int = 0
    job_minutes: int = 0
    alerts: int = 0
    actions: int = 0
    state_writes: int = 0
    restored_states: int = 0
    batches: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "extra"}
        return {**out, **self.extra}


class JobStageAgents:
    """The job stage's faust adapter: decode, feed the pure `JobPartition`, send, write states, ack."""

    def __init__(
        self,
        settings: Settings,
        app: faust.App,
        partitions: int,
        state_topic: str | None = None,
        appeals_policy: Policy | None = None,
    ) -> None:
        self.settings = settings
        self.ps = settings.processor
        self.app = app
        self.n = partitions
        k = settings.kafka
        self.codec = AvroCodec.from_settings(k)
        self.decoder = Decoder(self.codec, FaustDeadLetters(app), k.topic_prefix, lambda: int(time.time() * 1000))
        self.rows = JobRows(self.decoder)  # as the loop's job stage reads them
        self.t_job_dm, self.t_jobs = k.topic(JOB_DEVICE_MINUTES.name), k.topic(JOB_EVENTS.name)
        self.appeals_policy = appeals_policy
        self.t_appeals = k.topic(APPEALS.name) if appeals_policy is not None else None
        inputs = (self.t_job_dm, self.t_jobs) + ((self.t_appeals,) if self.t_appeals is not None else ())
        self.source = raw_topic(app, *inputs)
        self.appeal_steps: dict[str, dict[str, dict[str, Any]]] = {}  # by job, by event id
        self.granted_states: dict[str, IdleState] = {}  # changed by an appeal, to write
        self.out_names = (k.topic(JOB_MINUTES.name), k.topic(ALERTS.name), k.topic(RECLAIM_ACTIONS.name))
        self.out_jm, self.out_alerts, self.out_actions = (raw_topic(app, name) for name in self.out_names)
        state_name = state_topic or k.topic(IDLE_STATE_TOPIC)
        changelog = raw_topic(
            app,
            state_name,
            partitions=partitions,
            compacting=True,
            deleting=True,
            retention=30 * 24 * 3600,
            internal=True,
            replicas=k.topic_replication,
            config={"min.insync.replicas": str(k.topic_min_insync())},
        )
        self.states = app.Table(
            "idle-state",
            partitions=partitions,
            changelog_topic=changelog,
            use_partitioner=True,  # murmur2 of the key: the source partition, writable outside an event
            key_type=bytes,  # bytes: the raw serializer (UTF-8 keys, the runtime's JSON values as they are)
            value_type=bytes,
        )
        self.parts: dict[int, JobPartition] = {}
        self.unacked: dict[tuple[str, int], list[Any]] = {}
        self.order = InOrder(app)
        self.stats = AgentStats()
        self.meter = AgentsMeter(app_id(settings), settings.processor.grace_ms) if settings.metrics.enabled else None
        self.lock = asyncio.Lock()  # admission and checkpoint, or the order check (`InOrder.keep_checked`)
        self.in_hand = 0  # batches (and wall-clock ticks) under way (`busy`); the order check is not one
        self.last_input = time.monotonic()  # when a batch last arrived (`--exit-when-idle`)

    # ------------------------------------------------------------------ the idle test (`streams.agents.InputClock`)
    @property
    def batches(self) -> int:
        """Batches processed to the end (acked what they could)."""
        return self.stats.batches

    @property
    def busy(self) -> bool:
        """A batch (or the wall-clock tick) is being processed, or a partition was fetched past what was
        admitted (`InOrder.behind`): input is still to come. Not the order check holding the lock: it reads no
        input, and counted here it could keep `--exit-when-idle` from ever stopping (`streams.agents.drained`)."""
        return self.in_hand > 0 or bool(self.order.behind)

    # ------------------------------------------------------------------ assignment
    def forget(self, partitions: Iterable[int]) -> None:
        """Revoked: the consumer resumes these from the committed offsets; the state is rebuilt from there."""
        for p in partitions:
            self.parts.pop(p, None)
            self.unacked.pop((self.t_job_dm, p), None)
            self.unacked.pop((self.t_jobs, p), None)
            self.order.forget((self.t_job_dm, p), (self.t_jobs, p))

    def _part(self, p: int) -> JobPartition:
        part = self.parts.get(p)
        if part is None:
            part = self.parts[p] = JobPartition(self.ps)
            part.horizon.observe_clock(int(time.time() * 1000))
            restored = 0
            for key, value in list(self.states.items()):
                if partition_of(key, self.n) != p:
                    continue
                part.restore_state(key.decode(), decode_job_state(value))
                restored += 1
            self.stats.restored_states += restored
            log.info("partition %d: restored %d idle states from the changelog", p, restored)
        return part

    # ------------------------------------------------------------------ processing
    async def process(self, stream: Any, events: list[Any]) -> None:
        self.last_input = time.monotonic()
        # No current event: faust would attach every send (outputs, dead letters, the Table's changelog
        # writes) to it and publish them only when *that* event's offset commits, while the inputs that
        # made them are acked on other partitions: a stop could commit inputs whose outputs and states
        # were never sent (the likely cause of a job's job-minutes short by 180 s once in the fault
        # suite's dup-late run). Unattached, they go to the producer at once and `_checkpoint` waits for their delivery.
        _current_event.set(None)
        self.in_hand += 1
        try:
            await self._process(stream, events)
        finally:
            self.in_hand -= 1

    async def _process(self, stream: Any, events: list[Any]) -> None:
        async with self.lock:
            events = await self.order.admit(events, unordered=self.t_appeals)
            self.stats.extra["seeks_back"] = self.order.seeks_back
            now_ms = int(time.time() * 1000)
            for part in self.parts.values():
                part.horizon.observe_clock(now_ms)
            for event in events:
                self._feed(event)
            if self.meter is not None:
                self.meter.read(events, self.app.consumer.highwater)
            self._log_skipped()
            dirty: dict[str, JobState] = {**self.granted_states}
            self.granted_states.clear()
            dirty.update(self._advance())
            await self._checkpoint(stream, dirty)

    def _feed(self, event: Any) -> None:
        msg = event.message
        topic, p, off = msg.topic, msg.partition, msg.offset
        if topic == self.t_appeals:
            self._feed_appeal(msg)  # never acked: replayed from the topic's start after a restart
            return
        self.unacked.setdefault((topic, p), []).append(event)
        part = self._part(p)
        self.stats.events += 1
        if topic == self.t_job_dm:
            rows = self.rows.decode(msg)
            beyond = part.on_job_rows(rows, off) if rows is not None else None
            if beyond is not None:
                reason = FutureTimestamp(part.horizon.reason(beyond))
                self.decoder.refuse(msg, JOB_DEVICE_MINUTES.subject, reason)
        elif topic == self.t_jobs:
            ev = self.decoder.decode(msg, JOB_EVENTS.subject)
            if ev is not None and not part.on_job_event(ev, off):
                self.decoder.refuse(msg, JOB_EVENTS.subject, FutureTimestamp(part.horizon.reason(ev["ts_ms"])))

    def _log_skipped(self) -> None:
        """Device-minutes passed over (a replay of what is out, a forgotten job's), one line a batch: what
        explains a job-minute short of its device-minutes."""
        for p, part in self.parts.items():
            if part.skipped:
                log.info("partition %d: device-minutes passed over (the last 64 at most): %s", p, list(part.skipped))
                part.skipped.clear()

    def _feed_appeal(self, msg: Any) -> None:
        """Fold the job's appeal steps; its exemptions granted so far go into its state at once."""
        assert self.appeals_policy is not None
        step = self.decoder.decode(msg, APPEALS.subject)
        if step is None:
            return
        jid = qualified_job(step["cluster"], step["job_id"])
        p = partition_of(job_key(step["cluster"], step["job_id"]), self.n)
        if p != msg.partition and p not in self.parts:
            return  # the job's partition is another worker's (an appeals topic partitioned differently)
        steps = self.appeal_steps.setdefault(jid, {})
        steps[step["event_id"]] = step
        appeals, _ = fold(steps.values(), self.appeals_policy)
        changed = self._part(p).grant(jid, granted_exemptions(appeals.values()).get(jid, ()))
        if changed is not None:
            self.granted_states[jid] = changed
            log.info("job %s: exemptions granted on appeal now %s", jid, [ex.reason for ex in changed.granted])

    def _advance(self) -> dict[str, JobState]:
        """Drain and tick every partition (as the runtime's `_advance_jobs`); returns the changed states."""
        wall = int(time.time() * 1000) if self.ps.realtime else NEG_INF
        dirty: dict[str, JobState] = {}
        for part in self.parts.values():
            for out in (part.drain(), part.tick(max(wall, (part.max_ts or NEG_INF) + MINUTE_MS))):
                self._send(out)
                dirty.update(out.states)
        return dirty

    def _send(self, out: JobOutputs) -> None:
        enc = self.codec.encode
        for jm in out.job_minutes:
            self.out_jm.send_soon(key=job_key(jm["cluster"], jm["job_id"]), value=enc(JOB_MINUTES.subject, jm))
        for alert in out.alerts:
            alert["emitted_ts_ms"] = int(time.time() * 1000)
            self.out_alerts.send_soon(key=job_key(alert["cluster"], alert["job_id"]), value=enc(ALERTS.subject, alert))
        for action in out.actions:
            key = job_key(action["cluster"], action["job_id"])
            self.out_actions.send_soon(key=key, value=enc(RECLAIM_ACTIONS.subject, action))
        self.stats.job_minutes += len(out.job_minutes)
        self.stats.alerts += len(out.alerts)
        self.stats.actions += len(out.actions)
        if self.meter is not None:
            self.meter.sent(out, self.out_names)

    async def _checkpoint(self, stream: Any, dirty: Mapping[str, JobState]) -> None:
        """Outputs delivered, then the states they imply written, then the inputs no longer needed acked
        (none without a stream: the wall-clock tick reads no input)."""
        await delivered(self.app)
        for jkey, st in dirty.items():
            self.states[jkey.encode()] = encode_job_state(st)
        if dirty:
            await delivered(self.app)  # the states delivered before the inputs are acked
        self.stats.state_writes += len(dirty)
        if stream is None:
            return
        for (topic, p), pending in self.unacked.items():
            part = self.parts.get(p)
            if part is None or not pending:
                continue
            below = part.rows_commit_offset() if topic == self.t_job_dm else part.events_commit_offset()
            keep = []
            for event in pending:
                if event.message.offset < below:
                    await stream.ack(event)
                else:
                    keep.append(event)
            pending[:] = keep
        self.stats.batches += 1


class AgentsMeter:
    """The agents' /metrics (component "agents", `gpuledger status`): records read per topic and their lag
    behind the partitions' high watermarks, records sent per topic, and each alert's latency past when it was due
    (an idle alert's window end plus the grace, as the runtime's `ProcessorObserver` counts it)."""

    def __init__(self, group: str, grace_ms: int) -> None:
        self.m = metrics.component("agents")
        self.group = group
        self.grace_ms = grace_ms
        self.lag: dict[str, dict[int, int]] = {}  # topic -> partition -> records behind, as of the last batch

    def read(self, events: Iterable[Any], highwater: Any) -> None:
        """A batch read: `highwater(tp)` is the consumer's high watermark of a partition (None: unknown yet)."""
        try:
            self._read(events, highwater)
        except Exception as exc:  # metrics never stop the job stage
            log.debug("agents metrics: %s", exc)

    def _read(self, events: Iterable[Any], highwater: Any) -> None:
        last: dict[Any, int] = {}
        read: dict[str, int] = {}
        for event in events:
            msg = event.message
            read[msg.topic] = read.get(msg.topic, 0) + 1
            last[msg.tp] = max(last.get(msg.tp, -1), msg.offset)
        for topic, n in read.items():
            self.m.records_in(topic, n)
        for tp, offset in last.items():
            high = highwater(tp)
            if high is not None:
                self.lag.setdefault(tp.topic, {})[tp.partition] = max(0, int(high) - offset - 1)
        # A topic whose high watermark is not known yet has no lag sample (not 0: "caught up" would be a claim).
        for topic in {tp.topic for tp in last} & self.lag.keys():
            self.m.set_lag(self.group, topic, sum(self.lag[topic].values()))

    def sent(self, out: JobOutputs, topics: tuple[str, str, str]) -> None:
        """What one drain sent: job-minutes, alerts and reclaim actions, to those `topics` in that order."""
        try:
            self._sent(out, topics)
        except Exception as exc:
            log.debug("agents metrics: %s", exc)

    def _sent(self, out: JobOutputs, topics: tuple[str, str, str]) -> None:
        for topic, records in zip(topics, (out.job_minutes, out.alerts, out.actions), strict=True):
            if records:
                self.m.records_out(topic, len(records))
        for alert in out.alerts:
            self.m.alert_emitted(alert, self.grace_ms)


def build_app(settings: Settings, *, partitions: int | None = None, state_topic: str | None = None) -> faust.App:
    """The faust app running the job stage for `settings` (broker, security, topics, group, policy)."""
    ps = settings.processor
    n = partitions if partitions is not None else source_partitions(settings.kafka)
    faust_dir = settings.state_dir / "faust"  # faust makes its data directory even with nothing stored
    faust_dir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        app_id(settings),
        **broker_options(settings.kafka),
        store="memory://",
        datadir=str(faust_dir).replace("{", "{{").replace("}", "}}") + "/{conf.name}-data",  # not the cwd
        web_enabled=False,
        autodiscover=False,
        agent_supervisor=CrashingSupervisor,  # an agent that fails stops the worker: a restart replays its input
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6,
        broker_heartbeat_interval=1,
        broker_commit_interval=ps.commit_interval_ms / 1000,
        producer_acks=-1,
        producer_linger=0.005,
        topic_partitions=n,
        topic_replication_factor=settings.kafka.topic_replication,  # the changelog, replicated like the topics
        table_standby_replicas=0,
        # Inputs a job still needs stay unacked for its lifetime (a live allocation's start event): a stop or
        # a rebalance must not wait for them to be acked (the default waits, and a stop hung); the next
        # owner replays them from the committed offsets.
        stream_wait_empty=False,
        # No `<app id>-__assignor-__leader` topic (outside the topic prefix, one more ACL): it only elects
        # the worker that runs `@app.timer(on_leader=True)`, and this app has no such timer.
        topic_disable_leader=True,
    )
    use_project_clients(app)
    appeals_policy = None
    if settings.policy_path is not None:  # who may decide an appeal: without it, appeals are not read
        from schemas.policy import load_policy

        appeals_policy = load_policy(settings.policy_path)
    agents = JobStageAgents(settings, app, n, state_topic, appeals_policy)
    app.job_stage = agents  # type: ignore[attr-defined]

    @app.agent(agents.source, concurrency=1, name="job-stage")
    async def job_stage(stream: Any) -> None:
        # noack_take turns the stream's acks back on when it ends (a stop): the records still passing through
        # its buffer would then be acked, and committed by the stop, without ever being processed.
        stream.enable_acks = False
        async for events in stream.noack_take(ps.batch_size, within=TAKE_WITHIN_S):
            await agents.process(stream, list(events))

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, /, *args: Any, signal: BaseSignalT[Any], **kwargs: Any) -> None:
        revoked = args[0] if args else kwargs.get("revoked", ())
        agents.forget({tp.partition for tp in revoked})

    # Records faust fetched and dropped at a partition's end: no later record will show the skip (`InOrder`).
    agents.order.keep_checked((agents.t_job_dm, agents.t_jobs), agents.lock)

    if ps.realtime:

        @app.timer(1.0)
        async def tick() -> None:
            # The wall clock forgets ended jobs even without input; nothing to ack here.
            agents.in_hand += 1
            try:
                async with agents.lock:
                    await agents._checkpoint(None, agents._advance())
            finally:
                agents.in_hand -= 1

    return app


# ------------------------------------------------------------------------------------------------ the worker
def _write_stats(path: Path | None, stats: AgentStats) -> None:
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats.as_dict(), sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


async def _serve(
    settings: Settings, shutdown: StopSignal, exit_when_idle_s: float | None, stats_path: Path | None
) -> AgentStats:
    """Run the app in this event loop (`streams.agents.serve_app`) until stopped, idle (`exit_when_idle_s`:
    the input read to its end and quiet that long) or crashed, then stop it within the deadline."""
    app = build_app(settings)
    agents: JobStageAgents = app.job_stage  # type: ignore[attr-defined]
    t0 = time.monotonic()
    agents.last_input = t0
    last_stats = 0.0

    async def tick() -> None:
        nonlocal last_stats
        now = time.monotonic()
        if now - last_stats >= 1.0:
            last_stats = now
            agents.stats.extra["wall_s"] = round(now - t0, 3)
            _write_stats(stats_path, agents.stats)

    async def idle(ready: bool) -> bool:
        if exit_when_idle_s is None:
            return False
        if await drained(app, agents, (agents.t_job_dm, agents.t_jobs), exit_when_idle_s, ready):
            log.info("agents: input drained and quiet for %.1f s: stopping", exit_when_idle_s)
            return True
        return False

    try:
        crashed = await serve_app(app, shutdown, idle=idle, tick=tick)
    finally:
        agents.stats.extra["wall_s"] = round(time.monotonic() - t0, 3)
        _write_stats(stats_path, agents.stats)
    if crashed is not None:
        raise AgentsFailed(crashed, agents.stats)
    return agents.stats


class AgentsFailed(AppFailed):
    """The faust app crashed (an agent raised, a commit or a send failed, e.g. while the broker was away):
    `run_agents` builds a fresh one, which resumes from the committed offsets and the Table's changelog."""

    def __init__(self, cause: BaseException, stats: AgentStats) -> None:
        super().__init__("job-stage agents", cause, stats)


def run_agents(
    settings: Settings,
    *,
    shutdown: StopSignal,
    exit_when_idle_s: float | None = None,
    stats_path: Path | None = None,
    policy: RecoveryPolicy | None = None,
) -> AgentStats:
    """Run the job stage as a faust worker in this process until `shutdown` (SIGTERM/SIGINT), or, with
    `exit_when_idle_s`, once its input is read to the end and quiet that long. Raises `ServiceError` when
    the app failed more often than `policy` allows; before that, a failed app is replaced in-process by a
    fresh one, as a restart would (`streams.agents.run_replacing`, with the runtime's `RecoveryPolicy`)."""

    metrics.start_metrics_server(settings, "agents")

    def run_once() -> AgentStats:
        return run_loop(_serve(settings, shutdown, exit_when_idle_s, stats_path), shutdown)

    return run_replacing(run_once, shutdown, _add, AgentStats(), policy)


def _add(a: AgentStats, b: AgentStats) -> AgentStats:
    """Counters of two runs in one process (a replaced app's and its successor's)."""
    fields = ("events", "job_minutes", "alerts", "actions", "state_writes", "restored_states", "batches")
    return AgentStats(**{f: getattr(a, f) + getattr(b, f) for f in fields}, extra={**a.extra, **b.extra})


def main(argv: list[str] | None = None) -> None:
    """`python -m processors.idle_agents [--realtime|--event-time] [-l info]`: `gpuledger processors agents`
    without the rate card (tests and benchmarks)."""
    import argparse

    from base.logs import configure_logging
    from base.settings import load_settings

    parser = argparse.ArgumentParser(prog="processors.idle_agents")
    parser.add_argument("--event-time", dest="realtime", action="store_false", default=None)
    parser.add_argument("--realtime", dest="realtime", action="store_true")
    parser.add_argument("--exit-when-idle", type=float, default=None)
    parser.add_argument("-l", "--loglevel", default="warning")
    args = parser.parse_args(argv)
    settings = load_settings(None)
    if args.realtime is not None:
        proc = settings.processor.model_copy(update={"realtime": args.realtime})
        settings = settings.model_copy(update={"processor": proc})
    configure_logging(args.loglevel.lower() == "debug")
    shutdown = StopSignal(name="job-agents").install()
    stats = run_agents(settings, shutdown=shutdown, exit_when_idle_s=args.exit_when_idle)
    shutdown.finished()
    print(json.dumps(stats.as_dict(), sort_keys=True))


if __name__ == "__main__":
    main()
