"""producers/simulator/fleet.py: one simulated cluster's records sent as N clusters, read back by the codec."""

from __future__ import annotations

from typing import Any

import pytest

from base.settings import KafkaSettings
from producers.simulator import SimConfig, simulate
from producers.simulator.fleet import FleetPublisher, copy_cluster, copy_uuid
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, Topic, job_key, node_key

CFG = SimConfig(seed=3, nodes=3, duration_s=120)


class Collect:
    """What the fleet hands the producer: (topic name, key, encoded value)."""

    def __init__(self) -> None:
        self.codec = AvroCodec()
        self.kafka = KafkaSettings(topic_prefix="t.")
        self.out: list[tuple[str, bytes | None, bytes]] = []

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        self.out.append((self.kafka.topic(topic.name), key, self.codec.encode(topic.subject, record)))

    def publish_raw(self, topic_name: str, key: bytes | None, value: bytes | None) -> None:
        assert value is not None
        self.out.append((topic_name, key, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass


def _uuids(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(_uuids(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_uuids(v) for v in value)) if value else set()
    return {value} if isinstance(value, str) and value.startswith("GPU-") else set()


def _expected_copy(record: dict[str, Any], r: int) -> dict[str, Any]:
    """Copy r of a record, written out field by field (not with the module's own renaming)."""
    rec = {**record, "cluster": copy_cluster("sim", r)}
    if "event_id" in rec:
        rec["event_id"] = rec["event_id"].replace("sim/", copy_cluster("sim", r) + "/", 1)
    if "allocations" in rec:
        rec["allocations"] = [
            {**a, "devices": [{**d, "uuid": copy_uuid(d["uuid"], r)} for d in a["devices"]]} for a in rec["allocations"]
        ]
    if "devices" in rec:
        rec["devices"] = [{**d, "uuid": copy_uuid(d["uuid"], r)} for d in rec["devices"]]
    return rec


def test_every_record_goes_out_once_per_copy_and_reads_back_as_that_cluster() -> None:
    copies = 4
    sink = Collect()
    fleet = FleetPublisher(sink, "sim", copies)
    originals = list(simulate(CFG, end_s=65))
    for topic, key, record in originals:
        fleet.publish(topic, key, record)
    assert len(sink.out) == copies * len(originals)
    got = iter(sink.out)
    uuids_by_copy: list[set[str]] = [set() for _ in range(copies)]
    for topic, _key, record in originals:
        for r in range(copies):
            name, key, value = next(got)
            decoded = sink.codec.decode(value, topic.subject).record
            assert name == "t." + topic.name
            assert decoded == sink.codec.decode(sink.codec.encode(topic.subject, _expected_copy(record, r))).record
            cluster = copy_cluster("sim", r)
            want_key = job_key(cluster, record["job_id"]) if topic is JOB_EVENTS else node_key(cluster, record["node"])
            assert key == want_key
            uuids_by_copy[r] |= _uuids(decoded)
    kinds = {t for t, _, _ in originals}
    assert kinds == {DEVICE_SAMPLES, JOB_EVENTS, INVENTORY}
    # No GPU is claimed by two clusters, and each copy has as many GPUs as the simulated one.
    assert len(uuids_by_copy[0]) == CFG.nodes * CFG.gpus_per_node
    assert all(len(u) == len(uuids_by_copy[0]) for u in uuids_by_copy)
    assert len(set().union(*uuids_by_copy)) == copies * len(uuids_by_copy[0])


def test_copy_names() -> None:
    assert copy_cluster("sim", 0) == "sim"
    assert copy_cluster("sim", 12) == "sim-c12"
    assert copy_uuid("GPU-1a2b3c4d-0000", 0) == "GPU-1a2b3c4d-0000"
    assert copy_uuid("GPU-1a2b3c4d-0000", 0x1F) == "GPU-001f3c4d-0000"


def test_refuses_records_of_another_cluster_and_bad_counts() -> None:
    fleet = FleetPublisher(Collect(), "sim", 2)
    topic, key, record = next(iter(simulate(CFG)))
    with pytest.raises(ValueError, match="cluster 'other'"):
        fleet.publish(topic, key, {**record, "cluster": "other"})
    with pytest.raises(ValueError, match="copies"):
        FleetPublisher(Collect(), "sim", 0)
