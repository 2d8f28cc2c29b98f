"""Bytes per GPU-month of `raw_samples` (one row per device-sample at 1 Hz), measured on the real ClickHouse engine.

    .venv/bin/python bench/raw_samples_bytes.py                 # 8 nodes (64 GPUs), 24 h of samples: ~5 min
    .venv/bin/python bench/raw_samples_bytes.py --nodes 4 --hours 6

The samples are the simulator's (`producers/simulator`: jobs of every kind, activity that moves second by second,
dead exporters, an exporter upgrade), turned into rows by the sink's own `raw_sample_rows` and inserted into a
migrated database on the embedded ClickHouse server the tests use. After `OPTIMIZE ... FINAL` the active parts'
compressed and uncompressed bytes are divided by the device-seconds stored and scaled to a 30-day month. The
samples end at the current hour: the table's TTL would drop older ones at the first merge. Simulated
telemetry repeats more than real telemetry does, so read the figure as a floor.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine, migrated_database  # noqa: E402

MONTH_S = 30 * 24 * 3600
BATCH_ROWS = 200_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8, help="simulated nodes of 8 GPUs (default 8)")
    ap.add_argument("--hours", type=float, default=24.0, help="hours of 1 Hz samples (default 24)")
    args = ap.parse_args()
    if not (1 <= args.nodes <= 1000 and 0 < args.hours <= 24 * 31):
        sys.exit("--nodes must be 1-1000 and --hours 0-744")

    from fixtures_clickhouse import start_server, stop_server

    from producers.simulator import SimConfig, simulate
    from schemas.records import NodeScrape
    from schemas.topics import DEVICE_SAMPLES
    from sinks.rows import RAW_SAMPLE_COLUMNS, raw_sample_rows

    print(f"machine: {machine()}")
    duration_s = int(args.hours * 3600)
    # Ending now: the table's TTL (`clickhouse.raw_sample_ttl_days`) drops older samples at the first merge.
    end_s = int(time.time()) // 3600 * 3600
    config = SimConfig(nodes=args.nodes, duration_s=duration_s, start_ms=(end_s - duration_s) * 1000)
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as tmp:
        server = start_server(Path(tmp) / "data")
        try:
            client, ch = migrated_database(server)
            database = ch.database
            t0 = time.monotonic()
            batch: list[list[object]] = []
            rows = 0
            for topic, _key, record in simulate(config):
                if topic is not DEVICE_SAMPLES:
                    continue
                batch += raw_sample_rows(NodeScrape.from_avro(record))
                if len(batch) >= BATCH_ROWS:
                    client.insert("raw_samples", batch, column_names=list(RAW_SAMPLE_COLUMNS))
                    rows += len(batch)
                    batch = []
                    print(f"  {rows:,} rows, {time.monotonic() - t0:.0f} s", flush=True)
            if batch:
                client.insert("raw_samples", batch, column_names=list(RAW_SAMPLE_COLUMNS))
                rows += len(batch)
            client.command("OPTIMIZE TABLE raw_samples FINAL")
            stored, packed, unpacked = client.query(
                "SELECT sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) FROM system.parts "
                "WHERE active AND database = {db:String} AND table = 'raw_samples'", parameters={"db": database},
            ).result_rows[0]  # fmt: skip
            print(f"inserted {rows:,} rows in {time.monotonic() - t0:.0f} s; {stored:,} stored after FINAL")
            per_month = MONTH_S / stored  # device-seconds stored -> one GPU's month at 1 Hz
            print("\n| raw_samples, 1 Hz | rows | compressed | per GPU-month | uncompressed per GPU-month |")
            print("|---|---:|---:|---:|---:|")
            print(f"| {args.nodes * 8} GPUs x {args.hours:g} h (simulated) | {stored:,} | {packed / 1e6:,.1f} MB | "
                  f"{packed * per_month / 1e6:,.1f} MB | {unpacked * per_month / 1e6:,.1f} MB |")  # fmt: skip
            client.close()
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
