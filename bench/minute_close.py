"""The minute-close burst: one minute of N GPUs closed, attributed, rolled up and encoded, in one process.

    .venv/bin/python bench/minute_close.py                     # 100,000 GPUs (12,500 nodes x 8), 3 closes
    .venv/bin/python bench/minute_close.py --gpus 10000 --repeat 5

What it times, on one core (the process pins itself to core 0), with no broker: the node stage
(`NodePartition`, as `processors run` holds it) is fed every node's inventory, one job per node (every
tenth idle, every seventh starved, the fleet of bench/processor_throughput.py) and a full minute of
scrapes for every node; then
the watermark passes the minute's end plus grace and

- close: `NodePartition.advance` (attribution per second, classification, the device-minute and
  coverage-minute rows);
- encode: each device-minute row's Kafka key and value (`AvroCodec.encode`: the lean walk, fastavro off
  its plain path), in the order `processors run` sends them (rows of devices that did not compute first);
- encode (fastavro): the same rows through fastavro's schemaless_writer, for comparison.

Producing to the broker is not included: the real-time runs of bench/processor_throughput.py measure the
whole path (lag and idle alert latency).
Each repeat builds the minute anew; the figures are the median and the worst of the repeats.
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

from base.processor_settings import ProcessorSettings
from bench._common import GPUS, kind_of, node_devices, node_name
from processors.drivers.node import _busy_last
from processors.stages import NodePartition
from processors.testing import T0, inventory, job_event, scrape
from processors.windows import MINUTE_MS
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_MINUTES, job_key, node_key

CLUSTER = "bench"


def build_minute(nodes: int) -> NodePartition:
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
    devices = [node_devices(i, *kind_of(i)) for i in range(nodes)]
    offset = 0
    for s in range(60):
        ts = T0 + s * 1000
        for i in range(nodes):
            part.on_scrape(scrape(node_name(i), ts, devices[i], cluster=CLUSTER), offset)
            offset += 1
    return part


def one_close(nodes: int, codec: AvroCodec) -> dict[str, Any]:
    part = build_minute(nodes)
    grace = part.settings.grace_ms
    t0 = time.perf_counter()
    out = part.advance(T0 + MINUTE_MS + grace)
    t1 = time.perf_counter()
    rows = sorted(out.device_minutes, key=_busy_last)
    encoded = 0
    for row in rows:
        jid = row["job_id"]
        key = job_key(row["cluster"], jid) if jid is not None else node_key(row["cluster"], row["node"])
        encoded += len(key) + len(codec.encode(DEVICE_MINUTES.subject, row))
    t2 = time.perf_counter()
    parsed = codec.parsed_schema(DEVICE_MINUTES.subject)
    for row in rows:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, row)
    t3 = time.perf_counter()
    assert len(rows) == nodes * GPUS and all(r["job_id"] for r in rows), "every device held by its node's job"
    return {
        "rows": len(rows),
        "close_s": t1 - t0,
        "encode_s": t2 - t1,
        "fastavro_encode_s": t3 - t2,
        "bytes": encoded,
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
    runs = []
    for k in range(args.repeat):
        r = one_close(nodes, codec)
        runs.append(r)
        print(json.dumps({"repeat": k, **{n: round(v, 3) if isinstance(v, float) else v for n, v in r.items()}}))

    def fig(name: str) -> str:
        xs = [r[name] for r in runs]
        return f"{statistics.median(xs):.3f} s median, {max(xs):.3f} s worst"

    rows = runs[0]["rows"]
    burst = [r["close_s"] + r["encode_s"] for r in runs]
    print(
        f"# {args.gpus:,} GPUs, {rows:,} device-minutes: close {fig('close_s')}; encode {fig('encode_s')} "
        f"(fastavro alone {fig('fastavro_encode_s')}); burst (close + encode) {statistics.median(burst):.3f} s median, "
        f"{max(burst):.3f} s worst; {1e6 * statistics.median(burst) / rows:.1f} us a row"
    )


if __name__ == "__main__":
    main()
