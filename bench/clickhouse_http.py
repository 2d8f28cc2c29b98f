"""Embedded ClickHouse over HTTP vs chDB in-process: insert rate and per-query latency.

    .venv/bin/python bench/clickhouse_http.py [--rows 1000000] [--repeat 200]

Starts `python -m stack.clickhouse clickhouse serve` on a free loopback port with a temporary data
path, loads the same 10-column table through clickhouse-connect (HTTP, lz4 and uncompressed) and
through chDB in this process (`INSERT ... SELECT * FROM Python(df)`), then times `SELECT 1` and a
GROUP BY both ways. "Added" is the HTTP median minus the in-process median.
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import clickhouse_connect
import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DDL = (
    "CREATE TABLE {name} (ts DateTime, cluster LowCardinality(String), node String, gpu UInt8, job_id UInt64, "
    "team LowCardinality(String), sm_active Float32, fb_used_mib UInt32, power_w Float32, samples UInt32) "
    "ENGINE = MergeTree ORDER BY (cluster, node, gpu, ts)"
)
GROUP_BY = "SELECT team, count() AS n, avg(sm_active) AS sm, sum(power_w) AS w FROM {name} GROUP BY team ORDER BY team"


def frame(rows: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    nodes = np.array([f"node-{i:04d}" for i in range(512)])
    teams = np.array([f"team-{i:02d}" for i in range(24)])
    return pd.DataFrame(
        {
            "ts": pd.to_datetime(1_700_000_000 + np.arange(rows) // 64, unit="s"),
            "cluster": np.where(np.arange(rows) % 2 == 0, "east", "west"),
            "node": nodes[rng.integers(0, len(nodes), rows)],
            "gpu": rng.integers(0, 8, rows).astype(np.uint8),
            "job_id": rng.integers(1, 50_000, rows).astype(np.uint64),
            "team": teams[rng.integers(0, len(teams), rows)],
            "sm_active": rng.random(rows).astype(np.float32),
            "fb_used_mib": rng.integers(0, 81_920, rows).astype(np.uint32),
            "power_w": (rng.random(rows) * 700).astype(np.float32),
            "samples": np.full(rows, 60, dtype=np.uint32),
        }
    )


def start_server(path: Path, password: str) -> tuple[subprocess.Popen[str], str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(
        GPULEDGER_CONFIG=str(path / "none.toml"),
        GPULEDGER_STATE_DIR=str(path / "state"),
        GPULEDGER_CLICKHOUSE__PASSWORD=password,
        GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD=secrets.token_hex(8),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.clickhouse", "clickhouse", "serve",
         "--path", str(path / "http"), "--port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    match = re.search(r"listening on http://(\S+):(\d+)", proc.stdout.readline())
    if match is None:
        proc.kill()
        raise SystemExit("the embedded ClickHouse did not start")
    return proc, match.group(1), int(match.group(2))


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_ms(fn: object, repeat: int) -> tuple[float, float]:
    """(median, minimum) wall time of `fn()` in ms."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3, min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=200, help="runs of SELECT 1 (GROUP BY runs a tenth)")
    args = parser.parse_args()
    df = frame(args.rows)
    work = Path(tempfile.mkdtemp(prefix="gpuledger-bench-ch-"))
    password = secrets.token_hex(12)
    proc, host, port = start_server(work, password)
    try:
        results: dict[str, float] = {}
        cpu: dict[str, tuple[float, float]] = {}
        for compress in ("lz4", False):
            client = clickhouse_connect.get_client(
                host=host, port=port, username="gpuledger", password=password, compress=compress
            )
            name = f"http_{compress or 'none'}"
            client.command(DDL.format(name=name))
            client.insert_df(name, df.head(1000))  # warm-up: first-use costs of the engine and the client
            started, cpu_client, cpu_server = time.perf_counter(), time.process_time(), cpu_s(proc.pid)
            client.insert_df(name, df)
            results[f"insert {name}"] = args.rows / (time.perf_counter() - started)
            cpu[f"insert {name}"] = (time.process_time() - cpu_client, cpu_s(proc.pid) - cpu_server)
            assert client.command(f"SELECT count() FROM {name}") == args.rows + 1000
            client.close()

        client = clickhouse_connect.get_client(host=host, port=port, username="gpuledger", password=password)
        group_http = GROUP_BY.format(name="http_lz4")
        client.command("OPTIMIZE TABLE http_lz4 FINAL")  # same shape on both sides: one part
        runs = max(5, args.repeat // 10)
        # raw_query returns the Native bytes, like chDB's query() below: the difference is the HTTP hop.
        http_select1 = timed_ms(lambda: client.raw_query("SELECT 1", fmt="Native"), args.repeat)
        http_group = timed_ms(lambda: client.raw_query(group_http, fmt="Native"), runs)
        # query() also decodes the result into Python rows, as an application sees it.
        app_select1 = timed_ms(lambda: client.query("SELECT 1"), args.repeat)
        app_group = timed_ms(lambda: client.query(group_http), runs)
        client.close()

        import chdb

        conn = chdb.connect(str(work / "direct"))
        conn.query(DDL.format(name="direct"))
        warm = df.head(1000)  # noqa: F841 - read by the query below
        conn.query("INSERT INTO direct SELECT * FROM Python(warm)")
        started, cpu_self = time.perf_counter(), time.process_time()
        conn.query("INSERT INTO direct SELECT * FROM Python(df)")
        results["insert chdb in-process"] = args.rows / (time.perf_counter() - started)
        cpu["insert chdb in-process"] = (time.process_time() - cpu_self, 0.0)
        conn.query("OPTIMIZE TABLE direct FINAL")
        direct_select1 = timed_ms(lambda: conn.query("SELECT 1", "Native"), args.repeat)
        direct_group = timed_ms(lambda: conn.query(GROUP_BY.format(name="direct"), "Native"), runs)
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

    print(f"rows: {args.rows:,} x 10 columns; cpus: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}")
    for label, rate in results.items():
        client_cpu, server_cpu = cpu[label]
        print(
            f"{label:<28} {rate / 1e6:6.2f} M rows/s wall   CPU s: client {client_cpu:5.2f} "
            f"server {server_cpu:5.2f}  ({args.rows / (client_cpu + server_cpu) / 1e6:5.2f} M rows per CPU s)"
        )
    for label, http, direct in (
        ("SELECT 1 raw", http_select1, direct_select1),
        ("SELECT 1 query()", app_select1, direct_select1),
        ("GROUP BY raw", http_group, direct_group),
        ("GROUP BY query()", app_group, direct_group),
    ):
        print(
            f"{label:<28} median: http {http[0]:6.2f} ms, in-process {direct[0]:6.2f} ms, "
            f"added {http[0] - direct[0]:5.2f}"
            f" | min: http {http[1]:6.2f}, in-process {direct[1]:6.2f}, added {http[1] - direct[1]:5.2f}"
        )


if __name__ == "__main__":
    main()
