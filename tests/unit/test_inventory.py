"""Inventory from Slurm (scontrol text, slurmrestd JSON, sinfo --json), Kubernetes nodes and a static file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from base.errors import ParseError
from producers.inventory import from_kubernetes, from_sinfo_json, from_slurm, from_static, inventory_records
from schemas.codec import AvroCodec
from schemas.topics import INVENTORY

SLURM = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def _encodes(records: list[dict]) -> None:
    codec = AvroCodec()
    for r in records:
        assert codec.decode(codec.encode(INVENTORY.subject, r)).record == r


def test_scontrol_show_node() -> None:
    (path,) = (SLURM / "scontrol-text").glob("*scontrol-show-node*")
    recs = {r["node"]: r for r in from_slurm(path.read_text(), "hpc", 5)}
    assert [(d["index"], d["model"], d["generation"]) for d in recs["cortex-01"]["devices"]] == [
        (i, "m60", "maxwell") for i in range(8)
    ]
    assert len(recs["dumfries-002"]["devices"]) == 4
    assert recs["dumfries-002"]["devices"][0]["generation"] == "turing"
    assert recs["oxygen-04"]["devices"] == []
    assert all(r["source"] == "slurm" and r["ts_ms"] == 5 and not r["deleted"] for r in recs.values())
    assert all(d["uuid"] is None for r in recs.values() for d in r["devices"])
    _encodes(list(recs.values()))


def test_slurmrestd_nodes() -> None:
    (path,) = (SLURM / "slurmrestd-json").glob("*slurm-node-with-gpus*")
    (rec,) = from_slurm(path.read_text(), "hpc", 1)
    assert rec["node"] == "gpu1"
    assert [(d["index"], d["model"], d["generation"]) for d in rec["devices"]] == [
        (i, "h100", "hopper") for i in range(4)
    ]


def test_sinfo_json_groups_and_hostlists() -> None:
    doc = {
        "sinfo": [
            {"nodes": {"nodes": ["gpu[01-02]"]}, "gres": {"total": "gpu:a100:4(S:0-1)", "used": "gpu:a100:1(IDX:0)"}},
            {"nodes": {"nodes": ["mix01"]}, "gres": {"total": "gpu:l40s:2,gpu:h100:2"}},
            {"nodes": {"nodes": ["cpu01"]}, "gres": {"total": ""}},
        ]
    }
    recs = {r["node"]: r for r in from_slurm(json.dumps(doc), "hpc", 1)}
    assert set(recs) == {"gpu01", "gpu02", "mix01", "cpu01"}
    assert [d["generation"] for d in recs["gpu02"]["devices"]] == ["ampere"] * 4
    assert [(d["index"], d["generation"]) for d in recs["mix01"]["devices"]] == [
        (0, "ada"),
        (1, "ada"),
        (2, "hopper"),
        (3, "hopper"),
    ]
    assert from_sinfo_json(doc, "hpc", 1)[0]["node"] == "gpu01"


NODES = """
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: gke-l4-pool-1
    labels: {cloud.google.com/gke-accelerator: nvidia-l4}
  status:
    capacity: {cpu: "8", nvidia.com/gpu: "1"}
- apiVersion: v1
  kind: Node
  metadata:
    name: a100-mig
    labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB, nvidia.com/gpu.count: "1"}
  status:
    capacity: {nvidia.com/gpu: "0", nvidia.com/mig-1g.5gb: "2", nvidia.com/mig-3g.20gb: "1"}
- apiVersion: v1
  kind: Node
  metadata: {name: cpu-only}
  status: {capacity: {cpu: "64"}}
"""


def test_kubernetes_node_capacity_and_mig() -> None:
    recs = {r["node"]: r for r in from_kubernetes(NODES, "k8s", 1)}
    assert set(recs) == {"gke-l4-pool-1", "a100-mig"}
    (l4,) = recs["gke-l4-pool-1"]["devices"]
    assert (l4["model"], l4["generation"], l4["mig_profile"]) == ("nvidia l4", "ada", None)
    mig = recs["a100-mig"]["devices"]
    assert [(d["index"], d["mig_profile"], d["generation"]) for d in mig] == [
        (0, "1g.5gb", "ampere"),
        (1, "1g.5gb", "ampere"),
        (2, "3g.20gb", "ampere"),
    ]
    assert all(r["source"] == "kubernetes" for r in recs.values())
    _encodes(list(recs.values()))


def test_static_file() -> None:
    text = """
nodes:
  - {name: "dgx[1-2]", model: NVIDIA H100 80GB HBM3, gpus: 8}
  - name: t4box
    model: Tesla T4
    uuids: [GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a]
  - name: migbox
    devices:
      - {index: 0, model: NVIDIA A100-SXM4-40GB, uuid: GPU-34319582-d595-d1c7-d1d2-179bcfa61660}
      - {index: 0, model: NVIDIA A100-SXM4-40GB, uuid: GPU-34319582-d595-d1c7-d1d2-179bcfa61660,
         mig_profile: 1g.5gb, mig_instance_id: 13}
"""
    recs = {r["node"]: r for r in from_static(text, "lab", 1)}
    assert set(recs) == {"dgx1", "dgx2", "t4box", "migbox"}
    assert len(recs["dgx1"]["devices"]) == 8 and recs["dgx1"]["devices"][0]["generation"] == "hopper"
    assert recs["t4box"]["devices"][0]["uuid"] == "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"
    assert recs["migbox"]["devices"][1]["mig_instance_id"] == 13
    keyed = inventory_records("static", text, "lab", 1)
    assert {k for _, k, _ in keyed} == {b"lab/dgx1", b"lab/dgx2", b"lab/t4box", b"lab/migbox"}
    _encodes(list(recs.values()))


def test_bad_inputs_raise_parse_errors() -> None:
    with pytest.raises(ParseError):
        from_static("nodes: [{model: x}]", "c", 1)
    with pytest.raises(ParseError):
        from_kubernetes("kind: Pod\nmetadata: {name: p}", "c", 1)
    with pytest.raises(ParseError):
        inventory_records("ldap", "", "c", 1)
