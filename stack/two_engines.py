"""Both live engines into one ledger: the live Slurm and the local Kubernetes control plane with Kueue at once,
their devices played by the simulator's exporters, every producer a real `gpuledger` process on the real broker.

What runs (each started here, stopped by `stop`):
- Kubernetes: kube-controller-manager's Job controller (it makes the pods of the Jobs Kueue admits), KWOK
  (sigs.k8s.io/kwok, the Kubernetes project's kubelet stand-in: it starts, completes and deletes the pods on the
  fake node `KUBE_NODE`, as its own stages say), and `DeviceManager` here, the part of a kubelet KWOK does not
  play: it gives each GPU pod on the node free GPUs when the pod is bound and takes them back when it ends, and
  serves them through the kubelet's PodResources API (stack/kube/kubelet.py).
- Exporters: one simulated dcgm-exporter per node (`SimExporter`): the simulator's ground truth
  (producers/simulator/telemetry.py) for whichever job each device holds now, as the engine says: Slurm's own
  `scontrol show job -d` GPU indices, and the device manager's pods on Kubernetes.
- Producers: `slurm poll`, `kube watch` (as the gpuledger-watcher user), `kube podresources`, one `dcgm run` per
  cluster; the inventory of both nodes published once (`inventory publish --from static`).
The pipeline (processors, sinks, ClickHouse) is the caller's: the test starts its processes, `gpuledger dev
two-engines` starts `gpuledger up`. The work both run on it is stack/two_engines_scenarios.py's.

Job kinds: a job whose name starts with `idle` computes like the simulator's "poker" (2 busy seconds every 4
minutes: idle to the classifier); every other job like its "batch".
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import yaml

from base.errors import ServiceError
from producers.simulator.model import Person, SimDevice, SimJob
from producers.simulator.telemetry import device_labels, exporter_profile, exporter_samples, render_exposition, truth
from stack.broker import _die_with_parent, free_ports, stop_process
from stack.components import gpuledger_argv
from stack.kube import rbac_manifests, user_binding
from stack.kube.build import KubeBinaries, ensure_controller_manager, ensure_kwok, kwok_stages
from stack.kube.cluster import ADMIN, LocalKube, eventually
from stack.kube.kubelet import FakeKubelet
from stack.slurm.cluster import NODE as SLURM_NODE
from stack.slurm.cluster import SlurmClient

Progress = Callable[[str], None]

KUBE_NODE = "kwok-gpu-1"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
EXPORTER_VERSION = "3.3.5-3.4.0"
MODELS = {"h100": ("NVIDIA H100 80GB HBM3", "hopper", 81559, 700), "a100": ("NVIDIA A100-SXM4-80GB", "ampere", 81920,
                                                                             400)}  # fmt: skip
NOBODY = Person(user="", team="", projects=(), default_project="", cost_centre="")


def _quiet(_: str) -> None:
    return None


def gpu(node: str, index: int, kind: str, cluster: str) -> SimDevice:
    """A GPU of a live node: its UUID made from (cluster, node, index), so each run names the same devices."""
    model, generation, memory, power = MODELS[kind]
    digest = f"{zlib.crc32(f'{cluster}/{node}'.encode()):08x}"
    return SimDevice(node=node, index=index, uuid=f"GPU-{digest}-{index:04x}-4000-8000-{index:012x}", model=model,
                     generation=generation, memory_mib=memory, power_max_w=power,
                     pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", slot=index)  # fmt: skip


def slurm_devices(gres: Sequence[tuple[str, int]], cluster: str) -> list[SimDevice]:
    """The live Slurm node's GPUs in Slurm's index order (gres.conf: each type's files in turn)."""
    out: list[SimDevice] = []
    for kind, n in gres:
        for _ in range(n):
            out.append(gpu(SLURM_NODE, len(out), kind, cluster))
    return out


def kube_devices(cluster: str, n: int = 4) -> list[SimDevice]:
    return [gpu(KUBE_NODE, i, "h100", cluster) for i in range(n)]


def static_inventory(devices: Sequence[SimDevice]) -> str:
    """`inventory publish --from static`'s YAML for these devices (a site's hand-written inventory)."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for d in devices:
        nodes.setdefault(d.node, []).append({"index": d.index, "model": d.model, "uuid": d.uuid})
    return yaml.safe_dump({"nodes": [{"name": n, "devices": devs} for n, devs in nodes.items()]}, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Who holds which device, as each engine says


@dataclass(frozen=True)
class Holder:
    job_id: str  # Slurm's job id; `namespace/pod` on Kubernetes
    name: str  # the job's or pod's name: its kind (`idle...`)
    pos: int  # the device's position among the job's devices


def sim_job(holder: Holder) -> SimJob:
    """The simulator's job for a live holder: its activity pattern from its name, its noise from its id."""
    kind = "poker" if holder.name.startswith("idle") else "batch"
    return SimJob(job_id=holder.job_id, kind=kind, person=NOBODY, project="", project_source="EXPLICIT", start_s=0,
                  end_s=1 << 40, devices=(), interactive=False, preemptible=False, checkpointable=False, gang_id=None,
                  partition="", qos="", pricing_tier="", noise=zlib.crc32(holder.job_id.encode()),
                  submit_s=0)  # fmt: skip


_IDX = re.compile(r"IDX:([0-9,\-]+)")


def slurm_holders(scontrol_text: str, node: str = SLURM_NODE) -> dict[int, Holder]:
    """GPU index -> its running job, from `scontrol show job -d -o` (every job, one line each)."""
    out: dict[int, Holder] = {}
    for line in scontrol_text.splitlines():
        words = dict(w.partition("=")[::2] for w in line.split() if "=" in w)
        if words.get("JobState") != "RUNNING" or words.get("Nodes") != node:
            continue
        indices: list[int] = []
        for group in _IDX.findall(words.get("GRES", "")):
            for rng in group.split(","):
                lo, _, hi = rng.partition("-")
                indices.extend(range(int(lo), int(hi or lo) + 1))
        for pos, index in enumerate(sorted(indices)):
            out[index] = Holder(words["JobId"], words.get("JobName", ""), pos)
    return out


class SlurmWatch:
    """Slurm's own answer to "who holds which GPU", asked once a second in a thread."""

    def __init__(self, slurm: SlurmClient, interval_s: float = 1.0) -> None:
        self.slurm, self.interval_s = slurm, interval_s
        self._holders: dict[int, Holder] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slurm-holders", daemon=True)

    def holders(self) -> dict[int, Holder]:
        return dict(self._holders)

    def poll(self) -> None:
        proc = self.slurm.run("scontrol", "show", "job", "-d", "-o", check=False, timeout=30)
        if proc.returncode == 0:
            self._holders = slurm_holders(proc.stdout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):  # a slow controller: ask again next second
                self.poll()
            self._stop.wait(self.interval_s)

    def start(self) -> SlurmWatch:
        self.poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _requests_gpus(pod: dict[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or ():
        limits = (c.get("resources") or {}).get("limits") or {}
        with contextlib.suppress(ValueError):
            total += int(limits.get(GPU_RESOURCE, 0))
    return total


def _ended(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class DeviceManager:
    """The kubelet's device manager for the GPU pods on `node` (KWOK runs them, and has none): a pod bound to the
    node gets free GPUs (lowest index first) the moment it is seen, keeps them until it has ended or is gone, and
    the PodResources server lists what each pod holds. `pods` keeps each pod's last object (its own status: when it
    started, finished or was deleted) for whoever checks the ledger afterwards."""

    def __init__(self, kube: LocalKube, node: str, devices: Sequence[SimDevice], kubelet: FakeKubelet) -> None:
        self.kube, self.node, self.devices, self.kubelet = kube, node, list(devices), kubelet
        self.pods: dict[str, dict[str, Any]] = {}  # ns/pod -> last object seen
        self.assigned: dict[str, list[int]] = {}  # ns/pod -> device indices
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-manager", daemon=True)
        self.errors: list[str] = []

    def holders(self) -> dict[int, Holder]:
        with self._lock:
            return {i: Holder(key, key.split("/", 1)[1], pos) for key, idx in self.assigned.items()
                    for pos, i in enumerate(idx)}  # fmt: skip

    def on_pod(self, event: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if (pod.get("spec") or {}).get("nodeName") != self.node or not _requests_gpus(pod):
            return
        with self._lock:
            self.pods[key] = pod
            if event == "DELETED" or _ended(pod):
                self.assigned.pop(key, None)
            elif key not in self.assigned:
                taken = {i for idx in self.assigned.values() for i in idx}
                free = [d.index for d in self.devices if d.index not in taken]
                want = _requests_gpus(pod)
                if len(free) < want:
                    self.errors.append(f"{key} wants {want} GPUs, {len(free)} free on {self.node}")
                    return
                self.assigned[key] = free[:want]
            uuids = {d.index: d.uuid for d in self.devices}
            table: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
            for held, idx in self.assigned.items():
                ns, name = held.split("/", 1)
                table[(ns, name)] = {"main": {GPU_RESOURCE: [uuids[i] for i in idx]}}
            with self.kubelet.lock:
                self.kubelet.pods = table

    def _run(self) -> None:
        import urllib3
        from kubernetes import client, config, watch

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the loopback API server's own pair
        api = client.CoreV1Api(config.new_client_from_config(str(self.kube.cfg.kubeconfig(ADMIN))))
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listed = api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={self.node}")
                    for item in listed.items:
                        self.on_pod("ADDED", api.api_client.sanitize_for_serialization(item))
                    version = str(listed.metadata.resource_version) if listed.metadata else ""
                w = watch.Watch()
                for ev in w.stream(api.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={self.node}",
                                   resource_version=version, timeout_seconds=5, _request_timeout=10):  # fmt: skip
                    obj = api.api_client.sanitize_for_serialization(ev["object"])
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    self.on_pod(ev["type"], obj)
                    if self._stop.is_set():
                        break
            except Exception as exc:  # a 410 Gone or a dropped connection: list again
                version = ""
                if not self._stop.is_set():
                    self.errors.append(f"pod watch: {exc}")
                    self._stop.wait(0.5)

    def start(self) -> DeviceManager:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


# ---------------------------------------------------------------------------------------------
# What the engines say they ran (the expected ledger is worked from these, never from a plan)

SACCT_FIELDS = "JobID,Start,End,AllocTRES,State"


@dataclass(frozen=True)
class Run:
    start_s: int
    end_s: int
    gpus: int

    @property
    def gpu_seconds(self) -> int:
        return (self.end_s - self.start_s) * self.gpus


def sacct_runs(text: str) -> dict[str, list[Run]]:
    """Job -> each run Slurm's accounting has, from `sacct -D -X -n -P -o JobID,Start,End,AllocTRES,State` with
    `SLURM_TIME_FORMAT=%s` (-D: every run of a requeued or preempted job). A record that never started (or is still
    running) has no run."""
    runs: dict[str, list[Run]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        job, start, end, tres, _state = line.split("|")[:5]
        if not start.isdigit() or not end.isdigit():
            continue
        gpus = sum(int(kv.split("=", 1)[1]) for kv in tres.split(",") if kv.startswith("gres/gpu="))
        runs.setdefault(job, []).append(Run(int(start), int(end), gpus))
    return runs


def _epoch(stamp: str | None) -> int | None:
    return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()) if stamp else None


def pod_run(pod: dict[str, Any]) -> Run:
    """A pod's run as its own status says: startTime (KWOK's pod-ready stage), then its containers' finishedAt
    (pod-complete), or, deleted while running, the deletion time the API server stamped; its GPUs from its limits."""
    status = pod.get("status") or {}
    start = _epoch(status.get("startTime"))
    ends = [_epoch(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
            for cs in status.get("containerStatuses") or ()]  # fmt: skip
    end = max((e for e in ends if e), default=None) or _epoch((pod.get("metadata") or {}).get("deletionTimestamp"))
    if start is None or end is None:
        raise ValueError(f"pod {(pod.get('metadata') or {}).get('name')} has no start or end in its status")
    return Run(start, end, _requests_gpus(pod))


# ---------------------------------------------------------------------------------------------
# Simulated dcgm-exporters


class SimExporter:
    """A dcgm-exporter for one node at `http://127.0.0.1:<port>/metrics`: each scrape prints the simulator's truth
    of each device at this second for the job that holds it now (`holders()`), labelled as dcgm-exporter labels
    it (`hpc_job` on a Slurm node; `namespace`/`pod`/`container` on a Kubernetes node, read from PodResources)."""

    def __init__(self, devices: Sequence[SimDevice], holders: Callable[[], dict[int, Holder]], *, kube: bool,
                 port: int, version: str = EXPORTER_VERSION) -> None:  # fmt: skip
        self.devices, self.holders, self.kube, self.port = list(devices), holders, kube, port
        self.profile = exporter_profile(version)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = exporter.scrape(int(time.time())).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, name=f"exporter-{port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def scrape(self, now_s: int) -> str:
        held = self.holders()
        samples = []
        for dev in self.devices:
            h = held.get(dev.index)
            job = sim_job(h) if h is not None else None
            labels = device_labels(dev, self.profile, h.job_id if h is not None else None, self.kube)
            samples += exporter_samples(self.profile, labels, truth(dev, job, h.pos if h else 0, now_s, 0))
        return render_exposition(samples)

    def start(self) -> SimExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever, which never ran otherwise
            self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------------------------
# Processes


@dataclass
class Processes:
    """Child processes, each with its log in `logs/`; stopped in reverse order (each one's process group)."""

    logs: Path
    owned: bool = True  # die with this process (tests); False: outlive it (`dev two-engines up`)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _files: list[IO[bytes]] = field(default_factory=list)

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        out = (self.logs / f"{name}.log").open("ab")
        self._files.append(out)
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True,
                                preexec_fn=_die_with_parent if self.owned else None)  # fmt: skip
        self.procs[name] = proc
        return proc

    def check(self) -> None:
        """Raise, with its log's tail, when a process has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-2500:]
                raise ServiceError(f"{name} exited {proc.returncode}:\n{tail}")

    def stop(self, name: str | None = None, timeout: float = 20) -> None:
        for key in [name] if name else list(reversed(self.procs)):
            proc = self.procs.pop(key, None)
            if proc is None:
                continue
            if proc.poll() is None:
                stop_process(proc.pid, timeout=timeout)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        if name is None:
            for f in self._files:
                f.close()
            self._files.clear()


# ---------------------------------------------------------------------------------------------
# The whole


@dataclass(frozen=True)
class Clusters:
    slurm: str = "live-slurm"
    kube: str = "live-kube"


def kube_node(devices: Sequence[SimDevice]) -> dict[str, Any]:
    """The Node KWOK manages (its annotation), with the GPUs a device plugin would advertise."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": KUBE_NODE, "annotations": {KWOK_ANNOTATION: "fake"},
                         "labels": {"type": "kwok", "nvidia.com/gpu.product": devices[0].model.replace(" ", "-")}},
            "spec": {"taints": []},
            "status": {"capacity": {GPU_RESOURCE: str(len(devices)), "cpu": "64", "memory": "512Gi", "pods": "110"},
                       "allocatable": {GPU_RESOURCE: str(len(devices)), "cpu": "64", "memory": "512Gi",
                                       "pods": "110"}}}  # fmt: skip


def component_rbac(component: str, user: str | None = None) -> list[dict[str, Any]]:
    """deploy/kubernetes/rbac/<component>.yaml, and its ClusterRole bound to the token user `gpuledger-<component>`."""
    name = f"gpuledger-{component}"
    return [*rbac_manifests(component), user_binding(user or name, name, f"two-engines-{user or name}")]


class TwoEngines:
    """Everything between the two engines and the broker (see the module's docstring). `env` is the environment
    every gpuledger process gets (broker, topic prefix, ClickHouse, state dir): the cluster names are added here."""

    def __init__(self, slurm: SlurmClient, kube: LocalKube, bins: KubeBinaries, env: dict[str, str],
                 state_dir: Path, *, clusters: Clusters = Clusters(), owned: bool = True,
                 progress: Progress = _quiet) -> None:  # fmt: skip
        self.slurm, self.kube, self.bins, self.env = slurm, kube, bins, dict(env)
        self.state_dir, self.clusters, self.progress = state_dir, clusters, progress
        self.procs = Processes(state_dir / "logs", owned=owned)
        self.slurm_gpus = slurm_devices(slurm.cfg.gpus, clusters.slurm)
        self.kube_gpus = kube_devices(clusters.kube)
        self.kubelet = FakeKubelet(state_dir / "kubelet.sock", {GPU_RESOURCE: [d.uuid for d in self.kube_gpus]})
        self.devices = DeviceManager(kube, KUBE_NODE, self.kube_gpus, self.kubelet)
        self.slurm_watch = SlurmWatch(slurm)
        slurm_port, kube_port, self.kwok_port = free_ports(3)
        self.exporters = {
            clusters.slurm: SimExporter(self.slurm_gpus, self.slurm_watch.holders, kube=False, port=slurm_port),
            clusters.kube: SimExporter(self.kube_gpus, self.devices.holders, kube=True, port=kube_port),
        }

    def env_for(self, cluster: str, **extra: str) -> dict[str, str]:
        return {**self.env, **self.slurm.cfg.env, "GPULEDGER_CLUSTER": cluster, **extra}

    def run_cli(self, cluster: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        """`gpuledger ARGS` for `cluster` (more environment in `env`); a failure raises with its stderr's end."""
        proc = subprocess.run(gpuledger_argv(*args), env=self.env_for(cluster, **env), capture_output=True, text=True,
                              timeout=timeout, check=False)  # fmt: skip
        if proc.returncode != 0:
            raise ServiceError(f"gpuledger {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc

    # -- Kubernetes: the Job controller, KWOK and the node

    def start_kube_side(self) -> None:
        kcm = ensure_controller_manager(self.bins, progress=self.progress)
        kwok = ensure_kwok(self.bins, progress=self.progress)
        self.kube.apply([kube_node(self.kube_gpus)])
        for component in ("watcher", "reclaim"):  # the producers' and the executor's rights, and no more
            self.kube.apply(component_rbac(component))
        admin = str(self.kube.cfg.kubeconfig(ADMIN))
        self.procs.spawn("kube-controller-manager", [str(kcm), "--kubeconfig", admin, "--controllers=job",
                                                     "--leader-elect=false", "--secure-port=0", "-v=1"])  # fmt: skip
        self.procs.spawn("kwok", [str(kwok), "--kubeconfig", admin, "--config", str(kwok_stages(self.bins)),
                                  f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                                  f"--server-address=127.0.0.1:{self.kwok_port}", "--node-ip=127.0.0.1",
                                  "--cidr=10.244.0.0/16"])  # fmt: skip
        eventually(self._node_ready, "KWOK makes the node Ready", timeout=60)

    def _node_ready(self) -> bool:
        self.procs.check()
        out = self.kube.kubectl("get", "node", KUBE_NODE, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conds = json.loads(out.stdout).get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    # -- devices, inventory, producers

    def start_devices(self) -> None:
        self.kubelet.__enter__()
        self.devices.start()
        self.slurm_watch.start()
        for exporter in self.exporters.values():
            exporter.start()

    def publish_inventory(self) -> None:
        for cluster, devices in ((self.clusters.slurm, self.slurm_gpus), (self.clusters.kube, self.kube_gpus)):
            path = self.state_dir / f"inventory-{cluster}.yaml"
            path.write_text(static_inventory(devices), encoding="utf-8")
            self.run_cli(cluster, "inventory", "publish", str(path), "--from", "static", "--cluster", cluster)

    def start_producers(self) -> None:
        s, k = self.clusters.slurm, self.clusters.kube
        watcher = str(self.kube.cfg.kubeconfig("gpuledger-watcher"))
        kube_env = self.env_for(k, GPULEDGER_SCHEDULER__DCGM_URLS=json.dumps([self.exporters[k].url]))
        self.procs.spawn("slurm-poll", gpuledger_argv("slurm", "poll", "--interval", "1"), self.env_for(s))
        self.procs.spawn("kube-watch", gpuledger_argv("kube", "watch", "--kubeconfig", watcher, "--timeout", "30",
                                                      "--dcgm-interval", "1"), kube_env)  # fmt: skip
        self.procs.spawn("kube-podresources", gpuledger_argv(
            "kube", "podresources", "--node", KUBE_NODE, "--socket", str(self.kubelet.socket), "--interval", "1",
            "--kubeconfig", watcher), self.env_for(k))  # fmt: skip
        for cluster, exporter in self.exporters.items():
            node = SLURM_NODE if cluster == s else KUBE_NODE
            self.procs.spawn(f"dcgm-{cluster}", gpuledger_argv("dcgm", "run", "--target", f"{exporter.url}={node}"),
                             self.env_for(cluster))  # fmt: skip

    def start(self) -> TwoEngines:
        try:
            self.progress("Kubernetes: the Job controller, KWOK and its GPU node")
            self.start_kube_side()
            self.progress("devices: the kubelet's device manager and PodResources, one simulated exporter per node")
            self.start_devices()
            self.progress("inventory of both nodes")
            self.publish_inventory()
            self.progress("producers: slurm poll, kube watch, kube podresources, dcgm run x2")
            self.start_producers()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.procs.stop()
        for exporter in self.exporters.values():
            with contextlib.suppress(Exception):
                exporter.stop()
        self.slurm_watch.stop()
        self.devices.stop()
        with contextlib.suppress(Exception):
            self.kubelet.__exit__()

    def __enter__(self) -> TwoEngines:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def environ_without_gpuledger() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
