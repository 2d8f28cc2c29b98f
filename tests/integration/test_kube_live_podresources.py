"""The Kubernetes path end to end (issue 18): pods on the real API server, `kube watch` (KubeWatcher) and
`gpuledger kube podresources` (the CLI, against a fake kubelet built from the kubelet's own `api.proto`),
their events through the processors, device-minutes charged to the right GPUs.

Three pods on gpu-node-1, each asking for GPUs; the watcher has no device identity (no dcgm labels):
- `early` (4 GPUs) and `late` (4 GPUs): the kubelet names their UUIDs; until `kube podresources` publishes
  them each is four unidentified devices (dark), then its own four GPUs (busy in the samples);
- `dark` (2 GPUs): the kubelet does not list it: two unidentified devices all along, charged two.
GPU-8 and GPU-9 are held by nobody. The expected ledger is worked from the events' own times.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from fake_kubelet import FakeKubelet
from fixtures_kube import NODE, gpu_pod, run_pod
from kubernetes import config as kube_config

from base.processor_settings import ProcessorSettings
from processors.attribution import UNIDENTIFIED
from processors.pipeline import run_in_memory
from processors.testing import device, scrape
from producers.jobevents import EventContext
from producers.kube import WATCH_TARGETS, KubeTracker, KubeWatcher
from schemas.topics import DEVICE_SAMPLES, JOB_EVENTS, job_key, node_key
from stack.kube.cluster import LocalKube

UUIDS = [f"GPU-{i:08d}-0000-4000-8000-000000000000" for i in range(10)]
OWN = {"early": UUIDS[0:4], "late": UUIDS[4:8]}


def sec(ms: int) -> int:
    """The first second at or after `ms` (an interval [start, end) holds seconds sec(start)..sec(end)-1)."""
    return -(-ms // 1000)


def test_pods_are_charged_for_their_own_gpus(local_kube: LocalKube, kube_ns: str, tmp_path: Path) -> None:
    ns = kube_ns
    watcher_cfg = local_kube.cfg.kubeconfig("gpuledger-watcher")
    events: list[dict[str, Any]] = []
    lock = threading.Lock()

    class Sink:
        def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
            with lock:
                events.append(record)

    api = kube_config.new_client_from_config(config_file=str(watcher_cfg))
    watcher = KubeWatcher(api, KubeTracker(EventContext("local")), Sink(), clock=lambda: int(time.time() * 1000),
                          targets=[t for t in WATCH_TARGETS if t.name == "pods"], timeout_seconds=5)  # fmt: skip
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()

    def seen(job: str, kind: str) -> dict[str, Any] | None:
        with lock:
            return next((e for e in events if e["job_id"] == f"{ns}/{job}" and e["event_type"] == kind), None)

    def wait(job: str, kind: str) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (e := seen(job, kind)) is not None:
                return e
            time.sleep(0.1)
        raise AssertionError(f"{ns}/{job} {kind} not seen; {watcher.errors}")

    for name, gpus in (("early", 4), ("late", 4), ("dark", 2)):
        local_kube.apply([gpu_pod(name, ns, gpus, node=NODE)])
        run_pod(local_kube, ns, name)
    started = {name: wait(name, "STARTED") for name in ("early", "late", "dark")}
    for e in started.values():  # the watcher alone knows only counts
        assert all(d["uuid"] is None and d["index"] is None for d in e["allocations"][0]["devices"])
    time.sleep(2.2)  # some seconds of unidentified devices

    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as d:
        sock = Path(d) / "kubelet.sock"
        with FakeKubelet(sock, {"nvidia.com/gpu": UUIDS}) as kubelet:
            for name, ids in OWN.items():
                kubelet.pods[(ns, name)] = {"main": {"nvidia.com/gpu": ids}}
            proc = subprocess.run(
                [sys.executable, "-c", "from gpuledger.cli import main; main()", "kube", "podresources", "--node",
                 NODE, "--socket", str(sock), "--once", "--dry-run", "--kubeconfig", str(watcher_cfg),
                 "--state-dir", str(tmp_path)],
                capture_output=True, text=True, timeout=120, check=False,
                env={**os.environ, "GPULEDGER_CLUSTER": "local"},  # the watcher's cluster
            )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.splitlines()[0]) == {"node": NODE, "allocatable": UUIDS}
    updates = {e["job_id"]: e for e in map(json.loads, proc.stdout.splitlines()) if e["job_id"].startswith(ns)}
    assert set(updates) == {f"{ns}/early", f"{ns}/late"}
    for name, ids in OWN.items():
        assert [d["uuid"] for d in updates[f"{ns}/{name}"]["allocations"][0]["devices"]] == ids
    time.sleep(2.2)
    for name in ("early", "late", "dark"):
        run_pod(local_kube, ns, name, phase="Succeeded")
    ended = {name: wait(name, "ENDED") for name in ("early", "late", "dark")}
    watcher.stop()
    thread.join(timeout=30)

    with lock:
        mine = [e for e in events if e["job_id"].startswith(f"{ns}/")] + list(updates.values())
    first = min(e["ts_ms"] for e in mine) // 60_000 * 60_000
    last = max(e["ts_ms"] for e in mine) + 2_000
    records: list[tuple[int, int, Any, bytes, dict[str, Any]]] = [
        (e["ts_ms"], 0, JOB_EVENTS, job_key(e["cluster"], e["job_id"]), e) for e in mine]  # fmt: skip
    for s in range(first // 1000, last // 1000 + 1):
        devs = [device(u, i, sm=0.9) for i, u in enumerate(UUIDS)]
        records.append((s * 1000, 1, DEVICE_SAMPLES, node_key("local", NODE), scrape(NODE, s * 1000, devs, "local")))
    records.sort(key=lambda r: (r[0], r[1]))
    result = run_in_memory([r[2:] for r in records], ProcessorSettings(realtime=False))

    # Worked ledger, from the events' times
    start = {n: sec(e["ts_ms"]) for n, e in started.items()}
    end = {n: sec(e["ts_ms"]) for n, e in ended.items()}
    known = {n: sec(updates[f"{ns}/{n}"]["ts_ms"]) for n in OWN}
    expected = {
        f"{ns}/{n}": {"allocated_s": 4 * (end[n] - start[n]), "active_s": 4 * (end[n] - known[n]), "starved_s": 0,
                      "idle_s": 0, "dark_s": 4 * (known[n] - start[n])} for n in OWN}  # fmt: skip
    expected[f"{ns}/dark"] = {"allocated_s": 2 * (end["dark"] - start["dark"]), "active_s": 0, "starved_s": 0,
                              "idle_s": 0, "dark_s": 2 * (end["dark"] - start["dark"])}  # fmt: skip
    assert result.ledger() == expected
    assert all(v["dark_s"] > 0 and v["active_s"] > 0 for k, v in expected.items() if not k.endswith("dark"))

    held: dict[str, Counter[str]] = {}
    for r in result.device_minutes:
        if r["job_id"] is not None:
            held.setdefault(r["job_id"].split("/", 1)[1], Counter())[r["device_uuid"]] += r["allocated_s"]
    for n, ids in OWN.items():
        assert held[n] == {**{u: end[n] - known[n] for u in ids},
                           **{f"{UNIDENTIFIED}{k}": known[n] - start[n] for k in range(4)}}  # fmt: skip
    assert held["dark"] == {f"{UNIDENTIFIED}{k}": end["dark"] - start["dark"] for k in range(2)}
    free = {r["device_uuid"] for r in result.device_minutes if r["job_id"] is None and r["unallocated_s"]}
    assert {UUIDS[8], UUIDS[9]} <= free and not any(r["allocated_s"] for r in result.device_minutes
                                                   if r["device_uuid"] in UUIDS[8:])  # fmt: skip


def test_the_daemonset_manifest_is_valid_for_the_api_server(local_kube: LocalKube) -> None:
    """deploy/kubernetes/podresources-daemonset.yaml, judged by the real API server (a server-side dry run: the
    apps/v1 schema with strict field validation), with the node name from the downward API."""
    import yaml

    from stack.kube import deploy_dir

    path = deploy_dir() / "podresources-daemonset.yaml"
    local_kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuledger"}}])
    out = local_kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-o", "json", "-f", str(path))
    ds = json.loads(out.stdout)
    pod = ds["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"][:2] == ["kube", "podresources"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}} \
        in container["env"]  # fmt: skip
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount["mountPath"] == "/var/lib/kubelet/pod-resources" and mount["readOnly"] is True
    [vol] = [v for v in pod["volumes"] if v["name"] == "pod-resources"]
    assert vol["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert pod["serviceAccountName"] == "gpuledger-watcher"  # whose ClusterRole may get pods
    assert yaml.safe_load(path.read_text())["kind"] == "DaemonSet"
