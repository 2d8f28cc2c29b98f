"""Turn spooled Prolog/Epilog records (deploy/slurm/gpuledger_hook.py) into job events and send them.

Per-node events: a multi-node job's prolog runs on every node, so each node's STARTED carries that
node's devices only and its `event_id` includes the node. Files are deleted only after the publisher's
flush succeeded. The spool is writable by job hooks, so a file is untrusted: one that is too big
(`MAX_SPOOL_FILE_BYTES`), does not parse, or makes a record the contract refuses is quarantined to
`<spool>/bad/` with the reason next to it (`<name>.reason`), and the drain goes on with the next file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from base.errors import ContractError, ParseError
from base.untrusted import parses_untrusted
from producers.jobevents import EventContext, EventSink, HeldDevices, job_event
from producers.projects import Attribution
from producers.slurm import MAX_NODE_GPUS, parse_index_list, uid_text
from schemas.topics import JOB_EVENTS, job_key

log = logging.getLogger(__name__)

MAX_SPOOL_FILE_BYTES = 256 * 1024  # a hook record is ~2-10 KiB (the job's environment)
QUARANTINE_DIR = "bad"


@dataclass(frozen=True, slots=True)
class HookRecord:
    kind: str  # start, end
    node: str
    job_id: str
    numeric_id: int
    user: str
    user_uid: str | None  # SLURM_JOB_UID, which slurmd sets from the job's credential
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
            if len(parts) > MAX_NODE_GPUS:
                raise ParseError(f"{var} names {len(parts)} devices (at most {MAX_NODE_GPUS})")
            return (), tuple(parts)
        try:
            return parse_index_list(value), ()
        except ParseError:
            continue
    return (), ()


@parses_untrusted("spool record")
def parse_hook_record(data: Mapping[str, Any]) -> HookRecord:
    if not isinstance(data, Mapping):
        raise ParseError(f"spool record is a JSON {type(data).__name__}, not an object")
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
    hook_ts = data.get("hook_ts_ms") or 0
    if not isinstance(hook_ts, int) or isinstance(hook_ts, bool) or not 0 <= hook_ts < 1 << 62:
        raise ParseError(f"spool record hook_ts_ms {str(hook_ts)[:40]!r} is not epoch milliseconds")
    if not 0 <= numeric < 1 << 63:
        raise ParseError(f"spool record job id {numeric} is out of range")
    ts_ok = ts_text.isascii() and ts_text.isdigit() and len(ts_text) <= 12 and int(ts_text) > 0
    ts_ms = int(ts_text) * 1000 if ts_ok else hook_ts
    if kind == "end" and ts_ms > hook_ts > 0:
        ts_ms = hook_ts  # END_TIME in the epilog can be the projected limit: the job is over now
    indices, uuids = _gpu_env(env)
    uid = uid_text(env.get("SLURM_JOB_UID"))
    return HookRecord(
        kind=kind,
        node=str(data.get("host") or env.get("SLURMD_NODENAME") or "unknown"),
        job_id=job_id,
        numeric_id=numeric,
        user=env.get("SLURM_JOB_USER") or uid or "unknown",
        user_uid=uid,
        ts_ms=ts_ms,
        env=env,
        indices=indices,
        uuids=uuids,
    )


@parses_untrusted("spool record")
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
        user_uid=rec.user_uid,
        user_source="SCHEDULER" if rec.user != "unknown" else None,
        attribution=attribution,
        held=held,
        id_extra=("node", rec.node),
        gang_size=count,
        job_name=env.get("SLURM_JOB_NAME"),
        account=env.get("SLURM_JOB_ACCOUNT"),
        partition=env.get("SLURM_JOB_PARTITION"),
        qos=env.get("SLURM_JOB_QOS"),
        # as the poller's events say (slurm_events.slurm_event): the QOS the pricing names, or the partition
        preemptible=(env.get("SLURM_JOB_QOS") or "") in ctx.preemptible_qos
        or (env.get("SLURM_JOB_PARTITION") or "") in ctx.preemptible_partitions,
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


def read_hook_file(path: Path) -> HookRecord:
    """The record of one spool file; `ParseError` for one too big, unreadable or not a hook record."""
    try:
        size = path.stat().st_size
        if size > MAX_SPOOL_FILE_BYTES:
            raise ParseError(f"{size} bytes (at most {MAX_SPOOL_FILE_BYTES})")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParseError(f"unreadable: {type(exc).__name__}: {exc}") from exc
    return parse_hook_record(_json(text))


@parses_untrusted("spool file")
def _json(text: str) -> Any:
    return json.loads(text)


def quarantine(spool: Path, path: Path, exc: Exception) -> None:
    """Move `path` to `<spool>/bad/` with `<name>.reason` next to it (best effort: a failure is logged)."""
    try:
        bad_dir = spool / QUARANTINE_DIR
        bad_dir.mkdir(exist_ok=True)
        (bad_dir / (path.name + ".reason")).write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
        path.replace(bad_dir / path.name)
    except OSError as err:
        log.error("spool: cannot quarantine %s (%s): %s", path, exc, err)


def drain(spool: Path, ctx: EventContext, sink: EventSink, flush: Callable[[], None]) -> tuple[int, int]:
    """Publish every spooled record, flush, then delete what was sent. Returns (sent, quarantined)."""
    if not spool.is_dir():
        return 0, 0
    files = sorted(p for p in spool.glob("*.json") if not p.name.startswith("."))
    sent: list[Path] = []
    bad = 0
    for path in files:
        try:
            ev = hook_event(read_hook_file(path), ctx)
            sink.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)  # encodes: the contract may refuse
        except (ParseError, ContractError) as exc:
            quarantine(spool, path, exc)
            bad += 1
            continue
        sent.append(path)
    if sent:
        flush()  # raises when Kafka did not acknowledge: the files stay for the next round
        for path in sent:
            path.unlink(missing_ok=True)
    return len(sent), bad
