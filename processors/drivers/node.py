"""The node stage's driver: samples, allocations and inventory of one partition number meet here
(`NodePartition`); minutes close by the watermark policy below and go out as device-minutes,
coverage-minutes and coverage alerts.

Watermark per node partition: its own latest sample time (held while its inventory, its allocations or
the job events are unread); once the partition has been quiet for QUIET_PARTITION_S and its leader has
said, asked after that, that it is read to its end, the latest event time across every assigned partition
(so a node whose exporter died still gets its minutes closed as dark); in real-time mode never behind the
wall clock once caught up. The leader is asked because the consumer's own log end is the last one it
fetched: while the leader is down the partition looks read to its end and quiet, and the records its
producers hold for it would all arrive late. Following the others only when
quiet matters in event time: a replay runs through minutes in milliseconds, so a partition whose
records reach the broker a moment after another's would otherwise see its minutes closed before they
land.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message, TopicPartition

from base.collector import collector_paused
from processors._window import Scrape
from processors.dlq import FutureTimestamp
from processors.drivers.base import NEG_INF, LogEndProbe, StageContext, StageDriver
from processors.drivers.rekey import GroupRekeyed, RekeyDriver
from processors.fastdecode import Framed, UnsupportedSchema, scrape_reader
from processors.job_rows import encode_rows
from processors.stages import NodeOutputs, NodePartition, computed
from processors.windows import MINUTE_MS, Admit, Horizon
from schemas import load_schema
from schemas.topics import COVERAGE_MINUTES, DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, node_key

log = logging.getLogger("gpuledger.processors")

QUIET_PARTITION_S = 2.0  # a samples partition with nothing new this long follows the others' event time
LOG_END_TIMEOUT_S = 5.0  # a leader that has not said its log end by then is asked again after a quiet spell


def _busy_last(row: dict[str, Any]) -> tuple[int, bool]:
    return row["minute_start_ms"], computed(row)


def _first_minute(out: NodeOutputs) -> int | None:
    return out.device_minutes[0]["minute_start_ms"] if out.device_minutes else None


def split_by_activity(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows of devices that did not compute: idle, dark, unallocated; rows of devices that did), each in
    the order given."""
    waiting: list[dict[str, Any]] = []
    busy: list[dict[str, Any]] = []
    for row in rows:
        (busy if computed(row) else waiting).append(row)
    return waiting, busy


def _lean_scrapes(ctx: StageContext) -> Framed[Scrape] | None:
    """The latest samples schema's single-object framing read natively (anything else, older writers or
    Confluent framing included, goes through the codec)."""
    try:
        return Framed(scrape_reader(load_schema(DEVICE_SAMPLES.subject)).read, ctx.codec, DEVICE_SAMPLES.subject)
    except UnsupportedSchema as exc:
        log.warning("lean scrape decoder unavailable (%s): using the general codec", exc)
        return None


class NodeDriver(StageDriver):
    """Reads samples, allocations and inventory (range assignor: the same partition number of each)."""

    stage = "node"

    def __init__(self, ctx: StageContext, instance: str | None, rekey: RekeyDriver | None) -> None:
        super().__init__(ctx, instance)
        self.parts: dict[int, NodePartition] = {}
        self.watermarks = NodeWatermarks(self, rekey)
        self.fast_scrapes = _lean_scrapes(ctx)

    def topics(self) -> list[str]:
        t = self.ctx.topics
        return [t.samples, t.allocs, t.inventory]

    def assign(self, partitions: list[TopicPartition]) -> None:
        t = self.ctx.topics
        committed = self.resume([tp for tp in partitions if tp.topic != t.inventory])
        for tp in partitions:
            if tp.topic == t.samples:
                part = NodePartition(self.ctx.ps)
                c = committed.get((tp.topic, tp.partition))
                if c is not None and c.offset >= 0:
                    part.restore(c.metadata)
                    part.samples_next_offset = c.offset
                self.parts[tp.partition] = part
                self.watermarks.read_at[tp.partition] = time.monotonic()
            elif tp.topic == t.inventory:
                tp.offset = OFFSET_BEGINNING  # compacted: always read whole
                self.ctx.positions.resumed[(self.stage, tp.topic, tp.partition)] = None
        self.assigned = list(partitions)
        self.consumer.assign(partitions)
        self.observe_clock()

    def drop(self, tp: TopicPartition) -> None:
        if tp.topic == self.ctx.topics.samples:
            self.parts.pop(tp.partition, None)
            self.watermarks.forget(tp.partition)

    def horizons(self) -> list[Horizon]:
        return [p.horizon for p in self.parts.values()]

    # -- reading
    def poll(self, wait_s: float) -> int:
        """Read a batch into the partitions' windows and tables; the number of records read."""
        ctx = self.ctx
        t, decoder, stats = ctx.topics, ctx.decoder, ctx.stats
        msgs = self.consume(wait_s)
        if msgs and stats.first_sample_wall is None:
            stats.first_sample_wall = ctx.clock()
        now = time.monotonic()
        for msg, topic, p, off in self.records(msgs):
            part = self.parts.get(p)
            if part is None:
                continue
            if topic == t.samples:
                self._on_scrape(msg, p, off, part, now)
            elif topic == t.allocs:
                ev = decoder.decode(msg, JOB_EVENTS.subject)
                if ev is not None:
                    part.on_allocation((msg.key() or b"").decode(), ev, off)
                    stats.allocations += 1
            elif topic == t.inventory:
                inv = decoder.decode(msg, INVENTORY.subject)
                if inv is not None:
                    part.on_inventory(inv)
        return len(msgs)

    def _on_scrape(self, msg: Message, p: int, off: int, part: NodePartition, now: float) -> None:
        ctx = self.ctx
        subject = DEVICE_SAMPLES.subject
        value = msg.value() or b""
        try:
            read = self.fast_scrapes.decode(value) if self.fast_scrapes is not None else None
        except Exception:
            read = None  # the general codec has the last word (below)
        if read is not None:
            verdict, ts, samples = part.on_read_scrape(read, off), read.ts_ms, read.devices
        else:
            try:
                scrape = ctx.codec.decode(value, subject).record
            except Exception:
                # The general codec dead-letters the record with the reason, or (a body only the lean
                # reader refuses) returns it, and the scrape is not lost.
                checked = ctx.decoder.decode(msg, subject)
                if checked is None:
                    return
                scrape = checked
            verdict, ts, samples = part.on_scrape(scrape, off), scrape["ts_ms"], len(scrape["devices"])
        if verdict is Admit.FUTURE:
            ctx.decoder.refuse(msg, subject, FutureTimestamp(part.horizon.reason(ts)))
            return
        self.watermarks.read_at[p] = now
        stats = ctx.stats
        stats.scrapes += 1
        stats.samples += samples
        stats.last_sample_wall = ctx.clock()
        if verdict is Admit.LATE:
            stats.late_scrapes += 1
            ctx.outputs.send_raw(ctx.topics.late, msg.key(), msg.value() or b"")

    # -- closing minutes
    def latest_event_ms(self) -> int | None:
        """The latest sample or allocation time over every assigned partition."""
        return max(
            (t for part in self.parts.values() for t in (part.max_sample_ts, part.max_alloc_ts) if t is not None),
            default=None,
        )

    def advance(self, drain_to: int | None = None) -> None:
        """Close what the watermarks allow, emit it, and tick the coverage clocks. `drain_to`: for finite
        inputs, a watermark that closes the last minutes.

        Idle alerts wait for the rows of devices that did not compute, and a minute of 100,000 devices takes
        ~1 s to close: each partition first closes the nodes that had such a device the minute before (an idle
        job was idle then too), and those rows go out before any partition closes the rest. Then each
        partition's remaining rows of devices that did not compute go out as it closes. Busy rows follow
        every partition's, minute by minute: the job stage takes a job's minutes in order (a row of a minute
        before the last one it put out is a replay to it), so nothing of a later minute may go ahead of a
        busy row of an earlier one."""
        ticks: list[tuple[NodePartition, int]] = []
        held: list[dict[str, Any]] = []
        watermarks = self.watermarks
        with collector_paused():  # the burst of a minute's close: the collector's pass waits until it is sent
            closings = []
            for p, (w, now) in watermarks.compute(drain_to).items():
                part = self.parts[p]
                if w <= NEG_INF:
                    continue
                watermarks.advanced(p, w)
                closing = part.closing(w, part.waiting_nodes)
                out = next(closing)
                first = _first_minute(out)
                held.extend(self._emit(out, first))
                closings.append((closing, first))
                ticks.append((part, now))
            # The coverage clocks tick before the rest of the close, not after it: a deadline they pass does
            # not wait for it (their state is the samples seen, which the close does not touch).
            for part, now in ticks:
                for alert in part.tick(now):
                    self.ctx.emit_alert(alert, node_key(alert["cluster"], alert["node"] or ""))
            for closing, first in closings:
                for out in closing:
                    first = _first_minute(out) if first is None else first
                    held.extend(self._emit(out, first))
            held.sort(key=_busy_last)  # stable: minute by minute, each minute's busy rows last
            self._send_rows(held)

    def _emit(self, out: NodeOutputs, minute_ms: int | None) -> list[dict[str, Any]]:
        """Send the coverage-minutes of a step of a partition's close, and its rows of devices that did not
        compute of `minute_ms`, the partition's first closed minute. Returns the rest."""
        ctx = self.ctx
        rows = out.device_minutes  # minute by minute: `minute_ms`'s rows, if any, lead
        n = 0
        while n < len(rows) and rows[n]["minute_start_ms"] == minute_ms:
            n += 1
        waiting, busy = split_by_activity(rows[:n])
        self._send_rows(waiting)
        for cov in out.coverage_minutes:
            ctx.outputs.send(ctx.topics.cov, COVERAGE_MINUTES.subject, node_key(cov["cluster"], cov["node"]), cov)
        ctx.stats.coverage_minutes += len(out.coverage_minutes)
        if ctx.observer is not None and out.coverage_minutes:
            ctx.observer.coverage(out.coverage_minutes)
        return busy + rows[n:]

    def _send_rows(self, rows: list[dict[str, Any]]) -> None:
        """Each row to device-minutes, and the allocated ones bundled by job to the job stage's input
        (`processors.job_rows`), the bundles first: they are what alerts wait for."""
        ctx = self.ctx
        encoded, bundles = encode_rows(ctx.codec, rows)
        send, t = ctx.outputs.send_raw, ctx.topics
        for key, value in bundles:
            send(t.job_dm, key, value)
        for key, value in encoded:
            send(t.dm, key, value)
        ctx.stats.device_minutes += len(rows)
        ctx.stats.job_device_minutes += len(bundles)

    # -- commits and counters
    def commit_offsets(self) -> list[TopicPartition]:
        """Samples: the lowest offset an open window still needs, with which minutes are closed and where
        (replayed or late, decided as the first time); allocations: the oldest one still live. The
        inventory is never committed: it is read whole at every assignment."""
        t, positions = self.ctx.topics, self.ctx.positions
        offsets = []
        for p, _ in positions.committable(self.stage, t.samples, self.parts):
            part = self.parts[p]
            offsets.append(TopicPartition(t.samples, p, part.samples_commit_offset(), metadata=part.metadata()))
        for p, _ in positions.committable(self.stage, t.allocs, self.parts):
            offsets.append(TopicPartition(t.allocs, p, self.parts[p].allocs_commit_offset()))
        return offsets

    def after_commit(self) -> None:
        """Close offsets below the commit are needed no more (whether or not the commit lands)."""
        for p, _ in self.ctx.positions.committable(self.stage, self.ctx.topics.samples, self.parts):
            part = self.parts[p]
            part.committed(part.samples_commit_offset())

    def lag(self) -> int:
        """Scrapes not yet read on the assigned samples partitions (by the watermarks last fetched)."""
        topic = self.ctx.topics.samples
        lag = 0
        for p in self.parts:
            try:
                _, hi = self.consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            except KafkaException:
                continue
            pos = self.ctx.positions.next_offset(self.stage, topic, p) or 0
            if hi is not None and hi >= 0:
                lag += max(0, hi - pos)
        return lag

    def late_samples(self) -> int:
        return sum(p.windows.late_count for p in self.parts.values())

    def late_job_events(self) -> int:
        return sum(p.late_allocations for p in self.parts.values())

    def last_late_job_event(self) -> tuple[str, int, int] | None:
        """(job, event time, minutes closed up to) of the latest job event that came too late."""
        late = [p.last_late_allocation for p in self.parts.values() if p.last_late_allocation]
        return max(late, key=lambda x: x[1]) if late else None

    def tracked_devices(self) -> int:
        return sum(p.coverage.tracked_devices() for p in self.parts.values())


class NodeWatermarks:
    """The node stage's watermark policy (the module docstring): per partition, how far its minutes may
    close and the coverage clock, or a hold while an input that bounds them is unread."""

    def __init__(self, node: NodeDriver, rekey: RekeyDriver | None) -> None:
        self.node = node
        self.rekey = rekey  # in this process: its unread events and undelivered allocations hold watermarks
        self.advanced_to: dict[int, int] = {}  # partition -> the watermark it last advanced to
        self.read_at: dict[int, float] = {}  # partition -> when it last gave a sample (monotonic)
        self.probe = LogEndProbe(node.admin, LOG_END_TIMEOUT_S)
        self.at_end_at: dict[int, float] = {}  # partition -> when its leader was asked and said it is read to its end
        self.unconfirmed_at: dict[int, float] = {}  # partition -> when its leader gave no answer, or a later end
        # Job events held by the rekey stages of other processes (processor.instances > 1, or no rekey here):
        # a minute closes only once their group's commits say every event in the log was re-keyed.
        ps, topics = node.ctx.ps, node.ctx.topics
        self.group = GroupRekeyed(node.admin, f"{ps.group_id}.{RekeyDriver.stage}", topics.jobs, LOG_END_TIMEOUT_S)
        self.closing_since: float | None = None  # when a minute first wanted to close since the last close

    def compute(self, drain_to: int | None = None) -> dict[int, tuple[int, int]]:
        """Partition -> (window watermark, coverage clock); NEG_INF: hold (see the module docstring)."""
        node = self.node
        t = node.ctx.topics
        latest = node.latest_event_ms()
        global_max = NEG_INF if latest is None else latest
        wall = node.ctx.now_ms() if node.ctx.ps.realtime else NEG_INF
        mono = time.monotonic()
        candidates: dict[int, tuple[int, int]] = {}
        for p, part in node.parts.items():
            own = NEG_INF if part.max_sample_ts is None else part.max_sample_ts
            if not node.caught_up(t.inventory, p):
                candidates[p] = (NEG_INF, NEG_INF)  # rows carry inventory facts (model, generation): read it first
            elif not node.caught_up(t.samples, p):
                candidates[p] = (own, own)
            else:
                # a broker outage silences all; a leader that did not confirm the end starts the wait again
                since = max(self.read_at.get(p, 0.0), node.client_error_at, self.unconfirmed_at.get(p, 0.0))
                quiet = mono - since >= QUIET_PARTITION_S and (global_max <= own or self._at_log_end(p, since, mono))
                w = max(global_max if quiet else own, wall)
                candidates[p] = (w if drain_to is None else max(w, drain_to), w)
        held = self._allocations_held(candidates)
        # Hold while allocations are unread: they are few, so this is brief. Their event times are
        # no watermark: the rekey stage interleaves several job-event partitions (and replays after a
        # restart), so an older job end can still be unread behind a newer event.
        return {p: (NEG_INF, NEG_INF) if p in held else cand for p, cand in candidates.items()}

    def _at_log_end(self, p: int, since: float, mono: float) -> bool:
        """Whether partition `p`'s leader, asked after `since`, said its samples are read to their end. The
        question goes out now and is answered on a later round (the loop never waits on it)."""
        if self.at_end_at.get(p, 0.0) > since:
            return True
        node = self.node
        samples = node.ctx.topics.samples
        got = self.probe.answer(samples, p, mono)
        if got is None:
            self.probe.ask(samples, p, mono)
            return False
        asked_at, end = got
        read = node.read_position(samples, p)
        if end is not None and read is not None and read >= end:
            self.at_end_at[p] = asked_at
            return asked_at > since
        if end is None:
            log.info("samples partition %d: its leader did not say its log end; its minutes wait", p)
        self.unconfirmed_at[p] = mono
        return False

    def forget(self, p: int) -> None:
        self.probe.forget(p)
        self.at_end_at.pop(p, None)
        self.unconfirmed_at.pop(p, None)

    def advanced(self, p: int, watermark: int) -> None:
        self.advanced_to[p] = max(watermark, self.advanced_to.get(p, NEG_INF))

    def _allocations_held(self, candidates: dict[int, tuple[int, int]]) -> set[int]:
        """Partitions whose allocations may be incomplete: job events unread by the rekey stage in this
        process, re-keyed allocations not yet delivered or not yet read back, or allocations unread."""
        node, rekey = self.node, self.rekey
        t = node.ctx.topics
        jobs_lagging = rekey is not None and rekey.lagging()
        # A watermark about to close a minute asks the broker afresh whether job events are unread.
        grace = node.ctx.ps.grace_ms
        closing = any(
            (w - grace) // MINUTE_MS > (self.advanced_to.get(p, NEG_INF) - grace) // MINUTE_MS
            for p, (w, _) in candidates.items()
            if w > NEG_INF
        )
        if closing and not jobs_lagging and rekey is not None:
            jobs_lagging = rekey.lagging(fresh=True)
        others = self._others_unread(closing)
        if others is None:
            return set(candidates)
        in_flight = rekey is not None and rekey.allocs_in_flight > 0
        sent = rekey.allocs_sent if rekey is not None else {}
        held = set()
        for p in candidates:
            read = node.ctx.positions.next_offset(node.stage, t.allocs, p)
            if (
                jobs_lagging
                or in_flight
                or (read or 0) < sent.get(p, 0)  # re-keyed and not yet delivered, or not read back
                # what other processes re-keyed lands in the allocations' log end after our last fetch
                or not node.caught_up(t.allocs, p, fresh=bool(others))
            ):
                held.add(p)
        return held

    def _others_unread(self, closing: bool) -> frozenset[int] | None:
        """The job-events partitions other processes re-key, once their group's commits say each is re-keyed
        to the log end as asked after this close was first wanted; None while that is not so (hold). Asked
        only to close a minute: between closes the watermark moves within the minute."""
        if not closing:
            self.closing_since = None
            return frozenset()
        now = time.monotonic()
        if self.closing_since is None:
            self.closing_since = now
        rekey = self.rekey
        try:
            others = self.group.others(set(rekey.parts) if rekey is not None else set())
        except KafkaException as exc:
            log.debug("job-events partitions unknown: %s", exc)
            return None
        if not self.group.rekeyed(others, self.closing_since, now):
            return None
        self.closing_since = None
        return others
