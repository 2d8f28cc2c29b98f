"""The fleet page's what-if (issue 43): a proposed policy's comparison with the month as stored, for operators and
finance. Pure: which proposals may be picked, how an upload is bounded and parsed, and the comparison
(`sinks.whatif.Comparison`, computed by `policy whatif`'s own function through `web.queries.whatif_comparison`)
as page tables. Nothing here enforces a policy or writes to the ledger.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from schemas.policy import MAX_FILE_BYTES, Policy, PolicyError, load_policy, parse_policy
from web.model import Column, Table
from web.params import BadRequest

MAX_UPLOAD_BYTES = MAX_FILE_BYTES  # the command's bound (`load_policy`)
MAX_PROPOSALS = 200  # files offered from the folder
CURRENT = "current"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}\.ya?ml")
BY = ("team", "project", "generation")

LINE_COLUMNS = (
    Column("line", "line"), Column("jobs", "jobs", "int"), Column("charge_actual", "charge (actual)", "money"),
    Column("charge_whatif", "charge (what if)", "money"), Column("charge_change", "change", "money"),
    Column("warnings_actual", "warnings (actual)", "int"), Column("warnings_whatif", "warnings (what if)", "int"),
    Column("reclaims_actual", "reclaims (actual)", "int"), Column("reclaims_whatif", "reclaims (what if)", "int"),
    Column("released_gpu_h", "released GPU-h", "gpu_h"), Column("released_idle_gpu_h", "released idle GPU-h", "gpu_h"),
    Column("released_cost", "released cost", "money"), Column("released_idle_cost", "released idle cost", "money"),
    Column("queued_jobs", "queued jobs", "int"), Column("queued_wait_h", "queued wait h", "minutes"),
)  # fmt: skip
EVENT_COLUMNS = (
    Column("scenario", "scenario"), Column("kind", "kind"), Column("time_utc", "time (UTC)"),
    Column("cluster", "cluster"), Column("job_id", "job"), Column("team", "team"), Column("project", "project"),
    Column("generation", "generation"), Column("action", "action"), Column("idle_minutes", "idle minutes", "int"),
)  # fmt: skip

RESERVATION_COLUMNS = (
    Column("reservation_id", "reservation"), Column("cluster", "cluster"), Column("team", "team"),
    Column("generation", "generation"), Column("gpus", "GPUs", "int"), Column("start_utc", "start (UTC)"),
    Column("end_utc", "end (UTC)"), Column("actual", "actual"), Column("whatif", "what if"), Column("why", "why"),
)  # fmt: skip


def proposals(folder: Path | None, in_force: Path | None) -> dict[str, Path]:
    """What may be picked, by name: `current` (the policy in force) and the folder's *.yaml / *.yml files
    (plain names only, at most MAX_PROPOSALS, in name order). A name not listed here is never opened."""
    out: dict[str, Path] = {}
    if in_force is not None:
        out[CURRENT] = in_force
    if folder is not None and folder.is_dir():
        names = sorted(p.name for p in folder.iterdir() if _NAME.fullmatch(p.name) and p.is_file())
        out.update((name, folder / name) for name in names[:MAX_PROPOSALS] if name != CURRENT)
    return out


def by(value: str | None) -> str:
    if value in (None, ""):
        return "team"
    if value not in BY:
        raise BadRequest(f"by must be one of {', '.join(BY)}")
    return str(value)


def picked(name: str | None, offered: dict[str, Path]) -> tuple[str, Policy | list[str]]:
    """(label, the policy or its problems) of a picked proposal; a name not offered is a BadRequest."""
    if name is None or name not in offered:
        raise BadRequest("no such proposal: pick one of the list, or upload a file")
    try:
        return name, load_policy(offered[name])
    except PolicyError as exc:
        return name, exc.problems


def uploaded(filename: str, data: bytes) -> tuple[str, Policy | list[str]]:
    """(label, the policy or its problems) of an uploaded file: bounded as the command's file, UTF-8, problems
    named `<file name>:line: what` as the command names them."""
    name = _upload_name(filename)
    if len(data) > MAX_UPLOAD_BYTES:
        return name, [f"{name}: larger than {MAX_UPLOAD_BYTES} bytes"]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return name, [f"{name}: not UTF-8 text"]
    try:
        return name, parse_policy(text, name)
    except PolicyError as exc:
        return name, exc.problems


def _upload_name(filename: str) -> str:
    """The upload's base name as the problems cite it (printable, bounded); the file is never stored."""
    base = re.split(r"[\\/]", filename or "")[-1]
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", base)[:100].strip("_")
    return clean or "upload.yaml"


def tables(comparison: Any, label: str) -> list[Table]:
    """The comparison's lines and events as page tables; the CSV of each carries the period and the assumptions on
    every row, as `policy whatif --format csv` does."""
    note = f"{label} beside the month as stored; nothing enforced, nothing written."
    return [
        Table("lines", f"What if, by {comparison.by}", LINE_COLUMNS, list(comparison.lines), note=note),
        Table("events", "Warnings and reclaims, actual and what if", EVENT_COLUMNS, list(comparison.events)),
        Table("reservations", "Reservations the proposal's rules would refuse or end otherwise", RESERVATION_COLUMNS,
              list(comparison.reservations), note="Under the policy in force (none configured: not compared)."),
    ]


def csv_table(table: Table, period: str, assumptions: Iterable[str]) -> Table:
    """`table` as the command's CSV: `period`, its columns, `assumptions` (joined) on every row."""
    stated = " | ".join(assumptions)
    columns = (Column("period", "period"), *table.columns, Column("assumptions", "assumptions"))
    rows = [{"period": period, **row, "assumptions": stated} for row in table.rows]
    return Table(table.name, table.title, columns, rows)
