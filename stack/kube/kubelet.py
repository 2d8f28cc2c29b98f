"""A kubelet's PodResources server without a kubelet: the real v1 service, generated from the kubelet's own
`api.proto` (producers/kubelet), served over a unix socket as the kubelet serves it, answering from a table its
owner sets (the tests, or the device stand-in of `gpuledger dev two-engines`, which plays the kubelet's device
manager for the pods KWOK runs)."""

from __future__ import annotations

import importlib
import threading
from concurrent import futures
from pathlib import Path
from typing import Any, Self

import grpc

from producers.kubelet import api_pb2_grpc

# The generated message classes, typed Any (generated code has no annotations): producers/podresources.py does the same.
api_pb2: Any = importlib.import_module("producers.kubelet.api_pb2")

Pods = dict[tuple[str, str], dict[str, dict[str, list[str]]]]  # (ns, pod) -> container -> resource -> ids


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, socket: Path, allocatable: dict[str, list[str]] | None = None) -> None:
        self.socket = socket
        self.pods: Pods = {}
        self.allocatable = allocatable or {}
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{socket}")

    @staticmethod
    def _devices(by_resource: dict[str, list[str]]) -> list[Any]:
        return [api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in by_resource.items()]

    def List(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.calls.append("List")
            return api_pb2.ListPodResourcesResponse(pod_resources=[
                api_pb2.PodResources(namespace=ns, name=name, containers=[
                    api_pb2.ContainerResources(name=c, devices=self._devices(res)) for c, res in containers.items()])
                for (ns, name), containers in self.pods.items()])  # fmt: skip

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.calls.append("GetAllocatableResources")
            return api_pb2.AllocatableResourcesResponse(devices=self._devices(self.allocatable))

    def __enter__(self) -> Self:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(None)
