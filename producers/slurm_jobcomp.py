"""Slurm jobcomp/kafka records (one JSON object per finished job; since 25.05 optionally one at start).

Field names follow the plugin (23.02 to 26.05: `jobid`, `username`, `@start`, `@end`, `state`, `nodes`,
`tres_alloc`, `array_job_id`, `het_job_id`, `wc_key`, `account`, ...). GPUs appear only as a count in
`tres_alloc` (`gres/gpu=4`): per-GPU indices come from the STARTED event already seen for the job
(`StartIndex`), else from the node's GPU map when the job holds every GPU of its nodes.

Records arrive on a topic anyone with produce rights can write to: `parse_jobcomp_bytes` takes at most
`MAX_RECORD_BYTES` of JSON, and whatever does not parse or is out of range (a time past year 9999, a
text field that is an object) is a `ParseError`, which the consumer dead-letters before going on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import Any

from base.errors import ParseError
from base.untrusted import parses_untrusted
from producers.devicemap import DeviceMap
from producers.jobevents import EventContext
from producers.slurm import NodeGpus, SlurmJob, even_split, expand_hostlist, gpus_in_tres, parse_state, uid_text
from producers.slurm_events import slurm_event

MAX_RECORD_BYTES = 1 << 20
MAX_EPOCH_S = 253_402_300_799  # 9999-12-31T23:59:59Z


@parses_untrusted("jobcomp record")
def parse_jobcomp_bytes(data: bytes | None) -> Mapping[str, Any]:
    """The JSON object of one jobcomp message."""
    if data is None or len(data) > MAX_RECORD_BYTES:
        raise ParseError(f"jobcomp record of {0 if data is None else len(data)} bytes (at most {MAX_RECORD_BYTES})")
    rec = json.loads(data)
    if not isinstance(rec, Mapping):
        raise ParseError(f"jobcomp record is a JSON {type(rec).__name__}, not an object")
    return rec


def _time(value: Any, tz: tzinfo) -> int | None:
    if value in (None, "", 0, "Unknown", "None"):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not value > 0:
            return None
        if value > MAX_EPOCH_S:
            raise ParseError(f"jobcomp time {value!r} is after year 9999")
        return int(value) * 1000
    text = str(value).strip()
    if text.isascii() and text.isdigit():
        if len(text) > 12 or int(text) > MAX_EPOCH_S:
            raise ParseError(f"jobcomp time {text[:40]!r} is after year 9999")
        return int(text) * 1000
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ParseError(f"jobcomp time {text[:80]!r} is not ISO 8601") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz)
    return int(dt.timestamp() * 1000)


def _opt_text(rec: Mapping[str, Any], key: str) -> str | None:
    value = rec.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    raise ParseError(f"jobcomp field {key!r} is a {type(value).__name__}, not text")


def _opt_int(value: Any) -> int | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return n if -(1 << 63) <= n < (1 << 63) else None


@parses_untrusted("jobcomp record")
def parse_jobcomp(rec: Mapping[str, Any], tz: tzinfo = UTC) -> SlurmJob:
    if not isinstance(rec, Mapping):
        raise ParseError(f"jobcomp record is a {type(rec).__name__}, not an object")
    numeric = _opt_int(rec.get("jobid"))
    if numeric is None:
        raise ParseError("jobcomp record without a numeric `jobid`")
    state, flags = parse_state(str(rec.get("state") or "UNKNOWN"))
    array_job = _opt_int(rec.get("array_job_id"))
    array_task = _opt_int(rec.get("array_task_id"))
    het_job = _opt_int(rec.get("het_job_id") or rec.get("pack_job_id"))
    het_off_raw = rec.get("het_job_offset")
    het_off = _opt_int(het_off_raw if het_off_raw is not None else rec.get("pack_job_offset"))
    if array_job and array_task is not None and array_task < 4294967294:
        job_id, aj, at, hj, ho = f"{array_job}_{array_task}", str(array_job), array_task, None, None
    elif het_job and het_off is not None and het_off < 4294967294:
        job_id, aj, at, hj, ho = f"{het_job}+{het_off}", None, None, str(het_job), het_off
    else:
        job_id, aj, at, hj, ho = str(numeric), None, None, None, None
    nodes = expand_hostlist(str(rec.get("nodes") or ""))
    count = gpus_in_tres(str(rec.get("tres_alloc") or "")) or 0
    exit_text = str(rec.get("exit_code") if rec.get("exit_code") is not None else "")
    head = exit_text.split(":", 1)[0]
    end = _time(rec.get("@end"), tz)
    uid = uid_text(rec.get("user_id")) if not isinstance(rec.get("user_id"), bool) else None
    return SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        state=state if end is not None or state != "UNKNOWN" else "RUNNING",
        state_flags=flags,
        user=str(_opt_text(rec, "username") or uid or "unknown"),
        user_uid=uid,
        source="jobcomp",
        name=_opt_text(rec, "job_name"),
        account=_opt_text(rec, "account"),
        partition=_opt_text(rec, "partition"),
        qos=_opt_text(rec, "qos"),
        wckey=(str(rec["wc_key"]).lstrip("*") or None) if rec.get("wc_key") else None,
        comment=_opt_text(rec, "comment"),
        cluster=_opt_text(rec, "cluster"),
        array_job_id=aj,
        array_task_id=at,
        het_job_id=hj,
        het_job_offset=ho,
        submit_ms=_time(rec.get("@submit"), tz),
        start_ms=_time(rec.get("@start"), tz),
        end_ms=end,
        nodes=nodes,
        gpus=even_split(nodes, count),
        gpu_count=count,
        exit_code=_opt_int(head) if head.lstrip("-").isascii() and head.lstrip("-").isdigit() else None,
    )


class StartIndex:
    """Devices per job from STARTED events (ours, or consumed from the job-events topic)."""

    def __init__(self, max_jobs: int = 200_000) -> None:
        self._by_job: dict[tuple[str, str], tuple[NodeGpus, ...]] = {}
        self.max_jobs = max_jobs

    def observe(self, event: Mapping[str, Any]) -> None:
        if event.get("event_type") not in ("STARTED", "UPDATED", "RESUMED") or not event.get("allocations"):
            return
        key = (str(event["cluster"]), str(event["job_id"]))
        held: dict[str, list[int]] = {}
        for a in event["allocations"]:
            held.setdefault(a["node"], []).extend(d["index"] for d in a["devices"] if d.get("index") is not None)
        prev = {g.node: g for g in self._by_job.get(key, ())}
        for a in event["allocations"]:
            prev[a["node"]] = NodeGpus(a["node"], len(a["devices"]), tuple(sorted(held[a["node"]])))
        if len(self._by_job) >= self.max_jobs:
            self._by_job.pop(next(iter(self._by_job)))
        self._by_job[key] = tuple(prev.values())

    def get(self, cluster: str, job_id: str) -> tuple[NodeGpus, ...] | None:
        return self._by_job.get((cluster, job_id))


def join_devices(job: SlurmJob, cluster: str, starts: StartIndex | None, devmap: DeviceMap | None) -> SlurmJob:
    known = starts.get(cluster, job.job_id) if starts is not None else None
    if known and any(g.indices for g in known):
        return replace(job, gpus=known)
    if devmap is not None and job.gpus:
        filled = []
        for g in job.gpus:
            devs = devmap.devices(cluster, g.node)
            if devs and len(devs) == g.count:  # the job holds the whole node: every index is its
                filled.append(NodeGpus(g.node, g.count, tuple(sorted(devs))))
            else:
                filled.append(g)
        return replace(job, gpus=tuple(filled))
    return job


def jobcomp_events(
    rec: Mapping[str, Any], ctx: EventContext, starts: StartIndex | None = None, tz: tzinfo = UTC
) -> list[dict[str, Any]]:
    """STARTED (unless a start with devices was already seen) and ENDED, with the job's real times.

    Event ids match the poller's for the same transition, so sources de-duplicate downstream.
    """
    job = join_devices(parse_jobcomp(rec, tz), ctx.cluster, starts, ctx.devices)
    if not (job.gpu_count or job.gpus):
        return []
    out: list[dict[str, Any]] = []
    seen_start = starts is not None and starts.get(ctx.cluster, job.job_id) is not None
    if job.start_ms is not None and not seen_start:
        started = slurm_event(job, "STARTED", job.start_ms, ctx)
        out.append(started)
        if starts is not None:
            starts.observe(started)
    if job.end_ms is not None:
        out.append(slurm_event(job, "ENDED", job.end_ms, ctx))
    return out
