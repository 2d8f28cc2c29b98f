"""The headline: a simulated fleet at 1 Hz, in real time, through the whole local stack.

Starts the stack (`gpuledger up`: broker, schema registry, embedded ClickHouse, topics, schemas,
processors, agents, migrations, rate card, sinks) in a temporary state dir on free ports, then runs
`gpuledger simulate run --realtime` for N nodes of 8 GPUs, and every 5 s reads each consumer group's lag (records behind
the log end, as `gpuledger status` does). Lag in seconds is records behind divided by the rate
that group's input arrives at. Prints a table and stops everything.

    .venv/bin/python bench/headline.py --nodes 1250 --duration 600     # 10,000 GPUs, 10 minutes
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

import httpx

from base import metrics
from base.settings import Settings
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1250, help="nodes of 8 GPUs (1250 = 10,000 GPUs)")
    ap.add_argument("--duration", type=int, default=600, help="seconds of real time (at least 60)")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between lag readings")
    args = ap.parse_args()

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
    }
    os.environ.update(env)
    settings = Settings()
    sup = Supervisor(settings)
    print(f"state {state}; starting the stack ({STACK})", flush=True)
    subprocess.run(_gpuledger("up", "--only", STACK, "--wait", "0"), env=env, check=True)
    gpus = args.nodes * 8
    print(f"simulating {args.nodes} nodes x 8 GPUs = {gpus:,} GPUs at 1 Hz for {args.duration} s", flush=True)
    sim = subprocess.Popen(
        _gpuledger("simulate", "run", "--nodes", str(args.nodes), "--duration", str(args.duration)),
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
            samples_lag = sum(v[-1] for k, v in proc_lags.items() if k.endswith("telemetry.device-samples.v1"))
            print(
                f"  t={time.monotonic() - began:5.0f}s  device-samples not yet processed: {samples_lag:,.0f} scrapes "
                f"({samples_lag / args.nodes:.1f} s of input)",
                flush=True,
            )
        wall = time.monotonic() - began
        cpu = {name: max(cpu_last.get(name, 0.0), _cpu_s(pid)) - cpu0.get(name, 0.0) for name, pid in pids.items()}
    finally:
        if sim.poll() is None:
            sim.terminate()
        subprocess.run(_gpuledger("down"), env=env, check=False, capture_output=True)

    # Input rates: one scrape record per node per second feeds the node stage; the rest is smaller.
    print(f"\n{gpus:,} GPUs ({args.nodes} nodes) at 1 Hz for {wall:.0f} s of real time, whole stack on this machine")
    print("processing lag (records between a consumer's position and the log end, from its /metrics):")
    print(f"{'component:topic':52} {'max':>9} {'p99':>9} {'mean':>9} {'max s':>7}")
    for key, fvalues in sorted(proc_lags.items()):
        fvalues = sorted(fvalues)
        p99f = fvalues[min(len(fvalues) - 1, int(0.99 * len(fvalues)))]
        per_s = args.nodes if key.endswith("telemetry.device-samples.v1") else None
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


if __name__ == "__main__":
    main()
