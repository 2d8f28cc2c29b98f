"""Allocations and attribution: which job held a device at a given second.

The allocation table is built from scheduler job events (re-keyed by node, so one partition holds all
of a node's allocations) as intervals per device per job. A device-second `s` belongs to job J when
`start_ms <= s * 1000 < end_ms` for one of J's intervals (docs/classification.md). Pure code: plain
data in, plain data out; the caller supplies offsets only so it can tell which input is still needed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from processors.windows import MINUTE_MS, minute_of
from schemas.topics import qualified_job

OPENING = frozenset({"STARTED", "RESUMED"})
UNIDENTIFIED = "unidentified:"  # device_uuid prefix of a device-minute whose device no event identified
CLOSING = frozenset({"ENDED", "PREEMPTED", "SUSPENDED", "REQUEUED"})


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A device as a job event names it: by UUID when known, else by index; MIG instance if a slice.

    A device the event names by neither (a Kubernetes pod whose devices the kubelet did not tell us) is
    `unidentified`: `slot` is its ordinal among the job's unidentified devices on the node, so an
    allocation of N such devices stays N devices (N intervals, N rows, charged N), never one. An
    unidentified device matches no sample: its seconds are allocated and dark."""

    uuid: str | None
    index: int | None
    mig_instance_id: int | None = None
    slot: int | None = None

    def matches(self, uuid: str, index: int | None, mig_instance_id: int | None) -> bool:
        if self.mig_instance_id != mig_instance_id:
            return False
        if self.uuid is not None:
            return self.uuid == uuid
        return self.index is not None and self.index == index

    @property
    def unidentified(self) -> bool:
        return self.uuid is None and self.index is None

    @property
    def label(self) -> str:
        """The device as rows name it when no inventory knows it: `index:I`, or `unidentified:K`."""
        if self.uuid is not None:
            return self.uuid
        return f"index:{self.index}" if self.index is not None else f"{UNIDENTIFIED}{self.slot or 0}"

    @property
    def sort_key(self) -> tuple[str, int, int, int]:
        return (
            self.uuid or "",
            -1 if self.index is None else self.index,
            -1 if self.mig_instance_id is None else self.mig_instance_id,
            -1 if self.slot is None else self.slot,
        )


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What usage rows and alerts carry about a job: snapshotted at job start, never rewritten."""

    cluster: str
    job_id: str
    scheduler: str = "SIMULATOR"
    user: str | None = None
    project: str | None = None
    team: str | None = None
    cost_centre: str | None = None
    partition: str | None = None
    preemptible: bool = False
    interactive: bool = False
    checkpointable: bool = False
    pricing_tier: str = "on-prem"
    gang_size: int = 0

    @classmethod
    def from_event(cls, ev: Mapping[str, Any]) -> JobInfo:
        identity = ev.get("identity") or {}
        teams = identity.get("teams") or []
        team = identity.get("primary_team") or (teams[0] if teams else None)
        return cls(
            cluster=ev["cluster"],
            job_id=ev["job_id"],
            scheduler=str(ev.get("scheduler") or "SIMULATOR"),
            user=ev.get("user"),
            project=charged_project(ev),
            team=team,
            cost_centre=identity.get("cost_centre"),
            partition=ev.get("partition"),
            preemptible=bool(ev.get("preemptible", False)),
            interactive=bool(ev.get("interactive", False)),
            checkpointable=bool(ev.get("checkpointable", False)),
            pricing_tier=ev.get("pricing_tier") or "on-prem",
            gang_size=int(ev.get("gang_size") or 0),
        )


def charged_project(ev: Mapping[str, Any]) -> str | None:
    """The project a job event charges. A non-member's explicit project is never it: producers put such a
    claim in `project_claimed` and the user's default in `project`; a record from before that rule (strict
    mode once kept the claim in `project`, `EXPLICIT` + `NOT_A_MEMBER`) charges no project."""
    if ev.get("project_source") == "EXPLICIT" and ev.get("project_validation") == "NOT_A_MEMBER":
        return None
    project = ev.get("project")
    return str(project) if project is not None else None


@dataclass(slots=True)
class Interval:
    job_id: str  # the job's key, "cluster/job_id"
    ref: DeviceRef
    start_ms: int
    end_ms: int | None = None  # None: still open

    def overlaps(self, lo_ms: int, hi_ms: int) -> bool:
        return self.start_ms < hi_ms and (self.end_ms is None or self.end_ms > lo_ms)


def first_second(ms: int) -> int:
    """The first second `s` with `s * 1000 >= ms`."""
    return -((-ms) // 1000)


def seconds_span(iv: Interval, lo_s: int, hi_s: int) -> tuple[int, int]:
    """The seconds [a, b) of [lo_s, hi_s) the interval covers (a == b: none)."""
    a = min(hi_s, max(lo_s, first_second(iv.start_ms)))
    b = hi_s if iv.end_ms is None else min(hi_s, first_second(iv.end_ms))
    return a, max(a, b)


def allocated_seconds(intervals: Iterable[Interval], lo_s: int, hi_s: int) -> set[int]:
    """Seconds in [lo_s, hi_s) covered by any of the intervals."""
    out: set[int] = set()
    for iv in intervals:
        out.update(range(*seconds_span(iv, lo_s, hi_s)))
    return out


def owners_by_second(intervals: Iterable[Interval], minute_ms: int) -> dict[str, set[int]]:
    """Job -> its seconds of the minute. Should two jobs claim one second (a scheduler double booking),
    the later-started allocation wins, so a second is never counted twice."""
    lo_s = minute_ms // 1000
    ivs = sorted((iv for iv in intervals if iv.overlaps(minute_ms, minute_ms + MINUTE_MS)), key=lambda iv: iv.start_ms)
    if not ivs:
        return {}
    if len({iv.job_id for iv in ivs}) == 1:
        return {ivs[0].job_id: allocated_seconds(ivs, lo_s, lo_s + 60)}
    slot: dict[int, str] = {}
    for iv in ivs:
        for s in allocated_seconds((iv,), lo_s, lo_s + 60):
            slot[s] = iv.job_id
    owners: dict[str, set[int]] = {}
    for s, job in slot.items():
        owners.setdefault(job, set()).add(s)
    return owners


@dataclass(frozen=True, slots=True)
class _Step:
    """A job event as it bears on one node: `refs` are the devices it names there (None: it names none
    anywhere, e.g. an UPDATED that only changes metadata)."""

    ts: int
    kind: str
    refs: list[DeviceRef] | None

    @property
    def order(self) -> tuple[int, bool]:
        return (self.ts, self.kind == "ENDED")


@dataclass(slots=True)
class _Job:
    info: JobInfo
    first_offset: int
    submit_ms: int | None = None  # the submit time of the life `info` describes (job ids are reused)
    event_ids: set[tuple[str, str]] = field(default_factory=set)  # (node, event id)
    nodes: set[str] = field(default_factory=set)
    ended_ms: int | None = None
    # node -> the job's events applied there, in event-time order (an end last among equals)
    history: dict[str, list[_Step]] = field(default_factory=dict)


class AllocationTable:
    """Device allocations of the nodes of one partition, from job events.

    `apply` is idempotent per event id (the re-keying stage may re-publish after a crash); an event for a
    job that already ended at or after its time is ignored for the same reason. A job's intervals do not
    depend on the order its events arrive in: after a restart the node stage replays allocations from a
    committed offset that may fall between a job's start and its end, and the start can come back later
    (re-published by the re-keying stage), after the end it must not outlive.
    """

    def __init__(self) -> None:
        self._intervals: dict[str, list[Interval]] = {}  # node -> intervals
        self._jobs: dict[str, _Job] = {}
        self._ended: dict[str, int] = {}  # forgotten jobs -> end ms (tombstones against replays)
        self.min_event_ms: int | None = None

    # -- input
    def apply(self, node: str, ev: Mapping[str, Any], offset: int = 0) -> bool:
        """Apply one job event to `node`'s allocations. Returns False for a duplicate or stale event."""
        job_id = job_key_of(ev)
        ts: int = ev["ts_ms"]
        kind: str = ev["event_type"]
        tomb = self._ended.get(job_id)
        if tomb is not None and ts <= tomb:
            return False
        job = self._jobs.get(job_id)
        if job is None:
            job = _Job(JobInfo.from_event(ev), offset, ev.get("submit_ts_ms"))
            self._jobs[job_id] = job
        elif (node, ev["event_id"]) in job.event_ids:
            return False
        elif kind == "STARTED" and (job.info.user is None or _new_life(job, ev)):
            # a reused job id (a reinstalled scheduler counts from 1 again): the new job is charged to its
            # own user and project, and is not ended
            if job.info.user is not None:
                job.ended_ms = None
            job.info = JobInfo.from_event(ev)
            job.submit_ms = ev.get("submit_ts_ms", job.submit_ms)
        job.event_ids.add((node, ev["event_id"]))
        job.first_offset = min(job.first_offset, offset)
        self.min_event_ms = ts if self.min_event_ms is None else min(self.min_event_ms, ts)
        if kind == "SUBMITTED":
            return True
        names = bool(ev.get("allocations"))
        entry = _Step(ts, kind, _refs_for_node(ev, node) if names else None)
        history = job.history.setdefault(node, [])
        if kind == "ENDED":
            job.ended_ms = ts if job.ended_ms is None else max(job.ended_ms, ts)
        if not history or entry.order >= history[-1].order:
            history.append(entry)
            self._step(node, job_id, job, entry)
        else:  # older than an event already applied: replay the job's events on this node in time order
            history.insert(bisect.bisect_right(history, entry.order, key=lambda e: e.order), entry)
            kept = [iv for iv in self._intervals.get(node, ()) if iv.job_id != job_id]
            self._intervals[node] = kept
            for e in history:
                self._step(node, job_id, job, e)
        return True

    def _step(self, node: str, job_id: str, job: _Job, entry: _Step) -> None:
        """One event's effect on the job's intervals on `node`."""
        ts, kind, refs = entry.ts, entry.kind, entry.refs or []
        if kind == "UPDATED" and job.ended_ms is not None and ts >= job.ended_ms:
            return  # names devices after the job ended (a late device report, e.g. the kubelet's): opens nothing
        ivs = self._intervals.setdefault(node, [])
        open_ivs = [iv for iv in ivs if iv.job_id == job_id and iv.end_ms is None]
        if kind in OPENING or (kind == "UPDATED" and entry.refs is not None):
            if kind == "UPDATED":  # the allocation now: open intervals it no longer names end here
                keep = set(refs)
                for iv in open_ivs:
                    if iv.ref not in keep:
                        iv.end_ms = max(ts, iv.start_ms)
            already = {iv.ref for iv in open_ivs}
            for ref in refs:
                if ref not in already:
                    ivs.append(Interval(job_id, ref, ts))
            if refs:
                job.nodes.add(node)
        elif kind in CLOSING:
            for iv in open_ivs:
                iv.end_ms = max(ts, iv.start_ms)
        if not ivs:
            del self._intervals[node]

    def apply_all(self, ev: Mapping[str, Any], offset: int = 0) -> bool:
        """Apply a job event to every node it names and every node the job already holds devices on
        (the job stage keeps whole jobs, keyed by job)."""
        job = self._jobs.get(job_key_of(ev))
        nodes = event_nodes(ev)
        if job is not None:
            nodes += sorted(job.nodes - set(nodes))
        if not nodes:
            nodes = [""]  # SUBMITTED or an event with no devices: still record the job
        applied = False
        for node in nodes:
            applied = self.apply(node, ev, offset) or applied
        return applied

    def expected_devices(self, job_id: str, minute_ms: int) -> int:
        """Devices of the job that must have a row for the minute: one per (node, device) with an
        interval overlapping it, the rule the node stage uses to emit rows."""
        job = self._jobs.get(job_id)
        if job is None:
            return 0
        hi = minute_ms + MINUTE_MS
        return sum(
            len({iv.ref for iv in self._intervals.get(node, ()) if iv.job_id == job_id and iv.overlaps(minute_ms, hi)})
            for node in job.nodes
        )

    def expects_rows_between(self, job_id: str, lo_ms: int, hi_ms: int) -> bool:
        """Whether any minute in [lo_ms, hi_ms) (minute-aligned bounds) has `expected_devices` > 0, from
        the job's intervals rather than minute by minute."""
        job = self._jobs.get(job_id)
        if job is None or lo_ms >= hi_ms:
            return False
        for node in job.nodes:
            for iv in self._intervals.get(node, ()):
                if iv.job_id != job_id:
                    continue
                t = max(lo_ms, minute_of(iv.start_ms))  # first minute it can overlap
                if t < hi_ms and (iv.end_ms is None or iv.end_ms > t):
                    return True
        return False

    def job_devices(self, job_id: str) -> list[str]:
        job = self._jobs.get(job_id)
        if job is None:
            return []
        return sorted(
            {
                iv.ref.uuid or f"{node}:{iv.ref.label}"
                for node in job.nodes
                for iv in self._intervals.get(node, ())
                if iv.job_id == job_id
            }
        )

    def job_ended_ms(self, job_id: str) -> int | None:
        job = self._jobs.get(job_id)
        return job.ended_ms if job is not None else None

    def job_last_end_ms(self, job_id: str) -> int | None:
        """End of the job's last allocation interval; None while any is open or the job is unknown."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        ends: list[int] = []
        for node in job.nodes:
            for iv in self._intervals.get(node, ()):
                if iv.job_id == job_id:
                    if iv.end_ms is None:
                        return None
                    ends.append(iv.end_ms)
        return max(ends, default=job.ended_ms)

    def forgotten(self, job_id: str, ts_ms: int) -> bool:
        """`ts_ms` belongs to a forgotten job: at or before its end (a replay), or at any time when a restart
        restored its tombstone without the end (0). Later is another job under the same id (`apply`'s rule)."""
        tomb = self._ended.get(job_id)
        return tomb is not None and job_id not in self._jobs and (tomb == 0 or ts_ms <= tomb)

    def mark_forgotten(self, job_id: str, ended_ms: int) -> None:
        """A job whose every minute is already out (restored after a restart): ignore its replays."""
        self._ended[job_id] = ended_ms
        self._jobs.pop(job_id, None)

    def jobs(self) -> list[str]:
        return list(self._jobs)

    def forget_job(self, job_id: str) -> None:
        job = self._jobs.pop(job_id, None)
        if job is None:
            return
        if job.ended_ms is not None:
            self._ended[job_id] = job.ended_ms
        for node in job.nodes | {""}:
            ivs = [iv for iv in self._intervals.get(node, ()) if iv.job_id != job_id]
            if ivs:
                self._intervals[node] = ivs
            else:
                self._intervals.pop(node, None)

    # -- queries
    def nodes(self) -> Iterator[str]:
        return iter(self._intervals)

    def intervals(self, node: str) -> list[Interval]:
        return self._intervals.get(node, [])

    def intervals_in(self, node: str, lo_ms: int, hi_ms: int) -> list[Interval]:
        return [iv for iv in self._intervals.get(node, ()) if iv.overlaps(lo_ms, hi_ms)]

    def job(self, job_id: str) -> JobInfo | None:
        job = self._jobs.get(job_id)
        return job.info if job is not None else None

    def owner_at(self, node: str, uuid: str, index: int | None, mig: int | None, ts_ms: int) -> JobInfo | None:
        """The job holding the device at the second of `ts_ms`, or None (unallocated)."""
        s_ms = (ts_ms // 1000) * 1000
        best: Interval | None = None
        for iv in self._intervals.get(node, ()):
            holds = iv.start_ms <= s_ms and (iv.end_ms is None or s_ms < iv.end_ms)
            if holds and iv.ref.matches(uuid, index, mig) and (best is None or iv.start_ms >= best.start_ms):
                best = iv
        return self.job(best.job_id) if best is not None else None

    def min_live_offset(self) -> int | None:
        """Smallest input offset of any job still remembered: replaying from there rebuilds the table."""
        return min((j.first_offset for j in self._jobs.values()), default=None)

    # -- forgetting
    def prune(self, closed_before_ms: int) -> None:
        """Drop intervals that ended before `closed_before_ms` (every minute they touch is emitted) and
        jobs that ended with nothing left."""
        for node, ivs in list(self._intervals.items()):
            kept = [iv for iv in ivs if iv.end_ms is None or iv.end_ms > closed_before_ms]
            if kept:
                self._intervals[node] = kept
            else:
                del self._intervals[node]
        live = {iv.job_id for ivs in self._intervals.values() for iv in ivs}
        for job_id, job in list(self._jobs.items()):
            if job_id not in live and job.ended_ms is not None and job.ended_ms <= closed_before_ms:
                self._ended[job_id] = job.ended_ms
                del self._jobs[job_id]
        if len(self._ended) > 100_000:  # tombstones only guard replays of recent history
            for job_id in sorted(self._ended, key=self._ended.__getitem__)[: len(self._ended) // 2]:
                del self._ended[job_id]

    def __len__(self) -> int:
        return sum(len(v) for v in self._intervals.values())


def _new_life(job: _Job, ev: Mapping[str, Any]) -> bool:
    """A STARTED after the job ended, submitted at another time: another job under a reused id (a requeued
    job keeps its submit time)."""
    submit = ev.get("submit_ts_ms")
    return (
        job.ended_ms is not None
        and ev["ts_ms"] > job.ended_ms
        and submit is not None
        and job.submit_ms is not None
        and submit != job.submit_ms
    )


def job_key_of(ev: Mapping[str, Any]) -> str:
    """Jobs are known by "cluster/job_id" (job ids repeat across clusters); `Interval.job_id` holds it."""
    return qualified_job(ev["cluster"], ev["job_id"])


def _refs_for_node(ev: Mapping[str, Any], node: str) -> list[DeviceRef]:
    """The devices an event names on `node`. A device named twice (by UUID or index) is one device; each
    entry naming neither is a device of its own (`DeviceRef.slot`): a 4-GPU pod of unknown identity is
    four devices, never merged into one."""
    refs: list[DeviceRef] = []
    slot = 0
    for alloc in ev.get("allocations") or ():
        if alloc["node"] != node:
            continue
        for dev in alloc["devices"]:
            uuid, index, mig = dev.get("uuid"), dev.get("index"), dev.get("mig_instance_id")
            if uuid is None and index is None:
                refs.append(DeviceRef(None, None, mig, slot))
                slot += 1
                continue
            ref = DeviceRef(uuid, index, mig)
            if ref not in refs:
                refs.append(ref)
    return refs


def event_nodes(ev: Mapping[str, Any]) -> list[str]:
    """Nodes named in a job event's allocations, in order, once each."""
    out: list[str] = []
    for alloc in ev.get("allocations") or ():
        if alloc["node"] not in out:
            out.append(alloc["node"])
    return out


def split_scrape(scrape: Mapping[str, Any]) -> Iterator[tuple[tuple[str, str, int | None], Mapping[str, Any]]]:
    """A node scrape as ((node, uuid, mig_instance_id), device sample) pairs."""
    node = scrape["node"]
    for dev in scrape["devices"]:
        yield (node, dev["uuid"], dev.get("mig_instance_id")), dev


def attribute_scrape(
    table: AllocationTable, scrape: Mapping[str, Any]
) -> list[tuple[tuple[str, str, int | None], Mapping[str, Any], JobInfo | None]]:
    """Split a scrape into device samples, each with the job holding its device at that second (None:
    unallocated). The streaming path does the same per second at window close (`rollup`)."""
    ts = scrape["ts_ms"]
    return [
        (key, dev, table.owner_at(key[0], key[1], dev.get("index"), key[2], ts)) for key, dev in split_scrape(scrape)
    ]
