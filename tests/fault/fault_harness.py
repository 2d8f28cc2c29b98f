"""End-to-end harness for the fault suite: the real pipeline as separate processes.

`Stack` (one per module) owns a Kafka broker started with the project's launcher on free loopback
ports and a temporary data dir (so a test can stop and restart it), and an embedded ClickHouse
server process (`gpuledger clickhouse serve`) on a fixed free port with its own data path (so a
test can stop it and bring it back at the same address).

`PipelineRun` (one per test) is one pass of the pipeline with its own topic prefix
(`kafka.topic_prefix`), consumer groups and ClickHouse database:

    gpuledger topics apply                      the catalogue topics and their .dlq
    gpuledger db migrate                        the ledger tables and analyst views
    gpuledger sink run                          long-running, every ledger topic -> ClickHouse
    gpuledger simulate run --fast ...           the simulated cluster (or `publish()` from this process)
    gpuledger processors run --event-time       long-running, the rekey and node stages; `finish()` stops it
                                                (SIGTERM) and runs `processors run --exit-when-idle` to close
                                                the last minutes
    gpuledger processors agents --event-time    long-running, the job stage as faust agents; `finish()` stops
                                                it (SIGTERM), then runs it with `--exit-when-idle` once the
                                                last device-minutes are out

then `Ledger` is read back from ClickHouse: per job allocated/active/starved/idle/dark seconds from
`job_minutes FINAL`, from `device_minutes FINAL` and from the analyst view `v_chargeback_jobs`
(the daily rollup), which must all agree.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from fixtures_clickhouse import ClickHouseServer, server_env, start_server, stop_server, wait_for

from base.kafka import watermarks
from base.settings import KafkaSettings, Settings
from producers.simulator import DEFAULT_START_MS, SimConfig, expected_ledger
from schemas.codec import AvroCodec
from schemas.topics import (
    DEVICE_MINUTES,
    DEVICE_SAMPLES,
    JOB_MINUTES,
    LATE_SAMPLES,
    Topic,
    all_topics,
)
from sinks.rows import DEFAULT_TOPICS
from stack.broker import BrokerConfig, LocalBroker, LocalCluster, cluster_on_free_ports, free_ports
from streams.publish import RecordPublisher

REPO = Path(__file__).resolve().parents[2]
CLI = "from gpuledger.cli import main; main()"
LEDGER_FIELDS = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s")

# The simulated clusters every test runs, 25 minutes of cluster time: a Slurm-like one of 5 nodes x 8 GPUs (the
# simulator's defaults put the exporter upgrade half-way, one dead exporter from a third of the run for a
# quarter of it, and one device that never reports) and a Kubernetes one of 3 nodes through the watcher's own
# code (Kueue jobs and a two-pod gang, notebooks, pods on MIG slices, 4-GPU pods started while the watcher
# runs, a pod whose devices are named only at the next label refresh), as `simulate run` runs by default.
SIM = SimConfig(seed=11, nodes=5, duration_s=1500, start_ms=DEFAULT_START_MS, cluster="sim", kube_nodes=3)


# Outputs a restarted stage emits again, with their keys (device-minutes: one row per job in a device's minute).
REEMITTED = (
    (DEVICE_MINUTES, ("cluster", "device_uuid", "mig_instance_id", "minute_start_ms", "job_id")),
    (JOB_MINUTES, ("cluster", "job_id", "minute_start_ms")),
)


def expected_jobs(sim: SimConfig = SIM) -> dict[str, dict[str, int]]:
    """The simulator's own per-job ledger (allocated/active/starved/idle/dark seconds)."""
    return {j: {f: getattr(led, f) for f in LEDGER_FIELDS} for j, led in expected_ledger(sim).items()}


def log(msg: str) -> None:
    print(f"[fault {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    if not wait_for(predicate, timeout_s, interval_s):
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# ------------------------------------------------------------------------------------------------
# The services: broker and ClickHouse, each restartable at the same address.


class Stack:
    def __init__(self, root: Path) -> None:
        self.root = root
        port, controller = free_ports(2)
        self.broker_cfg = BrokerConfig(
            data_dir=root / "kafka",
            port=port,
            controller_port=controller,
            kafka_version=Settings().broker.kafka_version,
            jit="quick",
        )
        self.broker = LocalBroker(self.broker_cfg, log_path=root / "broker.log")
        (self.ch_port,) = free_ports(1)
        self.ch_path = root / "clickhouse" / "data"
        self.ch_path.parent.mkdir(parents=True, exist_ok=True)
        self.ch: ClickHouseServer | None = None

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def start(self) -> Stack:
        self.broker.start(timeout=180)
        self.start_clickhouse()
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_clickhouse()
        self.broker.stop()

    def stop_broker(self) -> None:
        self.broker.stop()

    def start_broker(self) -> None:
        self.broker.start(timeout=180)

    def start_clickhouse(self) -> None:
        self.ch = start_server(self.ch_path, port=self.ch_port, timeout_s=120)

    def stop_clickhouse(self) -> None:
        if self.ch is not None:
            stop_server(self.ch)
            self.ch = None

    @property
    def ch_url(self) -> str:
        return f"http://127.0.0.1:{self.ch_port}"

    def client(self, database: str) -> Any:
        assert self.ch is not None, "ClickHouse is stopped"
        return self.ch.client(database=database)


# ------------------------------------------------------------------------------------------------
# Reading topics


def topic_counts(bootstrap: str, topics: Iterable[str]) -> dict[str, int]:
    """Records currently in each topic (high - low watermark, summed over partitions); 0 if absent."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fault-reader", "enable.auto.commit": False})
    try:
        md = c.list_topics(timeout=10).topics
        out: dict[str, int] = {}
        for t in topics:
            meta = md.get(t)
            n = 0
            if meta is not None and meta.error is None:
                for p in meta.partitions:
                    lo, hi = watermarks(c, TopicPartition(t, p))
                    n += max(0, hi - lo)
            out[t] = n
        return out
    finally:
        c.close()


def group_lag(bootstrap: str, group: str, topics: Iterable[str]) -> int:
    """Records of `topics` not yet committed by consumer group `group` (a topic never committed: all)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=10).topics
    tps = [TopicPartition(t, p) for t in topics if t in md for p in md[t].partitions]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        lag = 0
        for tp in c.committed(tps, timeout=10):
            lo, hi = watermarks(c, TopicPartition(tp.topic, tp.partition))
            pos = tp.offset if tp.offset >= 0 else lo
            lag += max(0, hi - pos)
        return lag
    finally:
        c.close()


def committed_total(bootstrap: str, group: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10).topics.get(topic)
    if md is None:
        return 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = [TopicPartition(topic, p) for p in md.partitions]
        return sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=10))
    finally:
        c.close()


# ------------------------------------------------------------------------------------------------
# The ledger as ClickHouse holds it


@dataclass
class Ledger:
    """What one run left in ClickHouse."""

    jobs: dict[str, dict[str, int]]  # job -> allocated/active/starved/idle/dark seconds (job_minutes FINAL)
    from_device_minutes: dict[str, dict[str, int]]
    from_views: dict[str, dict[str, int]]  # v_chargeback_jobs (usage_daily, the analysts' view)
    sm_weighted: dict[str, float]
    device_minutes: set[tuple[Any, ...]]  # every device-minute row (FINAL), for an exact comparison
    job_minutes: set[tuple[Any, ...]]
    coverage_minutes: set[tuple[Any, ...]]
    alert_ids: set[str]
    rows: dict[str, int]  # table -> count() (no FINAL): a duplicate row would show here
    rows_final: dict[str, int]
    mapping_versions: list[tuple[int, str]]  # (minute_start_ms, mapping_version), distinct, sorted
    extra: dict[str, Any] = field(default_factory=dict)

    def totals(self) -> dict[str, int]:
        return {f: sum(j[f] for j in self.jobs.values()) for f in LEDGER_FIELDS}


def _per_job(rows: Iterable[tuple[Any, ...]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for job, *vals in rows:
        acc = out.setdefault(str(job), dict.fromkeys(LEDGER_FIELDS, 0))
        for f, v in zip(LEDGER_FIELDS, vals, strict=True):
            acc[f] += int(v)
    return out


def read_ledger(client: Any) -> Ledger:
    q = client.query
    sums = ", ".join(f"sum({f})" for f in LEDGER_FIELDS)
    jobs = _per_job(q(f"SELECT job_id, {sums} FROM job_minutes FINAL GROUP BY job_id").result_rows)
    dm = _per_job(q(f"SELECT job_id, {sums} FROM device_minutes FINAL WHERE job_id != '' GROUP BY job_id").result_rows)
    views = _per_job(q(f"SELECT job_id, {sums} FROM v_chargeback_jobs GROUP BY job_id").result_rows)
    sm = {
        str(j): round(float(v), 3)
        for j, v in q("SELECT job_id, sum(sm_weighted_s) FROM job_minutes FINAL GROUP BY job_id").result_rows
    }
    dm_rows = {
        tuple(r)
        for r in q(
            "SELECT cluster, node, device_uuid, mig_instance_id, minute_start_ms, job_id, allocated_s, active_s,"
            " starved_s, idle_s, dark_s, unallocated_s, sample_count, round(sm_weighted_s, 6), mapping_version"
            " FROM device_minutes FINAL"
        ).result_rows
    }
    jm_rows = {
        tuple(r)
        for r in q(
            "SELECT cluster, job_id, minute_start_ms, device_count, allocated_s, active_s, starved_s, idle_s, dark_s,"
            " sample_count FROM job_minutes FINAL"
        ).result_rows
    }
    cov_rows = {
        tuple(r)
        for r in q(
            "SELECT cluster, node, minute_start_ms, expected_devices, reporting_devices, expected_device_s,"
            " reporting_device_s FROM coverage_minutes FINAL"
        ).result_rows
    }
    alert_ids = {str(r[0]) for r in q("SELECT alert_id FROM alerts FINAL WHERE job_id != ''").result_rows}
    tables = ("device_minutes", "job_minutes", "coverage_minutes", "job_events", "alerts", "actions")
    rows = {t: int(q(f"SELECT count() FROM {t}").result_rows[0][0]) for t in tables}
    rows_final = {t: int(q(f"SELECT count() FROM {t} FINAL").result_rows[0][0]) for t in tables}
    versions = sorted(
        (int(m), str(v))
        for m, v in q(
            "SELECT DISTINCT minute_start_ms, mapping_version FROM device_minutes FINAL WHERE sample_count > 0"
        ).result_rows
    )
    daily = q("SELECT sum(allocated_s), sum(idle_s), sum(dark_s), sum(device_minutes) FROM usage_daily").result_rows[0]
    final = q("SELECT sum(allocated_s), sum(idle_s), sum(dark_s), count() FROM device_minutes FINAL").result_rows[0]
    return Ledger(
        jobs=jobs,
        from_device_minutes=dm,
        from_views=views,
        sm_weighted=sm,
        device_minutes=dm_rows,
        job_minutes=jm_rows,
        coverage_minutes=cov_rows,
        alert_ids=alert_ids,
        rows=rows,
        rows_final=rows_final,
        mapping_versions=versions,
        extra={"usage_daily": tuple(int(x) for x in daily), "device_minutes_final": tuple(int(x) for x in final)},
    )


def _diff(led: Ledger, reading: str) -> dict[str, tuple[Any, Any]]:
    """Jobs whose seconds differ: job -> (job_minutes, the other reading)."""
    other: dict[str, dict[str, int]] = getattr(led, reading)
    jobs = sorted(set(led.jobs) | set(other))
    return {j: (led.jobs.get(j), other.get(j)) for j in jobs if led.jobs.get(j) != other.get(j)}


def _minutes_diff(led: Ledger, jobs: Iterable[str], limit: int = 30) -> list[tuple[Any, ...]]:
    """Where a job's job-minutes and its device-minutes part: (job, minute, job-minute devices and allocated
    seconds or None, device-minutes' count, allocated seconds and nodes); what tells a job-minute missing
    from one emitted short."""
    wanted = set(jobs)
    dm: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for r in led.device_minutes:
        if str(r[5]) in wanted and r[6]:
            dm.setdefault((str(r[5]), int(r[4])), []).append((str(r[1]), int(r[6])))
    jm = {(str(r[1]), int(r[2])): (int(r[3]), int(r[4])) for r in led.job_minutes if str(r[1]) in wanted}
    out = []
    for key in sorted(set(dm) | set(jm)):
        rows = dm.get(key, [])
        got = jm.get(key)
        if got is None or got[1] != sum(s for _, s in rows):
            out.append((*key, got, len(rows), sum(s for _, s in rows), sorted({n for n, _ in rows})))
    return out[:limit]


def check_consistent(led: Ledger) -> None:
    """The three readings of one run agree, and no row is stored twice (the rollups saw each once)."""
    assert led.jobs, "no job-minutes in ClickHouse"
    dm, views = "from_device_minutes", "from_views"
    if led.from_device_minutes != led.jobs:
        diff = _diff(led, dm)
        raise AssertionError(f"device_minutes and job_minutes disagree: {diff}; minutes: {_minutes_diff(led, diff)}")
    assert led.from_views == led.jobs, f"the analyst view (usage_daily) and job_minutes disagree: {_diff(led, views)}"
    assert led.extra["usage_daily"] == led.extra["device_minutes_final"], "daily rollup counted a row twice"
    for t in ("device_minutes", "coverage_minutes"):  # rollup feeders: inserted once per key
        assert led.rows[t] == led.rows_final[t], f"{t}: {led.rows[t]} rows stored, {led.rows_final[t]} distinct"


def assert_same_ledger(run: Ledger, base: Ledger) -> None:
    check_consistent(run)
    assert run.jobs == base.jobs
    assert run.sm_weighted == base.sm_weighted
    assert run.device_minutes == base.device_minutes
    assert run.job_minutes == base.job_minutes
    assert run.coverage_minutes == base.coverage_minutes
    assert run.alert_ids == base.alert_ids
    # Rows of every ledger table (alerts aside: coverage alerts follow how fast the minutes arrive).
    assert {k: v for k, v in run.rows_final.items() if k != "alerts"} == {
        k: v for k, v in base.rows_final.items() if k != "alerts"
    }


# ------------------------------------------------------------------------------------------------
# One pass of the pipeline


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    started: float = field(default_factory=time.time)


class PipelineRun:
    SINK_TOPICS = DEFAULT_TOPICS

    def __init__(
        self, stack: Stack, name: str, root: Path, sim: SimConfig = SIM, sink_batch: int = 2000, instances: int = 1
    ) -> None:
        self.sink_batch = sink_batch
        self.instances = instances  # processes of each kind, as processor.instances makes `up` start them
        self.stack = stack
        self.name = name
        self.sim = sim
        tag = uuid.uuid4().hex[:8]
        self.prefix = f"fault-{name}-{tag}."
        self.database = f"fault_{name}_{tag}".replace("-", "_")
        self.root = root
        self.state = root / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.logs = root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.processor_group = self.prefix + "processors"
        self.sink_group = self.prefix + "sinks"
        self.processors: Proc | None = None
        self.agents: Proc | None = None
        self.sink: Proc | None = None
        self.simulator: Proc | None = None
        self.more: list[Proc] = []  # processes 2..N of `processors run` and `processors agents` (dynamic members)
        self.timings: dict[str, float] = {}
        self._n = 0

    # -- environment and commands -----------------------------------------------------------------
    def env(self, **extra: str) -> dict[str, str]:
        return server_env(
            GPULEDGER_STATE_DIR=str(self.state),
            GPULEDGER_BROKER__ENABLED="false",
            GPULEDGER_KAFKA__BOOTSTRAP_SERVERS=self.stack.bootstrap,
            GPULEDGER_KAFKA__TOPIC_PREFIX=self.prefix,
            GPULEDGER_CLICKHOUSE__URL=self.stack.ch_url,
            GPULEDGER_CLICKHOUSE__DATABASE=self.database,
            GPULEDGER_CLICKHOUSE__EMBEDDED="false",
            GPULEDGER_PROCESSOR__GROUP_ID=self.processor_group,
            GPULEDGER_PROCESSOR__REALTIME="false",
            GPULEDGER_PROCESSOR__COMMIT_INTERVAL_MS="300",
            GPULEDGER_SINKS__GROUP_ID=self.sink_group,
            GPULEDGER_SINKS__BATCH_MAX_RECORDS=str(self.sink_batch),
            GPULEDGER_SINKS__BATCH_MAX_WAIT_S="0.2",
            GPULEDGER_SINKS__RETRY_INITIAL_S="0.5",
            GPULEDGER_SINKS__RETRY_MAX_S="4",
            GPULEDGER_METRICS__BASE_PORT="0",  # any free port: other suites share this machine
            **extra,
        )

    def kafka(self) -> KafkaSettings:
        return KafkaSettings(bootstrap_servers=self.stack.bootstrap, topic_prefix=self.prefix)

    def topic(self, t: Topic | str) -> str:
        return self.prefix + (t.name if isinstance(t, Topic) else t)

    def spawn(self, name: str, *args: str) -> Proc:
        self._n += 1
        log_path = self.logs / f"{name}.log"
        with log_path.open("ab") as out:
            out.write(f"\n===== {time.strftime('%H:%M:%S')} start #{self._n}: {' '.join(args)}\n".encode())
            out.flush()
            popen = subprocess.Popen(
                [sys.executable, "-c", CLI, *args],
                cwd=REPO,
                env=self.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return Proc(name, popen, log_path)

    def cli(self, *args: str, timeout_s: float = 180) -> str:
        proc = self.spawn("cli", *args)
        try:
            rc = proc.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()
            raise
        assert rc == 0, f"gpuledger {' '.join(args)} exited {rc}: {self.tail(proc)}"
        return proc.log.read_text(errors="replace")

    @staticmethod
    def tail(proc: Proc, chars: int = 4000) -> str:
        return proc.log.read_text(errors="replace")[-chars:]

    # -- set-up -----------------------------------------------------------------------------------
    def setup(self) -> None:
        t0 = time.monotonic()
        self.cli("topics", "apply", "--json", "--timeout", "30")
        self.cli("db", "migrate")
        self.timings["setup_s"] = time.monotonic() - t0

    # -- components -------------------------------------------------------------------------------
    def start_sink(self) -> None:
        self.sink = self.spawn("sink", "sink", "run")

    def start_processors(self) -> None:
        self.processors = self.spawn(
            "processors", "processors", "run", "--instance", "w1", "--event-time",
            "--stats-file", str(self.root / "processors-stats.json"),
        )  # fmt: skip

    def start_agents(self) -> None:
        self.agents = self.spawn(
            "agents", "processors", "agents", "--event-time", "--stats-file", str(self.agents_stats),
        )  # fmt: skip

    def start_more(self, kind: str, k: int) -> Proc:
        """Process `k` of `kind` ("processors" or "agents"), a dynamic group member as `up` starts it: killed, its
        partitions go to the others once its session runs out."""
        command = ("processors", "run") if kind == "processors" else ("processors", "agents")
        proc = self.spawn(f"{kind}-{k}", *command, "--event-time", "--stats-file", str(self._stats(f"{kind}-{k}")))
        self.more.append(proc)
        return proc

    def _stats(self, name: str) -> Path:
        return self.root / f"{name}-stats.json"

    @property
    def agents_stats(self) -> Path:
        return self.root / "agents-stats.json"

    def agents_events(self) -> int:
        """Input records the running agents worker has processed (0 until it writes its stats)."""
        proc = self.agents
        try:
            if proc is None or self.agents_stats.stat().st_mtime <= proc.started:
                return 0
            return int(json.loads(self.agents_stats.read_text())["events"])
        except (OSError, ValueError, KeyError):
            return 0

    def start_simulator(self) -> None:
        s = self.sim
        start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s.start_ms / 1000))
        self.simulator = self.spawn(
            "simulator", "simulate", "run", "--fast", "--nodes", str(s.nodes), "--duration", str(s.duration_s),
            "--seed", str(s.seed), "--start", start, "--cluster", s.cluster, "--ledger", str(self.ledger_path),
            "--kube-nodes", str(s.kube_nodes),  # the CLI runs a Kubernetes cluster too unless told 0
        )  # fmt: skip

    @property
    def ledger_path(self) -> Path:
        return self.root / "expected-ledger.json"

    def expected_from_cli(self) -> dict[str, dict[str, int]]:
        doc = json.loads(self.ledger_path.read_text())
        return {j: {f: int(v[f]) for f in LEDGER_FIELDS} for j, v in doc["jobs"].items()}

    def kill(self, proc: Proc | None, sig: int = signal.SIGKILL) -> None:
        assert proc is not None
        if proc.popen.poll() is None:
            os.kill(proc.popen.pid, sig)
        proc.popen.wait(60)

    def alive(self, proc: Proc | None) -> bool:
        return proc is not None and proc.popen.poll() is None

    def check_alive(self, *procs: Proc | None) -> None:
        for p in procs:
            assert p is not None
            rc = p.popen.poll()
            assert rc is None, f"{p.name} exited with {rc}: {self.tail(p)}"

    def publisher(self) -> RecordPublisher:
        return RecordPublisher(self.kafka())

    # -- progress ---------------------------------------------------------------------------------
    def samples_published(self) -> int:
        return topic_counts(self.stack.bootstrap, [self.topic(DEVICE_SAMPLES)])[self.topic(DEVICE_SAMPLES)]

    def node_committed(self) -> int:
        return committed_total(self.stack.bootstrap, self.processor_group + ".node", self.topic(DEVICE_SAMPLES))

    def stored(self, table: str) -> int:
        try:
            client = self.stack.client(self.database)
            try:
                return int(client.query(f"SELECT count() FROM {table}").result_rows[0][0])
            finally:
                client.close()
        except Exception:
            return -1

    def sink_lag(self) -> int:
        return group_lag(self.stack.bootstrap, self.sink_group, [self.topic(t) for t in self.SINK_TOPICS])

    def sink_committed(self) -> int:
        return sum(committed_total(self.stack.bootstrap, self.sink_group, self.topic(t)) for t in self.SINK_TOPICS)

    def wait_simulator(self, timeout_s: float = 300) -> None:
        assert self.simulator is not None
        rc = self.simulator.popen.wait(timeout_s)
        assert rc == 0, f"simulator exited {rc}: {self.tail(self.simulator)}"

    # -- the end of a run -------------------------------------------------------------------------
    def finish(self, timeout_s: float = 300) -> None:
        """Input complete: stop the long-running processors (SIGTERM), close the last minutes with
        `--exit-when-idle`, let the sink land everything, stop it; then the counts are final."""
        t0 = time.monotonic()
        for proc in self.more:  # the other processes first: the first of each kind then holds every partition
            self._stop(proc, self._stats(proc.name))
        self._stop(self.processors, self.root / "processors-stats.json")
        self._stop(self.agents, self.agents_stats)
        final = self.spawn("processors", "processors", "run", "--instance", "w1", "--event-time",
                           "--exit-when-idle", "3")  # fmt: skip
        rc = final.popen.wait(timeout_s)
        assert rc == 0, f"processors exited {rc}: {self.tail(final)}"
        self.processors = None
        # Every device-minute is out: the job stage reads them to the end, then exits.
        final = self.spawn("agents", "processors", "agents", "--event-time", "--exit-when-idle", "3")
        rc = final.popen.wait(timeout_s)
        assert rc == 0, f"agents exited {rc}: {self.tail(final)}"
        self.agents = None
        sink = self.sink
        assert sink is not None

        def sink_caught_up() -> bool:
            self.check_alive(sink)  # a sink that died will never catch up: say so, with its log
            return self.sink_lag() == 0

        try:
            wait_until(sink_caught_up, timeout_s, "the sink to commit every record", interval_s=0.5)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} (lag {self.sink_lag()}); the sink's log ends:\n{self.tail(sink)}") from None
        self.kill(sink, signal.SIGTERM)
        assert sink.popen.returncode == 0, self.tail(sink)
        self.timings["finish_s"] = time.monotonic() - t0

    def _stop(self, proc: Proc | None, stats: Path) -> None:
        """SIGTERM a running process once it runs its loop (stats written), not while it still imports: a stop,
        not a crash; it must exit 0."""
        if proc is None or not self.alive(proc):
            return
        started = proc.started
        wait_until(lambda: stats.exists() and stats.stat().st_mtime > started, 120, f"{proc.name}'s loop", 0.2)
        self.kill(proc, signal.SIGTERM)
        assert proc.popen.returncode == 0, self.tail(proc)

    def restart(self, name: str) -> None:
        """Stop one running process as an operator would (SIGTERM, it must exit 0) and start it again: "sink",
        "processors" or "agents" (the first of each kind), or "processors-K" / "agents-K" (process K of a kind)."""
        if name == "sink":
            self.kill(self.sink, signal.SIGTERM)
            assert self.sink is not None and self.sink.popen.returncode == 0, self.tail(self.sink)
            self.start_sink()
        elif name == "processors":
            self._stop(self.processors, self.root / "processors-stats.json")
            self.start_processors()
        elif name == "agents":
            self._stop(self.agents, self.agents_stats)
            self.start_agents()
        else:
            kind, _, k = name.rpartition("-")
            running = [p for p in self.more if p.name == name and self.alive(p)]
            assert kind in ("processors", "agents") and k.isdigit() and running, f"no running process {name}"
            self._stop(running[0], self._stats(name))
            self.start_more(kind, int(k))

    def start_pipeline(self) -> None:
        """Start sink, simulator, processors and the job-stage agents (what every test does first)."""
        self.start_sink()
        self.start_simulator()
        self.start_processors()
        self.start_agents()
        for k in range(2, self.instances + 1):
            self.start_more("processors", k)
            self.start_more("agents", k)

    # -- what is left -----------------------------------------------------------------------------
    def dlq_counts(self) -> dict[str, int]:
        dlqs = [self.prefix + t.name for t in all_topics() if t.name.endswith(".dlq")]
        return {k: v for k, v in topic_counts(self.stack.bootstrap, dlqs).items() if v}

    def topic_values(self, t: Topic) -> list[bytes]:
        """Every value in the run's topic `t`, all partitions, start to end."""
        topic = self.topic(t)
        c = Consumer({"bootstrap.servers": self.stack.bootstrap, "group.id": "fault-topic-reader",
                      "enable.auto.commit": False})  # fmt: skip
        try:
            md = c.list_topics(topic, timeout=10).topics[topic]
            out: list[bytes] = []
            for p in md.partitions:
                lo, hi = watermarks(c, TopicPartition(topic, p))
                if hi <= lo:
                    continue
                c.assign([TopicPartition(topic, p, lo)])
                deadline = time.monotonic() + 30
                n = 0
                while n < hi - lo and time.monotonic() < deadline:
                    for m in c.consume(500, 1.0):
                        if m.error() is None:
                            out.append(m.value() or b"")
                            n += 1
            return out
        finally:
            c.close()

    def late_records(self) -> list[bytes]:
        """Values in the late topic (a restart re-reads held input, so a late record may be sent twice)."""
        return self.topic_values(LATE_SAMPLES)

    def conflicting_copies(self, t: Topic, key_fields: tuple[str, ...]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
        """Records of `t` emitted more than once (a restart re-emits what it had not committed) whose
        copies differ: the sinks keep the first copy and the agents may use another, so a difference is
        a ledger that disagrees with itself."""
        codec = AvroCodec()
        copies: dict[tuple[Any, ...], dict[bytes, dict[str, Any]]] = {}
        for value in self.topic_values(t):
            record = codec.decode(value).record
            copies.setdefault(tuple(record[f] for f in key_fields), {})[value] = record
        return {k: list(v.values()) for k, v in copies.items() if len(v) > 1}

    def assert_reemitted_identical(self) -> None:
        """Every output a restarted stage emitted again equals its first copy (`conflicting_copies`)."""
        for topic, key in REEMITTED:
            differing = self.conflicting_copies(topic, key)
            assert not differing, f"{len(differing)} {topic.name} records re-emitted with another content: " + str(
                list(differing.items())[:3]
            )

    def late_count(self) -> int:
        return topic_counts(self.stack.bootstrap, [self.topic(LATE_SAMPLES)])[self.topic(LATE_SAMPLES)]

    def ledger(self) -> Ledger:
        client = self.stack.client(self.database)
        try:
            return read_ledger(client)
        finally:
            client.close()

    def __enter__(self) -> PipelineRun:
        self.setup()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for p in (self.processors, self.agents, self.sink, self.simulator, *self.more):
            if p is not None and p.popen.poll() is None:
                with contextlib.suppress(Exception):
                    p.popen.kill()
                    p.popen.wait(30)


@dataclass
class Baseline:
    """The undisturbed run (one broker, one process of each kind) every fault's run must equal."""

    ledger: Ledger
    expected: dict[str, dict[str, int]]
    cli_expected: dict[str, dict[str, int]]
    dlq: dict[str, int]
    late: int


def finish_and_read(run: PipelineRun) -> Ledger:
    """Wait for the simulator, close the run (`PipelineRun.finish`) and read its ledger."""
    run.wait_simulator()
    run.finish()
    led = run.ledger()
    log(f"{run.name}: {run.timings} rows {led.rows_final} totals {led.totals()}")
    return led


def run_baseline(stack: Stack, root: Path) -> Baseline:
    with PipelineRun(stack, "base", root) as run:
        run.start_pipeline()
        led = finish_and_read(run)
        return Baseline(led, expected_jobs(), run.expected_from_cli(), run.dlq_counts(), run.late_count())


# ------------------------------------------------------------------------------------------------
# A replicated broker: three KRaft nodes, three processes of each processor kind


class ReplicatedStack(Stack):
    """The harness's stack with a three-node cluster in place of the single broker."""

    def __init__(self, root: Path) -> None:  # the harness's fields, a cluster for its broker
        self.root = root
        kafka_version = Settings().broker.kafka_version
        self.cluster = LocalCluster(cluster_on_free_ports(root / "kafka", kafka_version, heap="384m"), logs=root)
        (self.ch_port,) = free_ports(1)
        self.ch_path = root / "clickhouse" / "data"
        self.ch_path.parent.mkdir(parents=True, exist_ok=True)
        self.ch = None

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def start(self) -> ReplicatedStack:
        self.cluster.start(timeout=240)
        self.start_clickhouse()
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_clickhouse()
        self.cluster.stop()

    def stop_broker(self) -> None:
        self.cluster.stop()

    def start_broker(self) -> None:
        self.cluster.start(timeout=240)


INSTANCES = 3


class ReplicatedRun(PipelineRun):
    """A pipeline run whose topics (and the job stage's changelog) get three replicas, min ISR 2, with three
    processes of each processor kind."""

    def __init__(self, stack: Stack, name: str, root: Path, **options: Any) -> None:
        super().__init__(stack, name, root, instances=INSTANCES, **options)

    def env(self, **extra: str) -> dict[str, str]:
        return super().env(GPULEDGER_KAFKA__REPLICATION_FACTOR="3", **extra)
