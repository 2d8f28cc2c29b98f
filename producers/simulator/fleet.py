"""A fleet from one simulated cluster: every record the simulator publishes, sent as N clusters.

The simulator renders and normalizes each node's exporter output every second (about 0.15-0.6 ms of CPU a node
scrape), so simulating 12,500 nodes costs several cores. A fleet for load tests does not need 12,500 different
nodes, it needs 12,500 nodes' records: the simulator runs one cluster, and each record goes out once per copy.
Copy 0 is the simulated cluster itself; copy r (1 <= r < N) is cluster `<cluster>-c<r>` whose GPU UUIDs are the
simulated ones with their first four hex digits replaced by r's (`GPU-1a2b...` -> `GPU-000r...`), so no device is
claimed by two clusters. Everything else (nodes, job ids, users, activity) is the same in every copy, so each
copy's ledger is the simulator's expected ledger of the one cluster.

A device-samples record is encoded once and cut around its event time (the schema begins with cluster, node,
ts_ms): a copy is its head (framing, cluster, node; built once per node and copy), the time, and the rest with
the UUIDs rewritten in one regular-expression pass. Job events and inventory (a few a second) are rewritten as
records and encoded per copy.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from schemas.codec import AvroCodec, avro_string, read_avro_long
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, Topic, job_key, node_key

MAX_COPIES = 0x10000  # four hex digits of a UUID
_UUID_HEAD = re.compile(rb"GPU-[0-9a-f]{4}")
_UUID_HEAD_STR = re.compile(r"GPU-[0-9a-f]{4}")


class RawPublisher(Protocol):
    codec: AvroCodec

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None: ...

    def publish_raw(self, topic_name: str, key: bytes | None, value: bytes | None) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...

    @property
    def kafka(self) -> Any: ...


def copy_cluster(cluster: str, r: int) -> str:
    return cluster if r == 0 else f"{cluster}-c{r}"


def copy_uuid(uuid: str, r: int) -> str:
    return uuid if r == 0 else _UUID_HEAD_STR.sub(f"GPU-{r:04x}", uuid, count=1)


def cut_scrape(value: bytes, header_len: int) -> tuple[str, int, bytes]:
    """(node, offset where ts_ms begins, everything after ts_ms) of an encoded device-samples record."""
    at = header_len
    node = ""
    for field in range(2):  # cluster, node
        size, at = read_avro_long(value, at)
        if field == 1:
            node = value[at : at + size].decode()
        at += size
    _, end = read_avro_long(value, at)
    return node, at, value[end:]


def _renamed(value: Any, r: int, cluster: str, copy: str) -> Any:
    """A decoded record of cluster `cluster` as copy r's: its cluster, its event ids, its GPU UUIDs."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "cluster" and v == cluster:
                out[k] = copy
            elif k == "event_id" and isinstance(v, str) and v.startswith(cluster + "/"):
                out[k] = copy + v[len(cluster) :]
            else:
                out[k] = _renamed(v, r, cluster, copy)
        return out
    if isinstance(value, list):
        return [_renamed(v, r, cluster, copy) for v in value]
    if isinstance(value, str) and value.startswith("GPU-"):
        return copy_uuid(value, r)
    return value


class FleetPublisher:
    """A publisher of one simulated cluster's records (producers.simulator.run) that sends each as `copies`."""

    def __init__(self, publisher: RawPublisher, cluster: str, copies: int) -> None:
        if not 1 <= copies <= MAX_COPIES:
            raise ValueError(f"copies must be 1-{MAX_COPIES}")
        self.publisher = publisher
        self.cluster = cluster
        self.copies = copies
        self.names = [copy_cluster(cluster, r) for r in range(copies)]
        self._tags = [b""] + [b"GPU-%04x" % r for r in range(1, copies)]
        self._header = publisher.codec.header(DEVICE_SAMPLES.subject)
        self._heads: dict[str, tuple[list[bytes], list[bytes]]] = {}
        self._samples_topic = publisher.kafka.topic(DEVICE_SAMPLES.name)

    def _node_heads(self, node: str) -> tuple[list[bytes], list[bytes]]:
        """Per copy, the node's record head (framing, cluster, node) and its key: built once per node."""
        heads = self._heads.get(node)
        if heads is None:
            tail = avro_string(node)
            heads = self._heads[node] = (
                [self._header + avro_string(name) + tail for name in self.names],
                [node_key(name, node) for name in self.names],
            )
        return heads

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        if record.get("cluster") != self.cluster:
            raise ValueError(f"a record of cluster {record.get('cluster')!r}: this fleet copies {self.cluster!r}")
        if topic is not DEVICE_SAMPLES:
            for r, name in enumerate(self.names):
                rec = record if r == 0 else _renamed(record, r, self.cluster, name)
                if topic is JOB_EVENTS:
                    copy_key = job_key(name, rec["job_id"])
                elif topic is INVENTORY:
                    copy_key = node_key(name, rec["node"])
                else:
                    raise ValueError(f"a fleet copies device samples, job events and inventory, not {topic.name}")
                self.publisher.publish(topic, copy_key, rec)
            return
        value = self.publisher.codec.encode(DEVICE_SAMPLES.subject, record)
        node, ts_at, rest = cut_scrape(value, len(self._header))
        ts = value[ts_at : len(value) - len(rest)]
        heads, keys = self._node_heads(node)
        publish_raw, sub, topic_name = self.publisher.publish_raw, _UUID_HEAD.sub, self._samples_topic
        publish_raw(topic_name, key, value)
        for r in range(1, self.copies):
            publish_raw(topic_name, keys[r], heads[r] + ts + sub(self._tags[r], rest))

    def flush(self, timeout_s: float = 30.0) -> None:
        self.publisher.flush(timeout_s)
