"""Slurm job records (`producers.slurm.SlurmJob`) to `JobEvent` records."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from producers.jobevents import EventContext, HeldDevices, job_event
from producers.projects import Attribution, parse_comment_pairs
from producers.slurm import SlurmJob

_TRUE = frozenset({"1", "yes", "true", "on", "y"})


_MIG_TYPE = re.compile(r"(\d+g\.\d+gb)$")


def mig_profile(gpu_type: str | None) -> str | None:
    """`1g.10gb` / `nvidia_a100_3g.20gb` (Slurm's MIG gres types) -> the MIG profile; whole GPUs -> None."""
    m = _MIG_TYPE.search(gpu_type or "")
    return m.group(1) if m else None


def held_devices(job: SlurmJob) -> list[HeldDevices]:
    out = []
    for g in job.gpus:
        if g.count or g.indices:
            profile = mig_profile(g.gpu_type)
            out.append(HeldDevices(g.node, g.count, g.indices, mig_profiles=(profile,) if profile else ()))
    return out


def slurm_attribution(job: SlurmJob, ctx: EventContext) -> Attribution:
    if ctx.attributor is None:
        return ctx.attribution(None)
    teams: frozenset[str] = frozenset()
    if ctx.identity is not None:
        entry = ctx.identity.lookup(job.user)
        teams = frozenset(entry.teams) if entry else frozenset()
    return ctx.attributor.resolve_slurm(job.user, job.wckey, job.comment, job.account, teams)


def het_gang_sizes(jobs: Iterable[SlurmJob]) -> dict[str, int]:
    """Devices of each heterogeneous job, over all its components (a het job is one gang)."""
    out: dict[str, int] = {}
    for j in jobs:
        if j.het_job_id:
            out[j.het_job_id] = out.get(j.het_job_id, 0) + (j.gpu_count or sum(g.count for g in j.gpus))
    return out


def slurm_event(
    job: SlurmJob,
    event_type: str,
    ts_ms: int,
    ctx: EventContext,
    *,
    id_extra: tuple[str, ...] = (),
    gang_size: int | None = None,
) -> dict[str, Any]:
    comment = parse_comment_pairs(job.comment)
    exit_state = job.state if event_type == "ENDED" else None
    if event_type == "ENDED" and exit_state in ("RUNNING", "SUSPENDED", "PENDING"):
        exit_state = "UNKNOWN"
    return job_event(
        ctx,
        event_type=event_type,
        ts_ms=ts_ms,
        scheduler="SLURM",
        job_id=job.job_id,
        user=job.user,
        user_uid=job.user_uid,
        user_source="SCHEDULER" if job.user != "unknown" else None,  # slurmctld's own word (munge-authenticated)
        attribution=slurm_attribution(job, ctx),
        held=held_devices(job),
        id_extra=id_extra,
        gang_size=gang_size or job.gpu_count or sum(g.count for g in job.gpus),
        array_job_id=job.array_job_id,
        array_task_id=job.array_task_id,
        het_job_id=job.het_job_id,
        het_job_offset=job.het_job_offset,
        gang_id=f"{job.het_job_id}" if job.het_job_id else None,
        job_name=job.name,
        account=job.account,
        partition=job.partition,
        qos=job.qos,
        preemptible=(job.qos or "") in ctx.preemptible_qos or (job.partition or "") in ctx.preemptible_partitions,
        interactive=job.batch is False or (job.partition or "") in ctx.interactive_partitions,
        checkpointable=comment.get(ctx.checkpoint_comment_key, "").lower() in _TRUE,
        requested_devices=job.gpu_count,
        submit_ts_ms=job.submit_ms,
        start_ts_ms=job.start_ms,
        end_ts_ms=job.end_ms if event_type == "ENDED" else None,
        exit_state=exit_state,
        exit_code=job.exit_code if event_type == "ENDED" else None,
    )


def lifecycle_events(job: SlurmJob, ctx: EventContext, gang_size: int | None = None) -> list[dict[str, Any]]:
    """Every event one record alone implies (for `inspect` and first sight): SUBMITTED/STARTED/ENDED..."""

    def ev(etype: str, ts: int) -> dict[str, Any]:
        return slurm_event(job, etype, ts, ctx, gang_size=gang_size)

    out: list[dict[str, Any]] = []
    if job.state == "PENDING" or (job.submit_ms is not None and job.start_ms is None and not job.terminal):
        if job.submit_ms is not None:
            out.append(ev("SUBMITTED", job.submit_ms))
        return out
    if job.start_ms is not None:
        out.append(ev("STARTED", job.start_ms))
    if job.state == "SUSPENDED":
        out.append(ev("SUSPENDED", job.suspend_ms or job.start_ms or 0))
    if job.state == "REQUEUED" and job.end_ms is not None:
        out.append(ev("REQUEUED", job.end_ms))
    if job.terminal and job.end_ms is not None:
        out.append(ev("ENDED", job.end_ms))
    return out
