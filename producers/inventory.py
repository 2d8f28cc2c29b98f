"""The inventory producer: the devices each node is expected to report (topic `inventory.devices`, compacted).

Sources, each a pure parser from text to `NodeInventory` records:
- Slurm: `scontrol show node` text or slurmrestd `/nodes` JSON (`Gres=gpu:type:N`), read with the
  scheduler parsers in `producers.slurm`; `sinfo --json` (`gres.total` per node group);
- Kubernetes: Node objects (`kubectl get nodes -o json`, a List or one Node, JSON or YAML):
  `status.capacity["nvidia.com/gpu"]` whole GPUs and `nvidia.com/mig-<profile>` MIG slices, the
  model from the `nvidia.com/gpu.product` (GPU feature discovery) or a cloud accelerator label;
- a static YAML file: `nodes: [{name, model, gpus: 8, uuids: [...]}, {name, devices: [{index, model, uuid,
  mig_profile, mig_instance_id}]}]`.
The generation comes from the model name through the data table (`schemas.generations`).
Slurm and Kubernetes do not know GPU UUIDs: `uuid` is null there (telemetry supplies it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from base.errors import ParseError
from producers.records import inventory_device, node_inventory_record
from producers.slurm import expand_hostlist, parse_capture, parse_gres
from schemas.generations import generation_of
from schemas.topics import INVENTORY, Topic, node_key

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
MODEL_LABELS = (
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "k8s.amazonaws.com/accelerator",
    "accelerator",
)
UNKNOWN_MODEL = "unknown"


def _whole_gpus(count: int, model: str, uuids: list[str] | None = None) -> list[dict[str, Any]]:
    gen = generation_of(model)
    return [
        inventory_device(index=i, model=model, generation=gen, uuid=(uuids[i] if uuids and i < len(uuids) else None))
        for i in range(count)
    ]


def _records(cluster: str, ts_ms: int, source: str, nodes: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        node_inventory_record(cluster=cluster, node=name, ts_ms=ts_ms, source=source, devices=devices)
        for name, devices in nodes.items()
    ]


def from_slurm(text: str, cluster: str, ts_ms: int) -> list[dict[str, Any]]:
    """`scontrol show node` text, slurmrestd nodes JSON, or `sinfo --json`."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ParseError(f"Slurm JSON: {exc}") from exc
        if isinstance(doc, Mapping) and "sinfo" in doc:
            return from_sinfo_json(doc, cluster, ts_ms)
    capture = parse_capture(text)
    if not capture.nodes:
        raise ParseError(f"no nodes in the Slurm {capture.kind} output (expected scontrol show node or /nodes)")
    nodes: dict[str, list[dict[str, Any]]] = {}
    for n in capture.nodes:
        model = n.gpu_type or UNKNOWN_MODEL
        nodes[n.name] = _whole_gpus(n.gpu_count, model)
    return _records(cluster, ts_ms, "slurm", nodes)


def from_sinfo_json(doc: Mapping[str, Any], cluster: str, ts_ms: int) -> list[dict[str, Any]]:
    nodes: dict[str, list[dict[str, Any]]] = {}
    for entry in doc.get("sinfo") or []:
        if not isinstance(entry, Mapping):
            continue
        names_obj = entry.get("nodes") or {}
        names = names_obj.get("nodes") if isinstance(names_obj, Mapping) else names_obj
        gres_obj = entry.get("gres") or {}
        gres = gres_obj.get("total") if isinstance(gres_obj, Mapping) else gres_obj
        devices: list[dict[str, Any]] = []
        for item in parse_gres(str(gres) if gres else None):
            if item.name != "gpu" or not item.count:
                continue
            model = item.gpu_type or UNKNOWN_MODEL
            start = len(devices)
            gen = generation_of(model)
            devices.extend(inventory_device(index=start + i, model=model, generation=gen) for i in range(item.count))
        for name in names or []:
            for node in expand_hostlist(str(name)):
                nodes[node] = devices
    if not nodes:
        raise ParseError("sinfo --json: no node entries")
    return _records(cluster, ts_ms, "slurm", nodes)


def _model_from_labels(labels: Mapping[str, str]) -> str:
    for key in MODEL_LABELS:
        value = labels.get(key)
        if value:
            # GFD writes NVIDIA-A100-SXM4-40GB; GKE writes nvidia-tesla-t4 / nvidia-l4.
            return str(value).replace("-", " ")
    return UNKNOWN_MODEL


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def from_kubernetes(text: str, cluster: str, ts_ms: int) -> list[dict[str, Any]]:
    """Node objects (a List or a single Node; JSON or YAML): whole GPUs and MIG slices from capacity."""
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        raise ParseError(f"Kubernetes nodes: not JSON/YAML: {exc}") from exc
    items: list[Mapping[str, Any]] = []
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") in ("List", "NodeList"):
            items.extend(i for i in doc.get("items") or [] if isinstance(i, Mapping))
        elif isinstance(doc, Mapping) and doc.get("kind") == "Node":
            items.append(doc)
    if not items:
        raise ParseError("Kubernetes nodes: no Node objects (kubectl get nodes -o json)")
    nodes: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        meta = item.get("metadata") or {}
        name = str(meta.get("name"))
        labels = meta.get("labels") or {}
        capacity = (item.get("status") or {}).get("capacity") or {}
        model = _model_from_labels(labels)
        devices = _whole_gpus(_quantity(capacity.get(GPU_RESOURCE, 0)), model)
        # MIG (mixed strategy): one resource per profile; instances have no index of their own, so they
        # are numbered after the whole GPUs, in profile order.
        gen = generation_of(model)
        for resource in sorted(capacity):
            if resource.startswith(MIG_PREFIX):
                profile = resource[len(MIG_PREFIX) :]
                for _ in range(_quantity(capacity[resource])):
                    devices.append(
                        inventory_device(index=len(devices), model=model, generation=gen, mig_profile=profile)
                    )
        if devices:
            nodes[name] = devices
    return _records(cluster, ts_ms, "kubernetes", nodes)


def from_static(text: str, cluster: str, ts_ms: int) -> list[dict[str, Any]]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ParseError(f"static inventory: not YAML: {exc}") from exc
    entries = doc.get("nodes") if isinstance(doc, Mapping) else doc
    if not isinstance(entries, list):
        raise ParseError("static inventory: expected `nodes: [...]`")
    nodes: dict[str, list[dict[str, Any]]] = {}
    for n, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or "name" not in entry:
            raise ParseError(f"static inventory: node {n} needs a name")
        if "devices" in entry:
            devices = []
            for d in entry["devices"]:
                model = str(d.get("model") or entry.get("model") or UNKNOWN_MODEL)
                devices.append(
                    inventory_device(
                        index=int(d["index"]),
                        model=model,
                        generation=generation_of(model),
                        uuid=d.get("uuid"),
                        mig_profile=d.get("mig_profile"),
                        mig_instance_id=d.get("mig_instance_id"),
                    )
                )
        else:
            model = str(entry.get("model") or UNKNOWN_MODEL)
            uuids = [str(u) for u in entry.get("uuids") or []]
            devices = _whole_gpus(int(entry.get("gpus", len(uuids))), model, uuids)
        for name in expand_hostlist(str(entry["name"])):
            nodes[name] = devices
    return _records(cluster, ts_ms, "static", nodes)


SOURCES = {"slurm": from_slurm, "kubernetes": from_kubernetes, "static": from_static}


def inventory_records(kind: str, text: str, cluster: str, ts_ms: int) -> list[tuple[Topic, bytes, dict[str, Any]]]:
    """(topic, key, record) for every node of a source's output."""
    try:
        parse = SOURCES[kind]
    except KeyError:
        raise ParseError(f"unknown inventory source {kind!r}; known: {', '.join(SOURCES)}") from None
    return [(INVENTORY, node_key(cluster, r["node"]), r) for r in parse(text, cluster, ts_ms)]
