"""The three processing stages as plain objects over plain records (no Kafka here).

- `RekeyStage`: job events (keyed by job) -> the same events keyed by each node they touch, so that
  a node's samples and its allocations meet in one partition (ALLOCATIONS is co-partitioned with
  DEVICE_SAMPLES). Remembers each running job's nodes, because an end event may not list them.
- `NodePartition`: one DEVICE_SAMPLES partition with its ALLOCATIONS and INVENTORY partitions:
  windows, attribution at window close, DeviceMinute and CoverageMinute rows, coverage alerts.
- `JobPartition`: one JOB_DEVICE_MINUTES partition (device-minutes bundled by job) with its JOB_EVENTS
  partition: collects each job's device-minutes from every node, emits a JobMinute once every device
  the allocation names has reported for that minute (so the output never depends on arrival timing),
  and steps the job's idle state machine.

Every stage has a `Horizon` (windows.py): an event further ahead of the processing clock than
`processor.max_future_ms` is refused (the runtime dead-letters it) and moves no watermark. The runtime
gives the clock (`observe_clock`) once per batch; nothing here reads it.

Each stage reports the smallest input offset it still needs (`*_commit_offset`): the runtime commits
no further, so a crash replays exactly what is not yet reflected in emitted output.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from base.processor_settings import Exemption, ProcessorSettings
from processors._window import Scrape
from processors.attribution import AllocationTable, Interval, event_nodes, job_key_of
from processors.classify import activity_of
from processors.coverage import CoverageTracker
from processors.idle import IdleState, Output, mark_ended, new_state, on_tick, step
from processors.rollup import DeviceDirectory, device_row_key, job_minute, likely_waiting, node_minute_rows
from processors.windows import MINUTE_MS, Admit, DeviceWindow, DevKey, Horizon, MinuteWindows, minute_of
from schemas.topics import qualified_job, qualified_node, split_qualified_node

RowKey = tuple[str, str, int]  # `device_row_key`: (node, device uuid, MIG instance or -1)
NODE_ROWS_WAIT_MS = 10 * MINUTE_MS  # the longest a job's minute waits for rows its nodes said they wrote


def _nodes_of(ev: Mapping[str, Any]) -> list[str]:
    return [qualified_node(ev["cluster"], n) for n in event_nodes(ev)]


def _with_node_keys(ev: Mapping[str, Any]) -> dict[str, Any]:
    """The event with allocation node names replaced by "cluster/node" keys (the tables' node ids)."""
    out = dict(ev)
    out["allocations"] = [
        {"node": qualified_node(ev["cluster"], a["node"]), "devices": a["devices"]} for a in ev.get("allocations") or ()
    ]
    return out


# ---------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class _RekeyJob:
    nodes: list[str]
    first_offset: int


class RekeyStage:
    """Job events -> (node key, event) pairs for the ALLOCATIONS topic. One per JOB_EVENTS partition.

    After a restart it replays from the first event of a job still running (to learn its nodes again);
    events below `published_below` (restored from the commit) were re-keyed and delivered already, so
    they rebuild state without being published twice."""

    def __init__(self, published_below: int = 0, horizon: Horizon | None = None) -> None:
        self._jobs: dict[str, _RekeyJob] = {}
        self.published_below = published_below
        self.horizon = horizon if horizon is not None else Horizon(0)  # no clock given: admits everything

    def route(self, ev: Mapping[str, Any], offset: int = 0) -> list[str] | None:
        """Node keys ("cluster/node") the event must be published to: none for a replay of what was
        published before the restart (the event still updates what the stage knows of its job); None
        for an event beyond the horizon (refused: the caller dead-letters it)."""
        if not self.horizon.admits(ev["ts_ms"]):
            return None
        jid = job_key_of(ev)
        job = self._jobs.get(jid)
        nodes = _nodes_of(ev)
        if job is None:
            job = self._jobs[jid] = _RekeyJob([], offset)
        for n in nodes:
            if n not in job.nodes:
                job.nodes.append(n)
        out = list(job.nodes) if offset >= self.published_below else []
        if ev["event_type"] == "ENDED":
            del self._jobs[jid]
        return out

    def commit_offset(self, next_offset: int) -> int:
        return min((j.first_offset for j in self._jobs.values()), default=next_offset)

    def metadata(self, next_offset: int) -> str:
        """Stored with the commit (every event before `next_offset` has been delivered by then)."""
        return json.dumps({"pb": max(next_offset, self.published_below)})

    @staticmethod
    def published(metadata: str | None) -> int:
        """How far a commit's metadata (`metadata`) says the events were re-keyed and delivered."""
        return int(json.loads(metadata).get("pb", 0)) if metadata else 0

    @classmethod
    def restore(cls, metadata: str | None, horizon: Horizon | None = None) -> RekeyStage:
        return cls(cls.published(metadata), horizon)


# ---------------------------------------------------------------------------------------------------
def computed(row: Mapping[str, Any]) -> bool:
    """The device of a device-minute computed (active or starved) in some second of it: a busy row. The
    others (idle, dark, unallocated) are what an idle alert waits for."""
    return bool(row["active_s"] or row["starved_s"])


@dataclass(slots=True)
class NodeOutputs:
    device_minutes: list[dict[str, Any]] = field(default_factory=list)
    coverage_minutes: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)


class NodePartition:
    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        self.table = AllocationTable()
        self.windows = MinuteWindows(settings.grace_ms)
        self.horizon = Horizon(settings.max_future_ms, follow_events=not settings.realtime)
        self.advance_steps = 0  # iterations of the closing loop (a minute closed, or a stretch skipped)
        self.coverage = CoverageTracker(timeout_ms=settings.coverage_timeout_ms)
        self.directory = DeviceDirectory()
        self.device_keys: dict[str, tuple[DevKey, ...]] = {}  # node -> its devices' keys, made once (`absorb`)
        self.max_sample_ts: int | None = None
        self.max_alloc_ts: int | None = None
        self.samples_next_offset = 0
        self.allocs_next_offset = 0
        self.emitted_minutes = 0
        # Nodes with a device that did not compute in the last minute closed; None until one has closed.
        self.waiting_nodes: frozenset[str] | None = None
        self._next_tick_ms = -(2**62)
        # Job events that reached this stage after a minute they bound had closed (beyond the grace):
        # applied from then on, the closed minute keeps its attribution. Events below `_replay_below`
        # were read before the restored commit: replays, not counted again.
        self.late_allocations = 0
        self.last_late_allocation: tuple[str, int, int] | None = None  # (job, event ms, closed-until ms)
        self._replay_below = 0

    # -- inputs
    def on_allocation(self, key: str, ev: Mapping[str, Any], offset: int) -> None:
        applied = self.table.apply(key, _with_node_keys(ev), offset)
        ts = ev["ts_ms"]
        # Re-keyed events passed the re-keying stage's horizon; one beyond this stage's (a clock behind)
        # is applied, but moves the watermark no further than the horizon.
        lim = self.horizon.limit_ms
        if lim is not None and ts > lim:
            ts = lim
        closed_until = self.windows.next_close_ms
        if applied and closed_until is not None and ts < closed_until and offset >= self._replay_below:
            self.late_allocations += 1
            self.last_late_allocation = (job_key_of(ev), ts, closed_until)
        if self.max_alloc_ts is None or ts > self.max_alloc_ts:
            self.max_alloc_ts = ts
        self.allocs_next_offset = offset + 1

    def on_inventory(self, rec: Mapping[str, Any]) -> None:
        key = qualified_node(rec["cluster"], rec["node"])
        devices = None if rec.get("deleted") else list(rec["devices"])
        self.directory.set_node(key, devices)
        self.coverage.set_inventory(rec["cluster"], key, rec["ts_ms"], devices)

    def on_scrape(self, scrape: Mapping[str, Any], offset: int) -> Admit:
        """Hot path: one node scrape (all its devices). Admit.FUTURE: beyond the horizon, not admitted
        (nothing changes but the input position; the caller dead-letters it)."""
        self.samples_next_offset = offset + 1
        ts = scrape["ts_ms"]
        if self._beyond_horizon(ts):
            return Admit.FUTURE
        cluster = scrape["cluster"]
        key = cluster + "/" + scrape["node"]
        seen = self.coverage.last_seen
        index_of = self.coverage.index_of
        for dev in scrape["devices"]:
            dk = (key, dev["uuid"], dev["mig_instance_id"])
            seen[dk] = ts
            if dk not in index_of:
                index_of[dk] = dev["index"]
                self.coverage.unchecked.append(dk)
        return self.windows.add_scrape(key, scrape, activity_of, offset)

    def on_read_scrape(self, scrape: Scrape, offset: int) -> Admit:
        """`on_scrape` for a scrape read natively (`processors.fastdecode.scrape_reader`): the same changes,
        its devices added in C."""
        self.samples_next_offset = offset + 1
        if self._beyond_horizon(scrape.ts_ms):
            return Admit.FUTURE
        cov = self.coverage
        key = scrape.cluster + "/" + scrape.node
        return self.windows.add_read_scrape(
            key, scrape, offset, cov.last_seen, cov.index_of, cov.unchecked, self.device_keys
        )

    def _beyond_horizon(self, ts: int) -> bool:
        """True (and counted) for a sample time beyond the horizon; else it is the latest time if it is."""
        mx = self.max_sample_ts
        if mx is None or ts > mx:  # only a new latest time can be beyond the horizon (it never goes back)
            h = self.horizon
            lim = h.limit_ms
            if lim is not None and ts > lim:
                h.refused += 1
                return True
            self.max_sample_ts = ts
            if h.follow_events:
                h.follow(ts)
        return False

    # -- time
    def advance(self, watermark_ms: int) -> NodeOutputs:
        """Close every minute the watermark has passed (plus grace) and roll it up."""
        out = NodeOutputs()
        for part in self.closing(watermark_ms):
            out.device_minutes.extend(part.device_minutes)
            out.coverage_minutes.extend(part.coverage_minutes)
        return out

    def closing(self, watermark_ms: int, ahead: Container[str] | None = frozenset()) -> Iterator[NodeOutputs]:
        """`advance` in two steps, for a driver that sends rows as soon as they are made: first the rows and
        coverage-minutes of the first closed minute's nodes in `ahead` (nothing if no minute closes), then
        everything else, minute by minute. A driver may close other partitions between the two steps.
        `ahead` None: the nodes that look as if they held a device that did not compute in that minute
        (`rollup.likely_waiting`), for a partition with no closed minute to go by (`waiting_nodes` None)."""
        first, rest = NodeOutputs(), NodeOutputs()
        first_pending = True
        w = self.windows
        floor = minute_of(watermark_ms - self.settings.max_lookback_ms)
        if w.next_close_ms is None:
            # Start at the first minute with data, but not further back than the lookback: a partition's
            # first records may carry a time from long ago (samples older than that are counted late; a
            # job that started earlier is attributed from there), and nothing older is in the topic anyway.
            firsts = [m for m in w.open if m >= floor]
            if self.table.min_event_ms is not None:
                firsts.append(max(minute_of(self.table.min_event_ms), floor))
            if not firsts:
                if w.open and max(w.open) < floor:  # only samples from before the lookback: late
                    w.discard_before(floor)
                yield first
                yield rest
                return
            start = min(firsts)
            w.discard_before(start)
            w.start_at(start)
        end = minute_of(watermark_ms - MINUTE_MS - self.settings.grace_ms) + MINUTE_MS  # first not closable
        while w.closable(watermark_ms):
            self.advance_steps += 1
            nc = w.next_close_ms
            assert nc is not None
            if nc not in w.open:
                target = min(self._next_with_rows(nc, floor), end)
                if target > nc:
                    w.skip_to(target)
                    self.table.prune(target)
                    continue
            closed = w.close_next(self.samples_next_offset)
            m = closed.minute_ms
            per_node: dict[str, dict[tuple[str, int | None], DeviceWindow]] = {}
            for (nk, uuid, mig), win in closed.devices.items():
                per_node.setdefault(nk, {})[(uuid, mig)] = win
            intervals = {n: ivs for n in self.table.nodes() if (ivs := self.table.intervals_in(n, m, m + MINUTE_MS))}
            nodes = sorted(set(per_node) | set(self.coverage.expected) | set(intervals))
            waiting: set[str] = set()
            if first_pending:
                first_pending = False
                if ahead is None:
                    ahead = likely_waiting(per_node, intervals, self.settings.thresholds)
                self._close_nodes(m, [nk for nk in nodes if nk in ahead], per_node, intervals, first, waiting)
                yield first
                nodes = [nk for nk in nodes if nk not in ahead]
            self._close_nodes(m, nodes, per_node, intervals, rest, waiting)
            self.waiting_nodes = frozenset(waiting)
            self.emitted_minutes += 1
            self.table.prune(w.next_close_ms or m)
        if first_pending:
            yield first
        yield rest

    def _close_nodes(
        self,
        m: int,
        nodes: list[str],
        per_node: Mapping[str, Mapping[tuple[str, int | None], DeviceWindow]],
        intervals: Mapping[str, list[Interval]],
        out: NodeOutputs,
        waiting: set[str],
    ) -> None:
        """Minute `m`'s device-minutes and coverage-minutes of `nodes` into `out`; `waiting` gains the nodes
        with a device that did not compute."""
        th = self.settings.thresholds
        for nk in nodes:
            cluster, node = split_qualified_node(nk)
            wins = per_node.get(nk, {})
            rows = node_minute_rows(cluster, node, nk, m, wins, intervals.get(nk, []), self.table, self.directory, th)
            out.device_minutes.extend(rows)
            if not all(computed(r) for r in rows):
                waiting.add(nk)
            if nk in self.coverage.expected or wins:
                cov = self.coverage.minute(cluster, nk, m, wins)
                cov["node"] = node
                out.coverage_minutes.append(cov)

    def _next_with_rows(self, m: int, floor: int) -> int:
        """The first minute at or after `m` whose close emits a row: one with samples, with an allocation,
        or (not before `floor`) a node the inventory expects. Minutes before it have nothing to close."""
        w = self.windows
        first = min(w.open) if w.open else 2**63
        if self.coverage.expected:
            quiet = max(m, floor)
            if quiet == m:
                return m
            first = min(first, quiet)
        for node in self.table.nodes():
            for iv in self.table.intervals(node):
                t = max(m, minute_of(iv.start_ms))
                if t < first and (iv.end_ms is None or iv.end_ms > t):
                    first = t
        return first

    def tick(self, now_ms: int) -> list[dict[str, Any]]:
        """Coverage alerts due at `now_ms` (checked at most once per second of the clock given)."""
        if now_ms < self._next_tick_ms:
            return []
        self._next_tick_ms = now_ms - now_ms % 1000 + 1000
        alerts = self.coverage.on_tick(now_ms)
        for a in alerts:
            a["cluster"], a["node"] = split_qualified_node(a["node"])
        return alerts

    # -- durability
    def samples_commit_offset(self) -> int:
        need = self.windows.min_needed_offset()
        return self.samples_next_offset if need is None else need

    def allocs_commit_offset(self) -> int:
        need = self.table.min_live_offset()
        return self.allocs_next_offset if need is None else need

    def metadata(self) -> str:
        """What a restart needs besides the replayed input: which minutes are closed, and where."""
        w = self.windows
        return json.dumps(
            {
                "nc": w.next_close_ms,
                "co": {str(k): v for k, v in sorted(w.close_offsets.items())},
                "ao": max(self.allocs_next_offset, self._replay_below),
            }
        )

    def restore(self, metadata: str | None) -> None:
        if not metadata:
            return
        data = json.loads(metadata)
        self.windows.next_close_ms = data.get("nc")
        self.windows.close_offsets = {int(k): int(v) for k, v in data.get("co", {}).items()}
        self._replay_below = int(data.get("ao", 0))

    def committed(self, samples_offset: int) -> None:
        self.windows.forget_close_offsets(samples_offset)


# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Forgotten:
    """The state of a job the stage forgot (its tombstone), with the job's end: restored after a restart it
    passes over that job's replays only, and a later job under the same id (Slurm reuses ids) is another job."""

    ended_ms: int  # 0: unknown (a tombstone of an earlier version): passes over everything under the id


JobState = IdleState | Forgotten


def encode_job_state(state: JobState) -> bytes:
    """A job's state as the idle-state topic holds it: JSON of `IdleState`, or of its tombstone
    `{"ended_ms": ..., "forgotten": true}`."""
    data = {"forgotten": True, "ended_ms": state.ended_ms} if isinstance(state, Forgotten) else state.to_json()
    return json.dumps(data, sort_keys=True).encode()


def decode_job_state(value: bytes | str | None) -> JobState | None:
    """`encode_job_state`'s inverse; None for a deleted key. `{"forgotten": true}` without an end (written
    before the end was kept) restores as end 0, as it always did."""
    if value is None:
        return None
    data = json.loads(value)
    if data.get("forgotten"):
        return Forgotten(int(data.get("ended_ms", 0)))
    return IdleState.from_json(data)


@dataclass(slots=True)
class JobOutputs:
    job_minutes: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    states: dict[str, JobState] = field(default_factory=dict)  # "cluster/job_id" -> state (Forgotten: forget)


class JobPartition:
    def __init__(self, settings: ProcessorSettings) -> None:
        self.settings = settings
        self.table = AllocationTable()
        self.states: dict[str, IdleState] = {}
        self._ended: dict[str, None] = {}  # jobs whose state has ended (in order): all `tick` looks at
        self.pending: dict[str, dict[int, dict[tuple[str, str, int], tuple[int, dict[str, Any]]]]] = {}
        self.rows_next_offset = 0
        self.events_next_offset = 0
        self.max_ts: int | None = None
        self.horizon = Horizon(settings.max_future_ms, follow_events=not settings.realtime)
        self.granted: dict[str, tuple[Exemption, ...]] = {}  # on appeal, by job: for a state yet to come
        # (why, job, minute) of the last device-minutes passed over, for a log line (bounded: a replay is long)
        self.skipped: deque[tuple[str, str, int]] = deque(maxlen=64)

    def grant(self, job_id: str, exemptions: tuple[Exemption, ...]) -> IdleState | None:
        """The job's exemptions granted on appeal are now `exemptions`: its changed state (to write), if any."""
        self.granted[job_id] = exemptions
        st = self.states.get(job_id)
        if st is None or st.granted == exemptions:
            return None
        st = replace(st, granted=exemptions)
        self._set_state(job_id, st)
        return st

    def restore_state(self, job_id: str, state: JobState | None) -> None:
        """A job's state read back from the idle-state topic (None: the key was deleted)."""
        if isinstance(state, IdleState):
            self._set_state(job_id, state)
            return
        if isinstance(state, Forgotten):
            self.table.mark_forgotten(job_id, state.ended_ms)
        self.states.pop(job_id, None)
        self._ended.pop(job_id, None)

    def _set_state(self, job_id: str, state: IdleState) -> None:
        self.states[job_id] = state
        if state.ended_ms is not None:
            self._ended[job_id] = None
        else:
            self._ended.pop(job_id, None)

    def on_job_event(self, ev: Mapping[str, Any], offset: int) -> bool:
        """False: beyond the horizon, not admitted (the caller dead-letters it)."""
        self.events_next_offset = offset + 1
        if not self.horizon.admits(ev["ts_ms"]):
            return False
        jid = job_key_of(ev)
        if self.table.forgotten(jid, ev["ts_ms"]):
            return True
        self.table.apply_all(_with_node_keys(ev), offset)
        info = self.table.job(jid)
        if info is None:
            return True
        st = self.states.get(jid)
        if st is None:
            st = new_state(info, tuple(self.table.job_devices(jid)))
            if jid in self.granted:
                st = replace(st, granted=self.granted[jid])
        else:
            st = replace(st, job=info, devices=tuple(self.table.job_devices(jid)) or st.devices)
        if ev["event_type"] == "ENDED":
            st = mark_ended(st, ev["ts_ms"])
        self._set_state(jid, st)
        return True

    def on_job_rows(self, rows: Sequence[Mapping[str, Any]], offset: int) -> int | None:
        """The device-minutes of one bundle (`processors.job_rows`), all or none: None once taken, else the
        first minute beyond the horizon (nothing taken; the caller dead-letters the bundle)."""
        for row in rows:
            if row.get("job_id") is not None and not self.horizon.admits(int(row["minute_start_ms"])):
                return int(row["minute_start_ms"])
        self.rows_next_offset = offset + 1
        for row in rows:
            self.on_device_minute(row, offset)
        return None

    def on_device_minute(self, row: Mapping[str, Any], offset: int) -> bool:
        """False: a minute beyond the horizon, not admitted (the caller dead-letters it)."""
        self.rows_next_offset = offset + 1
        if row.get("job_id") is None:
            return True
        m = int(row["minute_start_ms"])
        if not self.horizon.admits(m):
            return False
        jid = qualified_job(row["cluster"], row["job_id"])
        if self.table.forgotten(jid, m):
            self.skipped.append(("job forgotten", jid, m))
            return True
        st = self.states.get(jid)
        if st is not None and st.last_minute_ms is not None and m <= st.last_minute_ms:
            self.skipped.append(("job-minute out", jid, m))
            return True  # replayed: that job-minute is already out
        per_minute = self.pending.setdefault(jid, {})
        rows = per_minute.setdefault(m, {})
        key = device_row_key(row)
        if key not in rows:
            rows[key] = (offset, dict(row))
        if self.max_ts is None or m > self.max_ts:
            self.max_ts = m
        return True

    def drain(self) -> JobOutputs:
        """Emit every job-minute that is complete, in minute order per job."""
        out = JobOutputs()
        policy = self.settings.idle
        for jid in sorted(self.pending):
            per_minute = self.pending[jid]
            info = self.table.job(jid)
            st = self.states.get(jid)
            if info is None or st is None:
                continue  # the job's events are not in yet
            for m in sorted(per_minute):
                if not self._gap_clear(jid, st.last_minute_ms, m):
                    break
                rows = per_minute[m]
                expected = self.table.expected_devices(jid, m)
                if len(rows) < expected or (expected == 0 and self.table.job_ended_ms(jid) is None):
                    # None expected of a job not ended: the event that placed these rows is not read yet (a
                    # replay after a restart reads a job's submission before its start, the rows meanwhile)
                    break
                if not self._nodes_whole(per_minute, m):
                    break
                jm = job_minute(info, m, [r for _, r in rows.values()])
                out.job_minutes.append(jm)
                st, emitted = step(st, jm, policy)
                self._route(emitted, out)
                del per_minute[m]
            self._set_state(jid, st)
            out.states[jid] = st
            if not per_minute:
                del self.pending[jid]
        return out

    def _nodes_whole(self, per_minute: Mapping[int, Mapping[RowKey, tuple[int, Mapping[str, Any]]]], m: int) -> bool:
        """Every node's rows of the job's minute `m` are in: as many as the node stage wrote there
        (`job_node_rows`), or a later minute of the job came from that node (it writes a node's minutes in
        order), or the partition read `NODE_ROWS_WAIT_MS` of minutes past `m` (rows promised and never
        written, a forged count: the minute goes out with what came). The allocation table alone can be
        behind: an UPDATED naming more devices, not read yet here, would leave the minute short of them."""
        have: dict[str, int] = {}
        promised: dict[str, int] = {}
        for (node, _, _), (_, row) in per_minute[m].items():
            have[node] = have.get(node, 0) + 1
            n = row.get("job_node_rows")
            if n is not None and n > promised.get(node, 0):
                promised[node] = n
        short = {node for node, n in promised.items() if have[node] < n}
        if not short or (self.max_ts is not None and self.max_ts >= m + NODE_ROWS_WAIT_MS):
            return True
        later = {key[0] for later_m, rows in per_minute.items() if later_m > m for key in rows}
        return short <= later

    def _gap_clear(self, jid: str, last: int | None, m: int) -> bool:
        """No minute between the last emitted one and `m` still expects rows (one look at the job's
        intervals, not a step per minute: the gap may be long)."""
        if last is None:
            return True
        return not self.table.expects_rows_between(jid, last + MINUTE_MS, m)

    @staticmethod
    def _route(emitted: list[Output], out: JobOutputs) -> None:
        for o in emitted:
            (out.alerts if o.kind == "alert" else out.actions).append(o.record)

    def tick(self, now_ms: int) -> JobOutputs:
        """Forget jobs that ended once their last job-minute is out (`idle.on_tick` decides when)."""
        out = JobOutputs()
        for jid in list(self._ended):
            st = self.states[jid]
            if st.ended_ms is None or jid in self.pending:
                continue
            last_end = self.table.job_last_end_ms(jid)
            last_minute = None if last_end is None else minute_of(last_end - 1)
            if (
                last_minute is not None
                and self.table.expected_devices(jid, last_minute) > 0
                and (st.last_minute_ms is None or st.last_minute_ms < last_minute)
            ):
                continue  # its last minutes are still to come
            new, emitted = on_tick(st, now_ms, self.settings.idle)
            self._route(emitted, out)
            if new is None:
                del self.states[jid]
                del self._ended[jid]
                self.table.forget_job(jid)
                self.table.mark_forgotten(jid, st.ended_ms)
                out.states[jid] = Forgotten(st.ended_ms)
        return out

    def rows_commit_offset(self) -> int:
        offs = [off for per in self.pending.values() for rows in per.values() for off, _ in rows.values()]
        return min(offs, default=self.rows_next_offset)

    def events_commit_offset(self) -> int:
        need = self.table.min_live_offset()
        return self.events_next_offset if need is None else need
