"""The sink writing raw samples: node scrapes from Kafka into `raw_samples`, rows per second of one core (issue 21).

What runs: `sinks.consumer.LedgerSink` on the device-samples topic alone (the product's sink code, in this process,
pinned to one core), against a local broker holding a backlog of 8-GPU node scrapes (`_common.produce_backlog`) and
the embedded ClickHouse server the tests start (its own process). The figure is rows inserted per CPU-second of the
sink process (all its threads, librdkafka's included: "per core"), and per second of wall time; the table's row
count is checked against what was produced.

    .venv/bin/python bench/sink_raw_samples.py                      # 100,000 scrapes = 800,000 rows
    .venv/bin/python bench/sink_raw_samples.py --scrapes 20000 --profile   # where the sink's time goes (cProfile)
    .venv/bin/python bench/sink_raw_samples.py --kept sampled --every 10   # clickhouse.raw_samples_kept = sampled
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

from _common import GPUS, REPO, broker_for, create_topics, machine, migrated_database, produce_backlog

sys.path.insert(0, str(REPO / "tests"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, all its threads (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=100_000, help="node scrapes in the backlog (8 rows each)")
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--batch", type=int, default=None, help="sinks.batch_max_records (default: the setting's)")
    ap.add_argument("--core", type=int, default=0, help="the core the sink is pinned to (-1: floats)")
    ap.add_argument("--bootstrap", default=None, help="an existing broker (default: start one)")
    ap.add_argument("--row-path", action="store_true", help="record by record (sinks.bulk_raw_samples = false)")
    ap.add_argument(
        "--kept",
        choices=("every_second", "sampled"),
        default="every_second",
        help="clickhouse.raw_samples_kept (sampled: one second in --every)",
    )
    ap.add_argument("--every", type=int, default=10, help="clickhouse.raw_sample_every_s for --kept sampled")
    ap.add_argument("--profile", action="store_true", help="print the sink's 25 costliest functions (cProfile)")
    args = ap.parse_args()
    if args.scrapes <= 0 or args.nodes <= 0:
        ap.error("--scrapes and --nodes must be positive")

    from fixtures_clickhouse import start_server, stop_server

    from base.settings import KafkaSettings, SinksSettings
    from schemas.topics import DEVICE_SAMPLES
    from sinks.consumer import LedgerSink
    from sinks.seconds_kept import SecondsKept
    from sinks.writer import LedgerWriter

    print(f"machine: {machine()}", flush=True)
    kept = SecondsKept(args.kept, args.every)
    with tempfile.TemporaryDirectory(prefix="bench-sink-raw-") as tmp, broker_for(args.bootstrap, Path(tmp)) as boot:
        prefix = f"bsr{os.getpid()}-"
        create_topics(boot, prefix)
        t0 = time.monotonic()
        start_ms = (int(time.time()) - 86_400) // 60 * 60_000  # recent: raw_samples keeps days, not months (TTL)
        produce_backlog(boot, prefix, args.nodes, args.scrapes, start_ms)
        seconds = [start_ms + 1000 * (k // args.nodes) for k in range(args.scrapes)]  # as produce_backlog sends them
        rows_expected = sum(GPUS for ts in seconds if kept.keeps(ts))
        took = time.monotonic() - t0
        print(f"backlog: {args.scrapes:,} scrapes ({rows_expected:,} rows) in {took:.1f} s", flush=True)
        server = start_server(Path(tmp) / "ch")
        try:
            client, _ = migrated_database(server)
            kafka = KafkaSettings(bootstrap_servers=boot, topic_prefix=prefix)
            cfg = SinksSettings(group_id=prefix + "sinks")
            if args.batch:
                cfg = cfg.model_copy(update={"batch_max_records": args.batch})
            if args.row_path:
                cfg = cfg.model_copy(update={"bulk_raw_samples": False})
            sink = LedgerSink(kafka, cfg, LedgerWriter(client), topics=[DEVICE_SAMPLES.name], kept=kept)
            if args.core >= 0 and args.core in os.sched_getaffinity(0):
                os.sched_setaffinity(0, {args.core})
            profile = cProfile.Profile() if args.profile else None
            wall0, cpu0, server0 = time.monotonic(), time.process_time(), cpu_seconds(server.pid)
            first: float | None = None
            if profile:
                profile.enable()
            while sink.stats.records < args.scrapes:  # every record consumed, kept or not
                if sink.step() and first is None:
                    first = time.monotonic()
                if time.monotonic() - wall0 > 900:
                    raise SystemExit(f"only {sink.stats.rows_inserted:,} of {rows_expected:,} rows after 900 s")
            if profile:
                profile.disable()
            wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
            server_cpu = cpu_seconds(server.pid) - server0
            stats = sink.stats
            sink.close()
            stored = client.query("SELECT count() FROM raw_samples").result_rows[0][0]
            print(f"sink ({kept.describe()}): {stats.records:,} records ({stats.samples_not_kept:,} not kept), "
                  f"{stats.rows_inserted:,} rows in {stats.batches} batches; raw_samples holds {stored:,}; "
                  f"load average {os.getloadavg()}", flush=True)  # fmt: skip
            if stored != rows_expected:
                raise SystemExit(f"raw_samples holds {stored:,} rows, {rows_expected:,} were produced")
            path = "record by record" if args.row_path else "bulk"
            print(f"path: {path}; wall {wall:.1f} s (first batch after {(first or wall0) - wall0:.2f} s); "
                  f"CPU: sink {cpu:.1f} s, ClickHouse server {server_cpu:.1f} s")  # fmt: skip
            print(f"rows/s of wall time: {stats.rows_inserted / wall:,.0f}")
            print(
                f"rows per CPU-second of the sink: {stats.rows_inserted / cpu:,.0f}; CPU per 10,000 scrapes: sink "
                f"{cpu * 10_000 / args.scrapes:.3f} s, server {server_cpu * 10_000 / args.scrapes:.3f} s"
            )
            print(f"rows per CPU-second of the ClickHouse server: {stats.rows_inserted / max(server_cpu, 1e-9):,.0f}")
            if profile:
                pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
