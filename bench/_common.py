"""What the benchmarks share: the machine line, a process's resident memory, and, for the processor
benchmarks (processor_throughput.py, cost_curves.py), a local broker, the topics, a synthetic fleet of
8-GPU nodes with jobs on them, its node scrapes produced ahead of a run, and `gpuledger processors` as a
subprocess.

Imported as `_common` (each benchmark runs as `.venv/bin/python bench/<name>.py`, so `bench/` is on the path).
The Kafka client and the project's modules are imported inside the functions that need them, so the
start-up benchmarks that only want `machine()` do not load them.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from confluent_kafka import Producer

    from schemas.codec import AvroCodec

REPO = Path(__file__).resolve().parents[1]
GPUS = 8  # devices per node scrape
GRACE_MS = 10_000
COVERAGE_TIMEOUT_MS = 20_000
CLI = "from gpuledger.cli import main; main()"


def cpu_s(pid: int) -> float | None:
    """user + sys of a live process, all threads, from /proc/<pid>/stat (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15 of stat(5)


def rss_mib(pid: int) -> float:
    """The process's resident set size in MiB (NaN when /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def machine() -> str:
    """Cores, memory and platform, as the figures in docs/benchmarks.md name the machine."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.platform()}"


# ------------------------------------------------------------------------------------------ broker, topics
@contextlib.contextmanager
def broker_for(bootstrap: str | None, tmp: Path) -> Iterator[str]:
    """`bootstrap` when given; else a one-node local broker with its data under `tmp`, stopped after the block."""
    if bootstrap:
        yield bootstrap
        return
    from base.settings import Settings
    from stack.broker import BrokerConfig, LocalBroker, free_ports

    port, cport = free_ports(2)
    cfg = BrokerConfig(
        data_dir=tmp / "kafka", port=port, controller_port=cport, kafka_version=Settings().broker.kafka_version
    )
    broker = LocalBroker(cfg, log_path=tmp / "broker.log").start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def create_topics(bootstrap: str, prefix: str, partitions: int = 4) -> None:
    """Every catalogue topic and the dead-letter topics, under `prefix`."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.topics import CATALOGUE, DEVICE_SAMPLES, INVENTORY, JOB_EVENTS

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [prefix + t.name for t in CATALOGUE] + [prefix + t.dlq for t in (DEVICE_SAMPLES, JOB_EVENTS, INVENTORY)]
    cfg = {prefix + INVENTORY.name: {"cleanup.policy": "compact"}}
    new = [NewTopic(n, partitions, 1, config=cfg.get(n, {})) for n in names]
    for fut in admin.create_topics(new).values():
        fut.result(timeout=30)


# ------------------------------------------------------------------------------------------ the fleet
def node_name(i: int) -> str:
    return f"bn-{i:05d}"


def node_devices(i: int, idle: bool, starved: bool) -> list[dict[str, Any]]:
    from processors.testing import device

    out = []
    for g in range(GPUS):
        sm = 0.0 if idle else (0.12 if starved else 0.6 + 0.03 * g)
        out.append(device(f"GPU-{i:05d}-{g}", g, sm=sm, fb_mib=8192.0 if not idle or g else 2048.0, power_w=300.0))
    return out


def kind_of(i: int) -> tuple[bool, bool]:
    """(idle, starved): every 10th node idle, every 7th starved, the rest busy."""
    return i % 10 == 3, i % 7 == 5


def setup_cluster(bootstrap: str, prefix: str, nodes: int, start_ms: int) -> None:
    """Each node's inventory, and one job STARTED at `start_ms` holding all its GPUs (interactive on idle nodes)."""
    from base.settings import KafkaSettings
    from processors.testing import inventory, job_event
    from schemas.topics import INVENTORY, JOB_EVENTS, job_key, node_key
    from streams.publish import RecordPublisher

    pub = RecordPublisher(KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix))
    for i in range(nodes):
        n = node_name(i)
        pub.publish(
            INVENTORY, node_key("bench", n), inventory(n, [f"GPU-{i:05d}-{g}" for g in range(GPUS)], start_ms, "bench")
        )
    for i in range(nodes):
        idle, _ = kind_of(i)
        n = node_name(i)
        ev = job_event(
            "STARTED",
            f"j{i}",
            start_ms,
            {n: [f"GPU-{i:05d}-{g}" for g in range(GPUS)]},
            cluster="bench",
            interactive=idle,
        )
        pub.publish(JOB_EVENTS, job_key("bench", f"j{i}"), ev)
    pub.flush()


class ScrapeTemplate:
    """Pre-encoded NodeScrape per node with the event time spliced in (exact Avro, fast to produce)."""

    def __init__(self, codec: AvroCodec, i: int) -> None:
        from processors.testing import scrape
        from schemas.codec import avro_long
        from schemas.topics import DEVICE_SAMPLES

        idle, starved = kind_of(i)
        marker = 7_777_777_777_777
        body = codec.encode(
            DEVICE_SAMPLES.subject, scrape(node_name(i), marker, node_devices(i, idle, starved), "bench")
        )
        self._avro_long = avro_long
        enc = avro_long(marker)
        at = body.index(enc)
        self.head, self.tail = body[:at], body[at + len(enc) :]

    def at(self, ts_ms: int) -> bytes:
        return self.head + self._avro_long(ts_ms) + self.tail


def scrape_producer(bootstrap: str) -> Producer:
    """The project's telemetry producer (`base.kafka.new_telemetry_producer`): the telemetry producers'
    compression and linger (`kafka.telemetry`, zstd and 20 ms by default), and above all the partitioner, Kafka's
    murmur2, so a node's scrapes share a partition with its re-keyed allocations and inventory, as every producer of
    the project (and Java's) puts them. librdkafka's own default (CRC32) would put most nodes' scrapes on
    another partition than their jobs, and the node stage would see those devices unallocated."""
    from base.kafka import new_telemetry_producer
    from base.settings import KafkaSettings

    return new_telemetry_producer(KafkaSettings(bootstrap_servers=bootstrap))


def produce_backlog(bootstrap: str, prefix: str, nodes: int, scrapes: int, start_ms: int) -> None:
    """`scrapes` node scrapes, one per node per second from `start_ms` (node 0..nodes-1, then the next second),
    into the device-samples topic; returns once the broker has them all."""
    from schemas.codec import AvroCodec
    from schemas.topics import DEVICE_SAMPLES, node_key

    codec = AvroCodec()
    templates = [ScrapeTemplate(codec, i) for i in range(min(nodes, scrapes))]
    keys = [node_key("bench", node_name(i)) for i in range(len(templates))]
    prod = scrape_producer(bootstrap)
    topic = prefix + DEVICE_SAMPLES.name
    for k in range(scrapes):
        sec, i = divmod(k, nodes)
        while True:
            try:
                prod.produce(topic, templates[i].at(start_ms + sec * 1000), keys[i])
                break
            except BufferError:
                prod.poll(0.05)
        prod.poll(0)
    left = prod.flush(120)
    if left:
        raise RuntimeError(f"{left} scrapes for {topic} not delivered within 120 s")


# ------------------------------------------------------------------------------------------ the processors
def worker(
    bootstrap: str,
    prefix: str,
    state: Path,
    realtime: bool,
    core: int,
    *extra: str,
    name: str = "stats",
    command: str = "run",
    env_extra: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """`processors run` (or `processors agents`, the job stage on faust) pinned to `core` (-1: floats);
    its stats in `state/<name>.json`, its output in `state/<name>.log`; `env_extra` adds settings."""
    env = dict(os.environ)
    env.update(
        {
            "GPULEDGER_CONFIG": str(state / "none.toml"),
            "GPULEDGER_STATE_DIR": str(state),
            "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
            "GPULEDGER_PROCESSOR__GROUP_ID": prefix + "processors",
            "GPULEDGER_PROCESSOR__REALTIME": "true" if realtime else "false",
            "GPULEDGER_PROCESSOR__GRACE_MS": str(GRACE_MS),
            "GPULEDGER_PROCESSOR__COVERAGE_TIMEOUT_MS": str(COVERAGE_TIMEOUT_MS),
            "GPULEDGER_PROCESSOR__IDLE__IDLE_AFTER_MIN_INTERACTIVE": "1",
            "GPULEDGER_PROCESSOR__IDLE__GRACE_MIN": "1",
            **(env_extra or {}),
        }
    )
    cores = os.sched_getaffinity(0)
    pin = {core} if core in cores else None
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "processors", command, "--stats-file", str(state / f"{name}.json"), *extra],
        env=env,
        cwd=REPO,
        stdout=open(state / f"{name}.log", "ab"),
        stderr=subprocess.STDOUT,
        preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None,
    )


def read_stats(state: Path, name: str = "stats") -> dict[str, Any]:
    try:
        return json.loads((state / f"{name}.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


# ------------------------------------------------------------------------------------------ ClickHouse
def migrated_database(server: Any, database: str | None = None) -> tuple[Any, Any]:
    """(writer client, its ClickHouseSettings) of a migrated database on `server` (the embedded server the tests
    start, `tests/fixtures_clickhouse.start_server`): a new `bench_<random>` one unless `database` names a kept
    one. Pending migrations are applied either way."""
    import uuid

    from base.settings import ClickHouseSettings
    from sinks.db import connect, migrate

    if database is None:
        database = "bench_" + uuid.uuid4().hex[:8]
        admin = server.client()
        admin.command(f"CREATE DATABASE {database}")
        admin.close()
    ch = ClickHouseSettings(url=server.url, database=database, password=server.password,
                            analyst_password=server.analyst_password)  # fmt: skip
    client = connect(ch, send_receive_timeout=600)
    migrate(client, ch)
    return client, ch


@contextlib.contextmanager
def kept_month(data_dir: Path) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A month bench/web_page.py kept in `data_dir` (--data-dir): its embedded server started, then (its
    database's ClickHouseSettings, what the marker says was generated); the server stopped after. Exits with one
    line when the directory holds no month."""
    from fixtures_clickhouse import start_server, stop_server

    from base.settings import ClickHouseSettings

    marker = data_dir / "seeded.json"
    if not marker.exists():
        sys.exit(f"{data_dir} holds no month: generate one with bench/web_page.py --data-dir {data_dir}")
    kept = json.loads(marker.read_text())
    server = start_server(data_dir / "data")
    try:
        yield ClickHouseSettings(url=server.url, database=kept["database"], password=server.password,
                                 analyst_password=server.analyst_password), kept  # fmt: skip
    finally:
        stop_server(server)
