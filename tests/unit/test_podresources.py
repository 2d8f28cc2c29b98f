"""The kubelet PodResources client (issue 18) against a fake kubelet built from the kubelet's own
`api.proto`, served over a unix socket; the tracker that turns its answers into UPDATED job events."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fake_kubelet import FakeKubelet

from base.errors import ParseError, ServiceError
from producers.jobevents import EventContext
from producers.kube import GangBook, KubeEventBuilder
from producers.podresources import KubeletDevice, PodResourcesClient, PodResourcesTracker, pod_allocations
from schemas.codec import AvroCodec
from schemas.topics import JOB_EVENTS

ROOT = Path(__file__).resolve().parents[2]
UUIDS = [f"GPU-{i:08x}-aaaa-bbbb-cccc-000000000000" for i in range(4)]


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kubelet-", dir="/tmp") as d:  # unix socket paths are short
        yield Path(d)


def test_stubs_are_generated_from_the_proto(tmp_path: Path) -> None:
    (tmp_path / "producers" / "kubelet").mkdir(parents=True)
    (tmp_path / "producers" / "kubelet" / "api.proto").write_bytes((ROOT / "producers/kubelet/api.proto").read_bytes())
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", "--python_out=.", "--grpc_python_out=.",
                    "producers/kubelet/api.proto"], cwd=tmp_path, check=True)  # fmt: skip
    for name in ("api_pb2.py", "api_pb2_grpc.py"):
        shipped = (ROOT / "producers/kubelet" / name).read_text(encoding="utf-8")
        header = "# ruff: noqa\n# mypy: ignore-errors\n"
        fresh = header + (tmp_path / "producers/kubelet" / name).read_text(encoding="utf-8")
        # The generator stamps its own version into the stubs (the least grpcio and protobuf runtime they accept);
        # pip brings the newest grpcio-tools of the allowed range, so only the code around those stamps must agree.
        assert _unstamped(shipped) == _unstamped(fresh)


def _unstamped(stub: str) -> str:
    stub = re.sub(r"GRPC_GENERATED_VERSION = '[0-9.]+'", "GRPC_GENERATED_VERSION = 'X'", stub)
    stub = re.sub(r"# Protobuf Python Version: [0-9.]+", "# Protobuf Python Version: X", stub)
    return re.sub(r"(Domain\.PUBLIC,\n)\s+\d+,\n\s+\d+,\n\s+\d+,\n", r"\1X,\n", stub)


def test_shipped_stubs_accept_the_installed_runtimes() -> None:
    import grpc
    from google.protobuf import __version__ as protobuf_version

    from producers.kubelet import api_pb2, api_pb2_grpc

    def as_tuple(version: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version.split(".")[:3])

    assert as_tuple(api_pb2_grpc.GRPC_GENERATED_VERSION) <= as_tuple(grpc.__version__)
    assert api_pb2.DESCRIPTOR.name == "producers/kubelet/api.proto" and as_tuple(protobuf_version) >= (6,)


def test_list_and_allocatable_over_the_socket(sock_dir: Path) -> None:
    with FakeKubelet(sock_dir / "kubelet.sock", {"nvidia.com/gpu": UUIDS, "example.com/nic": ["n0"]}) as kubelet:
        kubelet.pods[("ml", "train")] = {"main": {"nvidia.com/gpu": UUIDS[2:]}, "side": {"nvidia.com/gpu": UUIDS[:1],
                                                                                         "example.com/nic": ["n0"]}}
        kubelet.pods[("ml", "cpu-only")] = {"main": {"example.com/nic": ["n1"]}}
        kubelet.pods[("ml", "mig")] = {"main": {"nvidia.com/mig-1g.10gb": ["MIG-0001", "MIG-0002"]}}
        with PodResourcesClient(str(sock_dir / "kubelet.sock")) as client:
            pods = {p.key: p.devices for p in client.pods()}
            allocatable = client.allocatable()
    assert pods == {
        "ml/train": tuple(KubeletDevice("nvidia.com/gpu", u) for u in sorted([UUIDS[0], UUIDS[2], UUIDS[3]])),
        "ml/mig": (KubeletDevice("nvidia.com/mig-1g.10gb", "MIG-0001"), KubeletDevice("nvidia.com/mig-1g.10gb",
                                                                                      "MIG-0002")),
    }
    assert [d.device_id for d in allocatable] == UUIDS
    assert kubelet.calls == ["List", "GetAllocatableResources"]


def test_no_kubelet_is_one_line(sock_dir: Path) -> None:
    with PodResourcesClient(str(sock_dir / "absent.sock"), timeout_s=1.0) as client, \
            pytest.raises(ServiceError) as err:  # fmt: skip
        client.pods()
    assert "absent.sock" in str(err.value) and "\n" not in str(err.value)


def test_a_device_id_that_is_not_an_id_is_refused() -> None:
    from producers.kubelet import api_pb2

    bad = api_pb2.ListPodResourcesResponse(pod_resources=[api_pb2.PodResources(namespace="a", name="b", containers=[
        api_pb2.ContainerResources(name="c", devices=[
            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=["x" * 10_000])])])])  # fmt: skip
    with pytest.raises(ParseError):
        pod_allocations(bad)


def pod(name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "creationTimestamp": "2026-12-01T10:00:00Z",
                     "labels": {"gpuledger.io/project": "atlas", "jobset.sigs.k8s.io/jobset-name": "js"}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "resources": {
            "limits": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase, "startTime": "2026-12-01T10:00:05Z"},
    }  # fmt: skip


def test_tracker_publishes_each_pods_devices_once() -> None:
    tracker = PodResourcesTracker("node-1", KubeEventBuilder(EventContext("c1"), GangBook(), "gpuledger.io/project"))
    pods = {("ml", "train"): pod("train", 4), ("ml", "idx"): pod("idx", 2)}

    def get(ns: str, name: str) -> dict[str, Any] | None:
        return pods.get((ns, name))

    listing = pod_allocations(_response({("ml", "train"): UUIDS, ("ml", "idx"): ["0", "3"], ("ml", "gone"): ["1"]}))
    started = int(datetime(2026, 12, 1, 10, 0, 5, tzinfo=UTC).timestamp() * 1000)
    t0 = started + 95_000  # after the pods' start
    events = tracker.on_list(listing, t0, get)
    codec = AvroCodec()
    for ev in events:
        codec.encode(JOB_EVENTS.subject, ev)  # the contract accepts them
    by_job = {e["job_id"]: e for e in events}
    assert set(by_job) == {"ml/train", "ml/idx"}  # ml/gone: no pod object, tried again next time
    train = by_job["ml/train"]
    assert train["event_type"] == "UPDATED" and train["ts_ms"] == t0 and train["scheduler"] == "KUBERNETES"
    assert train["allocations"][0]["node"] == "node-1"
    assert [d["uuid"] for d in train["allocations"][0]["devices"]] == UUIDS
    assert train["project"] == "atlas" and train["gang_id"] == "jobset:ml/js"
    assert [d["index"] for d in by_job["ml/idx"]["allocations"][0]["devices"]] == [0, 3]
    assert tracker.on_list(listing, t0 + 10_000, get) == []  # unchanged: nothing again
    moved = pod_allocations(_response({("ml", "train"): [*UUIDS[:3], "GPU-new"], ("ml", "idx"): ["0", "3"]}))
    again = tracker.on_list(moved, t0 + 20_000, get)
    assert [(e["job_id"], e["ts_ms"]) for e in again] == [("ml/train", t0 + 20_000)]
    assert again[0]["event_id"] != train["event_id"]
    # a pod of MIG slices only: the kubelet's MIG device UUIDs match no sample (DCGM names the parent GPU and
    # the instance id), so nothing is published for it; its identity comes from dcgm-exporter's labels
    pods[("ml", "mig")] = pod("mig", 1)
    mig = pod_allocations(_response({("ml", "mig"): ["MIG-0001"]}, "nvidia.com/mig-1g.10gb"))
    assert tracker.on_list(mig, t0 + 30_000, get) == []
    # an answer from before the pod's start is stamped at the start, never earlier
    early = PodResourcesTracker("node-1", tracker.events).on_list(listing, t0 - 3_600_000, get)
    assert {e["ts_ms"] for e in early} == {started}
    # a pod the kubelet gave its devices but has not started (no startTime yet: the kubelet's device manager
    # allocates at admission) is published once it has started, not before (seen on KWOK's pods)
    fresh = PodResourcesTracker("node-1", tracker.events)
    pods[("ml", "train")] = {**pod("train", 4, "Pending"), "status": {"phase": "Pending"}}
    assert [e["job_id"] for e in fresh.on_list(listing, t0, get)] == ["ml/idx"]
    pods[("ml", "train")] = pod("train", 4)
    assert [(e["job_id"], e["ts_ms"]) for e in fresh.on_list(listing, t0 + 1_000, get)] == [("ml/train", t0 + 1_000)]


def _response(pods: dict[tuple[str, str], list[str]], resource: str = "nvidia.com/gpu") -> Any:
    from producers.kubelet import api_pb2

    return api_pb2.ListPodResourcesResponse(pod_resources=[
        api_pb2.PodResources(namespace=ns, name=name, containers=[api_pb2.ContainerResources(name="main", devices=[
            api_pb2.ContainerDevices(resource_name=resource, device_ids=ids)])])
        for (ns, name), ids in pods.items()])  # fmt: skip
