"""The local Kubernetes control plane (stack/kube): first build and warm start, memory, and the
watcher's events per second against the real API server.

    .venv/bin/python bench/kube_startup.py [--runs 3] [--pods 5000] [--jobs 1] [--json]

The first build is timed by whoever builds first (`gpuledger dev kube build` records its seconds in
`.complete` of the cache directory); this reads it back. Warm start: a fresh state directory each run,
start to Kueue ready. Watcher: `--pods` GPU pods are created (bound to one node), then KubeWatcher lists
them (as gpuledger-watcher) and its events per second are reported. Prints figures only; never fails on
wall time. Results go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, rss_mib

from stack.kube.build import ensure_binaries
from stack.kube.cluster import ClusterConfig, LocalKube


def warm_start(bins: Any, root: Path) -> tuple[LocalKube, float]:
    kube = LocalKube(ClusterConfig.on_free_ports(Path(tempfile.mkdtemp(dir=root))), bins)
    t = time.monotonic()
    kube.start()
    return kube, time.monotonic() - t


def create_pods(kube: LocalKube, n: int) -> float:
    """n GPU pods bound to one node (pending: status is not written), created by the admin in batches."""
    import yaml

    ns = "bench"
    kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}},
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1"}}])  # fmt: skip
    t = time.monotonic()
    batch = 500
    for start in range(0, n, batch):
        docs = [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": f"p{i}", "namespace": ns, "labels": {"gpuledger.io/project": "atlas"}},
                 "spec": {"nodeName": "gpu-node-1", "containers": [{"name": "c", "image": "busybox",
                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
                for i in range(start, min(n, start + batch))]
        kube.kubectl("create", "-f", "-", input=yaml.safe_dump_all(docs), timeout=300)
    return time.monotonic() - t


def watcher_rate(kube: LocalKube) -> tuple[int, float]:
    """KubeWatcher as gpuledger-watcher (its ClusterRole from deploy/): the initial list of every pod, each
    through the tracker, to a sink that counts. Returns (events, seconds from the list request to the last)."""
    from kubernetes import config as kube_config

    from producers.jobevents import EventContext
    from producers.kube import WATCH_TARGETS, KubeTracker, KubeWatcher
    from producers.projects import Attributor, ProjectRule, registry_from_data

    class Count:
        n = 0
        last = 0.0

        def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
            self.n += 1
            self.last = time.monotonic()

    import yaml

    from stack.kube import deploy_dir

    role = (deploy_dir() / "rbac" / "watcher.yaml").read_text(encoding="utf-8")
    group = "rbac.authorization.k8s.io"
    kube.apply([*(d for d in yaml.safe_load_all(role) if d), {
        "apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "bench-watcher"},
        "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": "gpuledger-watcher"},
        "subjects": [{"apiGroup": group, "kind": "User", "name": "gpuledger-watcher"}]}])  # fmt: skip
    api = kube_config.new_client_from_config(config_file=str(kube.cfg.kubeconfig("gpuledger-watcher")))
    sink = Count()
    registry = registry_from_data({"projects": [{"id": "atlas"}], "defaults": {}})
    ctx = EventContext("bench", attributor=Attributor(registry, ProjectRule(mode="grace")))
    watcher = KubeWatcher(api, KubeTracker(ctx), sink, clock=lambda: int(time.time() * 1000),
                          targets=[t for t in WATCH_TARGETS if t.name == "pods"], timeout_seconds=1)  # fmt: skip
    t = time.monotonic()
    watcher.run(rounds=1)
    took = sink.last - t  # list request to the last event published (the idle watch round after is left out)
    if watcher.errors or watcher.rejected:
        print(f"watcher errors: {watcher.errors}, rejected: {watcher.rejected}")
    return sink.n, took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    bins = ensure_binaries(jobs=args.jobs)
    first_build = float((bins.root / ".complete").read_text().strip() or "nan")
    results: dict[str, Any] = {"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                               "first_build_s": first_build, "warm_start_s": [], "rss_mib": {}}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            kube, took = warm_start(bins, Path(tmp))
            results["warm_start_s"].append(round(took, 2))
            if run == args.runs - 1:
                results["rss_mib"] = {n: round(rss_mib(p.pid)) for n, p in kube.procs.items()}
                if args.pods:
                    results["create_pods_s"] = round(create_pods(kube, args.pods), 1)
                    events, took = watcher_rate(kube)
                    results["watcher"] = {"pods": args.pods, "events": events, "seconds": round(took, 2),
                                          "events_per_s": round(events / took)}  # fmt: skip
            kube.stop()
    results["warm_start_median_s"] = statistics.median(results["warm_start_s"])
    print(json.dumps(results, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
