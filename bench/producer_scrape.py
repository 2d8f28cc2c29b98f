"""How many nodes (8 GPUs each) one DCGM producer process scrapes, parses, encodes and publishes at 1 Hz.

Synthetic dcgm-exporter expositions (every default counter of the 4.4.2-4.7.1 catalogue, 8 GPUs,
~250 lines / 47 KB per node, values changing between scrapes) are served by separate server
processes on loopback; the producer (`producers.scraper.DcgmScraper`, one process, one event loop)
scrapes every node once a second and publishes each record through `RecordPublisher` to a real
Kafka broker (`--bootstrap`, else a local broker started for the run).

Reported per fleet size: scrapes done / expected, missed ticks, the producer process's CPU seconds
(all its threads, librdkafka included) and node-scrapes per CPU second, i.e. how many nodes one
core keeps up with at 1 Hz. Usage:

    .venv/bin/python bench/producer_scrape.py --nodes 250,500,750 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from producers.dcgm import RawSample  # noqa: E402
from producers.simulator.telemetry import render_exposition  # noqa: E402

CATALOGUE = ROOT / "tests" / "fixtures" / "dcgm" / "counters" / "4.4.2-4.7.1" / "default-counters.csv"
VARIANTS = 4


def default_fields() -> list[str]:
    out = []
    for line in CATALOGUE.read_text().splitlines():
        if line.startswith("DCGM_"):
            name, kind, _ = (x.strip() for x in line.split(",", 2))
            if kind != "label":
                out.append(name)
    return out


def node_exposition(node: int, variant: int, fields: list[str]) -> bytes:
    samples = []
    for g in range(8):
        labels = {
            "gpu": str(g),
            "UUID": f"GPU-{node:08x}-0000-4000-8000-{g:012x}",
            "pci_bus_id": f"00000000:{0x18 + g:02X}:00.0",
            "device": f"nvidia{g}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": f"bench-node-{node:05d}",
            "DCGM_FI_DRIVER_VERSION": "580.105.08",
        }
        for f in fields:
            v = (node * 7 + g * 13 + variant * 31) % 100
            samples.append(RawSample(f, labels, v / 100 if "_PROF_" in f and "BYTES" not in f else float(v)))
    return render_exposition(samples).encode()


def serve(port: int, nodes: range, ready: mp.synchronize.Event) -> None:  # type: ignore[name-defined]
    fields = default_fields()
    bodies = {n: [node_exposition(n, v, fields) for v in range(VARIANTS)] for n in nodes}
    hits: dict[int, int] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                n = int(path.split("/")[2])
                hits[n] = hits.get(n, 0) + 1
                body = bodies[n][hits[n] % VARIANTS]
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: "
                    + str(len(body)).encode()
                    + b"\r\n\r\n"
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_one(n_nodes: int, duration: float, servers: int, bootstrap: str, reference: bool) -> dict[str, float]:
    from base.settings import KafkaSettings
    from producers.dcgm import parse_exposition
    from producers.scraper import DcgmScraper, Target
    from streams.publish import RecordPublisher

    ports = [free_port() for _ in range(servers)]
    procs = []
    for i, port in enumerate(ports):
        ready = mp.Event()
        p = mp.Process(target=serve, args=(port, range(i, n_nodes, servers), ready), daemon=True)
        p.start()
        procs.append(p)
        if not ready.wait(120):
            raise RuntimeError("server did not start")
    targets = [
        Target(f"http://127.0.0.1:{ports[n % servers]}/node/{n}/metrics", f"bench-node-{n:05d}", "4.4.2-4.7.1")
        for n in range(n_nodes)
    ]
    publisher = RecordPublisher(KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=f"bench{os.getpid()}."),
                                telemetry=True)  # fmt: skip
    scraper = DcgmScraper(targets, publisher, "bench", timeout_s=0.9)
    if reference:
        scraper.parser.parse = parse_exposition  # type: ignore[method-assign]
    try:
        # Warm up (connections, label caches), then measure.
        asyncio.run(scraper.run(duration_s=2))
        before = (scraper.stats.ok, scraper.stats.failed, scraper.stats.missed_ticks)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        asyncio.run(scraper.run(duration_s=duration))
        publisher.flush(60)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        for p in procs:
            p.terminate()
    ok = scraper.stats.ok - before[0]
    return {
        "nodes": n_nodes,
        "expected": n_nodes * duration,
        "ok": ok,
        "failed": scraper.stats.failed - before[1],
        "missed": scraper.stats.missed_ticks - before[2],
        "cpu_s": cpu,
        "wall_s": wall,
        "nodes_per_core": ok / cpu if cpu else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="250,500,750", help="Comma-separated fleet sizes.")
    ap.add_argument("--duration", type=float, default=10.0, help="Measured seconds per fleet size.")
    ap.add_argument("--servers", type=int, default=2, help="Exporter server processes.")
    ap.add_argument("--bootstrap", default=None, help="Kafka bootstrap; default: start a local broker.")
    ap.add_argument("--reference-parser", action="store_true", help="Parse with text_string_to_metric_families.")
    args = ap.parse_args()
    from contextlib import ExitStack

    with ExitStack() as stack:
        bootstrap = args.bootstrap
        if bootstrap is None:
            from base.settings import Settings
            from stack.broker import BrokerConfig, LocalBroker, free_ports

            port, cport = free_ports(2)
            data = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            cfg = BrokerConfig(
                data_dir=data, port=port, controller_port=cport, kafka_version=Settings().broker.kafka_version
            )
            bootstrap = stack.enter_context(LocalBroker(cfg)).bootstrap
        print(
            f"producer_scrape: 8 GPUs/node, {len(default_fields())} metrics/GPU, broker {bootstrap}, "
            f"parser {'reference' if args.reference_parser else 'cached-labels'}, {os.cpu_count()} CPUs"
        )
        print(
            f"{'nodes':>6} {'scrapes':>9} {'expected':>9} {'failed':>6} {'missed':>6} {'cpu s':>7} {'wall s':>7}"
            f" {'nodes/core @1Hz':>16}"
        )
        for n in (int(x) for x in args.nodes.split(",")):
            r = run_one(n, args.duration, args.servers, bootstrap, args.reference_parser)
            print(
                f"{r['nodes']:>6} {r['ok']:>9} {r['expected']:>9.0f} {r['failed']:>6} {r['missed']:>6}"
                f" {r['cpu_s']:>7.2f} {r['wall_s']:>7.2f} {r['nodes_per_core']:>16.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
