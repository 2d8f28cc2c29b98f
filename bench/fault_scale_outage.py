"""ClickHouse down for five minutes at 10,000 GPUs (issue 44 item 5): how long the sink takes to catch up, and that
the ledger is still exact.

    .venv/bin/python bench/fault_scale_outage.py [--outage 300] [--seconds 420] [--at 60]

The fault suite's scale harness (tests/fault/scale/scale_harness.py) whole: three KRaft nodes (three replicas, min
ISR 2), the embedded ClickHouse server, three `processors run` and three `processors agents` processes, the sink,
and the simulator's 125 nodes sent as 10 clusters (10,000 GPUs) for `--seconds`, recorded once (cached) and replayed
at 1 Hz. At run second `--at` the ClickHouse server is stopped, `--outage` seconds later started again; the catch-up
is the time from then until the sink has stored and committed every record its topics held at that moment (the load
still running). `make fault-scale` runs the same scenario with a 60 s outage against an undisturbed run; here, to keep
it to one run, the ledger read back is checked against the simulator's own in each of the 10 clusters (per job
allocated, active, starved, idle and dark seconds) and for agreement of its three readings
(`fault_harness.check_consistent`).

The load must outlast the outage: `--seconds` >= `--at` + `--outage` + 30. Recording 420 s costs the simulator
about 40 CPU s the first time (820 MB on disk and in memory). Prints figures only; never fails on wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for where in (ROOT, ROOT / "tests", ROOT / "tests" / "fault", ROOT / "tests" / "fault" / "scale"):
    sys.path.insert(0, str(where))

from _common import machine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outage", type=int, default=300, help="seconds ClickHouse is down (default 300)")
    ap.add_argument("--seconds", type=int, default=420, help="seconds of load recorded and replayed (default 420)")
    ap.add_argument("--at", type=int, default=60, help="the run second the outage begins at (default 60)")
    args = ap.parse_args()
    if args.seconds < args.at + args.outage + 30:
        ap.error("--seconds must be at least --at + --outage + 30: the load outlasts the outage")
    os.environ["GPULEDGER_FAULT_SCALE_SECONDS"] = str(args.seconds)  # read by scale_harness at import

    from fault_harness import ReplicatedStack, check_consistent, finish_and_read, wait_until
    from scale_harness import ScaleRun, committed_past, end_offsets, per_cluster_jobs, record

    print(f"machine: {machine()}; load average {os.getloadavg()}", flush=True)
    c0 = time.process_time()
    rec = record()
    print(f"recording: {rec.records:,} records ({rec.scrapes:,} node scrapes) over {len(rec.seconds)} s, "
          f"{time.process_time() - c0:.0f} CPU s", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-fault-scale-") as tmp:
        stack = ReplicatedStack(Path(tmp) / "stack").start()
        try:
            with ScaleRun(stack, "outage", Path(tmp) / "run", rec) as run:
                run.start_pipeline()
                run.wait_second(args.at)
                wait_until(lambda: run.stored("device_minutes") > 0, 300, "the first device-minutes", 0.5)
                t0 = time.monotonic()
                stack.stop_clickhouse()
                print(f"ClickHouse stopped at run second {run.second}; load average {os.getloadavg()}", flush=True)
                time.sleep(args.outage)
                run.check_alive(run.sink)
                behind = run.sink_lag()
                stack.start_clickhouse()
                t1 = time.monotonic()
                ends = end_offsets(stack.bootstrap, [run.topic(t) for t in run.SINK_TOPICS])
                wait_until(lambda: committed_past(stack.bootstrap, run.sink_group, ends), 1800, "the catch-up", 0.5)
                t2 = time.monotonic()
                second = run.second
                led = finish_and_read(run)
                check_consistent(led)
                exact = per_cluster_jobs(led) == dict.fromkeys(rec.clusters, rec.expected)
                assert run.load is not None
                print(f"outage {t1 - t0:.0f} s; {behind:,} records behind the sink at its return (run second "
                      f"{second}); caught up {t2 - t1:.1f} s later; load {run.load.figures.overran} seconds "
                      f"overran; ledger equals the simulator's: {exact}; dead-lettered {run.dlq_counts()}; "
                      f"load average {os.getloadavg()}", flush=True)  # fmt: skip
                if not exact:
                    raise SystemExit("the ledger differs from the simulator's")
        finally:
            stack.close()


if __name__ == "__main__":
    main()
