"""Processors' CPU and memory against fleet size (issue 21, item 5): N GPUs at 1 Hz, input produced beforehand.

    .venv/bin/python bench/cost_curves.py                                  # 1k, 10k, 50k, 100k GPUs, 3 min each
    .venv/bin/python bench/cost_curves.py --sizes 1000 10000 --minutes 2 --results /tmp/cc.jsonl
    .venv/bin/python bench/cost_curves.py --plot-only --results /tmp/cc.jsonl   # re-plot saved lines

For each size N (8 GPUs per node scrape, one scrape per node per second, one job per node):
1. fresh topics (a prefix of their own); inventory, job STARTED events, then `--minutes` of node scrapes,
   all produced before any processor starts, so the load generator does not share the cores with them;
2. `gpuledger processors run --event-time --stage rekey --stage node --exit-when-idle 3` over that backlog,
   then `gpuledger processors agents --event-time --exit-when-idle 3` (the job stage) over what it wrote;
3. per process, from the kernel: CPU seconds (user + sys, `wait4`'s rusage of that child, every thread),
   peak RSS (`ru_maxrss`, the VmHWM at exit), and the CPU it had used when its stats file first showed
   input (start-up: imports, joining the groups), sampled from /proc/<pid>/stat every 0.2 s.

Derived: cores needed at 1 Hz = CPU seconds after start-up / seconds of event time; peak RSS per tracked
device. CPU time, not wall time: the machine may be shared. One JSON line per size goes to stdout (and is
appended to `--results`); then a table, and the plot (`--plot`, two panels, log x).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import (
    GPUS,
    REPO,
    broker_for,
    cpu_s,
    create_topics,
    machine,
    produce_backlog,
    read_stats,
    setup_cluster,
    worker,
)
from confluent_kafka.admin import AdminClient

from processors.testing import T0

SIZES = (1_000, 10_000, 50_000, 100_000)
PLOT = REPO / "docs" / "images" / "cost-curves-processors.png"


@dataclass(frozen=True)
class Usage:
    """What the kernel says one finished process used."""

    cpu_s: float  # user + sys, all threads
    startup_cpu_s: float  # CPU used when its stats file first showed input
    peak_rss_mib: float
    wall_s: float
    exit_code: int
    stats: dict[str, Any]


def measure(
    bootstrap: str,
    prefix: str,
    state: Path,
    command: str,
    started: str,
    *extra: str,
    timeout_s: float,
    env_extra: dict[str, str] | None = None,
) -> Usage:
    """Run one `processors <command>` to its exit; `started` is the stats counter that shows input arrived."""
    name = command
    t0 = time.monotonic()
    proc = worker(
        bootstrap,
        prefix,
        state,
        False,
        -1,
        *extra,
        "--event-time",
        "--exit-when-idle",
        "3",
        name=name,
        command=command,
        env_extra=env_extra,
    )
    startup: float | None = None
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if startup is None and read_stats(state, name).get(started):
            startup = cpu_s(proc.pid)
        if time.monotonic() - t0 > timeout_s:
            proc.send_signal(signal.SIGTERM)
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = ru.ru_utime + ru.ru_stime
    return Usage(
        cpu_s=round(cpu, 2),
        startup_cpu_s=round(startup if startup is not None else cpu, 2),
        peak_rss_mib=round(ru.ru_maxrss / 1024, 1),  # KiB on Linux
        wall_s=round(time.monotonic() - t0, 1),
        exit_code=proc.returncode,
        stats=read_stats(state, name),
    )


def one_size(
    bootstrap: str, tmp: Path, gpus: int, minutes: float, agents: bool, timeout_s: float, fetch_queue_kib: int | None
) -> dict[str, Any]:
    nodes = gpus // GPUS
    seconds = round(minutes * 60)
    prefix = f"cc{gpus // 1000}k{uuid.uuid4().hex[:4]}."
    create_topics(bootstrap, prefix)
    t = time.monotonic()
    setup_cluster(bootstrap, prefix, nodes, T0)
    produce_backlog(bootstrap, prefix, nodes, nodes * seconds, T0)
    produce_s = time.monotonic() - t
    state = tmp / prefix
    state.mkdir()
    out: dict[str, Any] = {
        "gpus": gpus,
        "nodes": nodes,
        "event_s": seconds,
        "scrapes": nodes * seconds,
        "produce_s": round(produce_s, 1),
        "fetch_queue_kib": fetch_queue_kib,
    }
    # librdkafka prefetches up to queued.max.messages.kbytes (64 MiB by default) of a backlog; at 1 Hz in
    # real time its queue holds about a second of input, so `--fetch-queue-kib` shows the RSS without it.
    queue = {"GPULEDGER_KAFKA__CONFIG": json.dumps({"queued.max.messages.kbytes": str(fetch_queue_kib)})}
    run = measure(
        bootstrap,
        prefix,
        state,
        "run",
        "samples",
        "--stage",
        "rekey",
        "--stage",
        "node",
        timeout_s=timeout_s,
        env_extra=queue if fetch_queue_kib else None,
    )
    out["run"] = _summary(run, gpus, seconds)
    out["run"].update(
        {
            "samples": run.stats.get("samples"),
            "device_minutes": run.stats.get("device_minutes"),
            "tracked_devices": run.stats.get("extra", {}).get("tracked_devices", run.stats.get("tracked_devices")),
            "late_samples": run.stats.get("late_samples_total"),
        }
    )
    if agents:
        job = measure(bootstrap, prefix, state, "agents", "events", timeout_s=timeout_s)
        out["agents"] = _summary(job, gpus, seconds)
        out["agents"].update({"events": job.stats.get("events"), "job_minutes": job.stats.get("job_minutes")})
    admin = AdminClient({"bootstrap.servers": bootstrap})  # the next size's backlog gets the disk
    admin.delete_topics([n for n in admin.list_topics(timeout=10).topics if n.startswith(prefix)])
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    return out


def _summary(u: Usage, gpus: int, seconds: int) -> dict[str, Any]:
    work = max(0.0, u.cpu_s - u.startup_cpu_s)
    return {
        **{k: v for k, v in asdict(u).items() if k != "stats"},
        "cores_at_1hz": round(work / seconds, 4),
        "cores_at_1hz_with_startup": round(u.cpu_s / seconds, 4),
        "rss_bytes_per_gpu": round(u.peak_rss_mib * 2**20 / gpus),
    }


# ------------------------------------------------------------------------------------------ output
def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| GPUs | scrapes | process | CPU s (start-up) | cores at 1 Hz | peak RSS MiB | RSS per GPU | "
        "marginal per GPU | device-minutes | wall s |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    prev: dict[str, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: r["gpus"]):
        for proc in ("run", "agents"):
            p = r.get(proc)
            if not p:
                continue
            before = prev.get(proc)
            marginal = (
                f"{(p['peak_rss_mib'] - before['peak_rss_mib']) * 2**20 / (r['gpus'] - before['gpus']):,.0f} B"
                if before
                else "-"
            )
            minutes = p.get("device_minutes") if proc == "run" else p.get("job_minutes")
            lines.append(
                f"| {r['gpus']:,} | {r['scrapes']:,} | {proc} | {p['cpu_s']:.1f} ({p['startup_cpu_s']:.1f}) | "
                f"{p['cores_at_1hz']:.3f} | {p['peak_rss_mib']:,.0f} | {p['rss_bytes_per_gpu']:,} B | {marginal} | "
                f"{minutes if minutes is not None else '-'}{' job-min' if proc == 'agents' else ''} | {p['wall_s']} |"
            )
            prev[proc] = {"gpus": r["gpus"], "peak_rss_mib": p["peak_rss_mib"]}
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(rows, key=lambda r: r["gpus"])
    fig, (ax_cpu, ax_mem) = plt.subplots(1, 2, figsize=(10, 4))
    for proc, label, marker in (
        ("run", "processors run (rekey + node)", "o"),
        ("agents", "processors agents (job)", "s"),
    ):
        pts = [(r["gpus"], r[proc]) for r in rows if r.get(proc)]
        if not pts:
            continue
        xs = [g for g, _ in pts]
        for ax, key, fmt in ((ax_cpu, "cores_at_1hz", "{:.2f}"), (ax_mem, "peak_rss_mib", "{:,.0f}")):
            ys = [p[key] for _, p in pts]
            ax.plot(xs, ys, marker=marker, label=label)
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(fmt.format(y), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax_cpu.axhline(1.0, linestyle="--", color="grey", linewidth=0.8, label="one core (a process's Python is one)")
    for ax, title, unit in (
        (ax_cpu, "CPU at 1 Hz (after start-up)", "cores"),
        (ax_mem, "peak RSS", "MiB"),
    ):
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_xlabel("GPUs (8 per node, 1 scrape/s per node)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    minutes = {r["event_s"] / 60 for r in rows}
    fig.suptitle(
        f"gpuledger processors vs fleet size (event-time backlog of {'/'.join(f'{m:g}' for m in sorted(minutes))} min)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load(path: Path) -> list[dict[str, Any]]:
    """Saved lines, the last one of each size."""
    by_size: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by_size[r["gpus"]] = r
    return list(by_size.values())


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="GPUs (multiples of 8)")
    ap.add_argument("--minutes", type=float, default=3.0, help="event time per size (default 3)")
    ap.add_argument("--no-agents", action="store_true", help="leave out `processors agents` (the job stage)")
    ap.add_argument("--bootstrap", help="Kafka bootstrap; default: start a local broker in a temp dir")
    ap.add_argument("--results", type=Path, help="append each size's JSON line here; the table and plot use all")
    ap.add_argument("--plot", type=Path, default=PLOT, help=f"PNG (default {PLOT.relative_to(REPO)})")
    ap.add_argument("--plot-only", action="store_true", help="no runs: table and plot from --results")
    ap.add_argument(
        "--fetch-queue-kib", type=int, help="`processors run`: librdkafka queued.max.messages.kbytes (default 64 MiB)"
    )
    ap.add_argument("--timeout", type=float, default=1800.0, help="per process, seconds (then SIGTERM)")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    if not args.plot_only:
        print(f"# {machine()}; load average at start {os.getloadavg()[0]:.2f}", flush=True)
        with tempfile.TemporaryDirectory(prefix="gpuledger-cost-") as tmpdir:
            tmp = Path(tmpdir)
            with broker_for(args.bootstrap, tmp) as bootstrap:
                for gpus in args.sizes:
                    r = one_size(
                        bootstrap, tmp, gpus, args.minutes, not args.no_agents, args.timeout, args.fetch_queue_kib
                    )
                    print(json.dumps(r), flush=True)
                    if args.results:
                        with args.results.open("a") as f:
                            f.write(json.dumps(r) + "\n")
                    rows.append(r)
    if args.results and args.results.exists():
        rows = load(args.results)
    if not rows:
        return
    print(table(rows))
    plot(rows, args.plot)
    print(f"# plot: {args.plot}; load average at end {os.getloadavg()[0]:.2f} (CPU seconds, not wall: shared machine)")


if __name__ == "__main__":
    main()
