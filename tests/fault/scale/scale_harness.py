"""The fault suite at scale (issue 44 item 5): 10,000 GPUs on three brokers and three processes of each processor
kind, the fleet's load replayed so it costs the machine next to nothing.

`Recording`: the simulator's run of `SCALE_SIM` (125 nodes of 8 GPUs, `GPULEDGER_FAULT_SCALE_SECONDS` of cluster
time, default 180) sent as `SCALE_COPIES` (10) clusters by the simulator's own fleet publisher
(`producers.simulator.fleet`, as `simulate run --clusters 10` sends it: copy r is cluster `scale-c<r>` with GPU
UUIDs of its own), so 1,250 nodes and 10,000 GPUs, each copy's ledger the simulator's expected one. Every record
(inventory, job events, node scrapes) is kept encoded, grouped by the run second it belongs to, once; it is kept
on disk (`~/.cache/gpuledger/fault-scale/`) under a hash of the simulator's source and the contracts, so a
change to either records it again (about 20 CPU s).

`Load`: a thread that publishes the recording paced to the wall clock, run second `s` within second `s` of the load
(1,250 node scrapes a second: 10,000 GPUs at 1 Hz), through `streams.publish.RecordPublisher`, the exporters' and
the simulator's publisher (acks=all, idempotent, the client's own retries): what an exporter does while the
cluster cannot take its records is what this publisher does. Event time is the recording's own
(`SCALE_SIM.start_ms`), so every run of the session carries the same records and must leave the same ledger.
Sending costs one produce call a record (the encoding was done once): its CPU is measured (`LoadFigures.cpu_s`,
this thread's).

`ScaleRun`: the harness's replicated run (`fault_harness.ReplicatedRun`: three replicas, min.insync.replicas 2,
three processes of `processors run` and of `processors agents`) with the `Load` where the simulator was; the rest
(the sink, `finish`, the ledger read back and compared) is the fault suite's own.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from fault_harness import LEDGER_FIELDS, REPO, Ledger, ReplicatedRun, Stack, expected_jobs, log, wait_until

from base.kafka import watermarks
from base.settings import KafkaSettings
from producers.simulator import DEFAULT_START_MS, SimConfig, simulate
from producers.simulator.fleet import FleetPublisher, copy_cluster
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, Topic, all_topics
from streams.publish import RecordPublisher

SCALE_SECONDS = int(os.environ.get("GPULEDGER_FAULT_SCALE_SECONDS", "180"))
SCALE_SIM = SimConfig(seed=11, nodes=125, duration_s=SCALE_SECONDS, start_ms=DEFAULT_START_MS, cluster="scale")
SCALE_COPIES = 10  # clusters the simulated one is sent as: 1,250 nodes
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuledger" / "fault-scale"
ENTRY = struct.Struct(">HBHI")  # run second, topic index, key length, value length; then key, value


# ------------------------------------------------------------------------------------------------
# The recording


@dataclass
class Recording:
    config: SimConfig
    copies: int
    topics: list[str]  # topic names (unprefixed), indexed by the entries
    seconds: list[list[tuple[int, bytes, bytes]]] = field(repr=False)  # per run second: (topic, key, value)
    expected: dict[str, dict[str, int]] = field(repr=False)  # the simulator's per-job ledger, every copy's
    simulator_cpu_s: float = 0.0  # the recording's cost when it was made (0 when read from the cache)

    @property
    def clusters(self) -> list[str]:
        return [copy_cluster(self.config.cluster, r) for r in range(self.copies)]

    @property
    def scrapes_per_second(self) -> int:
        return self.copies * self.config.nodes

    @property
    def records(self) -> int:
        return sum(len(s) for s in self.seconds)

    @property
    def scrapes(self) -> int:
        samples = self.topics.index(DEVICE_SAMPLES.name)
        return sum(1 for s in self.seconds for t, _, _ in s if t == samples)


class _Recorder:
    """What the fleet publisher publishes through (`fleet.RawPublisher`): each record kept, encoded, under the run
    second being recorded."""

    def __init__(self) -> None:
        self.codec = AvroCodec()  # single-object framing, as the pipeline's publishers without a registry
        self.kafka = KafkaSettings()  # no prefix: the names are the catalogue's
        self.topics: list[str] = []
        self.seconds: list[list[tuple[int, bytes, bytes]]] = []
        self.second = 0

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        self.publish_raw(topic.name, key, self.codec.encode(topic.subject, record))

    def publish_raw(self, topic_name: str, key: bytes | None, value: bytes | None) -> None:
        assert key is not None and value is not None
        if topic_name not in self.topics:
            self.topics.append(topic_name)
        while len(self.seconds) <= self.second:
            self.seconds.append([])
        self.seconds[self.second].append((self.topics.index(topic_name), key, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def _source_hash(cfg: SimConfig, copies: int) -> str:
    """What the recorded bytes depend on: the configuration, the simulator's source and the contracts."""
    digest = hashlib.sha256(f"{cfg!r} x{copies}".encode())
    for pattern in ("producers/simulator/*.py", "schemas/codec.py", "schemas/**/*.avsc"):
        for path in sorted(REPO.glob(pattern)):
            digest.update(path.relative_to(REPO).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def record(cfg: SimConfig = SCALE_SIM, copies: int = SCALE_COPIES) -> Recording:
    """The simulator's run of `cfg` as `copies` clusters, encoded; from the cache when the same source recorded it."""
    key = _source_hash(cfg, copies)
    data, meta = CACHE / f"{key}.bin", CACHE / f"{key}.json"
    if data.exists() and meta.exists():
        doc = json.loads(meta.read_text())
        return Recording(cfg, copies, doc["topics"], _read_entries(data.read_bytes()), doc["expected"])
    c0 = time.process_time()
    recorder = _Recorder()
    fleet = FleetPublisher(recorder, cfg.cluster, copies)
    for topic, rec_key, rec in simulate(cfg):
        recorder.second = (int(rec["ts_ms"]) - cfg.start_ms) // 1000
        fleet.publish(topic, rec_key, rec)
    expected = expected_jobs(cfg)
    cpu = time.process_time() - c0
    CACHE.mkdir(parents=True, exist_ok=True)
    part = data.with_suffix(".part")
    with part.open("wb") as out:
        for s, entries in enumerate(recorder.seconds):
            for t, k, v in entries:
                out.write(ENTRY.pack(s, t, len(k), len(v)) + k + v)
    part.rename(data)
    meta.write_text(json.dumps({"topics": recorder.topics, "expected": expected}))
    return Recording(cfg, copies, recorder.topics, recorder.seconds, expected, cpu)


def _read_entries(raw: bytes) -> list[list[tuple[int, bytes, bytes]]]:
    seconds: list[list[tuple[int, bytes, bytes]]] = []
    at = 0
    while at < len(raw):
        s, t, k, v = ENTRY.unpack_from(raw, at)
        at += ENTRY.size
        while len(seconds) <= s:
            seconds.append([])
        seconds[s].append((t, raw[at : at + k], raw[at + k : at + k + v]))
        at += k + v
    return seconds


# ------------------------------------------------------------------------------------------------
# The load


@dataclass
class LoadFigures:
    sent: int = 0
    second: int = -1  # the run second being sent
    overran: int = 0  # seconds whose records were not all handed to the client within their wall second
    most_queued: int = 0  # the most records the publisher held unacknowledged at once
    queued: list[tuple[float, int]] = field(default_factory=list)  # (seconds since the load began, held)
    cpu_s: float = 0.0  # this thread's CPU sending the records (the client's own threads not counted)
    wall_s: float = 0.0
    flush_s: float = 0.0  # from the last record handed over to the last acknowledged


class Load(threading.Thread):
    """The recording published paced to the wall clock through the exporters' publisher. `error`: why it stopped
    early (a delivery that failed, a flush that timed out)."""

    FLUSH_S = 600.0  # what the load waits for its last acknowledgements: more than any outage in the suite

    def __init__(self, recording: Recording, kafka: KafkaSettings) -> None:
        super().__init__(name="scale-load", daemon=True)
        self.recording = recording
        self.names = [kafka.topic(t) for t in recording.topics]
        self.publisher = RecordPublisher(kafka, telemetry=True)  # as the exporters build theirs
        self.figures = LoadFigures()
        self.error: BaseException | None = None
        self.started_at = 0.0  # monotonic clock: when the first record was sent
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def _held(self, w0: float) -> None:
        held = self.publisher.queued
        f = self.figures
        f.most_queued = max(f.most_queued, held)
        f.queued.append((round(time.monotonic() - w0, 1), held))

    def run(self) -> None:
        f = self.figures
        pub, names = self.publisher, self.names
        try:
            c0, w0 = time.thread_time(), time.monotonic()
            self.started_at = w0
            for s, entries in enumerate(self.recording.seconds):
                if self._halt.is_set():
                    return
                f.second = s
                for t, key, value in entries:
                    pub.publish_raw(names[t], key, value)  # blocks (polling) while the client's queue is full
                f.sent += len(entries)
                if w0 + s + 1 - time.monotonic() <= 0:
                    f.overran += 1
                self._held(w0)
                while (wait := w0 + s + 1 - time.monotonic()) > 0:
                    pub.poll(min(wait, 0.5))
            f.cpu_s = time.thread_time() - c0
            f1 = time.monotonic()
            f.second = len(self.recording.seconds)
            self._held(w0)
            pub.flush(self.FLUSH_S)  # raises when a record failed delivery or is still held
            f.flush_s = time.monotonic() - f1
            f.wall_s = time.monotonic() - w0
        except BaseException as exc:
            self.error = exc

    def wait(self, timeout_s: float) -> LoadFigures:
        self.join(timeout_s)
        assert not self.is_alive(), f"the load still runs after {timeout_s:.0f} s (at second {self.figures.second})"
        if self.error is not None:
            raise AssertionError(f"the load failed: {self.error!r}") from self.error
        return self.figures


# ------------------------------------------------------------------------------------------------
# A run


class ScaleRun(ReplicatedRun):
    """A replicated run whose fleet is the recording, replayed by `Load`."""

    def __init__(self, stack: Stack, name: str, root: Path, recording: Recording) -> None:
        super().__init__(stack, name, root, sim=recording.config, sink_batch=10_000)
        self.recording = recording
        self.load: Load | None = None

    def start_simulator(self) -> None:  # the fleet: the recording, replayed
        self.load = Load(self.recording, self.kafka())
        self.load.start()

    def wait_simulator(self, timeout_s: float = 900) -> None:
        assert self.load is not None
        figures = self.load.wait(timeout_s)
        log(f"{self.name}: load {figures.sent:,} records in {figures.wall_s:.0f} s, {figures.overran} seconds overran, "
            f"most held {figures.most_queued:,}, CPU {figures.cpu_s:.2f} s, flush {figures.flush_s:.1f} s")  # fmt: skip

    @property
    def second(self) -> int:
        """The run second the load is sending (-1 before it starts)."""
        return self.load.figures.second if self.load is not None else -1

    def wait_second(self, second: int, timeout_s: float = 600) -> None:
        """Until the load sends run second `second`; fails when the load stopped short of it."""

        def reached() -> bool:
            assert self.load is not None
            if self.load.error is not None:
                raise AssertionError(f"the load failed: {self.load.error!r}")
            return self.second >= second

        wait_until(reached, timeout_s, f"the load to reach run second {second}", 0.1)

    def close(self) -> None:
        if self.load is not None:
            self.load.stop()
        super().close()

    def run_topics(self) -> list[str]:
        names = {self.topic(t) for t in all_topics()}
        listed = AdminClient({"bootstrap.servers": self.stack.bootstrap}).list_topics(timeout=10).topics
        return sorted(n for n in listed if n in names or n.startswith(self.prefix + "processors."))


def under_replicated(bootstrap: str, topics: list[str], below: int) -> int:
    """Partitions of `topics` whose in-sync replicas number fewer than `below`, as the cluster's metadata says."""
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return sum(1 for t in topics if t in md for p in md[t].partitions.values() if len(p.isrs) < below)


def end_offsets(bootstrap: str, topics: list[str]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fault-scale-ends", "enable.auto.commit": False})
    try:
        md = c.list_topics(timeout=10).topics
        return {(t, p): watermarks(c, TopicPartition(t, p))[1] for t in topics if t in md for p in md[t].partitions}
    finally:
        c.close()


def per_cluster_jobs(led: Ledger) -> dict[str, dict[str, dict[str, int]]]:
    """cluster -> job -> allocated/active/starved/idle/dark seconds, from the run's job-minutes."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for cluster, job, _minute, _devices, *seconds, _samples in led.job_minutes:
        acc = out.setdefault(str(cluster), {}).setdefault(str(job), dict.fromkeys(LEDGER_FIELDS, 0))
        for f, v in zip(LEDGER_FIELDS, seconds, strict=True):
            acc[f] += int(v)
    return out


def committed_past(bootstrap: str, group: str, ends: dict[tuple[str, int], int]) -> bool:
    """Whether `group` has committed every partition of `ends` to at least its offset there."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        done = c.committed([TopicPartition(t, p) for t, p in ends], timeout=10)
        return all(ends[(tp.topic, tp.partition)] <= max(tp.offset, 0) for tp in done)
    finally:
        c.close()


def figures_line(name: str, figures: dict[str, Any]) -> None:
    """A scenario's figures: logged, and appended to GPULEDGER_FAULT_SCALE_FIGURES (a JSON-lines file) when set."""
    log(f"{name}: {figures}")
    path = os.environ.get("GPULEDGER_FAULT_SCALE_FIGURES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"scenario": name, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                  "load_average": os.getloadavg(), **figures}) + "\n")  # fmt: skip
