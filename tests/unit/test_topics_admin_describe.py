"""BrokerTopics.state over a cluster whose brokers disagree for a moment: metadata (from one broker) names a
topic that the broker answering describe_configs has not learnt yet. The topic is "not there yet" (a wait asks
again, an apply's create tolerates that it exists), never a failure; any other describe error still fails.
The admin client stands in for the brokers' answers (what is tested is how they are read)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from base.errors import ServiceError
from base.settings import KafkaSettings
from streams.topics_admin import BrokerTopics


class Brokers:
    def __init__(self, describe_error: int | None) -> None:
        self.describe_error = describe_error

    def list_topics(self, timeout: float) -> Any:
        partitions = {0: SimpleNamespace(replicas=[1, 2, 3])}
        return SimpleNamespace(topics={"t": SimpleNamespace(error=None, partitions=partitions)})

    def describe_configs(self, resources: list[Any]) -> dict[Any, Future[Any]]:
        out: dict[Any, Future[Any]] = {}
        for r in resources:
            f: Future[Any] = Future()
            if self.describe_error is None:
                f.set_result({})
            else:
                f.set_exception(KafkaException(KafkaError(self.describe_error)))
            out[r] = f
        return out


def topics(brokers: Brokers) -> BrokerTopics:
    bt = BrokerTopics(KafkaSettings(bootstrap_servers="127.0.0.1:1"), timeout_s=1)
    bt._admin = brokers  # type: ignore[assignment]
    return bt


def test_a_topic_the_answering_broker_does_not_know_yet_is_absent_not_an_error() -> None:
    assert topics(Brokers(KafkaError.UNKNOWN_TOPIC_OR_PART)).state(["t"]) == {}
    assert "t" in topics(Brokers(None)).state(["t"])


def test_any_other_describe_error_fails_in_one_line() -> None:
    with pytest.raises(ServiceError, match="cannot describe t"):
        topics(Brokers(KafkaError.TOPIC_AUTHORIZATION_FAILED)).state(["t"])
