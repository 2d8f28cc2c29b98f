"""Device identity from the kubelet: its PodResources API (v1, gRPC over the kubelet's unix socket).

The kubelet knows which device plugin device each container holds: for NVIDIA's plugin the device ids are
GPU UUIDs (`GPU-...`), MIG device UUIDs (`MIG-...`) for `nvidia.com/mig-*` resources, or indices when the
plugin runs with `DEVICE_ID_STRATEGY=index`. `gpuledger kube podresources` runs on each node (a DaemonSet,
`deploy/kubernetes/podresources-daemonset.yaml`) and publishes, for each GPU pod on it, an UPDATED job
event naming its whole GPUs; the processors then end the pod's unidentified intervals and charge the real
devices (`processors/attribution.py`, `DeviceRef.slot`). MIG slices are read but not published: the
kubelet names them by MIG device UUID, telemetry by parent GPU UUID and instance id (see `on_list`).

Pure core: `pod_allocations(response)` (the List answer as devices per pod) and
`PodResourcesTracker.on_list(allocations, now_ms, get_pod) -> events` (an event when a pod's devices are
new or changed, once). The adapter `PodResourcesClient` speaks gRPC with the stubs generated from
`producers/kubelet/api.proto`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import ParseError, ServiceError
from producers.jobevents import EventSink, HeldDevices
from producers.kube import GPU_RESOURCE, MIG_PREFIX, KubeEventBuilder, gpu_request, parse_time
from producers.slurm import MAX_NODE_GPUS
from schemas.topics import JOB_EVENTS, job_key

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_DEVICE_ID = 256  # a device id longer than this is not a device plugin's id


def _is_gpu(resource: str) -> bool:
    return resource == GPU_RESOURCE or resource.startswith(MIG_PREFIX)


@dataclass(frozen=True, slots=True)
class KubeletDevice:
    """One device a container holds: the plugin's resource name and device id."""

    resource: str
    device_id: str

    @property
    def mig_profile(self) -> str | None:
        return self.resource[len(MIG_PREFIX):] if self.resource.startswith(MIG_PREFIX) else None


@dataclass(frozen=True, slots=True)
class PodAllocation:
    namespace: str
    name: str
    devices: tuple[KubeletDevice, ...]  # sorted, once each (containers of a pod may not share one)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _devices(container_devices: Iterable[Any]) -> list[KubeletDevice]:
    out: list[KubeletDevice] = []
    for cd in container_devices:
        resource = str(cd.resource_name)
        if not _is_gpu(resource):
            continue
        for device_id in cd.device_ids:
            text = str(device_id)
            if not text or len(text) > MAX_DEVICE_ID or not text.isprintable():
                raise ParseError(f"kubelet device id of {resource} is not an id: {text[:80]!r}")
            out.append(KubeletDevice(resource, text))
    return out


def pod_allocations(response: Any) -> list[PodAllocation]:
    """The GPU devices (whole and MIG) of each pod in a `ListPodResourcesResponse`; pods without any left
    out. A pod listing more devices than a node has is a `ParseError`."""
    out: list[PodAllocation] = []
    for pod in response.pod_resources:
        devices: set[KubeletDevice] = set()
        for container in pod.containers:
            devices.update(_devices(container.devices))
        if len(devices) > MAX_NODE_GPUS:
            raise ParseError(f"pod {pod.namespace}/{pod.name} lists {len(devices)} GPU devices (max {MAX_NODE_GPUS})")
        if devices:
            ordered = tuple(sorted(devices, key=lambda d: (d.resource, d.device_id)))
            out.append(PodAllocation(str(pod.namespace), str(pod.name), ordered))
    return out


def allocatable_devices(response: Any) -> list[KubeletDevice]:
    """The GPU devices the kubelet can hand out (`AllocatableResourcesResponse`), sorted."""
    return sorted(set(_devices(response.devices)), key=lambda d: (d.resource, d.device_id))


def held_from_kubelet(node: str, devices: Iterable[KubeletDevice]) -> HeldDevices:
    """The pod's devices as a job event holds them: UUIDs (`GPU-...`, `MIG-...`), or indices where the
    plugin names devices by index."""
    devs = list(devices)
    ids = [d.device_id for d in devs]
    profiles = tuple(d.mig_profile for d in devs)
    if all(i.isdigit() and len(i) <= 4 for i in ids):
        return HeldDevices(node, len(devs), indices=tuple(int(i) for i in ids), mig_profiles=profiles)
    return HeldDevices(node, len(devs), uuids=tuple(ids), mig_profiles=profiles)


GetPod = Callable[[str, str], Mapping[str, Any] | None]  # (namespace, name) -> the pod object, None: gone


class PodResourcesTracker:
    """Which devices each GPU pod on one node holds, as last published.

    `on_list` compares a List answer with what was published: a pod whose devices are new or changed gets
    one UPDATED event (built from its pod object, so user, project and gang are the watcher's), at
    `now_ms` but never before the pod's start; pods no longer listed are forgotten (their end is the
    watcher's to publish). A pod the API server no longer has is skipped and tried again next time."""

    def __init__(self, node: str, events: KubeEventBuilder) -> None:
        self.node = node
        self.events = events
        self.published: dict[str, tuple[KubeletDevice, ...]] = {}

    def on_list(self, allocations: Iterable[PodAllocation], now_ms: int, get_pod: GetPod) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        listed: set[str] = set()
        for alloc in allocations:
            listed.add(alloc.key)
            # A MIG slice is named here by its MIG device UUID, which telemetry never carries (DCGM names
            # the parent GPU's UUID and the GPU instance id) and the inventory does not map: published, it
            # would be a device no sample matches. MIG identity is left to dcgm-exporter's pod labels.
            whole = tuple(d for d in alloc.devices if d.mig_profile is None)
            if not whole or self.published.get(alloc.key) == whole:
                continue
            pod = get_pod(alloc.namespace, alloc.name)
            if pod is None:
                continue
            status = pod.get("status") or {}
            on_node = (pod.get("spec") or {}).get("nodeName") == self.node
            if status.get("phase") not in ("Running", "Pending") or not on_node:
                continue
            started = parse_time(status.get("startTime"))
            if started is None:
                # Admitted by the kubelet (it gives a pod its devices first) but not started: published now, the
                # devices would be charged from before the pod's start. Tried again at the next List.
                continue
            ts = max(now_ms, started)
            held = held_from_kubelet(self.node, whole)
            req = gpu_request(pod.get("spec") or {})
            out.append(self.events.pod_event(
                pod, "UPDATED", ts, req, [held], start_ts_ms=started,
                id_extra=("podresources", *(d.device_id for d in whole)),
            ))  # fmt: skip
            self.published[alloc.key] = whole
        for key in set(self.published) - listed:
            del self.published[key]
        return out


def _messages() -> Any:
    """The generated message classes (typed Any: generated code has no annotations)."""
    import importlib

    return importlib.import_module("producers.kubelet.api_pb2")


class PodResourcesClient:
    """The kubelet's PodResourcesLister over its unix socket (`List`, `GetAllocatableResources`). Errors
    are one `ServiceError` line naming the socket."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 10.0) -> None:
        import grpc

        from producers.kubelet import api_pb2_grpc

        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._grpc = grpc
        # the kubelet caps its answers at 16 MiB (podresources.DefaultPodResourcesMaxSize)
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}", options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)]
        )
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)

    def _call(self, name: str, request: Any) -> Any:
        try:
            return getattr(self._stub, name)(request, timeout=self.timeout_s)
        except self._grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "?"
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            raise ServiceError(f"kubelet PodResources {name} at {self.socket_path}: {code} {detail}"[:300]) from exc

    def pods(self) -> list[PodAllocation]:
        """`List`: the GPU devices of each pod on the node."""
        return pod_allocations(self._call("List", _messages().ListPodResourcesRequest()))

    def allocatable(self) -> list[KubeletDevice]:
        """`GetAllocatableResources`: the GPU devices the kubelet can hand out."""
        return allocatable_devices(self._call("GetAllocatableResources", _messages().AllocatableResourcesRequest()))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def api_pod_getter(api_client: Any) -> GetPod:
    """(namespace, name) -> the pod as the API server stores it (plain JSON), None when it is gone (404)."""
    import json

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)

    def get(namespace: str, name: str) -> Mapping[str, Any] | None:
        try:
            resp: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ServiceError(f"get pod {namespace}/{name}: {exc.status} {exc.reason}"[:300]) from exc
        data = json.loads(resp.data)
        return data if isinstance(data, dict) else None

    return get


class PodResourcesPublisher:
    """The node agent's loop: ask the kubelet every `interval_s`, publish what changed. A failed round
    (kubelet or API server away) is logged in `errors` and tried again at the next interval."""

    def __init__(self, client: PodResourcesClient, tracker: PodResourcesTracker, get_pod: GetPod, sink: EventSink,
                 *, clock: Callable[[], int]) -> None:  # fmt: skip
        self.client = client
        self.tracker = tracker
        self.get_pod = get_pod
        self.sink = sink
        self.clock = clock
        self.errors: list[str] = []

    def round(self) -> list[dict[str, Any]]:
        try:
            events = self.tracker.on_list(self.client.pods(), self.clock(), self.get_pod)
        except (ServiceError, ParseError) as exc:
            self.errors.append(str(exc))
            log.warning("podresources: %s", exc)
            return []
        for ev in events:
            self.sink.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)
        return events

    def run(self, stop: threading.Event, interval_s: float, rounds: int | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        done = 0
        while not stop.is_set() and (rounds is None or done < rounds):
            out.extend(self.round())
            done += 1
            if rounds is None or done < rounds:
                stop.wait(interval_s)
        return out
