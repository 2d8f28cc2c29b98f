"""Turn spooled Prolog/Epilog records (deploy/slurm/gpuledger_hook.py) into job events and send them.

Per-node events: a multi-node job's prolog runs on every node, so each node's STARTED carries that
node's devices only and its `event_id` includes the node. Files are deleted only after the publisher's
flush succeeded; an unreadable file moves to `<spool>/bad/` with the reason next to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuledger.errors import ParseError
from producers.jobevents import EventContext, EventSink, HeldDevices, job_event
from producers.projects import Attribution
from producers.slurm import parse_index_list
from schemas.topics import JOB_EVENTS, job_key


@dataclass(frozen=True, slots=True)
class HookRecord:
    kind: str  # start, end
    node: str
    job_id: str
    numeric_id: int
    user: str
    ts_ms: int
    env: Mapping[str, str]
    indices: tuple[int, ...]
    uuids: tuple[str, ...]


def _gpu_env(env: Mapping[str, str]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """SLURM_JOB_GPUS (`0,1` or `0-3`), else CUDA_VISIBLE_DEVICES (indices, or GPU-/MIG- UUIDs)."""
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        value = (env.get(var) or "").strip()
        if not value or value.lower() in ("nodevfiles", "none", "n/a"):
            continue
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if all(p.startswith(("GPU-", "MIG-")) for p in parts):
            return (), tuple(parts)
        try:
            return parse_index_list(value), ()
        except ValueError:
            continue
    return (), ()


def parse_hook_record(data: Mapping[str, Any]) -> HookRecord:
    try:
        env = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
        kind = str(data["kind"])
        numeric_text = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        numeric = int(numeric_text)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ParseError(f"spool record without kind/job id: {exc}") from exc
    if kind not in ("start", "end"):
        raise ParseError(f"spool record kind {kind!r} is not start/end")
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    het_job, het_off = env.get("SLURM_HET_JOB_ID") or env.get("SLURM_PACK_JOB_ID"), env.get("SLURM_HET_JOB_OFFSET")
    if array_job and array_task and array_task.isdigit():
        job_id = f"{array_job}_{array_task}"
    elif het_job and het_off and het_off.isdigit():
        job_id = f"{het_job}+{het_off}"
    else:
        job_id = str(numeric)
    ts_var = "SLURM_JOB_START_TIME" if kind == "start" else "SLURM_JOB_END_TIME"
    ts_text = env.get(ts_var, "")
    hook_ts = int(data.get("hook_ts_ms") or 0)
    ts_ms = int(ts_text) * 1000 if ts_text.isdigit() and int(ts_text) > 0 else hook_ts
    if kind == "end" and ts_ms > hook_ts > 0:
        ts_ms = hook_ts  # END_TIME in the epilog can be the projected limit: the job is over now
    indices, uuids = _gpu_env(env)
    return HookRecord(
        kind=kind,
        node=str(data.get("host") or env.get("SLURMD_NODENAME") or "unknown"),
        job_id=job_id,
        numeric_id=numeric,
        user=env.get("SLURM_JOB_USER") or env.get("SLURM_JOB_UID") or "unknown",
        ts_ms=ts_ms,
        env=env,
        indices=indices,
        uuids=uuids,
    )


def hook_event(rec: HookRecord, ctx: EventContext) -> dict[str, Any]:
    env = rec.env
    attribution = Attribution(None, "MISSING", "NOT_CHECKED")
    if ctx.attributor is not None:
        teams: frozenset[str] = frozenset()
        if ctx.identity is not None:
            entry = ctx.identity.lookup(rec.user)
            teams = frozenset(entry.teams) if entry else frozenset()
        attribution = ctx.attributor.resolve_slurm(
            rec.user, env.get("SLURM_JOB_WCKEY") or env.get("SLURM_WCKEY"), env.get("SLURM_JOB_COMMENT"),
            env.get("SLURM_JOB_ACCOUNT"), teams,
        )
    count = len(rec.indices) or len(rec.uuids)
    held = [HeldDevices(rec.node, count, rec.indices, rec.uuids)] if count else []
    etype = "STARTED" if rec.kind == "start" else "ENDED"
    exit_code = None
    code_text = env.get("SLURM_JOB_EXIT_CODE2") or env.get("SLURM_JOB_EXIT_CODE") or ""
    head = code_text.split(":", 1)[0]
    if head.isdigit():
        exit_code = int(head)
    task = env.get("SLURM_ARRAY_TASK_ID", "")
    offset = env.get("SLURM_HET_JOB_OFFSET", "")
    het = env.get("SLURM_HET_JOB_ID") or env.get("SLURM_PACK_JOB_ID")
    return job_event(
        ctx,
        event_type=etype,
        ts_ms=rec.ts_ms,
        scheduler="SLURM",
        job_id=rec.job_id,
        user=rec.user,
        attribution=attribution,
        held=held,
        id_extra=("node", rec.node),
        gang_size=count,
        job_name=env.get("SLURM_JOB_NAME"),
        account=env.get("SLURM_JOB_ACCOUNT"),
        partition=env.get("SLURM_JOB_PARTITION"),
        qos=env.get("SLURM_JOB_QOS"),
        array_job_id=env.get("SLURM_ARRAY_JOB_ID") if task.isdigit() else None,
        array_task_id=int(task) if task.isdigit() else None,
        het_job_id=het if offset.isdigit() else None,
        het_job_offset=int(offset) if offset.isdigit() and het else None,
        gang_id=het if offset.isdigit() and het else None,
        requested_devices=count,
        start_ts_ms=rec.ts_ms if etype == "STARTED" else None,
        end_ts_ms=rec.ts_ms if etype == "ENDED" else None,
        exit_state=("COMPLETED" if exit_code == 0 else "FAILED") if etype == "ENDED" and exit_code is not None
        else ("UNKNOWN" if etype == "ENDED" else None),
        exit_code=exit_code if etype == "ENDED" else None,
    )


def drain(spool: Path, ctx: EventContext, sink: EventSink, flush: Callable[[], None]) -> tuple[int, int]:
    """Publish every spooled record, flush, then delete what was sent. Returns (sent, bad)."""
    if not spool.is_dir():
        return 0, 0
    files = sorted(p for p in spool.glob("*.json") if not p.name.startswith("."))
    sent: list[Path] = []
    bad = 0
    for path in files:
        try:
            rec = parse_hook_record(json.loads(path.read_text(encoding="utf-8")))
        except (ParseError, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
            bad_dir = spool / "bad"
            bad_dir.mkdir(exist_ok=True)
            path.replace(bad_dir / path.name)
            (bad_dir / (path.name + ".reason")).write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
            bad += 1
            continue
        ev = hook_event(rec, ctx)
        sink.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)
        sent.append(path)
    if sent:
        flush()  # raises when Kafka did not acknowledge: the files stay for the next round
        for path in sent:
            path.unlink(missing_ok=True)
    return len(sent), bad
