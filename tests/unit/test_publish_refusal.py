"""What a flush says about records still waiting: a broker away (wait and flush again) or a refusal (stop)."""

from __future__ import annotations

import gc

import pytest
from confluent_kafka import KafkaError, Producer

from base.errors import NotDelivered, ServiceError
from base.settings import KafkaSettings
from stack.broker import free_ports
from streams.publish import RecordPublisher


def test_records_behind_a_broker_away_are_not_delivered_yet_and_behind_a_refusal_are_an_error() -> None:
    (port,) = free_ports(1)  # nothing listens: librdkafka keeps the record and retries
    pub = RecordPublisher(KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"))
    pub.publish_raw("t", b"k", b"v")
    with pytest.raises(NotDelivered, match="1 records not delivered within 1s"):
        pub.flush(1.0)
    pub._outcome.on_error(KafkaError(KafkaError._TRANSPORT))  # a broker away says nothing permanent
    with pytest.raises(NotDelivered):
        pub.flush(0.5)
    pub._outcome.on_error(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: invalid credentials"))
    with pytest.raises(ServiceError, match=r"records not delivered: .*invalid credentials") as refused:
        pub.flush(0.5)
    assert not isinstance(refused.value, NotDelivered)  # a caller that waits out NotDelivered stops here
    del refused, pub  # the client goes with its last reference (test below): no retries logged after the test


def _live_producers() -> int:
    gc.collect()
    return sum(isinstance(o, Producer) for o in gc.get_objects())


def test_a_dropped_publisher_takes_its_client_with_it() -> None:
    """No cycle through the C client: a publisher dropped with a record still queued for a broker that is away
    frees its producer, instead of leaving it (and its threads) retrying for the rest of the process."""
    (port,) = free_ports(1)
    before = _live_producers()
    pub = RecordPublisher(KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}"))
    pub.publish_raw("t", b"k", b"v")
    assert _live_producers() == before + 1
    del pub
    assert _live_producers() == before
