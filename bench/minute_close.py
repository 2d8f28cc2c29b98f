"""The minute-close burst: one minute of N GPUs closed, attributed, rolled up and encoded, in one process.

    .venv/bin/python bench/minute_close.py                     # 100,000 GPUs (12,500 nodes x 8), 3 closes
    .venv/bin/python bench/minute_close.py --gpus 10000 --repeat 5

What it times, on one core (the process pins itself to core 0), with no broker: the node stage
(`NodePartition`, as `processors run` holds it) is fed every node's inventory, one job per node (every
tenth idle, every seventh starved, the fleet of bench/processor_throughput.py) and a full minute of
scrapes for every node, encoded as the exporters send them and read natively as `processors run` reads
them; then the watermark passes the minute's end plus grace and

- close: `NodePartition.advance` (attribution per second, classification, the device-minute and
  coverage-minute rows);
- encode: each device-minute row's Kafka key and value (`AvroCodec.encode`: the lean walk, fastavro off
  its plain path), rows of devices that did not compute first, as `processors run` sends them, and the
  same values bundled by job for the job stage (`processors.job_rows.encode_rows`, what the node driver
  calls);
- encode (fastavro): the same rows through fastavro's schemaless_writer, for comparison.

The close and the encode run with the cyclic collector held off, as the node driver runs its burst
(`base.collector.collector_paused`); its pass then falls in the next minute's feed, which is not timed.

Producing to the broker is not included: the real-time runs of bench/processor_throughput.py measure the
whole path (lag and idle alert latency).
The stage runs minute after minute, as `processors run` does: minute k's scrapes are fed, then minute
k - 1 is closed. Minute 0, the first close after a start (it makes the device facts the later closes
keep), is printed but not counted; the figures are the median and the worst of minutes 1 to --repeat.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastavro

from base.collector import collector_paused
from base.processor_settings import ProcessorSettings
from bench._common import GPUS, ScrapeTemplate, kind_of, node_name
from processors.drivers.node import split_by_activity
from processors.fastdecode import Framed, scrape_reader
from processors.job_rows import encode_rows
from processors.stages import NodePartition
from processors.testing import T0, inventory, job_event
from processors.windows import MINUTE_MS
from schemas import load_schema
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_MINUTES, DEVICE_SAMPLES, node_key

CLUSTER = "bench"


def build_partition(nodes: int) -> NodePartition:
    """The node stage with every node's inventory and its job (STARTED at T0, holding its 8 GPUs)."""
    part = NodePartition(ProcessorSettings(realtime=False))
    for i in range(nodes):  # the inventory, as every node's is: the close looks devices up in it
        part.on_inventory(inventory(node_name(i), [f"GPU-{i:05d}-{g}" for g in range(GPUS)], T0, CLUSTER))
    for i in range(nodes):
        idle, _ = kind_of(i)
        ev = job_event(
            "STARTED",
            f"j{i}",
            T0,
            {node_name(i): [f"GPU-{i:05d}-{g}" for g in range(GPUS)]},
            cluster=CLUSTER,
            interactive=idle,
        )
        part.on_allocation(node_key(CLUSTER, node_name(i)).decode(), ev, i)  # the allocs topic is keyed by node
    return part


class Scrapes:
    """Every node's scrape, encoded once (`ScrapeTemplate`: the event time spliced in) and read as
    `processors run` reads it (the native reader, `on_read_scrape`)."""

    def __init__(self, nodes: int, codec: AvroCodec) -> None:
        self.templates = [ScrapeTemplate(codec, i) for i in range(nodes)]
        self.read = Framed(scrape_reader(load_schema(DEVICE_SAMPLES.subject)).read, codec, DEVICE_SAMPLES.subject)

    def feed_minute(self, part: NodePartition, minute: int) -> None:
        """A full minute of scrapes of every node: minute `minute` after T0."""
        offset = part.samples_next_offset
        for s in range(60):
            ts = T0 + minute * MINUTE_MS + s * 1000
            for template in self.templates:
                scrape = self.read.decode(template.at(ts))
                assert scrape is not None
                part.on_read_scrape(scrape, offset)
                offset += 1


def one_close(part: NodePartition, nodes: int, minute: int, codec: AvroCodec) -> dict[str, Any]:
    """Close `minute` (the next minute's scrapes are in, as they are while its grace runs) and encode its rows."""
    grace = part.settings.grace_ms
    with collector_paused():  # as the node driver holds the collector off through its burst
        t0 = time.perf_counter()
        out = part.advance(T0 + (minute + 1) * MINUTE_MS + grace)
        t1 = time.perf_counter()
        waiting, busy = split_by_activity(out.device_minutes)
        rows = waiting + busy
        sent, bundles = encode_rows(codec, waiting)  # two sends, as the node driver makes them
        sent_busy, bundles_busy = encode_rows(codec, busy)
        t2 = time.perf_counter()
        sent += sent_busy
        bundles += bundles_busy
    parsed = codec.parsed_schema(DEVICE_MINUTES.subject)
    for row in rows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
    t3 = time.perf_counter()
    assert len(rows) == nodes * GPUS and all(r["job_id"] for r in rows), "every device held by its node's job"
    assert {r["minute_start_ms"] for r in rows} == {T0 + minute * MINUTE_MS}
    return {
        "rows": len(rows),
        "close_s": t1 - t0,
        "encode_s": t2 - t1,
        "fastavro_encode_s": t3 - t2,
        "bytes": sum(len(k) + len(v) for k, v in sent),
        "bundles": len(bundles),
        "bundle_bytes": sum(len(k) + len(v) for k, v in bundles),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=100_000, help="GPUs (8 a node)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--core", type=int, default=0, help="pin to this core (-1: do not pin)")
    args = ap.parse_args()
    if args.core >= 0 and args.core in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {args.core})
    codec = AvroCodec()
    nodes = args.gpus // GPUS
    part = build_partition(nodes)
    scrapes = Scrapes(nodes, codec)
    scrapes.feed_minute(part, 0)
    runs = []
    for k in range(args.repeat + 1):
        scrapes.feed_minute(part, k + 1)
        r = one_close(part, nodes, k, codec)
        print(json.dumps({"minute": k, **{n: round(v, 3) if isinstance(v, float) else v for n, v in r.items()}}))
        if k:
            runs.append(r)  # minute 0 is the first close after a start: the device facts are made then

    def fig(name: str) -> str:
        xs = [r[name] for r in runs]
        return f"{statistics.median(xs):.3f} s median, {max(xs):.3f} s worst"

    rows = runs[0]["rows"]
    burst = [r["close_s"] + r["encode_s"] for r in runs]
    print(
        f"# {args.gpus:,} GPUs, {rows:,} device-minutes, minutes 1-{args.repeat}: close {fig('close_s')}; "
        f"encode {fig('encode_s')} (fastavro alone {fig('fastavro_encode_s')}); burst (close + encode) "
        f"{statistics.median(burst):.3f} s median, {max(burst):.3f} s worst; "
        f"{1e6 * statistics.median(burst) / rows:.1f} us a row"
    )


if __name__ == "__main__":
    main()
