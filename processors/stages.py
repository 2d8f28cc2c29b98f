"""The three processing stages as plain objects over plain records (no Kafka here).

- `RekeyStage`: job events (keyed by job) -> the same events keyed by each node they touch, so that
  a node's samples and its allocations meet in one partition (ALLOCATIONS is co-partitioned with
  DEVICE_SAMPLES). Remembers each running job's nodes, because an end event may not list them.
- `NodePartition`: one DEVICE_SAMPLES partition with its ALLOCATIONS and INVENTORY partitions:
  windows, attribution at window close, DeviceMinute and CoverageMinute rows, coverage alerts.
- `JobPartition`: one DEVICE_MINUTES partition with its JOB_EVENTS partition: collects each job's
  device-minutes from every node, emits a JobMinute once every device the allocation names has
  reported for that minute (so the output never depends on arrival timing), and steps the job's
  idle state machine.

Each stage reports the smallest input offset it still needs (`*_commit_offset`): the runtime commits
no further, so a crash replays exactly what is not yet reflected in emitted output.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from processors.attribution import MINUTE_MS, AllocationTable, event_nodes, job_key_of
from processors.classify import activity_of
from processors.config import ProcessorSettings
from processors.coverage import CoverageTracker
from processors.idle import IdleState, Output, mark_ended, new_state, on_tick, step
from processors.rollup import DeviceDirectory, device_row_key, job_minute, node_minute_rows
from processors.windows import Admit, DeviceWindow, MinuteWindows


def minute_floor(ts_ms: int) -> int:
    return ts_ms - ts_ms % MINUTE_MS


def node_key(cluster: str, node: str) -> str:
    return f"{cluster}/{node}"


def split_node_key(key: str) -> tuple[str, str]:
    cluster, _, node = key.partition("/")
    return cluster, node


def _nodes_of(ev: Mapping[str, Any]) -> list[str]:
    return [node_key(ev["cluster"], n) for n in event_nodes(ev)]


def _with_node_keys(ev: Mapping[str, Any]) -> dict[str, Any]:
    """The event with allocation node names replaced by "cluster/node" keys (the tables' node ids)."""
    out = dict(ev)
    out["allocations"] = [
        {"node": node_key(ev["cluster"], a["node"]), "devices": a["devices"]} for a in ev.get("allocations") or ()
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

    def __init__(self, published_below: int = 0) -> None:
        self._jobs: dict[str, _RekeyJob] = {}
        self.published_below = published_below

    def route(self, ev: Mapping[str, Any], offset: int = 0) -> list[str]:
        """Node keys ("cluster/node") the event must be published to: none for a replay of what was
        published before the restart (the event still updates what the stage knows of its job)."""
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

    @classmethod
    def restore(cls, metadata: str | None) -> RekeyStage:
        return cls(int(json.loads(metadata).get("pb", 0)) if metadata else 0)


# ---------------------------------------------------------------------------------------------------
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
        self.coverage = CoverageTracker(timeout_ms=settings.coverage_timeout_ms)
        self.directory = DeviceDirectory()
        self.max_sample_ts: int | None = None
        self.max_alloc_ts: int | None = None
        self.samples_next_offset = 0
        self.allocs_next_offset = 0
        self.emitted_minutes = 0
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
        closed_until = self.windows.next_close_ms
        if applied and closed_until is not None and ts < closed_until and offset >= self._replay_below:
            self.late_allocations += 1
            self.last_late_allocation = (job_key_of(ev), ts, closed_until)
        if self.max_alloc_ts is None or ts > self.max_alloc_ts:
            self.max_alloc_ts = ts
        self.allocs_next_offset = offset + 1

    def on_inventory(self, rec: Mapping[str, Any]) -> None:
        key = node_key(rec["cluster"], rec["node"])
        devices = None if rec.get("deleted") else list(rec["devices"])
        self.directory.set_node(key, devices)
        self.coverage.set_inventory(rec["cluster"], key, rec["ts_ms"], devices)

    def on_scrape(self, scrape: Mapping[str, Any], offset: int) -> Admit:
        """Hot path: one node scrape (all its devices)."""
        self.samples_next_offset = offset + 1
        ts = scrape["ts_ms"]
        if self.max_sample_ts is None or ts > self.max_sample_ts:
            self.max_sample_ts = ts
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

    # -- time
    def advance(self, watermark_ms: int) -> NodeOutputs:
        """Close every minute the watermark has passed (plus grace) and roll it up."""
        out = NodeOutputs()
        w = self.windows
        if w.next_close_ms is None:
            firsts = [t for t in (w.earliest_open(), self.table.min_event_ms) if t is not None]
            if not firsts:
                return out
            w.start_at(min(firsts))
        th = self.settings.thresholds
        while w.closable(watermark_ms):
            closed = w.close_next(self.samples_next_offset)
            m = closed.minute_ms
            per_node: dict[str, dict[tuple[str, int | None], DeviceWindow]] = {}
            for (nk, uuid, mig), win in closed.devices.items():
                per_node.setdefault(nk, {})[(uuid, mig)] = win
            nodes = set(per_node) | set(self.coverage.expected)
            nodes.update(n for n in self.table.nodes() if self.table.intervals_in(n, m, m + MINUTE_MS))
            for nk in sorted(nodes):
                cluster, node = split_node_key(nk)
                wins = per_node.get(nk, {})
                ivs = self.table.intervals_in(nk, m, m + MINUTE_MS)
                out.device_minutes.extend(
                    node_minute_rows(cluster, node, nk, m, wins, ivs, self.table, self.directory, th)
                )
                if nk in self.coverage.expected or wins:
                    cov = self.coverage.minute(cluster, nk, m, wins)
                    cov["node"] = node
                    out.coverage_minutes.append(cov)
            self.emitted_minutes += 1
            self.table.prune(w.next_close_ms or m)
        return out

    def tick(self, now_ms: int) -> list[dict[str, Any]]:
        """Coverage alerts due at `now_ms` (checked at most once per second of the clock given)."""
        if now_ms < self._next_tick_ms:
            return []
        self._next_tick_ms = now_ms - now_ms % 1000 + 1000
        alerts = self.coverage.on_tick(now_ms)
        for a in alerts:
            a["cluster"], a["node"] = split_node_key(a["node"])
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
@dataclass(slots=True)
class JobOutputs:
    job_minutes: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    states: dict[str, IdleState | None] = field(default_factory=dict)  # "cluster/job_id" -> state (None: forget)


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

    def restore_state(self, job_id: str, state: IdleState | None) -> None:
        if state is None:
            self.states.pop(job_id, None)
            self._ended.pop(job_id, None)
        else:
            self._set_state(job_id, state)

    def _set_state(self, job_id: str, state: IdleState) -> None:
        self.states[job_id] = state
        if state.ended_ms is not None:
            self._ended[job_id] = None
        else:
            self._ended.pop(job_id, None)

    def on_job_event(self, ev: Mapping[str, Any], offset: int) -> None:
        self.events_next_offset = offset + 1
        jid = job_key_of(ev)
        if self.table.forgotten(jid):
            return
        self.table.apply_all(_with_node_keys(ev), offset)
        info = self.table.job(jid)
        if info is None:
            return
        st = self.states.get(jid)
        if st is None:
            st = new_state(info, tuple(self.table.job_devices(jid)))
        else:
            st = replace(st, job=info, devices=tuple(self.table.job_devices(jid)) or st.devices)
        if ev["event_type"] == "ENDED":
            st = mark_ended(st, ev["ts_ms"])
        self._set_state(jid, st)

    def on_device_minute(self, row: Mapping[str, Any], offset: int) -> None:
        self.rows_next_offset = offset + 1
        if row.get("job_id") is None:
            return
        jid = f"{row['cluster']}/{row['job_id']}"
        if self.table.forgotten(jid):
            return
        m = int(row["minute_start_ms"])
        st = self.states.get(jid)
        if st is not None and st.last_minute_ms is not None and m <= st.last_minute_ms:
            return  # replayed: that job-minute is already out
        per_minute = self.pending.setdefault(jid, {})
        rows = per_minute.setdefault(m, {})
        key = device_row_key(row)
        if key not in rows:
            rows[key] = (offset, dict(row))
        if self.max_ts is None or m > self.max_ts:
            self.max_ts = m

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
                if len(rows) < expected:
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

    def _gap_clear(self, jid: str, last: int | None, m: int) -> bool:
        """No minute between the last emitted one and `m` still expects rows."""
        if last is None:
            return True
        t = last + MINUTE_MS
        while t < m:
            if self.table.expected_devices(jid, t) > 0:
                return False
            t += MINUTE_MS
        return True

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
            last_minute = None if last_end is None else minute_floor(last_end - 1)
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
                out.states[jid] = None
        return out

    def rows_commit_offset(self) -> int:
        offs = [off for per in self.pending.values() for rows in per.values() for off, _ in rows.values()]
        return min(offs, default=self.rows_next_offset)

    def events_commit_offset(self) -> int:
        need = self.table.min_live_offset()
        return self.events_next_offset if need is None else need
