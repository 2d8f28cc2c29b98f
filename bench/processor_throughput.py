"""Processor benchmark: device-samples/s per processor process on one core, alert latencies, memory.

    .venv/bin/python bench/processor_throughput.py                # ~3-4 min: backlog + 120 s real-time run
    .venv/bin/python bench/processor_throughput.py --soak         # real-time run of 600 s instead
    .venv/bin/python bench/processor_throughput.py --bootstrap 127.0.0.1:9092 --rate 100000

Parts (each prints one JSON line, then a summary):
1. backlog:  N node scrapes (8 GPUs each) already in the topic; one `gpuledger processors run` process
   (all three stages) pinned to one core reads them; samples/s between its first and last sample.
2. realtime: a producer process (pinned to the other core) publishes `--rate` device-samples/s at 1 Hz
   per node, event time = wall clock, for `--duration` s; the worker (one core, real-time mode) keeps
   up or not: lag (unread samples) is sampled every second. Some nodes run idle jobs (interactive,
   idle_after 1 min, grace 1 min): idle alert latency = receipt of the alert - (end of the window that
   completed the idle period + grace). Some exporters die at a third of the run: coverage alert
   latency = receipt of COVERAGE_GAP - (last sample + coverage_timeout).
3. memory: bytes per tracked device of the node stage (tracemalloc, in-process), with two minutes of
   windows open (the steady state: the current minute and the previous one within its grace).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from _common import (
    GPUS,
    GRACE_MS,
    ScrapeTemplate,
    broker_for,
    cpu_s,
    create_topics,
    kind_of,
    node_devices,
    node_name,
    produce_backlog,
    read_stats,
    scrape_producer,
    setup_cluster,
    worker,
)
from confluent_kafka import Consumer

from base.processor_settings import ProcessorSettings
from processors.stages import NodePartition
from processors.testing import T0, inventory, job_event, scrape
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_MINUTES, DEVICE_SAMPLES, job_key, node_key

# ------------------------------------------------------------------------------------------ helpers
ALL_LOOP_STAGES = ("--stage", "rekey", "--stage", "node", "--stage", "job")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


# ------------------------------------------------------------------------------------------ parts
def part_backlog(bootstrap: str, tmp: Path, samples: int) -> dict[str, Any]:
    prefix = f"bb{uuid.uuid4().hex[:6]}."
    create_topics(bootstrap, prefix)
    nodes = 500
    start = T0
    setup_cluster(bootstrap, prefix, nodes, start)
    produce_backlog(bootstrap, prefix, nodes, samples // GPUS, start)
    state = tmp / prefix
    state.mkdir()
    # Every stage on the loop in one process (the job stage's loop is kept for comparison): the figure
    # recorded before the job stage moved to faust measured exactly this.
    proc = worker(bootstrap, prefix, state, False, 0, *ALL_LOOP_STAGES, "--exit-when-idle", "3")
    proc.wait(timeout=1800)
    st = read_stats(state)
    span = (st.get("last_sample_wall") or 0) - (st.get("first_sample_wall") or 0)
    return {
        "part": "backlog",
        "samples": st.get("samples"),
        "nodes": nodes,
        "seconds": round(span, 2),
        "samples_per_s": round(st["samples"] / span) if span > 0 else None,
        "device_minutes": st.get("device_minutes"),
        "job_minutes": st.get("job_minutes"),
        "late": st.get("late_scrapes"),
    }


def _producer_main(bootstrap: str, prefix: str, nodes: int, duration_s: float, dead: int, core: int) -> None:
    if core in os.sched_getaffinity(0):
        os.sched_setaffinity(0, {core})
    codec = AvroCodec()
    templates = [ScrapeTemplate(codec, i) for i in range(nodes)]
    prod = scrape_producer(bootstrap)
    topic = prefix + DEVICE_SAMPLES.name
    keys = [node_key("bench", node_name(i)) for i in range(nodes)]
    t_end = time.time() + duration_s
    dead_from = time.time() + duration_s / 3
    sent = 0
    behind = 0.0
    sec = int(time.time())
    while sec < t_end:
        ts = sec * 1000
        for i in range(nodes):
            if i < dead and sec >= dead_from:
                continue
            while True:
                try:
                    prod.produce(topic, templates[i].at(ts), keys[i])
                    break
                except BufferError:
                    prod.poll(0.02)
            sent += 1
        prod.poll(0)
        sec += 1
        wait = sec - time.time()
        if wait > 0:
            time.sleep(wait)
        else:
            behind = max(behind, -wait)
    prod.flush(60)
    print(json.dumps({"producer_scrapes": sent, "producer_max_behind_s": round(behind, 2)}), flush=True)


def rows_created(bootstrap: str, prefix: str) -> dict[bytes, list[int]]:
    """Job key -> when the node stage produced each of its device-minutes (the records' CreateTime)."""
    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": prefix + "bench-rows", "auto.offset.reset": "earliest"}
    )
    c.subscribe([prefix + DEVICE_MINUTES.name])
    out: dict[bytes, list[int]] = {}
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < 3:
        msgs = c.consume(10_000, 0.5)
        if msgs:
            quiet_since = time.monotonic()
        for m in msgs:
            if not m.error() and m.key():
                out.setdefault(m.key() or b"", []).append(m.timestamp()[1])
    c.close()
    return out


def part_realtime(
    bootstrap: str, tmp: Path, rate: int, duration_s: float, split: bool, job_stage: str = "agents"
) -> dict[str, Any]:
    prefix = f"br{uuid.uuid4().hex[:6]}."
    create_topics(bootstrap, prefix)
    nodes = max(10, rate // GPUS)
    dead = max(1, nodes // 100)
    t_start = int(time.time()) + 15  # the producer's first second: the inventory is true from then on
    setup_cluster(bootstrap, prefix, nodes, t_start * 1000)
    state = tmp / prefix
    state.mkdir()
    alerts: list[tuple[float, dict[str, Any]]] = []
    stop = threading.Event()

    def collect() -> None:
        codec = AvroCodec()
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": prefix + "bench", "auto.offset.reset": "earliest"})
        c.subscribe([prefix + "alerts.v1"])
        while not stop.is_set():
            for m in c.consume(500, 0.1):
                if m.error() or m.value() is None:
                    continue
                alerts.append((time.time(), codec.decode(m.value() or b"", "alerts").record))
        c.close()

    t = threading.Thread(target=collect, daemon=True)
    t.start()
    # As shipped: the hot path (re-keying, windows) in `processors run` on core 0, the job stage
    # (job-minutes, idle machines) in `processors agents` on core 1 when split, else floating.
    proc = worker(bootstrap, prefix, state, True, 0)
    if job_stage == "agents":
        job_proc = worker(bootstrap, prefix, state, True, 1 if split else -1, name="job", command="agents")
    else:  # the loop's job stage, the reference the agents are tested against
        job_proc = worker(bootstrap, prefix, state, True, 1 if split else -1, "--stage", "job", name="job")
    time.sleep(max(0.0, t_start - time.time()))  # the worker joins its groups meanwhile
    producer = subprocess.Popen(
        [sys.executable, __file__, "--producer", bootstrap, prefix, str(nodes), str(duration_s), str(dead)],
        stdout=subprocess.PIPE,
    )
    lags: list[int] = []
    rss: list[float] = []
    t0 = time.time()
    while producer.poll() is None:
        time.sleep(1)
        st = read_stats(state)
        lags.append(int(st.get("lag_records", 0)) * GPUS)
        r = rss_mib(proc.pid)
        if r is not None:
            rss.append(r)
    produced = json.loads((producer.stdout.read() if producer.stdout else b"{}").decode() or "{}")
    time.sleep(GRACE_MS / 1000 + 15)  # let the last minutes close and the alerts arrive
    st = read_stats(state)
    cpu = {"worker_cpu_s": cpu_s(proc.pid), "job_stage_cpu_s": cpu_s(job_proc.pid)}  # start-up included
    proc.terminate()
    proc.wait(timeout=60)
    job_proc.terminate()
    job_proc.wait(timeout=60)
    stop.set()
    t.join(timeout=5)
    # Read after the run, not beside it: reading every device-minute in this process took CPU the processes
    # measured needed at exactly the moments measured (a minute's close).
    rows_out = rows_created(bootstrap, prefix)
    idle = [(recv, a) for recv, a in alerts if a["kind"] in ("IDLE_WARNING", "RECLAIM_NOTICE")]
    idle_lat = [recv - (a["ts_ms"] + GRACE_MS) / 1000 for recv, a in idle]
    # where it goes: until the job stage emitted the alert (its wall clock), and from there to this reader
    idle_emitted = [(a["emitted_ts_ms"] - a["ts_ms"] - GRACE_MS) / 1000 for _, a in idle if a["emitted_ts_ms"]]

    def rows_sent(a: dict[str, Any]) -> float | None:
        """When the node stage produced the last device-minute of the alert's job-minute, past its due time."""
        due = a["ts_ms"] + GRACE_MS
        near = [t for t in rows_out.get(job_key(a["cluster"], a["job_id"]), []) if abs(t - due) < 30_000]
        return (max(near) - due) / 1000 if near else None

    idle_rows = [x for _, a in idle if (x := rows_sent(a)) is not None]
    # The first minute closed after a start is slower (every node's device facts are made then): the later
    # closes are the steady state.
    first_end = (t_start * 1000 // 60_000 + 1) * 60_000
    later = [lat for lat, (_, a) in zip(idle_lat, idle, strict=True) if a["ts_ms"] > first_end]
    by_close: dict[int, list[float]] = {}
    for lat, (_, a) in zip(idle_lat, idle, strict=True):
        by_close.setdefault(a["ts_ms"], []).append(lat)
    # An idle job on a node whose exporter died goes dark: whether it was warned first depends on when in its
    # minute the exporter died (the idle machine does not count dark minutes as idle).
    warned = {a["job_id"] for _, a in idle if a["kind"] == "IDLE_WARNING"}
    never_warned = [i for i in range(nodes) if kind_of(i)[0] and f"j{i}" not in warned]
    dead_nodes = {node_name(i) for i in range(dead)}  # after the run every exporter stops: not counted
    cov_lat = [
        recv - a["ts_ms"] / 1000 for recv, a in alerts if a["kind"] == "COVERAGE_GAP" and a["node"] in dead_nodes
    ]
    span = (st.get("last_sample_wall") or 0) - (st.get("first_sample_wall") or 0)
    steady = lags[len(lags) // 4 :] or lags
    return {
        "part": "realtime",
        "processes": f"run (rekey+node) on core 0, job stage ({job_stage}) " + ("on core 1" if split else "floating"),
        "target_samples_per_s": nodes * GPUS,
        "nodes": nodes,
        "duration_s": round(time.time() - t0, 1),
        "produced_samples": produced.get("producer_scrapes", 0) * GPUS,
        "producer_max_behind_s": produced.get("producer_max_behind_s"),
        "processed_samples": st.get("samples"),
        "processed_samples_per_s": round(st.get("samples", 0) / span) if span > 0 else None,
        "lag_samples_max": max(lags, default=None),
        "lag_samples_last": lags[-1] if lags else None,
        "lag_samples_steady_max": max(steady, default=None),
        "idle_alerts": len(idle_lat),
        "idle_jobs_never_warned": len(never_warned),
        "idle_jobs_never_warned_exporter_dead": sum(1 for i in never_warned if i < dead),
        "idle_alert_latency_s_p50": pct(idle_lat, 0.5),
        "idle_alert_latency_s_p99": pct(idle_lat, 0.99),
        "idle_alert_latency_s_p99_after_first_close": pct(later, 0.99),
        "idle_alerts_after_first_close": len(later),
        "idle_alert_latency_s_p50_max_by_close": [
            (pct(v, 0.5), round(max(v), 3)) for _, v in sorted(by_close.items())
        ],
        "idle_alert_emitted_s_p50": pct(idle_emitted, 0.5),
        "idle_alert_emitted_s_p99": pct(idle_emitted, 0.99),
        "idle_alert_rows_sent_s_p50": pct(idle_rows, 0.5),
        "idle_alert_rows_sent_s_p99": pct(idle_rows, 0.99),
        "coverage_alerts_dead_exporters": len(cov_lat),
        "dead_exporter_devices": dead * GPUS,
        "coverage_alert_latency_s_p50": pct(cov_lat, 0.5),
        "coverage_alert_latency_s_max": round(max(cov_lat), 3) if cov_lat else None,
        **{k: round(v, 1) if v is not None else None for k, v in cpu.items()},
        "worker_rss_mib_max": round(max(rss), 1) if rss else None,
        "devices": nodes * GPUS,
    }


def part_memory(devices: int = 20_000) -> dict[str, Any]:
    nodes = devices // GPUS
    part = NodePartition(ProcessorSettings())
    scrapes = []
    for i in range(nodes):
        idle, starved = kind_of(i)
        scrapes.append(scrape(node_name(i), T0, node_devices(i, idle, starved), "bench"))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(nodes):
        n = node_name(i)
        part.on_inventory(inventory(n, [f"GPU-{i:05d}-{g}" for g in range(GPUS)], T0, "bench"))
        part.on_allocation(
            f"bench/{n}",
            job_event("STARTED", f"j{i}", T0, {n: [f"GPU-{i:05d}-{g}" for g in range(GPUS)]}, cluster="bench"),
            i,
        )
    off = 0
    for sec in range(70):  # minute 0 complete, 10 s of minute 1: both open (minute 0 is within grace)
        for s in scrapes:
            s["ts_ms"] = T0 + sec * 1000
            part.on_scrape(s, off)
            off += 1
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {"part": "memory", "devices": devices, "bytes_per_device": round(used / devices), "open_minutes": 2}


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", help="Kafka bootstrap; default: start a local broker in a temp dir")
    ap.add_argument("--duration", type=float, default=120.0, help="real-time run, seconds (default 120)")
    ap.add_argument("--soak", action="store_true", help="real-time run of 600 s")
    ap.add_argument("--rate", type=int, default=100_000, help="device-samples/s to publish (default 100000)")
    ap.add_argument("--backlog-samples", type=int, default=800_000)
    ap.add_argument("--one-process", action="store_true", help="real-time run: agents not pinned")
    ap.add_argument(
        "--job-stage",
        choices=["agents", "loop"],
        default="agents",
        help="real-time run: the job stage as shipped (faust agents) or the loop's (`processors run --stage job`)",
    )
    ap.add_argument("--skip", action="append", default=[], choices=["backlog", "realtime", "memory"])
    ap.add_argument("--producer", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.producer:
        b, prefix, nodes, dur, dead = args.producer
        _producer_main(b, prefix, int(nodes), float(dur), int(dead), 1)
        return
    duration = 600.0 if args.soak else args.duration
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-") as tmpdir:
        tmp = Path(tmpdir)
        with broker_for(args.bootstrap, tmp) as bootstrap:
            if "memory" not in args.skip:
                results.append(part_memory())
                print(json.dumps(results[-1]), flush=True)
            if "backlog" not in args.skip:
                results.append(part_backlog(bootstrap, tmp, args.backlog_samples))
                print(json.dumps(results[-1]), flush=True)
            if "realtime" not in args.skip:
                results.append(part_realtime(bootstrap, tmp, args.rate, duration, not args.one_process, args.job_stage))
                print(json.dumps(results[-1]), flush=True)
    load = os.getloadavg()
    print(f"# cores: {os.cpu_count()}, load average at end: {load[0]:.2f} (machine shared; figures are as measured)")
    for r in results:
        print("# " + ", ".join(f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
