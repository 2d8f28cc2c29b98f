"""Bytes per GPU-month of `raw_samples` (one row per device-sample at 1 Hz), measured on the real ClickHouse engine,
for each choice of `clickhouse.raw_samples_kept` (issue 44 item 3), and the same scrapes' bytes in Kafka.

    .venv/bin/python bench/raw_samples_bytes.py                 # 8 nodes (64 GPUs), 24 h of samples: ~5 min
    .venv/bin/python bench/raw_samples_bytes.py --nodes 4 --hours 6 --every 10 --kafka

The samples are the simulator's (`producers/simulator`: jobs of every kind, activity that moves second by second,
dead exporters, an exporter upgrade), turned into rows by the sink's own `raw_sample_rows` and inserted into a
migrated database on the embedded ClickHouse server the tests use. After `OPTIMIZE ... FINAL` the active parts'
compressed and uncompressed bytes are divided by the device-seconds stored and scaled to a 30-day month. The
samples end at the current hour: the table's TTL would drop older ones at the first merge. Simulated
telemetry repeats more than real telemetry does, so read the figure as a floor.

Each choice gets a table of its own made `AS raw_samples` (same columns, key, compression and TTL): every second,
and `sampled` (the scrapes `sinks.seconds_kept.SecondsKept` keeps, one second in `--every`); `minutes` stores
none. With `--kafka`, the same records, encoded as the producers encode them, go through the project's telemetry
producer (`base.kafka.new_telemetry_producer`: `kafka.telemetry`'s compression, its batching) into a 4-partition
topic on a local broker, and the topic's log segments are measured on disk: what `telemetry.device-samples` holds
per GPU-day, the cost of keeping seconds in Kafka's retention instead. CPU seconds (user + sys) of this process and
of the ClickHouse server are printed beside the load average: the figures here are bytes and rows, which load does
not change.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import broker_for, cpu_s, machine, migrated_database, scrape_producer  # noqa: E402

MONTH_S = 30 * 24 * 3600
DAY_S = 24 * 3600
BATCH_ROWS = 200_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8, help="simulated nodes of 8 GPUs (default 8)")
    ap.add_argument("--hours", type=float, default=24.0, help="hours of 1 Hz samples (default 24)")
    ap.add_argument("--every", type=int, default=10, help="sampled: one second in EVERY (default 10)")
    ap.add_argument("--kafka", action="store_true", help="also the topic's bytes on a local broker's disk")
    args = ap.parse_args()
    if not (1 <= args.nodes <= 1000 and 0 < args.hours <= 24 * 31):
        sys.exit("--nodes must be 1-1000 and --hours 0-744")

    from fixtures_clickhouse import start_server, stop_server

    from producers.simulator import SimConfig, simulate
    from schemas.codec import AvroCodec
    from schemas.records import NodeScrape
    from schemas.topics import DEVICE_SAMPLES, node_key
    from sinks.rows import RAW_SAMPLE_COLUMNS, raw_sample_rows
    from sinks.seconds_kept import SecondsKept

    print(f"machine: {machine()}; load average {os.getloadavg()}")
    duration_s = int(args.hours * 3600)
    # Ending now: the table's TTL (`clickhouse.raw_sample_ttl_days`) drops older samples at the first merge.
    end_s = int(time.time()) // 3600 * 3600
    config = SimConfig(nodes=args.nodes, duration_s=duration_s, start_ms=(end_s - duration_s) * 1000)
    sampled = SecondsKept("sampled", args.every)
    tables = {"every_second": "raw_samples", "sampled": "raw_samples_sampled"}
    codec = AvroCodec()
    topic = f"bench{os.getpid()}." + DEVICE_SAMPLES.name
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as tmp, contextlib.ExitStack() as stack:
        producer = None
        if args.kafka:
            from confluent_kafka.admin import AdminClient, NewTopic

            bootstrap = stack.enter_context(broker_for(None, Path(tmp)))
            admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need the handle alive
            for fut in admin.create_topics([NewTopic(topic, 4, 1)]).values():
                fut.result(timeout=60)
            producer = scrape_producer(bootstrap)
        server = start_server(Path(tmp) / "data")
        try:
            client, ch = migrated_database(server)
            database = ch.database
            client.command("CREATE TABLE raw_samples_sampled AS raw_samples")
            server_cpu0, own_cpu0 = cpu_s(server.pid) or 0.0, os.times()
            t0 = time.monotonic()
            batches: dict[str, list[list[object]]] = {name: [] for name in tables}
            inserted = dict.fromkeys(tables, 0)
            scrapes = 0

            def flush(name: str) -> None:
                if batches[name]:
                    client.insert(tables[name], batches[name], column_names=list(RAW_SAMPLE_COLUMNS))
                    inserted[name] += len(batches[name])
                    batches[name] = []

            for topic_of, _key, record in simulate(config):
                if topic_of is not DEVICE_SAMPLES:
                    continue
                scrapes += 1
                scrape = NodeScrape.from_avro(record)
                rows = raw_sample_rows(scrape)  # the sink's own row mapping
                batches["every_second"] += rows
                if sampled.keeps(scrape.ts_ms):
                    batches["sampled"] += rows
                if producer is not None:
                    value = codec.encode(DEVICE_SAMPLES.subject, record)
                    while True:
                        try:
                            producer.produce(topic, value, node_key(scrape.cluster, scrape.node))
                            break
                        except BufferError:
                            producer.poll(0.05)
                    producer.poll(0)
                for name in tables:
                    if len(batches[name]) >= BATCH_ROWS:
                        flush(name)
                if scrapes % 20_000 == 0:
                    print(f"  {scrapes:,} scrapes, {inserted['every_second']:,} rows, "
                          f"{time.monotonic() - t0:.0f} s", flush=True)  # fmt: skip
            for name in tables:
                flush(name)
            if producer is not None and producer.flush(120):
                raise SystemExit("the scrapes did not reach the broker within 120 s")
            own = os.times()
            own_cpu = own.user - own_cpu0.user + own.system - own_cpu0.system
            print(f"{scrapes:,} scrapes in {time.monotonic() - t0:.0f} s; CPU s: this process {own_cpu:.1f} "
                  f"(simulator, rows{', Kafka' if producer else ''}), ClickHouse server "
                  f"{(cpu_s(server.pid) or 0.0) - server_cpu0:.1f}; load average {os.getloadavg()}")  # fmt: skip
            gpu_s = None
            print("\n| raw_samples_kept | rows (device-seconds stored) | compressed | per GPU-day | per GPU-month "
                  "| uncompressed per GPU-day | at 100,000 GPUs, a day |")  # fmt: skip
            print("|---|---:|---:|---:|---:|---:|---:|")
            for mode, table in tables.items():
                client.command(f"OPTIMIZE TABLE {table} FINAL")  # fixed names: the two tables above
                stored, packed, unpacked = client.query(
                    "SELECT sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) FROM system.parts "
                    "WHERE active AND database = {db:String} AND table = {t:String}",
                    parameters={"db": database, "t": table},
                ).result_rows[0]  # fmt: skip
                if gpu_s is None:
                    gpu_s = stored  # every second: the device-seconds the run covers
                label = mode if mode == "every_second" else f"sampled, 1 in {args.every}"
                per_day = packed * DAY_S / gpu_s
                print(f"| {label} | {stored:,} | {packed / 1e6:,.2f} MB | {per_day / 1e6:,.3f} MB | "
                      f"{per_day * 30 / 1e6:,.1f} MB | {unpacked * DAY_S / gpu_s / 1e6:,.2f} MB | "
                      f"{per_day * 100_000 / 1e9:,.0f} GB |")  # fmt: skip
            print(f"| minutes | 0 | 0 | 0 | 0 | 0 | 0 |")  # noqa: F541
            if producer is not None:
                logs = [f for f in Path(tmp).rglob("*") if f.parent.name.startswith(topic + "-") and f.is_file()
                        and f.suffix == ".log"]  # fmt: skip
                size = sum(f.stat().st_size for f in logs)
                assert gpu_s
                from base.settings import KafkaSettings

                packed = KafkaSettings().telemetry.compression_type
                print(f"\nKafka, {topic} (4 partitions, {packed} as the producers send it): {size / 1e6:,.2f} MB "
                      f"on disk for {scrapes:,} scrapes ({size / scrapes:,.0f} B a scrape); per GPU-day "
                      f"{size * DAY_S / gpu_s / 1e6:,.3f} MB; at 100,000 GPUs "
                      f"{size * DAY_S / gpu_s * 100_000 / 1e9:,.0f} GB a day, one replica")  # fmt: skip
            client.close()
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
