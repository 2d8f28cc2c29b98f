"""Bench: `policy whatif`'s replay of a large month (issue 43 item 5): the month's job-minutes read from the
warehouse (`sinks.whatif.load_month`) and stepped through the live idle state machine (`processors.whatif.
replay_month`), the part that grows with GPUs x minutes. The pricing (the live view over the proposed card) is the
warehouse's own SQL and is measured by bench/chargeback_overlap.py; it is not in these figures.

The month is generated in the warehouse (INSERT ... SELECT into job_minutes, job_events STARTED per job): GPUS
devices in 4-GPU jobs of 12 hours back to back for DAYS days from 1 November 2026. Per job, by a hash of its id:
7 in 10 are busy with a 5-minute idle dip every hour (below any warning threshold), 2 in 10 also go idle for 3
hours in the middle (warned, then reclaimed), 1 in 10 goes dark for 30 minutes. About 12% of job-minutes are idle.

Usage: python bench/whatif_replay.py [--gpus 1000] [--days 30] [--before 0] [--profile] [--every-minute]
       [--no-optimize] [--analyst] [--keep DIR [--database NAME]]
Prints, per phase (generate, load, replay, released), the wall time, this process's CPU time (user + sys), the
server's and the load average; the job-minutes, runs fed, events, and the rate in job-minutes per second.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _common import cpu_s, machine  # noqa: E402
from sink_chargeback import ANALYST, PASSWORD, start_server  # noqa: E402

from base.processor_settings import IdlePolicy  # noqa: E402
from base.settings import ClickHouseSettings  # noqa: E402
from sinks.db import check_identifier, connect, migrate  # noqa: E402

NOV_1 = 1_793_491_200_000  # 2026-11-01T00:00Z
PERIOD = "2026-11"
JOB_GPUS = 4
JOB_MIN = 720
POLICY = IdlePolicy(idle_after_min_interactive=30, idle_after_min_batch=60, grace_min=30)


def generate(client: object, gpus: int, days: int, before: int = 0) -> int:
    """job_minutes and job_events for the month (and `before` days before it, the same way); returns the job-minutes
    written."""
    slots, minutes = gpus // JOB_GPUS, (days + before) * 1440
    # k: the job's kind (hash of its id), m: minute in the job
    shape = (
        f"SELECT s, t, concat('j', toString(s), '-', toString(intDiv(t, {JOB_MIN}))) AS job, "
        f"{NOV_1 - before * 86_400_000} + t * 60000 AS ts, t % {JOB_MIN} AS m, cityHash64(job) % 10 AS k, "
        f"multiIf(k = 9 AND m >= 300 AND m < 330, 2, k IN (7, 8) AND m >= 240 AND m < 420, 1, m % 60 >= 55, 1, 0) AS c "
        f"FROM (SELECT number % {slots} AS s, intDiv(number, {slots}) AS t FROM numbers({slots * minutes}))"
    )
    client.command(  # type: ignore[attr-defined]
        "INSERT INTO job_minutes (cluster, job_id, minute_start_ms, device_count, generation, user, project, team, "
        "cost_centre, preemptible, pricing_tier, allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s, "
        "sample_count, mapping_version, classifier_version) "
        f"SELECT 'c1', job, ts, {JOB_GPUS}, 'hopper', concat('u', toString(s % 200)), concat('p', toString(s % 40)), "
        f"concat('t', toString(s % 12)), 'cc', false, 'on-prem', {60 * JOB_GPUS}, if(c = 0, {50 * JOB_GPUS}, 0), "
        f"if(c = 0, {10 * JOB_GPUS}, 0), if(c = 1, {60 * JOB_GPUS}, 0), if(c = 2, {60 * JOB_GPUS}, 0), 0, "
        f"if(c = 2, 0, {60 * JOB_GPUS}), 'm1', 'c1' FROM ({shape})",
        settings={"max_insert_threads": 2},
    )
    client.command(  # type: ignore[attr-defined]
        "INSERT INTO job_events (event_id, cluster, job_id, event_type, ts_ms, scheduler, user, project, team, "
        "partition, preemptible, interactive, checkpointable, gang_size, allocations, requested_devices, pricing_tier) "
        f"SELECT concat('e', job), 'c1', job, 'STARTED', min(ts), 'SLURM', 'u', 'p', 't', 'gpu', false, false, true, "
        f"0, '[]', {JOB_GPUS}, 'on-prem' FROM ({shape}) GROUP BY job"
    )
    return int(client.query("SELECT count() FROM job_minutes").result_rows[0][0])  # type: ignore[attr-defined]


class Phases:
    """Wall time, this process's CPU (user + sys) and the server's, and the 1-minute load average, per phase: other
    work on the machine stretches wall time, not CPU time."""

    def __init__(self, server_pid: int) -> None:
        self.server_pid = server_pid
        self.rows: list[tuple[str, float, float, float, float]] = []
        self._mark = self._now()

    def _now(self) -> tuple[float, float, float]:
        t = os.times()
        return time.perf_counter(), t.user + t.system, cpu_s(self.server_pid) or 0.0

    def done(self, name: str) -> None:
        now = self._now()
        wall, cpu, server = (a - b for a, b in zip(now, self._mark, strict=True))
        self.rows.append((name, wall, cpu, server, os.getloadavg()[0]))
        self._mark = self._now()

    def report(self, names: tuple[str, ...]) -> str:
        lines = [f"{'phase':<10} {'wall s':>8} {'cpu s':>8} {'server cpu s':>13} {'load 1m':>8}"]
        lines += [f"{n:<10} {w:8.1f} {c:8.1f} {sv:13.1f} {ld:8.2f}" for n, w, c, sv, ld in self.rows]
        picked = [r for r in self.rows if r[0] in names]
        wall, cpu, server = sum(r[1] for r in picked), sum(r[2] for r in picked), sum(r[3] for r in picked)
        lines.append(f"{'+'.join(names):<10} {wall:8.1f} {cpu:8.1f} {server:13.1f}")
        return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--every-minute", action="store_true", help="feed every job-minute (no runs)")
    ap.add_argument("--no-optimize", action="store_true", help="leave the generated parts unmerged")
    ap.add_argument("--before", type=int, default=0, help="days of the same work before the month (the lookback)")
    ap.add_argument("--analyst", action="store_true", help="read as the read-only analyst, as the fleet page does")
    ap.add_argument("--keep", type=Path, help="the server's folder, kept: a month generated there before is reused")
    ap.add_argument("--database", default="whatif_bench", help="the database in it")
    args = ap.parse_args()
    from processors.whatif import replay_month, run_classes
    from sinks.whatif import first_reclaims, load_month, released_after, shortest_warning

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_server(args.keep or Path(tmp))
        try:
            ch = ClickHouseSettings(url=url, database=args.database, password=PASSWORD, analyst_password=ANALYST)
            admin = connect(ch.model_copy(update={"database": "default"}))
            kept = bool(admin.query("SELECT count() FROM system.databases WHERE name = {d:String}",
                                    parameters={"d": args.database}).result_rows[0][0])  # fmt: skip
            if not kept:
                admin.command(f"CREATE DATABASE {check_identifier(args.database)}")
            client = connect(ch, send_receive_timeout=3600)
            migrate(client, ch)
            phases = Phases(proc.pid)
            if kept:  # generated by an earlier run with --keep (its --gpus, --days, --before)
                rows = int(client.query("SELECT count() FROM job_minutes").result_rows[0][0])
            else:
                rows = generate(client, args.gpus, args.days, args.before)
                if not args.no_optimize:  # a month past is merged by the time anyone asks about it
                    client.command("OPTIMIZE TABLE job_minutes FINAL")
            phases.done("generate")
            reader = connect(ch, analyst=True, send_receive_timeout=3600) if args.analyst else client
            prof = cProfile.Profile() if args.profile else None
            if prof:
                prof.enable()
            month = load_month(reader, PERIOD, None if args.every_minute else run_classes(), shortest_warning(POLICY))
            phases.done("load")
            out = replay_month(month.minutes, month.jobs, month.appeals, POLICY, None)
            phases.done("replay")
            released = released_after(reader, month, first_reclaims(month, out.actions))
            phases.done("released")
            if prof:
                prof.disable()
            warned = sum(a["kind"] == "IDLE_WARNING" for a in out.alerts)
            print(f"machine: {machine()}")
            fed = sum(len(m) for m in month.minutes.values())
            print(f"gpus {args.gpus} days {args.days} (+{args.before} before): job-minutes {rows:,}, runs fed to the "
                  f"replay {fed:,}, jobs {len(month.minutes):,}, released jobs {len(released):,}")  # fmt: skip
            print(f"warnings {warned}, reclaims {len(out.actions)}, alerts {len(out.alerts)}")
            print(phases.report(("load", "replay", "released")))
            total = sum(r[1] for r in phases.rows if r[0] != "generate")
            print(f"{rows / total:,.0f} job-minutes/s (wall)")
            if prof:
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
                print(text.getvalue())
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
