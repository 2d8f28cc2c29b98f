"""The broker's cost per GPU against the producer's batching, linger, compression and the partition count (issue 44
item 2): the replayed load (`bench/replay_load.py`) into one local broker, one topic per setting.

    .venv/bin/python bench/broker_cost.py --recording /tmp/rec1250.bin --rate 1250 --duration 30

One broker (`stack.broker.LocalBroker`, the project's settings) serves every setting in turn; a first run at the
default setting warms its JIT and is not reported. For each setting: a fresh `telemetry.device-samples` topic with
its partitions, the project's producer (`base.kafka.new_producer`) with the setting's overrides, `--duration`
seconds of node scrapes at `--rate` a second, paced to the wall clock, then a flush. Measured:
- the broker JVM's CPU seconds (user + sys, all threads, from /proc) over the run and the flush;
- the producer process's CPU seconds (`os.times`);
- the topic's log segments on disk;
- produce-to-acknowledgement latency (librdkafka's `Message.latency()`, one record in 100): with one broker and
  acks=all, the part of the end-to-end latency the producer settings change (linger, batching, compression);
- `--consumers` consumer processes (default 2, as the processors and the sinks read the topic), each in a group of
  its own, reading the topic while it is written until they have every record: the broker serves their fetches,
  and their own CPU seconds from their first record on (start-up left out) show what decompressing costs.
Reported per 10,000 GPUs at 1 Hz (1,250 scrapes a second). The CPU figures are CPU seconds, the latency is wall
time: on a shared machine the latency says little; the load average is printed beside each row.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import cpu_s, machine  # noqa: E402
from replay_load import Replay, record, topic_records  # noqa: E402

SETTINGS: list[tuple[str, int, dict[str, str]]] = [
    ("lz4, linger 20 ms (the other producers' default)", 4, {}),
    ("zstd, linger 20 ms (the telemetry producers' default)", 4, {"compression.type": "zstd"}),
    ("none, linger 20 ms", 4, {"compression.type": "none"}),
    ("lz4, linger 100 ms, batch 1 MiB", 4, {"linger.ms": "100", "batch.size": "1048576"}),
    ("zstd, linger 100 ms, batch 1 MiB", 4, {"compression.type": "zstd", "linger.ms": "100", "batch.size": "1048576"}),
    ("lz4, linger 20 ms, 16 partitions", 16, {}),
]


# A reader: a consumer in a group of its own, from the start of the topic until it has N records (or 300 s).
# It prints the CPU seconds it used from its first record on (its start-up and group join left out).
READER = """
import os, sys, time, uuid
from confluent_kafka import Consumer
boot, topic, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Consumer({"bootstrap.servers": boot, "group.id": "reader-" + uuid.uuid4().hex, "auto.offset.reset": "earliest",
              "enable.auto.commit": False})
c.subscribe([topic])
got, first, deadline = 0, None, time.monotonic() + 300
while got < want and time.monotonic() < deadline:
    got += sum(1 for m in c.consume(1000, 0.5) if m.error() is None)
    if got and first is None:
        first = os.times()
end = os.times()
c.close()
print(end.user - first.user + end.system - first.system if first else 0.0)
sys.exit(0 if got >= want else 3)
"""


class Latencies:
    def __init__(self) -> None:
        self.ms: list[float] = []

    def __call__(self, err: Any, msg: Any) -> None:
        if err is None and msg.latency() is not None:
            self.ms.append(msg.latency() * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recording", type=Path, required=True, help="bench/replay_load.py's (made when missing)")
    ap.add_argument("--rate", type=int, default=1250, help="node scrapes a second (default 1,250 = 10,000 GPUs)")
    ap.add_argument("--duration", type=int, default=30, help="seconds per setting (default 30)")
    ap.add_argument("--only", type=int, nargs="*", default=None, help="setting numbers to run (default all)")
    ap.add_argument("--consumers", type=int, default=2, help="consumer processes reading each topic (default 2)")
    args = ap.parse_args()

    from confluent_kafka.admin import AdminClient, NewTopic

    from base.kafka import new_producer
    from base.settings import KafkaSettings, Settings
    from stack.broker import BrokerConfig, LocalBroker, free_ports

    print(f"machine: {machine()}; load average {os.getloadavg()}", flush=True)
    if not args.recording.exists():
        record(args.recording, 1250, 60)
    replay = Replay(args.recording, args.rate)
    if replay.copies > 1:  # copies of a node in one batch compress far better than distinct nodes do
        print(f"warning: {replay.copies} copies of each recorded node: bytes on disk will read low", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-broker-cost-") as tmp:
        port, cport = free_ports(2)
        cfg = BrokerConfig(data_dir=Path(tmp) / "kafka", port=port, controller_port=cport,
                           kafka_version=Settings().broker.kafka_version)  # fmt: skip
        with LocalBroker(cfg, log_path=Path(tmp) / "broker.log") as broker:
            pid = broker._proc.pid  # type: ignore[union-attr]  # the JVM this object started
            boot = broker.bootstrap
            admin = AdminClient({"bootstrap.servers": boot})
            chosen = [(i, s) for i, s in enumerate(SETTINGS) if args.only is None or i in args.only]
            rows = []
            for n, (i, (label, partitions, overrides)) in enumerate([(-1, SETTINGS[0]), *chosen]):
                topic = f"cost{n}.telemetry.device-samples.v1"
                for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                    fut.result(timeout=60)
                latencies = Latencies()
                producer = new_producer(KafkaSettings(bootstrap_servers=boot), **overrides)
                sampled = _Sampled(producer, latencies)
                producer.list_topics(topic, timeout=30)  # connected and the topic's leaders known before timing
                want = sum(
                    min(args.rate, len(replay.seconds[t % len(replay.seconds)]) * replay.copies)
                    for t in range(args.duration)
                )  # what run() will send
                argv = [sys.executable, "-c", READER, boot, topic, str(want)]
                readers = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(args.consumers)]
                b0, c0, w0 = cpu_s(pid) or 0.0, os.times(), time.monotonic()
                sent, overran = replay.run(sampled, topic, args.duration)
                if producer.flush(120):
                    raise SystemExit(f"{label}: not delivered within 120 s")
                reader_cpu = 0.0
                for reader in readers:
                    out, _ = reader.communicate(timeout=330)
                    if reader.returncode != 0:
                        raise SystemExit(f"{label}: a reader failed ({reader.returncode})")
                    reader_cpu += float(out.strip() or 0.0)
                b1, c1, wall = cpu_s(pid) or 0.0, os.times(), time.monotonic() - w0
                held = topic_records(boot, topic, partitions)
                if held != sent:
                    raise SystemExit(f"{label}: the topic holds {held:,} records, {sent:,} were sent")
                size = sum(f.stat().st_size for f in Path(tmp).rglob("*.log") if f.parent.name.startswith(topic + "-"))
                if i < 0:
                    print(f"warm-up ({label}): {sent:,} scrapes, broker {b1 - b0:.1f} CPU s", flush=True)
                    continue
                per_10k = 1250 / sent  # one second of 10,000 GPUs, per scrape sent
                lat = sorted(latencies.ms)
                p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
                rows.append(
                    (i, label, partitions, (b1 - b0) * per_10k, (c1.user - c0.user + c1.system - c0.system) * per_10k,
                     reader_cpu * per_10k / max(len(readers), 1), size / sent, size * per_10k * 86_400 / 1e9,
                     statistics.median(lat) if lat else float("nan"), p99, overran, os.getloadavg()[0])
                )  # fmt: skip
                print(f"  {label}: {sent:,} scrapes in {wall:.0f} s, broker {b1 - b0:.1f} CPU s, {size / 1e6:.1f} MB",
                      flush=True)  # fmt: skip
    print(f"\n| # | setting | partitions | broker CPU s per 10,000 GPU-seconds ({args.consumers} readers) | producer "
          "CPU s per 10,000 GPU-seconds | a reader's CPU s per 10,000 GPU-seconds | bytes a scrape on disk "
          "| GB a day per 10,000 GPUs | ack latency p50 / p99 ms | seconds overran | load |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, label, parts, broker_cpu, prod_cpu, read_cpu, per_scrape, gb_day, p50, p99, overran, load in rows:
        print(f"| {i} | {label} | {parts} | {broker_cpu:.3f} | {prod_cpu:.3f} | {read_cpu:.3f} | {per_scrape:,.0f} | "
              f"{gb_day:.1f} | {p50:.0f} / {p99:.0f} | {overran} | {load:.1f} |")  # fmt: skip


class _Sampled:
    """The producer, with one record in 100 carrying a delivery callback that keeps its latency."""

    def __init__(self, producer: Any, latencies: Latencies) -> None:
        self._p = producer
        self._cb = latencies
        self._n = 0

    def produce(self, topic: str, value: bytes, key: bytes) -> None:
        self._n += 1
        if self._n % 100 == 0:
            self._p.produce(topic, value, key, on_delivery=self._cb)
        else:
            self._p.produce(topic, value, key)

    def poll(self, timeout: float) -> int:
        return int(self._p.poll(timeout))


if __name__ == "__main__":
    main()
