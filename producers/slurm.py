"""Pure parsers for what Slurm prints: squeue/slurmrestd JSON, sacct JSON, `scontrol show job -d` text.

Every format is normalised to one frozen `SlurmJob`. No IO here: callers hand in text or decoded JSON.

Formats accepted (auto-detected by `parse_capture`):
- slurmctld job lists (`squeue --json`, slurmrestd `/slurm/v0.0.3x-v0.0.44/jobs`): records carry `job_state`
  (a string in the old openapi plugins, a list of base state + flags from data_parser v0.0.40 on); numbers
  are plain ints or `{"set", "infinite", "number"}` wrappers; per-node GPU indices come from `gres_detail`.
- slurmdbd job lists (`sacct --json`, slurmrestd `/slurmdb/...`): records carry `state.current` (a string
  in openapi dbv0.0.37, a list from v0.0.40) and `time.{submission,start,end}`; GPUs only as a TRES count.
- `scontrol show job -d` text, with per-node lines in the old `GRES_IDX=gpu(IDX:0,2-3)` style and the
  newer `JOB_GRES=` / `GRES=gpu:type:N(IDX:...)` style.

The text comes from outside (and job names, comments and wckeys from users), so every expansion is
bounded before it allocates: a hostlist names at most `MAX_HOSTS` hosts (`a[1-99999999]` is refused
from its bounds, not by expanding it), an index list at most `MAX_NODE_GPUS` indices below
`MAX_GPU_INDEX`, a node at most `MAX_NODE_GPUS` devices, a job at most `MAX_JOB_GPUS`. Anything else that
does not parse is a `ParseError`, never a bare ValueError or TypeError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from functools import lru_cache
from typing import Any

from base.errors import ParseError
from base.untrusted import parses_untrusted, small_int

MAX_HOSTS = 65_536  # hosts one hostlist expression may name (the largest clusters have ~10,000 nodes)
MAX_HOSTLIST_BRACKETS = 16  # bracket groups in one host pattern (`r[1-2]n[1-4]` has two)
MAX_NODE_GPUS = 1_024  # devices (GPUs or MIG instances) one node may hold in a record
MAX_GPU_INDEX = 65_535
MAX_JOB_GPUS = 1 << 24  # GPUs one job may hold in a record

BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "REQUEUED",
        "RESIZING",
        "REVOKED",
    }
)
# States after which the job holds nothing any more.
TERMINAL_STATES = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
     "REVOKED"}
)
ACTIVE_STATES = frozenset({"RUNNING", "SUSPENDED"})

_STATE_ABBREV = {
    "PD": "PENDING",
    "R": "RUNNING",
    "S": "SUSPENDED",
    "CD": "COMPLETED",
    "CA": "CANCELLED",
    "F": "FAILED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "PR": "PREEMPTED",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "OOM": "OUT_OF_MEMORY",
    "RQ": "REQUEUED",
}


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """GPUs a job holds on one node: indices when Slurm printed them, else only a count."""

    node: str
    count: int
    indices: tuple[int, ...] = ()
    gpu_type: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.count <= MAX_NODE_GPUS:
            raise ParseError(f"{self.count} GPUs on node {self.node[:80]!r}: more than {MAX_NODE_GPUS} per node")


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job record, whichever Slurm output it came from. Times are UTC epoch milliseconds."""

    job_id: str  # as Slurm prints it: 1234, 1234_7 (array task), 1234_[1-9] (pending array), 1234+1 (het part)
    numeric_id: int
    state: str  # base state (RUNNING, COMPLETED, ...)
    user: str
    source: str  # squeue-json, sacct-json, scontrol
    state_flags: tuple[str, ...] = ()
    user_uid: str | None = None  # the POSIX uid beside the name, where the source prints it (sacct does not)
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    wckey: str | None = None
    comment: str | None = None
    cluster: str | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None
    het_job_id: str | None = None
    het_job_offset: int | None = None
    submit_ms: int | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    suspend_ms: int | None = None
    nodes: tuple[str, ...] = ()
    gpus: tuple[NodeGpus, ...] = ()
    gpu_count: int = 0
    exit_code: int | None = None
    state_reason: str | None = None
    batch: bool | None = None
    restarts: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def has_indices(self) -> bool:
        return bool(self.gpus) and all(g.indices for g in self.gpus if g.count)


@dataclass(frozen=True, slots=True)
class Capture:
    """What a captured file held: its detected kind and the jobs in it."""

    kind: str  # squeue-json, sacct-json, scontrol
    jobs: tuple[SlurmJob, ...]
    slurm_version: str | None = None
    data_parser: str | None = None
    nodes: tuple[SlurmNode, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class SlurmNode:
    """A node's GPU inventory as Slurm sees it (scontrol show node, slurmrestd nodes)."""

    name: str
    gpu_count: int
    gpu_type: str | None
    used_indices: tuple[int, ...]


# ------------------------------------------------------------------------------------------------
# Small grammars: hostlists, index ranges, gres strings


@lru_cache(maxsize=8192)
def expand_hostlist(expr: str | None) -> tuple[str, ...]:
    """`gpu[1-2],cn[01-03,07]-ib` -> ('gpu1', 'gpu2', 'cn01-ib', ...). Empty/`(null)`/`None assigned` -> ().

    More than `MAX_HOSTS` hosts is a `ParseError`, found from the ranges' bounds before expanding."""
    if not expr:
        return ()
    expr = expr.strip()
    if expr in ("(null)", "None assigned", "N/A", "None"):
        return ()
    out: list[str] = []
    for part in _split_top(expr, ","):
        out.extend(_expand_one(part.strip(), MAX_HOSTS - len(out), expr))
    return tuple(h for h in out if h)


def _split_top(text: str, sep: str) -> list[str]:
    """Split on `sep` outside brackets/parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in parts if p != ""]


def _bracket_items(body: str, expr: str) -> list[tuple[int, int, int] | str]:
    """`01-03,07` -> [(1, 3, 2), '07']: ranges as (lo, hi, zero-pad width), single names as text."""
    out: list[tuple[int, int, int] | str] = []
    for rng in body.split(","):
        if "-" not in rng:
            out.append(rng)
            continue
        lo, hi = rng.split("-", 1)
        what = f"hostlist {expr[:80]!r}: range {rng[:40]!r}"
        out.append((small_int(lo, what, 10**18), small_int(hi, what, 10**18), len(lo) if lo.startswith("0") else 0))
    return out


def _expand_one(part: str, budget: int, expr: str) -> list[str]:
    """The hosts of one pattern; more than `budget` is a `ParseError`."""
    lb = part.find("[")
    if lb < 0:
        return [part]
    if part.count("[") > MAX_HOSTLIST_BRACKETS:
        raise ParseError(f"hostlist {expr[:80]!r}: more than {MAX_HOSTLIST_BRACKETS} bracket groups in one name")
    rb = part.find("]", lb)
    if rb < 0:
        raise ParseError(f"unbalanced hostlist {part[:80]!r}")
    prefix, body, suffix = part[:lb], part[lb + 1 : rb], part[rb + 1 :]
    items = _bracket_items(body, expr)
    n = sum(1 if isinstance(it, str) else max(0, it[1] - it[0] + 1) for it in items)
    if n > budget:
        raise ParseError(f"hostlist {expr[:80]!r} names more than {MAX_HOSTS} hosts")
    if n == 0:
        return []
    rests = _expand_one(suffix, budget // n, expr)
    if n * len(rests) > budget:
        raise ParseError(f"hostlist {expr[:80]!r} names more than {MAX_HOSTS} hosts")
    out: list[str] = []
    for it in items:
        if isinstance(it, str):
            out.extend(prefix + it + rest for rest in rests)
        else:
            lo, hi, width = it
            for k in range(lo, hi + 1):
                out.extend(prefix + str(k).zfill(width) + rest for rest in rests)
    return out


def parse_index_list(text: str) -> tuple[int, ...]:
    """`0,2-3,5` -> (0, 2, 3, 5); `N/A` or empty -> (). At most `MAX_NODE_GPUS` indices, each at most
    `MAX_GPU_INDEX`; anything else is a `ParseError`."""
    text = text.strip()
    if not text or text.upper() == "N/A":
        return ()
    out: list[int] = []
    what = f"GPU index list {text[:80]!r}"
    for piece in text.split(","):
        piece = piece.strip()
        if not piece:
            continue
        if "-" in piece:
            lo, hi = piece.split("-", 1)
            first, last = small_int(lo.strip(), what, MAX_GPU_INDEX), small_int(hi.strip(), what, MAX_GPU_INDEX)
            if len(out) + last - first + 1 > MAX_NODE_GPUS:
                raise ParseError(f"{what}: more than {MAX_NODE_GPUS} indices")
            out.extend(range(first, last + 1))
        else:
            if len(out) >= MAX_NODE_GPUS:
                raise ParseError(f"{what}: more than {MAX_NODE_GPUS} indices")
            out.append(small_int(piece, what, MAX_GPU_INDEX))
    return tuple(out)


_GRES_ITEM = re.compile(r"^(?P<name>[^:(]+)(?::(?P<a>[^:(]+))?(?::(?P<b>[^:(]+))?(?:\((?P<detail>[^)]*)\))?$")


@dataclass(frozen=True, slots=True)
class GresItem:
    name: str
    gpu_type: str | None
    count: int | None
    indices: tuple[int, ...]


@lru_cache(maxsize=8192)
def parse_gres(text: str | None) -> tuple[GresItem, ...]:
    """Parse a gres string: `gpu:h100:4(IDX:0-3)`, `gpu(IDX:0,2-3,5)`, `gg:g0(CNT:1),gpu:1(IDX:3)`, `gpu:4`."""
    if not text:
        return ()
    text = text.strip()
    if text in ("(null)", "N/A"):
        return ()
    items: list[GresItem] = []
    for raw in _split_top(text, ","):
        raw = raw.strip()
        m = _GRES_ITEM.match(raw)
        if not m:
            raise ParseError(f"cannot parse gres item {raw!r} in {text!r}")
        name = m.group("name")
        if name.startswith("gres/"):
            name = name[5:]
        a, b = m.group("a"), m.group("b")
        gpu_type: str | None = None
        count: int | None = None
        for tok in (a, b):
            if tok is None:
                continue
            if tok.isascii() and tok.isdigit():
                count = small_int(tok, f"gres {text[:80]!r}", MAX_JOB_GPUS)  # also mps/shard counts
            elif gpu_type is None:
                gpu_type = tok
        indices: tuple[int, ...] = ()
        detail = m.group("detail")
        if detail:
            for piece in detail.split(")("):
                if piece.startswith("IDX:"):
                    indices = parse_index_list(piece[4:])
                elif piece.startswith("CNT:") and count is None:
                    count = small_int(piece[4:], f"gres {text[:80]!r}", MAX_JOB_GPUS)
        if count is None and indices:
            count = len(indices)
        items.append(GresItem(name, gpu_type, count, indices))
    return tuple(items)


def gpus_in_tres(tres: str | None) -> int | None:
    """`cpu=4,mem=80G,gres/gpu=4` -> 4 (only the untyped `gres/gpu`, to avoid counting typed duplicates)."""
    if not tres:
        return None
    for piece in tres.split(","):
        key, _, value = piece.partition("=")
        if key.strip() == "gres/gpu":
            value = value.strip()
            if not (value.isascii() and value.isdigit()):
                return None
            return small_int(value, f"TRES {tres[:80]!r}", MAX_JOB_GPUS)
    return None


def gpus_in_tres_per(spec: str | None) -> int | None:
    """`gres/gpu:8`, `gpu:h100:2`, `gres/gpu:a100=2`, `gres:gpu:a100:2` (Slurm 22.05's squeue --json)
    (tres_per_job/tres_per_node) -> count of GPUs."""
    if not spec:
        return None
    total = None
    for piece in spec.split(","):
        piece = piece.strip()
        if piece.startswith(("gres/", "gres:")):
            piece = piece[5:]
        if not piece.startswith("gpu"):
            continue
        tail = re.split(r"[:=]", piece)[-1]
        total = (total or 0) + (small_int(tail, f"TRES {spec[:80]!r}", MAX_JOB_GPUS) if tail.isdigit() else 1)
    return total


def _gpus_on_nodes(nodes: tuple[str, ...], detail: list[str] | tuple[str, ...]) -> tuple[NodeGpus, ...]:
    """Pair `gres_detail` entries with the job's nodes (same order, one entry per node)."""
    out: list[NodeGpus] = []
    for node, text in zip(nodes, detail, strict=False):
        gpu_items = [g for g in parse_gres(text) if g.name == "gpu"]
        if not gpu_items:
            continue
        indices = tuple(sorted({i for g in gpu_items for i in g.indices}))
        count = sum((g.count or 0) for g in gpu_items) or len(indices)
        gtype = next((g.gpu_type for g in gpu_items if g.gpu_type), None)
        if count or indices:
            out.append(NodeGpus(node, max(count, len(indices)), indices, gtype))
    return tuple(out)


def even_split(nodes: tuple[str, ...], total: int | None) -> tuple[NodeGpus, ...]:
    """Only a job-wide GPU count is known: spread it evenly over the nodes (indices unknown)."""
    if not total or not nodes:
        return ()
    per, rest = divmod(total, len(nodes))
    return tuple(NodeGpus(n, per + (1 if i < rest else 0)) for i, n in enumerate(nodes) if per or i < rest)


# ------------------------------------------------------------------------------------------------
# Value helpers for the JSON dialects


def _num(value: Any) -> int | None:
    """Plain number, or the `{"set", "infinite", "number"}` wrapper of data_parser >= v0.0.39."""
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -_NUM_LIMIT <= value <= _NUM_LIMIT else None
    if isinstance(value, float):
        return int(value) if -_NUM_LIMIT <= value <= _NUM_LIMIT else None  # NaN and infinities fail both
    if isinstance(value, str):
        text = value.strip()
        digits = text[1:] if text.startswith("-") else text
        if digits.isascii() and digits.isdigit() and len(digits) <= 18:
            return int(text)
    return None


_NUM_LIMIT = (1 << 63) - 1  # Slurm's numbers are 64-bit at most


def _ts_ms(value: Any) -> int | None:
    secs = _num(value)
    if secs is None or secs <= 0:
        return None
    return secs * 1000


MAX_UID = 4_294_967_294  # uid_t is 32 bits; (uid_t)-1 means "no user"


def uid_text(value: Any) -> str | None:
    """A POSIX uid as the ledger keeps it (decimal text), from a number or digits; None when absent or not a
    uid (negative, above `MAX_UID`, not a number): the job then says its identifier is unknown."""
    if isinstance(value, str) and len(value.strip()) > 10:
        return None
    uid = _num(value)
    return str(uid) if uid is not None and 0 <= uid <= MAX_UID else None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        return None
    s = str(value).strip()
    return s or None


def parse_state(value: Any) -> tuple[str, tuple[str, ...]]:
    """Base state and flags from a string (`RUNNING`, `CANCELLED by 0`), a list, or an abbreviation."""
    if isinstance(value, str):
        items = [value.split(" ", 1)[0]]
    elif isinstance(value, list | tuple):
        items = [str(v) for v in value]
    else:
        items = []
    items = [_STATE_ABBREV.get(i.upper(), i.upper()) for i in items if i]
    base = next((i for i in items if i in BASE_STATES and i not in ("REQUEUED", "RESIZING")), None)
    if base is None:
        base = next((i for i in items if i in BASE_STATES), items[0] if items else "UNKNOWN")
    flags = tuple(i for i in items if i != base)
    return base, flags


def _exit_code(value: Any) -> int | None:
    if isinstance(value, Mapping):
        return _num(value.get("return_code"))
    if isinstance(value, str) and ":" in value:
        return _num(value.split(":", 1)[0])
    return _num(value)


def _job_id_text(
    numeric: int,
    array_job: int | None,
    array_task: int | None,
    array_string: str | None,
    het_job: int | None,
    het_offset: int | None,
) -> tuple[str, str | None, int | None, str | None, int | None]:
    """The job id as Slurm prints it, with the normalised array/het fields."""
    if array_job and array_task is not None:
        return f"{array_job}_{array_task}", str(array_job), array_task, None, None
    if array_string:
        return f"{numeric}_[{array_string}]", str(numeric), None, None, None
    if het_job and het_offset is not None:
        return f"{het_job}+{het_offset}", None, None, str(het_job), het_offset
    return str(numeric), None, None, None, None


def _when_ran(state: str, start: int | None, end: int | None, nodes: tuple[str, ...]) -> tuple[int | None, int | None]:
    """Slurm prints projected times for jobs that have not started/ended: keep only real ones. A completing job's
    run is over (a requeued one shows COMPLETING, then REQUEUED, on its way back to the queue): its end is real."""
    if state == "PENDING" or (state in TERMINAL_STATES and not nodes and state not in ("NODE_FAIL", "BOOT_FAIL")):
        return None, (end if state in TERMINAL_STATES else None)
    if state in TERMINAL_STATES or state in ("COMPLETING", "REQUEUED"):
        return start, end
    return start, None


# ------------------------------------------------------------------------------------------------
# slurmctld JSON (squeue --json, slurmrestd /slurm/.../jobs)


@parses_untrusted("slurmctld job record")
def parse_ctld_job(rec: Mapping[str, Any]) -> SlurmJob:
    numeric = _num(rec.get("job_id"))
    if numeric is None:
        raise ParseError(f"slurmctld job record without job_id: keys {sorted(rec)[:8]}")
    state, flags = parse_state(rec.get("job_state"))
    array_task = _num(rec.get("array_task_id"))
    array_job = _num(rec.get("array_job_id"))
    array_string = _text(rec.get("array_task_string")) if array_task is None else None
    job_id, aj, at, hj, ho = _job_id_text(
        numeric, array_job, array_task, array_string, _num(rec.get("het_job_id")), _num(rec.get("het_job_offset"))
    )
    nodes = expand_hostlist(_text(rec.get("nodes")))
    if not nodes:
        res = rec.get("job_resources") or {}
        res_nodes = res.get("nodes") if isinstance(res, Mapping) else None
        if isinstance(res_nodes, Mapping):
            nodes = expand_hostlist(_text(res_nodes.get("list")))
        elif isinstance(res.get("allocated_nodes"), list):  # openapi v0.0.36-38
            nodes = tuple(str(n.get("nodename")) for n in res["allocated_nodes"] if isinstance(n, Mapping))
    detail = rec.get("gres_detail") or []
    gpus = _gpus_on_nodes(nodes, detail) if isinstance(detail, list) else ()
    count = sum(g.count for g in gpus) or (
        gpus_in_tres(_text(rec.get("tres_alloc_str")))
        or gpus_in_tres_per(_text(rec.get("tres_per_job")))
        or ((gpus_in_tres_per(_text(rec.get("tres_per_node"))) or 0) * max(len(nodes), 1))
        or gpus_in_tres(_text(rec.get("tres_req_str")))
        or 0
    )
    if not gpus and state in ACTIVE_STATES | TERMINAL_STATES:
        gpus = even_split(nodes, count)
    start, end = _when_ran(state, _ts_ms(rec.get("start_time")), _ts_ms(rec.get("end_time")), nodes)
    uid = uid_text(rec.get("user_id"))
    user = _text(rec.get("user_name")) or uid or "unknown"
    batch = rec.get("batch_flag")
    return SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        state=state,
        state_flags=flags,
        user=user,
        user_uid=uid,
        source="squeue-json",
        name=_text(rec.get("name")),
        account=_text(rec.get("account")),
        partition=_text(rec.get("partition")),
        qos=_text(rec.get("qos")),
        wckey=_text(rec.get("wckey")),
        comment=_text(rec.get("comment")),
        cluster=_text(rec.get("cluster")),
        array_job_id=aj,
        array_task_id=at,
        het_job_id=hj,
        het_job_offset=ho,
        submit_ms=_ts_ms(rec.get("submit_time")),
        start_ms=start,
        end_ms=end,
        suspend_ms=_ts_ms(rec.get("suspend_time")),
        nodes=nodes,
        gpus=gpus,
        gpu_count=count,
        exit_code=_exit_code(rec.get("exit_code")),
        state_reason=_text(rec.get("state_reason")),
        batch=bool(batch) if isinstance(batch, bool) else None,
        restarts=_num(rec.get("restart_cnt")),
    )


# ------------------------------------------------------------------------------------------------
# slurmdbd JSON (sacct --json, slurmrestd /slurmdb/.../jobs)


def _tres_gpus(tres_list: Any) -> int | None:
    if not isinstance(tres_list, list):
        return None
    for t in tres_list:
        if isinstance(t, Mapping) and t.get("type") == "gres" and t.get("name") == "gpu":
            return _num(t.get("count"))
    return None


@parses_untrusted("slurmdbd job record")
def parse_dbd_job(rec: Mapping[str, Any]) -> SlurmJob:
    numeric = _num(rec.get("job_id"))
    if numeric is None:
        raise ParseError(f"slurmdbd job record without job_id: keys {sorted(rec)[:8]}")
    st = rec.get("state") or {}
    state, flags = parse_state(st.get("current") if isinstance(st, Mapping) else st)
    array = rec.get("array") or {}
    het = rec.get("het") or {}
    array_task = _num(array.get("task_id"))
    array_string = _text(array.get("task")) if array_task is None else None
    job_id, aj, at, hj, ho = _job_id_text(
        numeric,
        _num(array.get("job_id")),
        array_task,
        array_string,
        _num(het.get("job_id")),
        _num(het.get("job_offset")),
    )
    nodes = expand_hostlist(_text(rec.get("nodes")))
    tres = rec.get("tres") or {}
    alloc = _tres_gpus(tres.get("allocated"))
    count = alloc if alloc is not None else (_tres_gpus(tres.get("requested")) or 0)
    gpus = even_split(nodes, count) if state in ACTIVE_STATES | TERMINAL_STATES or state == "REQUEUED" else ()
    t = rec.get("time") or {}
    start, end = _when_ran(state, _ts_ms(t.get("start")), _ts_ms(t.get("end")), nodes)
    if state == "REQUEUED":  # the requeued run of the record did run: keep its times
        start, end = _ts_ms(t.get("start")), _ts_ms(t.get("end"))
    wckey = rec.get("wckey")
    comment = rec.get("comment")
    return SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        state=state,
        state_flags=flags,
        user=_text(rec.get("user")) or _text((rec.get("association") or {}).get("user")) or "unknown",
        source="sacct-json",
        name=_text(rec.get("name")),
        account=_text(rec.get("account")),
        partition=_text(rec.get("partition")),
        qos=_text(rec.get("qos")),
        wckey=_text(wckey.get("wckey")) if isinstance(wckey, Mapping) else _text(wckey),
        comment=_text(comment.get("job")) if isinstance(comment, Mapping) else _text(comment),
        cluster=_text(rec.get("cluster")),
        array_job_id=aj,
        array_task_id=at,
        het_job_id=hj,
        het_job_offset=ho,
        submit_ms=_ts_ms(t.get("submission")),
        start_ms=start,
        end_ms=end,
        nodes=nodes,
        gpus=gpus,
        gpu_count=count,
        exit_code=_exit_code(rec.get("exit_code")),
        state_reason=_text(st.get("reason")) if isinstance(st, Mapping) else None,
    )


# ------------------------------------------------------------------------------------------------
# scontrol show job -d / scontrol show node


_KEY = re.compile(r"(?:(?<=\s)|^)([A-Za-z_][A-Za-z0-9_:/]*)=")


def _kv_line(line: str) -> list[tuple[str, str]]:
    """`A=1 B=x y C=` -> [(A, 1), (B, 'x y'), (C, '')]: values run to the next key."""
    matches = list(_KEY.finditer(line))
    out: list[tuple[str, str]] = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out.append((m.group(1), line[m.end() : end].strip()))
    return out


def _scontrol_records(text: str) -> Iterator[list[str]]:
    block: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            if block:
                yield block
                block = []
            continue
        if block and not line[:1].isspace() and (line.startswith("JobId=") or line.startswith("NodeName=")):
            yield block
            block = []
        block.append(line)
    if block:
        yield block


def _scontrol_time(value: str | None, tz: tzinfo) -> int | None:
    if not value or value in ("Unknown", "None", "N/A", "(null)"):
        return None
    try:
        dt = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=tz)
    except ValueError as exc:
        raise ParseError(f"bad scontrol time {value!r}") from exc
    return int(dt.timestamp() * 1000)


def _name_in_parens(value: str | None) -> str | None:
    """`user1(100)` -> `user1`."""
    if not value:
        return None
    return value.split("(", 1)[0] or None


def _id_in_parens(value: str | None) -> str | None:
    """`user1(100)` -> `100` (the uid); None when there is no `(digits)` after the name."""
    if not value or not value.endswith(")") or "(" not in value:
        return None
    return uid_text(value[value.rindex("(") + 1 : -1])


def _scontrol_opt(value: str | None) -> str | None:
    if value is None or value in ("(null)", "N/A", ""):
        return None
    return value


@parses_untrusted("scontrol job record")
def parse_scontrol_job(lines: list[str], tz: tzinfo = UTC) -> SlurmJob:
    fields: dict[str, str] = {}
    node_lines: list[dict[str, str]] = []
    for line in lines:
        pairs = _kv_line(line)
        if pairs and pairs[0][0] == "Nodes":
            node_lines.append(dict(pairs))
            continue
        for k, v in pairs:
            fields.setdefault(k, v)
    numeric = _num(fields.get("JobId", ""))
    if numeric is None or numeric < 0:
        raise ParseError(f"scontrol record without a numeric JobId: {lines[0][:80]!r}")
    state, flags = parse_state(fields.get("JobState", ""))

    def opt_int(key: str) -> int | None:
        v = _num(fields.get(key))
        return v if v is not None and v >= 0 else None

    job_id, aj, at, hj, ho = _job_id_text(
        numeric, opt_int("ArrayJobId"), opt_int("ArrayTaskId"), None, opt_int("HetJobId"), opt_int("HetJobOffset")
    )
    nodes = expand_hostlist(_scontrol_opt(fields.get("NodeList")))
    gpus: list[NodeGpus] = []
    for nl in node_lines:
        gres = nl.get("GRES") if "GRES" in nl else nl.get("GRES_IDX")
        items = [g for g in parse_gres(gres) if g.name == "gpu"]
        if not items:
            continue
        indices = tuple(sorted({i for g in items for i in g.indices}))
        count = max(sum(g.count or 0 for g in items), len(indices))
        gtype = next((g.gpu_type for g in items if g.gpu_type), None)
        gpus.extend(NodeGpus(n, count, indices, gtype) for n in expand_hostlist(nl.get("Nodes")))
    count = sum(g.count for g in gpus) or gpus_in_tres(fields.get("TRES")) or 0
    if not gpus and state in ACTIVE_STATES | TERMINAL_STATES:
        gpus = list(even_split(nodes, count))
    start, end = _when_ran(
        state, _scontrol_time(fields.get("StartTime"), tz), _scontrol_time(fields.get("EndTime"), tz), nodes
    )
    wckey = _scontrol_opt(fields.get("WCKey"))
    if wckey is not None:
        wckey = wckey.lstrip("*") or None  # a leading `*` marks the user's default wckey
    batch = fields.get("BatchFlag")
    return SlurmJob(
        job_id=job_id,
        numeric_id=numeric,
        state=state,
        state_flags=flags,
        user=_name_in_parens(fields.get("UserId")) or "unknown",
        user_uid=_id_in_parens(fields.get("UserId")),
        source="scontrol",
        name=_scontrol_opt(fields.get("JobName")),
        account=_scontrol_opt(fields.get("Account")),
        partition=_scontrol_opt(fields.get("Partition")),
        qos=_scontrol_opt(fields.get("QOS")),
        wckey=wckey,
        comment=_scontrol_opt(fields.get("Comment")),
        cluster=None,
        array_job_id=aj,
        array_task_id=at,
        het_job_id=hj,
        het_job_offset=ho,
        submit_ms=_scontrol_time(fields.get("SubmitTime"), tz),
        start_ms=start,
        end_ms=end,
        suspend_ms=_scontrol_time(fields.get("SuspendTime"), tz),
        nodes=nodes,
        gpus=tuple(gpus),
        gpu_count=count,
        exit_code=_exit_code(fields.get("ExitCode")),
        state_reason=_scontrol_opt(fields.get("Reason")),
        batch=(batch == "1") if batch in ("0", "1") else None,
        restarts=opt_int("Restarts"),
    )


@parses_untrusted("scontrol node record")
def parse_scontrol_node(lines: list[str]) -> SlurmNode:
    fields: dict[str, str] = {}
    for line in lines:
        for k, v in _kv_line(line):
            fields.setdefault(k, v)
    name = fields.get("NodeName", "")
    gres = [g for g in parse_gres(fields.get("Gres")) if g.name == "gpu"]
    used = [g for g in parse_gres(fields.get("GresUsed")) if g.name == "gpu"]
    return SlurmNode(
        name=name,
        gpu_count=sum(g.count or 0 for g in gres),
        gpu_type=next((g.gpu_type for g in gres if g.gpu_type), None),
        used_indices=tuple(sorted({i for g in used for i in g.indices})),
    )


@parses_untrusted("scontrol text")
def parse_scontrol_text(text: str, tz: tzinfo = UTC) -> Capture:
    jobs: list[SlurmJob] = []
    nodes: list[SlurmNode] = []
    for block in _scontrol_records(text):
        if block[0].startswith("JobId="):
            jobs.append(parse_scontrol_job(block, tz))
        elif block[0].startswith("NodeName="):
            nodes.append(parse_scontrol_node(block))
        else:
            raise ParseError(f"unrecognised scontrol record starting {block[0][:60]!r}")
    return Capture("scontrol", tuple(jobs), nodes=tuple(nodes))


# ------------------------------------------------------------------------------------------------
# Detection


def _ctld_node(rec: Mapping[str, Any]) -> SlurmNode:
    gres = [g for g in parse_gres(_text(rec.get("gres"))) if g.name == "gpu"]
    used = [g for g in parse_gres(_text(rec.get("gres_used"))) if g.name == "gpu"]
    return SlurmNode(
        name=str(rec.get("name")),
        gpu_count=sum(g.count or 0 for g in gres),
        gpu_type=next((g.gpu_type for g in gres if g.gpu_type), None),
        used_indices=tuple(sorted({i for g in used for i in g.indices})),
    )


# slurmdbd's "Nothing found with query" (ESLURM_REST_EMPTY_RESULT): `sacct --json` over a window without
# jobs exits 0 with this error and `"jobs": []` (Slurm 22.05, seen on the live cluster of the tests).
EMPTY_RESULT_ERROR = 9003


def _empty_result(error: Any) -> bool:
    return isinstance(error, Mapping) and _num(error.get("error_number")) == EMPTY_RESULT_ERROR


@parses_untrusted("Slurm JSON document")
def parse_json_doc(doc: Mapping[str, Any]) -> Capture:
    meta = doc.get("meta") or {}
    plugin = meta.get("plugin") or {}
    slurm_meta = meta.get("slurm") or meta.get("Slurm") or {}
    version = slurm_meta.get("release") if isinstance(slurm_meta, Mapping) else None
    parser = plugin.get("data_parser") or plugin.get("type")
    errors = [e for e in doc.get("errors") or [] if not _empty_result(e)]
    if errors and not doc.get("jobs") and not doc.get("nodes"):
        raise ParseError(f"Slurm answered with errors: {json.dumps(errors)[:300]}")
    if "nodes" in doc and "jobs" not in doc:
        nodes = tuple(_ctld_node(n) for n in doc["nodes"] if isinstance(n, Mapping))
        return Capture("nodes-json", (), version, parser, nodes)
    recs = doc.get("jobs")
    if not isinstance(recs, list):
        raise ParseError("JSON document has no `jobs` list: not squeue/sacct/slurmrestd output")
    jobs: list[SlurmJob] = []
    kind = "squeue-json"
    for rec in recs:
        if not isinstance(rec, Mapping):
            raise ParseError("job record is not an object")
        if "job_state" in rec:
            jobs.append(parse_ctld_job(rec))
        elif "state" in rec and "time" in rec:
            kind = "sacct-json"
            jobs.append(parse_dbd_job(rec))
        else:
            raise ParseError(f"job record of unknown dialect (keys {sorted(rec)[:10]})")
    if (not recs and "dbv" in str(parser)) or "slurmdbd" in str(plugin.get("type", "")):
        kind = "sacct-json"
    return Capture(kind, tuple(jobs), version, parser)


@parses_untrusted("Slurm output")
def parse_capture(text: str, tz: tzinfo = UTC) -> Capture:
    """Auto-detect: JSON (squeue/sacct/slurmrestd) or scontrol text."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ParseError(f"invalid JSON at line {exc.lineno}: {exc.msg}") from exc
        return parse_json_doc(doc)
    if stripped.startswith("JobId=") or stripped.startswith("NodeName="):
        return parse_scontrol_text(text, tz)
    if not stripped or stripped.startswith("No jobs in the system"):
        return Capture("scontrol", ())
    raise ParseError("not squeue/sacct/slurmrestd JSON nor `scontrol show job -d` text")


def gpu_jobs(jobs: Iterable[SlurmJob]) -> list[SlurmJob]:
    return [j for j in jobs if j.gpu_count or j.gpus]
