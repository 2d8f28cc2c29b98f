"""A load generator that costs little (issue 44 item 1): the simulator's node scrapes recorded once, then replayed,
time-shifted, into `telemetry.device-samples` at up to 12,500 node scrapes a second (100,000 GPUs at 1 Hz).

    .venv/bin/python bench/replay_load.py --nodes 1250 --seconds 60 --rate 12500 --duration 30
    .venv/bin/python bench/replay_load.py --recording /tmp/rec.bin --rate 1250 --duration 60   # 10,000 GPUs

1. Record (once; kept in `--recording` and reused): `producers.simulator.simulate` for `--nodes` nodes of 8 GPUs
   and `--seconds` seconds, each device-samples record encoded as the producers encode it (Avro, single-object
   framing). Its CPU per scrape is printed: what the simulator costs when it is the load generator.
2. Replay: each record is cut once around its `ts_ms` (the schema begins with cluster, node, ts_ms), so sending
   one is a concatenation: head (the framing, cluster, node), the new time, tail (the rest, untouched). To reach
   `--rate` scrapes a second from a recording of fewer nodes, node `n` is also sent as `n~1`, `n~2` ... (its
   head rebuilt once, its key the new name's). The recording loops; each pass is shifted by its length, so event
   time only moves forward, and is paced to the wall clock: second `s` of the run is stamped `start + s` and sent
   within that second (`--as-fast` sends without waiting). Through the project's telemetry producer (`base.kafka`,
   `kafka.telemetry`: zstd, linger 20 ms; murmur2), so partitions and batches are the real ones.

Reported: scrapes sent, wall time, seconds that overran, and the process's CPU seconds (user + sys, all threads,
librdkafka's included, from `os.times`) per scrape, per 10,000 GPUs for a second at 1 Hz (x 1,250 scrapes), and as
cores at the asked rate; the load average beside them. On a shared machine the wall-clock figures (overruns) say
nothing about the generator, the CPU seconds do.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import broker_for, machine, scrape_producer  # noqa: E402

from schemas.codec import avro_string, read_avro_long  # noqa: E402

GPUS = 8
RECORD = struct.Struct(">IHH")  # second in the recording, node index, tail length; then the tail


def cut(value: bytes, header: int) -> tuple[str, str, int, bytes]:
    """(cluster, node, ts_ms, tail) of an encoded scrape; `tail` is everything after ts_ms."""
    at = header
    names = []
    for _ in range(2):
        size, at = read_avro_long(value, at)
        names.append(value[at : at + size].decode())
        at += size
    ts, at = read_avro_long(value, at)
    return names[0], names[1], ts, value[at:]


def record(path: Path, nodes: int, seconds: int) -> None:
    """The simulator's scrapes for `nodes` x `seconds`, encoded, into `path`; prints the simulator's CPU."""
    from producers.simulator import SimConfig, simulate
    from schemas.codec import SINGLE_OBJECT_HEADER_LEN, AvroCodec
    from schemas.topics import DEVICE_SAMPLES

    codec = AvroCodec()
    t0, c0 = time.monotonic(), os.times()
    start_ms = 1_700_000_000_000
    names: dict[str, int] = {}
    cluster = ""
    framing = b""
    n = 0
    with path.open("wb") as out:
        for topic, _key, rec in simulate(SimConfig(nodes=nodes, duration_s=seconds, start_ms=start_ms)):
            if topic is not DEVICE_SAMPLES:
                continue
            value = codec.encode(DEVICE_SAMPLES.subject, rec)
            cluster, node, ts, tail = cut(value, SINGLE_OBJECT_HEADER_LEN)
            framing = value[:SINGLE_OBJECT_HEADER_LEN]
            index = names.setdefault(node, len(names))
            out.write(RECORD.pack((ts - start_ms) // 1000, index, len(tail)) + tail)
            n += 1
    c1 = os.times()
    cpu = c1.user - c0.user + c1.system - c0.system
    index_file(path).write_text("\n".join([framing.hex(), cluster, *names]))
    print(f"recorded {n:,} scrapes of {len(names)} nodes x {seconds} s in {time.monotonic() - t0:.0f} s: simulator + "
          f"encode {cpu:.1f} CPU s = {cpu / n * 1e6:.0f} us a scrape, {cpu / n * 1250:.2f} CPU s per 10,000 GPUs "
          f"for a second at 1 Hz; load average {os.getloadavg()}", flush=True)  # fmt: skip


def index_file(path: Path) -> Path:
    return path.with_suffix(path.suffix + ".names")


def load(path: Path) -> tuple[bytes, str, list[str], list[list[tuple[int, bytes]]]]:
    """(framing, cluster, node names, per second of the recording: (node index, tail) in order)."""
    framing_hex, cluster, *names = index_file(path).read_text().split("\n")
    data = path.read_bytes()
    seconds: list[list[tuple[int, bytes]]] = []
    at = 0
    while at < len(data):
        sec, node, size = RECORD.unpack_from(data, at)
        at += RECORD.size
        while len(seconds) <= sec:
            seconds.append([])
        seconds[sec].append((node, data[at : at + size]))
        at += size
    return bytes.fromhex(framing_hex), cluster, names, seconds


class Replay:
    """A recording ready to send at `rate` scrapes a second: each node's head per copy, each record's tail."""

    def __init__(self, path: Path, rate: int) -> None:
        from schemas.topics import node_key

        framing, cluster, names, self.seconds = load(path)
        self.nodes = len(names)
        self.per_second = max(len(s) for s in self.seconds)
        self.rate = rate
        self.copies = -(-rate // self.per_second)  # ceil
        self.heads = [[framing + avro_string(cluster) + avro_string(n if r == 0 else f"{n}~{r}") for n in names]
                      for r in range(self.copies)]  # fmt: skip
        self.keys = [[node_key(cluster, n if r == 0 else f"{n}~{r}") for n in names] for r in range(self.copies)]

    def run(self, producer: Any, topic: str, duration: int, *, as_fast: bool = False) -> tuple[int, int]:
        """Send `duration` seconds, second `s` stamped now + s; (scrapes sent, seconds that overran)."""
        from schemas.codec import avro_long

        start_ms = int(time.time()) * 1000
        sent = overran = 0
        w0 = time.monotonic()
        for s in range(duration):
            todo = self.seconds[s % len(self.seconds)]
            ts = avro_long(start_ms + 1000 * s)
            budget = self.rate
            for r in range(self.copies):
                heads, keys = self.heads[r], self.keys[r]
                for node, tail in todo[: min(len(todo), budget)]:
                    while True:
                        try:
                            producer.produce(topic, heads[node] + ts + tail, keys[node])
                            break
                        except BufferError:
                            producer.poll(0.05)
                    producer.poll(0)
                budget -= len(todo)
                if budget <= 0:
                    break
            sent += min(self.rate, len(todo) * self.copies)
            if not as_fast:
                if w0 + s + 1 - time.monotonic() <= 0:
                    overran += 1
                while (wait := w0 + s + 1 - time.monotonic()) > 0:
                    producer.poll(wait)  # deliveries served as they come, not at the next second's first send
        return sent, overran


def topic_records(boot: str, topic: str, partitions: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": boot, "group.id": f"probe-{os.getpid()}"})
    try:
        return sum(probe.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions))
    finally:
        probe.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1250, help="nodes recorded (8 GPUs each; default 1250)")
    ap.add_argument("--seconds", type=int, default=60, help="seconds recorded (60-3600, default 60)")
    ap.add_argument("--recording", type=Path, default=None, help="kept recording (made when missing)")
    ap.add_argument("--rate", type=int, default=12_500, help="node scrapes a second to send (default 12,500)")
    ap.add_argument("--duration", type=int, default=30, help="seconds of event time to send (default 30)")
    ap.add_argument("--as-fast", action="store_true", help="send without pacing to the wall clock")
    ap.add_argument("--bootstrap", default=None, help="an existing broker (default: start one)")
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    if not (1 <= args.nodes <= 100_000 and 60 <= args.seconds <= 3600 and 1 <= args.rate <= 1_000_000):
        ap.error("--nodes 1-100000, --seconds 60-3600, --rate 1-1000000")

    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.topics import DEVICE_SAMPLES

    print(f"machine: {machine()}; load average {os.getloadavg()}", flush=True)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-replay-")))
        path = args.recording or tmp / "recording.bin"
        if not path.exists() or not index_file(path).exists():
            record(path, args.nodes, args.seconds)
        replay = Replay(path, args.rate)
        print(f"recording: {replay.nodes} nodes x {len(replay.seconds)} s ({replay.per_second} scrapes a second); "
              f"sending {args.rate:,} a second as {replay.copies} copies of each node, {args.duration} s",
              flush=True)  # fmt: skip

        boot = stack.enter_context(broker_for(args.bootstrap, tmp))
        topic = f"replay{os.getpid()}." + DEVICE_SAMPLES.name
        admin = AdminClient({"bootstrap.servers": boot})
        for fut in admin.create_topics([NewTopic(topic, args.partitions, 1)]).values():
            fut.result(timeout=60)
        producer = scrape_producer(boot)
        c0, w0 = os.times(), time.monotonic()
        sent, overran = replay.run(producer, topic, args.duration, as_fast=args.as_fast)
        left = producer.flush(120)
        c1, wall = os.times(), time.monotonic() - w0
        if left:
            raise SystemExit(f"{left} scrapes not delivered within 120 s")
        cpu = c1.user - c0.user + c1.system - c0.system
        held = topic_records(boot, topic, args.partitions)
        if held != sent:
            raise SystemExit(f"the topic holds {held:,} records, {sent:,} were sent")
        print(f"sent {sent:,} scrapes ({sent * GPUS:,} device-samples) in {wall:.1f} s of wall time, "
              f"{overran} of {args.duration} seconds overran; the topic holds {held:,}", flush=True)  # fmt: skip
        per = cpu / sent
        print(f"replay CPU: {cpu:.2f} s (user {c1.user - c0.user:.2f}, sys {c1.system - c0.system:.2f}) = "
              f"{per * 1e6:.1f} us a scrape; {per * 1250:.3f} CPU s per 10,000 GPUs for a second at 1 Hz; "
              f"{per * args.rate:.3f} cores at {args.rate:,} scrapes/s; load average {os.getloadavg()}")  # fmt: skip


if __name__ == "__main__":
    main()
