"""Every producer of the project partitions keys as Kafka's Java client does (murmur2), so records a
downstream Java producer writes meet ours on the same partition (the node and job stages join by it)."""

from __future__ import annotations

import pytest

from base.kafka import PRODUCER_DEFAULTS
from processors.pipeline import murmur2, partition_of

# org.apache.kafka.common.utils.Utils.murmur2 (kafka-clients 4.1.1), and toPositive(..) % 4.
JAVA = [
    ("c1/n1", 178099016, 0),
    ("sim/node-00", -329790704, 0),
    ("sim/node-01", 1208193074, 2),
    ("c1/4242", -1826943802, 2),
    ("21", -973932308, 0),
    ("foobar", -790332482, 2),
    ("", 275646681, 1),
]


@pytest.mark.parametrize(("key", "java_hash", "java_partition_of_4"), JAVA)
def test_murmur2_and_partition_match_the_java_client(key: str, java_hash: int, java_partition_of_4: int):
    assert murmur2(key.encode()) == java_hash
    assert partition_of(key.encode(), 4) == java_partition_of_4


def test_our_producers_use_the_java_compatible_partitioner():
    assert PRODUCER_DEFAULTS["partitioner"] == "murmur2_random"
