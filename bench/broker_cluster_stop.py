"""A three-node loopback KRaft cluster (`broker.nodes = 3`): time to start, and time to stop with every node
stopped at once (as `gpuledger down` and `LocalCluster.stop` do) or one after the other (as before).

    .venv/bin/python bench/broker_cluster_stop.py [--runs 2] [--one-by-one]

Prints figures only; never fails on wall time. Results go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import machine

from base.settings import Settings
from stack.broker import LocalCluster, cluster_on_free_ports


def one_run(one_by_one: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = LocalCluster(cluster_on_free_ports(root / "kafka", Settings().broker.kafka_version), logs=root)
        t0 = time.monotonic()
        cluster.start(timeout=240)
        started = time.monotonic() - t0
        t1 = time.monotonic()
        if one_by_one:
            for node in reversed(list(cluster.nodes.values())):
                node.stop()
        else:
            cluster.stop()
        return started, time.monotonic() - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--one-by-one", action="store_true", help="stop the nodes one after the other")
    args = parser.parse_args()
    print(machine())
    for k in range(args.runs):
        started, stopped = one_run(args.one_by_one)
        how = "one by one" if args.one_by_one else "at once"
        print(f"run {k + 1}: start to ready {started:.1f} s; stop ({how}) {stopped:.1f} s")


if __name__ == "__main__":
    main()
