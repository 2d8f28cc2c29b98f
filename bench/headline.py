"""The headline: a simulated fleet at 1 Hz, in real time, through the whole local stack.

Starts the stack (`gpuledger up`: broker, schema registry, embedded ClickHouse, topics, schemas,
processors, agents, migrations, rate card, sinks) in a temporary state dir on free ports, then runs
`gpuledger simulate run --realtime` for N nodes of 8 GPUs, and every 5 s reads each consumer group's lag (records behind
the log end, as `gpuledger status` does). Lag in seconds is records behind divided by the rate
that group's input arrives at. Prints a table and stops everything.

    .venv/bin/python bench/headline.py --nodes 1250 --duration 600     # 10,000 GPUs, 10 minutes
    .venv/bin/python bench/headline.py --nodes 125 --clusters 100 --duration 1800   # 100,000 GPUs, 30 minutes

With `--clusters N` the simulator simulates `--nodes` nodes and sends every record as N clusters
(producers/simulator/fleet.py: the load of N x nodes x 8 GPUs at the simulator's cost for one cluster). The
alerts are read as they come (idle warnings and reclaim notices: latency past the minute's end plus grace;
coverage gaps: past their due time), and at the end every cluster's per-job ledger in ClickHouse (job_minutes)
is compared with the simulator's expected ledger, which each copy must equal to the second.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from base import metrics
from base.settings import Settings
from producers.simulator.fleet import copy_cluster
from stack import broker
from stack.supervisor import Supervisor

STACK = "broker,registry,clickhouse,topics,schemas,processors,agents,db-migrate,ratecard,sinks"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _gpuledger(*args: str) -> list[str]:
    return [sys.executable, "-c", "from gpuledger.cli import main; main()", *args]


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _processing_lag(settings: Settings, components: list[str]) -> dict[str, float]:
    """Records behind the log end from each component's own consumer positions (its /metrics)."""
    lag: dict[str, float] = {}
    for name in components:
        port = metrics.read_port(settings, name)
        if port is None:
            continue
        try:
            samples = metrics.scrape(f"http://127.0.0.1:{port}/metrics")
        except httpx.HTTPError:
            continue
        for sample in samples:
            if sample.name == "gpuledger_consumer_lag_records":
                key = f"{name}:{sample.labels.get('topic', '')}"
                lag[key] = lag.get(key, 0.0) + sample.value
    return lag


LEDGER_FIELDS = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s")


class AlertClock:
    """Reads the alerts topic beside the run: when each alert reached a reader, against when it was due."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.seen: list[tuple[float, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="alerts", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        from base.kafka import new_consumer
        from schemas.codec import AvroCodec
        from schemas.topics import ALERTS

        # The stack writes Confluent's framing when its own registry runs: read the ids there, as its components do.
        kafka = self.settings.kafka.model_copy(update={"schema_registry_url": self.settings.registry_url})
        codec = AvroCodec.from_settings(kafka)
        c = new_consumer(self.settings.kafka, f"headline-alerts-{os.getpid()}", **{"auto.offset.reset": "earliest"})
        c.subscribe([self.settings.kafka.topic(ALERTS.name)])
        try:
            while not self._stop.is_set():
                for m in c.consume(500, 0.2):
                    if m.error() is None and m.value():
                        self.seen.append((time.time(), codec.decode(m.value() or b"").record))
        finally:
            c.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def write_csv(self, path: Path) -> None:
        """Every alert read: kind, cluster, node, job, due (ts_ms), emitted (the processor's clock), read."""
        lines = ["kind,cluster,node,job_id,ts_ms,emitted_ts_ms,read_ms"]
        for read, a in self.seen:
            lines.append(f"{a['kind']},{a['cluster']},{a.get('node') or ''},{a.get('job_id') or ''},{a['ts_ms']},"
                         f"{a.get('emitted_ts_ms') or ''},{int(read * 1000)}")  # fmt: skip
        path.write_text("\n".join(lines) + "\n")

    def latencies(self, grace_ms: int, until_ms: int) -> dict[str, list[float]]:
        """Seconds from due to read: idle alerts (due at their minute's end plus grace), coverage gaps (due at the
        last report plus the timeout) of gaps that began before `until_ms` (the end of the input: every exporter
        stops then)."""
        out: dict[str, list[float]] = {"idle": [], "coverage": []}
        first: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}
        for read, a in self.seen:  # an alert stated again (a restarted processor) counts once, when first read
            first.setdefault((a["kind"], a["cluster"], a.get("node"), a.get("job_id"), a["ts_ms"]), (read, a))
        for read, a in first.values():
            if a["kind"] in ("IDLE_WARNING", "RECLAIM_NOTICE"):
                out["idle"].append(read - (a["ts_ms"] + grace_ms) / 1000)
            elif a["kind"] == "COVERAGE_GAP" and a["ts_ms"] < until_ms:
                out["coverage"].append(read - a["ts_ms"] / 1000)
        return out


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def close_last_minutes(pids: dict[str, int], state: Path) -> None:
    """Input complete: the processors and agents (event time: nothing closes the last minutes once input stops)
    are stopped (SIGTERM) and run once more with `--exit-when-idle`, in the environment `up` gave them, as the
    fault suite ends a run."""
    envs = {}
    for name in ("processors", "agents"):
        raw = Path(f"/proc/{pids[name]}/environ").read_bytes()
        envs[name] = dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
    for name in ("processors", "agents"):
        os.kill(pids[name], signal.SIGTERM)
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pids[name]}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    for name, command in (("processors", "run"), ("agents", "agents")):
        with open(state / f"{name}-final.log", "w") as log:
            subprocess.run(_gpuledger("processors", command, "--event-time", "--exit-when-idle", "3"),
                           env=envs[name], stdout=log, stderr=log, check=True, timeout=600)  # fmt: skip


def ledger_check(settings: Settings, expected_path: Path, clusters: list[str], timeout_s: float) -> tuple[int, int]:
    """Waits until job_minutes stop changing, then compares every cluster's per-job seconds with the simulator's
    expected ledger; (jobs compared, jobs that differ). Prints the first differences."""
    from sinks.db import connect

    jobs = json.loads(expected_path.read_text())["jobs"]
    expected = {j: {f: led[f] for f in LEDGER_FIELDS} for j, led in jobs.items()}
    client = connect(settings.clickhouse)
    sums = ", ".join(f"sum({f})" for f in LEDGER_FIELDS)
    last, stable_since, deadline = None, time.monotonic(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = client.query("SELECT count(), sum(allocated_s) FROM job_minutes").result_rows[0]
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since > 30:
            break
        time.sleep(3)
    rows = client.query(f"SELECT cluster, job_id, {sums} FROM job_minutes FINAL GROUP BY cluster, job_id").result_rows
    got: dict[str, dict[str, dict[str, int]]] = {}
    for cluster, job, *vals in rows:
        got.setdefault(str(cluster), {})[str(job)] = {f: int(v) for f, v in zip(LEDGER_FIELDS, vals, strict=True)}
    compared = differ = 0
    for cluster in clusters:
        have = got.get(cluster, {})
        for job in sorted(set(expected) | set(have)):
            compared += 1
            if have.get(job) != expected.get(job):
                differ += 1
                if differ <= 10:
                    print(f"  differs: {cluster} job {job}: warehouse {have.get(job)}, expected {expected.get(job)}")
    return compared, differ


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1250, help="nodes of 8 GPUs (1250 = 10,000 GPUs)")
    ap.add_argument("--duration", type=int, default=600, help="seconds of real time (at least 60)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between lag readings")
    ap.add_argument("--clusters", type=int, default=1, help="send the simulated cluster as this many (fleet.py)")
    ap.add_argument("--seed", type=int, default=1, help="the simulator's seed")
    args = ap.parse_args()
    if args.duration < 60 or not 1 <= args.clusters <= 4096:
        ap.error("--duration at least 60, --clusters 1-4096")

    state = Path(tempfile.mkdtemp(prefix="gpuledger-headline-"))
    port, controller, ch_port = broker.free_ports(3)
    env = {
        **os.environ,
        "GPULEDGER_STATE_DIR": str(state),
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(controller),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "GPULEDGER_CLICKHOUSE__URL": f"http://127.0.0.1:{ch_port}",
        "GPULEDGER_CONFIG": str(state / "none.toml"),
        # Idle warnings within a run of minutes (the defaults wait far longer): interactive jobs after 2 idle
        # minutes, batch after 5, a minute of grace; what is measured is the delay past the minute + grace.
        "GPULEDGER_PROCESSOR__IDLE__IDLE_AFTER_MIN_INTERACTIVE": "2",
        "GPULEDGER_PROCESSOR__IDLE__IDLE_AFTER_MIN_BATCH": "5",
        "GPULEDGER_PROCESSOR__IDLE__GRACE_MIN": "1",
    }
    os.environ.update(env)
    sup = Supervisor(Settings())
    print(f"state {state}; starting the stack ({STACK})", flush=True)
    subprocess.run(_gpuledger("up", "--only", STACK, "--wait", "0"), env=env, check=True)
    settings = Settings()  # now with what `up` made: the registry's address, the ClickHouse passwords
    nodes = args.nodes * args.clusters
    gpus = nodes * 8
    print(f"simulating {args.nodes} nodes x 8 GPUs x {args.clusters} clusters = {gpus:,} GPUs at 1 Hz for "
          f"{args.duration} s; load average {os.getloadavg()}", flush=True)  # fmt: skip
    alerts = AlertClock(settings)
    expected = state / "expected-ledger.json"
    began_ms = int(time.time() * 1000)
    sim_args = ["--nodes", str(args.nodes), "--duration", str(args.duration), "--seed", str(args.seed)]
    sim_args += ["--clusters", str(args.clusters), "--ledger", str(expected)]
    if args.clusters > 1:
        sim_args += ["--kube-nodes", "0"]  # the fleet copies the Slurm-like cluster
    sim = subprocess.Popen(
        _gpuledger("simulate", "run", *sim_args),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(state / "simulator.log", "w"),  # noqa: SIM115
    )
    pids = {c.name: c.pid for c in sup.status(probe=False).components if c.pid}
    pids["simulator"] = sim.pid
    cpu0 = {name: _cpu_s(pid) for name, pid in pids.items()}
    began = time.monotonic()
    lags: dict[str, list[int]] = {}
    proc_lags: dict[str, list[float]] = {}
    rss_max: dict[str, float] = {}
    cpu_last: dict[str, float] = {}
    try:
        while sim.poll() is None:
            time.sleep(args.every)
            st = sup.status()
            for g in st.consumer_lag:
                lags.setdefault(g.group, []).append(g.lag)
            for key, value in _processing_lag(settings, ["processors", "sinks"]).items():
                proc_lags.setdefault(key, []).append(value)
            for name, pid in pids.items():
                rss_max[name] = max(rss_max.get(name, 0.0), _rss_mib(pid))
                cpu_last[name] = max(cpu_last.get(name, 0.0), _cpu_s(pid))  # a process that exited reads 0
            gone = [c.name for c in st.components if c.name in STACK.split(",") and c.state in ("failed", "stopped")]
            if gone:  # a figure from a stack that lost a component measures nothing
                raise SystemExit(f"headline: {', '.join(gone)} stopped; see {state / 'logs'}")
            behind = {k.split(":")[0]: v[-1] for k, v in proc_lags.items() if k.endswith("telemetry.device-samples.v1")}
            print(
                f"  t={time.monotonic() - began:5.0f}s  device-samples behind, in seconds of input: "
                + ", ".join(f"{name} {n / nodes:.1f}" for name, n in sorted(behind.items())),
                flush=True,
            )
        wall = time.monotonic() - began
        cpu = {name: max(cpu_last.get(name, 0.0), _cpu_s(pid)) - cpu0.get(name, 0.0) for name, pid in pids.items()}
        if sim.returncode:
            raise SystemExit(f"headline: the simulator failed; see {state / 'simulator.log'}")
        print("input done; closing the last minutes, then comparing the ledger", flush=True)
        alerts.stop()  # not timed: what processors emit on the way out (a restart states open gaps again)
        close_last_minutes(pids, state)
        clusters = [copy_cluster(settings.cluster, r) for r in range(args.clusters)]
        compared, differ = ledger_check(settings, expected, clusters, timeout_s=600)
    finally:
        alerts.stop()
        if sim.poll() is None:
            sim.terminate()
        subprocess.run(_gpuledger("down"), env=env, check=False, capture_output=True)

    # Input rates: one scrape record per node per second feeds the node stage; the rest is smaller.
    print(f"\n{gpus:,} GPUs ({nodes} nodes) at 1 Hz for {wall:.0f} s of real time, whole stack on this machine")
    print("processing lag (records between a consumer's position and the log end, from its /metrics):")
    print(f"{'component:topic':52} {'max':>9} {'p99':>9} {'mean':>9} {'max s':>7}")
    for key, fvalues in sorted(proc_lags.items()):
        fvalues = sorted(fvalues)
        p99f = fvalues[min(len(fvalues) - 1, int(0.99 * len(fvalues)))]
        per_s = nodes if key.endswith("telemetry.device-samples.v1") else None
        max_s = f"{fvalues[-1] / per_s:7.1f}" if per_s else "      -"
        print(f"{key:52} {fvalues[-1]:>9,.0f} {p99f:>9,.0f} {statistics.fmean(fvalues):>9,.0f} {max_s}")
    print("\ncommitted-offset lag (commits are held until the windows using a record are emitted, so this")
    print("includes up to a minute plus grace of input by design):")
    print(f"{'consumer group':34} {'max lag':>10} {'p99 lag':>10} {'mean lag':>10}  (records behind log end)")
    for group, values in sorted(lags.items()):
        values = sorted(values)
        p99 = values[min(len(values) - 1, int(0.99 * len(values)))]
        print(f"{group:34} {values[-1]:>10,} {p99:>10,} {statistics.fmean(values):>10,.0f}")
    print(f"\n{'process':12} {'CPU s':>8} {'cores':>6} {'max RSS MiB':>12}")
    for name in sorted(cpu):
        print(f"{name:12} {cpu[name]:>8.1f} {cpu[name] / wall:>6.2f} {rss_max.get(name, 0.0):>12.0f}")
    print(f"{'total':12} {sum(cpu.values()):>8.1f} {sum(cpu.values()) / wall:>6.2f}")
    alerts.write_csv(state / "alerts.csv")
    print(f"alerts read: {state / 'alerts.csv'}")
    lat = alerts.latencies(settings.processor.grace_ms, began_ms + args.duration * 1000)
    for kind, seconds in lat.items():
        p50, p99f, top = pct(seconds, 0.5), pct(seconds, 0.99), max(seconds, default=float("nan"))
        print(f"{kind} alerts: {len(seconds):,}, seconds past due p50 {p50:.2f}, p99 {p99f:.2f}, max {top:.2f}")
    print(f"ledger: {compared:,} jobs of {args.clusters} clusters compared with the simulator's expected ledger: "
          f"{differ} differ")  # fmt: skip
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
