"""How the producers' inspect commands print (`inspect slurm`, `inspect dcgm`): what a capture or a scrape yields,
as tables. Output only; what a source holds is text, never markup."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _ms_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _devices_text(ev: dict[str, Any]) -> str:
    parts = []
    for a in ev["allocations"]:
        idx = [str(d["index"]) if d["index"] is not None else (d["uuid"] or "?") for d in a["devices"]]
        parts.append(f"{a['node']}[{','.join(idx)}]")
    return " ".join(parts) or (f"{ev['requested_devices']} requested" if ev["requested_devices"] else "-")


def slurm_capture(name: str, capture: Any, events: list[dict[str, Any]]) -> None:
    """The job events of a captured Slurm output, its nodes, and the counts."""
    console = Console()
    title = f"{name}: {capture.kind}"
    if capture.slurm_version or capture.data_parser:
        title += f" (Slurm {capture.slurm_version or '?'}, {capture.data_parser or '?'})"
    table = Table(title=escape(title))  # what the capture holds is text, never markup
    for col in ("job", "event", "time (UTC)", "user", "account", "project", "partition", "devices", "exit"):
        table.add_column(col)
    for ev in events:
        table.add_row(*map(escape, (
            ev["job_id"], ev["event_type"], _ms_text(ev["ts_ms"]), ev["user"], ev["account"] or "-",
            f"{ev['project'] or '-'} ({ev['project_source'].lower()})", ev["partition"] or "-",
            _devices_text(ev), ev["exit_state"] or "",
        )))  # fmt: skip
    console.print(table)
    if capture.nodes:
        nodes = Table(title="nodes")
        for col in ("node", "gpus", "type", "in use"):
            nodes.add_column(col)
        for n in capture.nodes:
            cells = (n.name, str(n.gpu_count), n.gpu_type or "-", ",".join(map(str, n.used_indices)) or "-")
            nodes.add_row(*map(escape, cells))
        console.print(nodes)
    console.print(f"{len(capture.jobs)} jobs, {len(events)} events")


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


def dcgm_scrape(node: str, norm: Any, exporter_version: str | None) -> None:
    """The devices one dcgm-exporter scrape yields, the driver and exporter versions, and its warnings."""
    from schemas.generations import generation_of

    console = Console()
    # What the exporter reports (pod names, models) is text, never markup.
    table = Table(title=escape(f"{node}: {len(norm.devices)} devices, mapping {norm.mapping_version}"))
    for col in ("idx", "uuid", "MIG", "model", "gen", "activity", "util %", "fb used MiB", "power W", "owner"):
        # UUIDs are what a user matches against: fold them, never cut them.
        table.add_column(col, overflow="fold" if col in ("uuid", "owner") else "ellipsis")
    for d in norm.devices:
        act = d["sm_active_ratio"]
        if act is None:
            act = d["gr_engine_active_ratio"]
        if act is None and d["gpu_util_pct"] is not None:
            act = d["gpu_util_pct"] / 100
        mig = f"{d['mig_instance_id']} {d['mig_profile'] or ''}".strip() if d["mig_instance_id"] is not None else ""
        owner = "/".join(x for x in (d["namespace"], d["pod"]) if x) or (d["hpc_job"] or "")
        cells = (
            _fmt(d["index"]),
            d["uuid"],
            mig,
            d["model"] or "-",
            generation_of(d["model"]),
            _fmt(act, 3),
            _fmt(d["gpu_util_pct"]),
            _fmt(d["fb_used_mib"]),
            _fmt(d["power_w"], 1),
            owner,
        )
        table.add_row(*map(escape, cells))
    console.print(table)
    console.print(f"driver: {norm.driver_version or '-'}  exporter version: {exporter_version or 'not given'}")
    for w in norm.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
