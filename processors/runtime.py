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
- Watermark per node partition: its own latest sample time, held while inputs that bound it are unread
  (the policy and why: processors/drivers/node.py).

Who owns what: this module the loop (`ProcessorRuntime`: one round over the stages, the commit cadence,
the idle exit, the stats file, the bounded close); processors/drivers/ one driver per stage (its
consumer, assignment, poll and advance, commit points); processors/positions.py what is consumed and
the commit protocol; processors/outputs.py the one producer; processors/recovery.py the rebuild of a
runtime whose consumer failed.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException

from base.errors import ServiceError
from base.settings import Settings
from base.shutdown import CLOSE_WAIT_S, StopSignal
from processors.drivers import IDLE_STATE_TOPIC, JobDriver, NodeDriver, RekeyDriver, StageContext, StageDriver, Stats
from processors.positions import CommitProtocol
from processors.recovery import ConsumerFailed, RecoveryPolicy, run_recovering
from processors.windows import MINUTE_MS, Horizon

__all__ = [
    "IDLE_STATE_TOPIC",
    "STAGES",
    "ConsumerFailed",
    "ProcessorRuntime",
    "RecoveryPolicy",
    "Stats",
    "run_recovering",
]

log = logging.getLogger("gpuledger.processors")

STAGES = ("rekey", "node", "job")
IDLE_WAIT_S = 0.01  # the longest a poll waits for a batch while the round has read little


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
        shutdown: StopSignal | None = None,
    ) -> None:
        self.settings = settings
        self.ps = settings.processor
        self.stages = tuple(s for s in STAGES if s in stages)
        self.clock = clock
        self.exit_when_idle_s = exit_when_idle_s
        self.stats_path = stats_path
        # SIGTERM/SIGINT (installed by `run`, or by the CLI for the whole process) or stop(): every wait
        # on the way out is bounded by its deadline (base.shutdown).
        self.shutdown = shutdown if shutdown is not None else StopSignal(name="processors")
        # Dead letters go through `self.publish_raw`, where /metrics counts them (`count_dead_letters`).
        ctx = StageContext(
            settings, clock=clock, shutdown=self.shutdown, dead_letters=self, commit_now=lambda: self.commit(True)
        )
        self.ctx = ctx
        self.rekey = RekeyDriver(ctx, instance) if "rekey" in self.stages else None
        self.node = NodeDriver(ctx, instance, self.rekey) if "node" in self.stages else None
        self.job = JobDriver(ctx, instance) if "job" in self.stages else None
        self.drivers: list[StageDriver] = [d for d in (self.rekey, self.node, self.job) if d is not None]
        self.committer = CommitProtocol(ctx.outputs, ctx.topics.state, self.ps.commit_interval_ms, clock)
        # What the /metrics observer (base/metrics.py) and tests read of a runtime.
        t = ctx.topics
        self.t_samples, self.t_dm, self.t_jm, self.t_cov = t.samples, t.dm, t.jm, t.cov
        self.t_job_dm = t.job_dm
        self.t_alerts, self.t_actions, self.t_late = t.alerts, t.actions, t.late
        self.pos, self.start_pos = ctx.positions.read, ctx.positions.resumed
        self.producer, self.decoder = ctx.outputs.producer, ctx.decoder
        self.rekey_c, self.node_c, self.job_c = (d.consumer if d else None for d in (self.rekey, self.node, self.job))
        self.counters = Counters(ctx, self.node, self._horizons, stats_path)
        self._last_msg = self.clock()
        self._drained = False

    @property
    def stats(self) -> Stats:
        return self.ctx.stats

    @property
    def observer(self) -> Any:
        """base.metrics.ProcessorObserver while /metrics is served (set by `run`), else None."""
        return self.ctx.observer

    @property
    def rekey_ready(self) -> bool:
        """The node stage reads only once the rekey stage of this process has caught up (or there is none)."""
        return self.rekey is None or self.rekey.ready

    def publish_raw(
        self, topic_name: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]] | None = None
    ) -> None:
        """Dead-letter sink for `streams.consume` (delivered before the next offset commit)."""
        self.ctx.outputs.send_raw(topic_name, key, value or b"", headers)

    def start(self) -> None:
        if self.job is not None:
            self.job.ensure_state_topic()
        for driver in self.drivers:
            driver.subscribe()

    # ------------------------------------------------------------------ the loop
    def step(self) -> int:
        """One round over every stage. Returns the number of input records read.

        A poll waits for a batch (it returns early once one is there) only while the round has read
        little: never on the job-events topic beside other stages (it is idle most of the time, and a
        10 ms wait there each round took a sixth of the node loop at 100k samples/s), and at low rates
        the node and job polls batch what arrives in their wait instead of spinning."""
        n = 0
        few = self.ps.batch_size // 10
        self._observe_clock()
        if self.rekey is not None:
            alone = self.node is None and self.job is None
            n += self.rekey.poll(IDLE_WAIT_S if alone else 0.0)
        if self.node is not None and self.rekey_ready:
            n += self.node.poll(IDLE_WAIT_S if n < few else 0.0)
            self.node.advance()
        if self.job is not None:
            n += self.job.poll(IDLE_WAIT_S if n < few else 0.0)
            self.job.advance()
        self.ctx.outputs.poll()
        self.commit()
        return n

    def commit(self, force: bool = False) -> None:
        """Flush outputs, then the idle states they imply, then commit what is no longer needed; at most
        once per `processor.commit_interval_ms` unless forced (processors/positions.py)."""
        if self.committer.commit(self.drivers, force):
            self.stats.commits += 1

    def stop(self, *_: object) -> None:
        self.shutdown.request()

    def _horizons(self) -> list[Horizon]:
        return [h for driver in self.drivers for h in driver.horizons()]

    def _observe_clock(self) -> None:
        """Every stage's horizon (how far ahead of the clock an event may be) from the clock, once a round."""
        now_ms = self.ctx.now_ms()
        for horizon in self._horizons():
            horizon.observe_clock(now_ms)

    def _idle_done(self, n: int) -> bool:
        """For finite inputs: once everything is read and quiet, close the last minutes, then stop."""
        now = self.clock()
        if n:
            self._last_msg = now
            return False
        if self.exit_when_idle_s is None or now - self._last_msg < self.exit_when_idle_s:
            return False
        if not (self.rekey_ready and all(driver.all_caught_up() for driver in self.drivers)):
            return False
        if not self._drained and self.node is not None:
            self._drained = True
            last = self.node.latest_event_ms()
            if last is not None:
                self.node.advance(drain_to=last - last % MINUTE_MS + 2 * MINUTE_MS + self.ps.grace_ms)
            self.commit(force=True)
            self._last_msg = now
            return False
        return True

    # ------------------------------------------------------------------ run, and the way out
    def run(self) -> Stats:
        """Loop until stopped (SIGTERM/SIGINT, `stop()`) or, for finite inputs, idle. A stop ends the run
        within `self.shutdown`'s deadline whatever the broker does; what it could not finish is logged."""
        own_signals = not self.shutdown.installed
        if own_signals:
            self.shutdown.install()
        try:
            return self._run()
        finally:
            if own_signals:
                self.shutdown.uninstall()

    def _run(self) -> Stats:
        t0 = time.monotonic()
        try:
            self.start()
            from base.metrics import instrument_processor

            if self.observer is None:  # else carried over from the runtime this one replaces
                self.ctx.observer = instrument_processor(self)  # /metrics of this process (docs/operations.md)
            last_log = last_stats = t0
            while not self.shutdown.requested:
                n = self.step()
                if self._idle_done(n):
                    break
                if time.monotonic() - last_stats > 1:
                    last_stats = time.monotonic()
                    self.counters.refresh()
                if time.monotonic() - last_log > 10:
                    last_log = time.monotonic()
                    log.info("processors: %s", self.stats.as_dict())
            if self.job is not None:
                self.job.advance()
            self.commit(force=True)
            self.counters.refresh()
        except (ServiceError, KafkaException) as exc:
            if not self.shutdown.requested:
                raise
            # Outputs not delivered, or a broker query given up: nothing past them was committed.
            self.shutdown.abandon(f"the step in progress ({exc})")
        finally:
            self.ctx.closing = True  # see StageDriver._on_assign and _on_revoke
            self._close_consumers()
        return self.counters.finish(wall_s=time.monotonic() - t0)

    def carry_from(self, old: ProcessorRuntime) -> None:
        """Continue the counters of the runtime this one replaces (`run_recovering`): the stats file and
        /metrics stay monotonic (replayed input is counted again, as after a restart)."""
        self.counters.carry_from(old.counters)
        if old.observer is not None:
            from base.metrics import count_dead_letters

            old.observer.rt = self
            count_dead_letters(self, old.observer.m)
            self.ctx.observer = old.observer

    def release(self) -> None:
        """After a failed run (its consumers are closed): deliver what it produced, within CLOSE_WAIT_S.
        Not needed for exactness (the next runtime replays from the last commit), only tidy."""
        left = self.ctx.outputs.release()
        if left:
            log.warning("%d output records of the failed runtime not delivered: the next one re-emits them", left)

    def _close_consumers(self) -> None:
        """Close every consumer at once, waiting CLOSE_WAIT_S at most (less once stopping): a close waits
        for the commits in flight and on the group coordinator, which may be gone or still loading."""
        closing = [call for driver in self.drivers for call in driver.close_calls()]
        end = time.monotonic() + CLOSE_WAIT_S
        for call in closing:
            if not call.wait(max(0.0, end - time.monotonic()), self.shutdown):
                self.shutdown.abandon(call.what)
                continue
            try:
                call.result()
            except Exception as exc:  # leaving the group is best effort
                log.warning("%s: %s", call.what, exc)


class Counters:
    """What the stats file (`--stats-file`) and /metrics show beyond what the drivers count as they go:
    lag, late samples and job events, events refused as future, devices tracked; refreshed once a second.
    Totals continue across the runtimes `run_recovering` rebuilds, so they never go backwards."""

    def __init__(
        self, ctx: StageContext, node: NodeDriver | None, horizons: Callable[[], list[Horizon]], path: Path | None
    ) -> None:
        self.ctx = ctx
        self.node = node
        self.horizons = horizons
        self.path = path
        # Totals of the runtimes this one replaced: counters that live in the stage objects.
        self.carried = {"late_samples_total": 0, "late_job_events_total": 0, "dead_lettered": 0}

    def late_totals(self) -> tuple[int, int]:
        """Late samples and late job events so far, with those of the runtimes this one replaced."""
        node, carried = self.node, self.carried
        return (
            carried["late_samples_total"] + (node.late_samples() if node else 0),
            carried["late_job_events_total"] + (node.late_job_events() if node else 0),
        )

    def dead_lettered(self) -> int:
        return self.carried["dead_lettered"] + self.ctx.decoder.dead_lettered

    def carry_from(self, old: Counters) -> None:
        self.ctx.stats = old.ctx.stats
        late_samples, late_events = old.late_totals()
        self.carried = {
            "late_samples_total": late_samples,
            "late_job_events_total": late_events,
            "dead_lettered": old.dead_lettered(),
        }

    def refresh(self) -> None:
        stats, node = self.ctx.stats, self.node
        if node is not None:
            stats.lag_records = node.lag()
        late_samples, late_events = self.late_totals()
        stats.extra["late_samples_total"] = late_samples
        latest = node.last_late_job_event() if node else None
        before = stats.extra.get("late_job_events_total", 0)
        if late_events > before and latest is not None:
            job, ts, closed = latest
            log.warning(
                "%d job event(s) arrived after the minute they bound had closed (latest: %s at %d ms, minutes "
                "closed up to %d ms): applied from arrival, closed minutes keep their attribution; raise "
                "processor.grace_ms if the scheduler's events are routinely this late",
                late_events - before, job, ts, closed,
            )  # fmt: skip
        stats.extra["late_job_events_total"] = late_events
        stats.extra["future_events_total"] = sum(h.refused for h in self.horizons())
        stats.extra["tracked_devices"] = node.tracked_devices() if node else 0
        if self.ctx.observer is not None:
            self.ctx.observer.refresh()
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(stats.as_dict(), sort_keys=True), encoding="utf-8")
            os.replace(tmp, self.path)

    def finish(self, wall_s: float) -> Stats:
        """The totals of a run that ended, written to the stats file."""
        stats = self.ctx.stats
        stats.dead_lettered = self.dead_lettered()
        stats.extra["wall_s"] = round(wall_s, 3)
        if self.path is not None:
            self.path.write_text(json.dumps(stats.as_dict(), sort_keys=True), encoding="utf-8")
        return stats
