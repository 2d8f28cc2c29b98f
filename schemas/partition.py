"""Kafka's default partitioner in Python (pure): where every producer of the project puts a key, so the
in-memory pipeline, the processors' job stage and a reader looking for one node's records (sinks/seconds.py) agree
with the broker."""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of a key as a signed 32-bit int (the Java client's `Utils.murmur2`)."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * m) & 0xFFFFFFFF
        k = ((k ^ (k >> 24)) * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_of(key: bytes, partitions: int) -> int:
    """The partition every producer of the project puts `key` on: Kafka's default partitioner (the Java
    client's, librdkafka's `murmur2_random`), so records of a downstream Java producer meet ours."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions
