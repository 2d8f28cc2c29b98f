"""What deciding a statement on the engine's own parse costs (stack/clickhouse/access.py).

    .venv/bin/python bench/clickhouse_policy.py [--repeat 2000]

Opens chDB on a temporary path in this process, as the embedded server does, and times
`Engine.inspect` (formatQuery + EXPLAIN AST on a parser handle) plus `access.denial` for statements
the server sees every day, next to running `SELECT 1` itself. Medians and p99 in milliseconds;
thread CPU time too, since the machine is shared.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stack.clickhouse import access
from stack.clickhouse.engine import Engine

STATEMENTS = {
    "SELECT 1": "SELECT 1",
    "report (CTE, joins, 12 functions)": (
        "WITH jobs AS (SELECT cluster, job_id, any(project) AS project FROM job_events FINAL GROUP BY cluster, job_id) "
        "SELECT j.project, sum(d.allocated_s) / 3600 AS allocated_h, "
        "sum(d.active_s + d.starved_s) / 3600 AS consumed_h, "
        "round(sum(d.idle_s) / nullIf(sum(d.allocated_s), 0), 4) AS idle_share, toStartOfMonth(toDateTime(intDiv("
        "d.minute_start_ms, 1000))) AS month FROM device_minutes AS d FINAL INNER JOIN jobs AS j ON d.cluster = "
        "j.cluster AND d.job_id = j.job_id WHERE d.minute_start_ms >= {start:Int64} GROUP BY j.project, month "
        "ORDER BY allocated_h DESC LIMIT 100 FORMAT Native"
    ),
    "sink insert (spooled)": (
        "INSERT INTO device_minutes (cluster, node, device_uuid) FROM INFILE '/dev/shm/x/insert-1.data' "
        "COMPRESSION 'none' FORMAT Native"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine(Path(tmp) / "data")
        scope = access.Scope(access.Role.ANALYST, "default", table_functions=engine.table_functions)
        handle = engine.open_handle()
        print("| statement | inspect + denial, median ms | p99 ms | CPU ms (median) |")
        print("|---|---:|---:|---:|")
        for name, sql in STATEMENTS.items():
            walls, cpus = [], []
            for _ in range(args.repeat):
                started, cpu = time.perf_counter(), time.thread_time()
                formatted, tree = engine.inspect(sql, {"start": "0"})
                access.denial(tree, scope, formatted)
                walls.append((time.perf_counter() - started) * 1e3)
                cpus.append((time.thread_time() - cpu) * 1e3)
            walls.sort()
            print(f"| {name} | {statistics.median(walls):.3f} | {walls[int(len(walls) * 0.99)]:.3f} | "
                  f"{statistics.median(cpus):.3f} |")
        walls = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            handle.run("SELECT 1")
            walls.append((time.perf_counter() - started) * 1e3)
        p99 = sorted(walls)[int(len(walls) * 0.99)]
        print(f"| (running `SELECT 1` itself) | {statistics.median(walls):.3f} | {p99:.3f} | |")
        handle.close()
        engine.close()


if __name__ == "__main__":
    main()
