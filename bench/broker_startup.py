"""Local Kafka broker start-up and memory: cold (empty jar cache, empty Maven repository: everything
downloaded) and warm (jars cached; a fresh data dir, and a restart on existing data), plus RSS.

    .venv/bin/python bench/broker_startup.py [--runs 3] [--messages 100000] [--json]

Prints figures only; never fails on wall time. Results go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _common import machine, rss_mib
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from base.settings import Settings
from stack import broker


def timed_start(cfg: broker.BrokerConfig) -> tuple[broker.LocalBroker, dict[str, float]]:
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    libs_existed = broker.jars_cached(cfg.kafka_version, cfg.cache_root)
    libs = broker.ensure_jars(cfg.kafka_version, cfg.cache_root, maven_repo=cfg.maven_repo)
    marks["jars_s"] = 0.0 if libs_existed else time.monotonic() - t0
    t1 = time.monotonic()
    broker.format_storage(cfg, libs)
    marks["format_s"] = time.monotonic() - t1
    b = broker.LocalBroker(cfg)
    t2 = time.monotonic()
    b.start()
    marks["start_to_ready_s"] = time.monotonic() - t2
    marks["total_s"] = time.monotonic() - t0
    return b, marks


def load(b: broker.LocalBroker, messages: int) -> float:
    topic = "bench.load"
    admin = AdminClient(b.client_config())
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(timeout=30)
    p = Producer({**b.client_config(), "linger.ms": "10", "compression.type": "lz4"})
    payload = b"x" * 200
    t = time.monotonic()
    for i in range(messages):
        while True:
            try:
                p.produce(topic, key=str(i % 64).encode(), value=payload)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    return messages / (time.monotonic() - t)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="warm starts to take the median of")
    ap.add_argument("--messages", type=int, default=100_000, help="200-byte records produced before RSS under load")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    version = Settings().broker.kafka_version
    results: dict[str, object] = {
        "kafka_version": version,
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-") as tmp:
        root = Path(tmp)
        port, cport = broker.free_ports(2)

        def cfg(name: str) -> broker.BrokerConfig:
            return broker.BrokerConfig(
                data_dir=root / name,
                port=port,
                controller_port=cport,
                kafka_version=version,
                cache_root=root / "cache",
                maven_repo=root / "m2",
            )

        # Cold: nothing cached, Maven downloads plugin and broker jars.
        b, cold = timed_start(cfg("cold"))
        results["cold"] = cold
        results["rss_idle_mib"] = round(rss_mib(b.pid or 0), 1)
        results["produce_msgs_per_s"] = round(load(b, args.messages))
        results["rss_after_load_mib"] = round(rss_mib(b.pid or 0), 1)
        t = time.monotonic()
        b.stop()
        results["stop_s"] = round(time.monotonic() - t, 2)
        results["jar_cache_mib"] = round(
            sum(f.stat().st_size for f in (root / "cache").rglob("*.jar")) / 2**20, 1
        )

        warm_new, warm_restart = [], []
        for i in range(args.runs):
            b, m = timed_start(cfg(f"warm{i}"))  # jars cached, fresh data dir (formats)
            warm_new.append(m)
            b.stop()
            b, m = timed_start(cfg("cold"))  # restart on existing data
            warm_restart.append(m)
            b.stop()

        def med(rows: list[dict[str, float]]) -> dict[str, float]:
            return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}

        results["cold"] = {k: round(v, 2) for k, v in cold.items()}
        results["warm_fresh_data_dir"] = med(warm_new)
        results["warm_restart_existing_data"] = med(warm_restart)

    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"Apache Kafka {version} local broker   machine: {results['machine']}")
    print(f"{'case':32} {'jars s':>8} {'format s':>9} {'start s':>8} {'total s':>8}")
    for case in ("cold", "warm_fresh_data_dir", "warm_restart_existing_data"):
        m = results[case]
        assert isinstance(m, dict)
        print(f"{case:32} {m['jars_s']:8.2f} {m['format_s']:9.2f} {m['start_to_ready_s']:8.2f} {m['total_s']:8.2f}")
    print(f"RSS idle {results['rss_idle_mib']} MiB; after {args.messages} x 200 B records "
          f"{results['rss_after_load_mib']} MiB; produce {results['produce_msgs_per_s']} msg/s")
    print(f"stop {results['stop_s']} s; jar cache {results['jar_cache_mib']} MiB")


if __name__ == "__main__":
    main()
