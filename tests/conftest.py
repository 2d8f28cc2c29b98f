"""Shared fixtures. Keep this file tidy: one section per service, each fixture documented.

Kafka (session-scoped, started once):
  kafka_bootstrap   "host:port" of a real broker: `GPULEDGER_KAFKA_BOOTSTRAP` when set, else
                    testcontainers' Kafka when a Docker engine answers, else the project's own
                    launcher (stack.broker) on free loopback ports with a temporary data dir.
  kafka_config      librdkafka configuration dict for that broker (copy it before changing it).
  unique_topic      factory: unique_topic("samples") -> "test.samples.<hex>"; never shared.
  new_topic         factory: creates a unique topic on the broker (partitions, config) and
                    deletes it after the test; returns its name.
Settings:
  settings          a gpuledger `Settings` pointed at the test broker with a tmp state dir; its own
                    local broker is disabled (the test broker plays the external cluster).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from base.settings import BrokerSettings, KafkaSettings, Settings

# embedded ClickHouse; the schema registry; the Java reference program of tests/interop; Kubernetes + Kueue;
# a live Slurm
pytest_plugins = ["fixtures_clickhouse", "fixtures_registry", "fixtures_interop", "fixtures_kube", "fixtures_slurm"]

# ------------------------------------------------------------------------------------------------
# Kafka


def _docker_engine_available() -> bool:
    """A Docker engine answers (a client binary alone is not enough)."""
    try:
        import docker

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    external = os.environ.get("GPULEDGER_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    if _docker_engine_available():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield container.get_bootstrap_server()
        return
    from stack.broker import BrokerConfig, LocalBroker

    cfg = BrokerConfig.on_free_ports(tmp_path_factory.mktemp("kafka"), Settings().broker.kafka_version)
    with LocalBroker(cfg) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def _kafka_config_session(kafka_bootstrap: str) -> dict[str, str]:
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture
def kafka_config(_kafka_config_session: dict[str, str]) -> dict[str, str]:
    return dict(_kafka_config_session)


@pytest.fixture
def unique_topic() -> Callable[[str], str]:
    def make(name: str = "topic") -> str:
        return f"test.{name}.{uuid.uuid4().hex[:12]}"

    return make


@pytest.fixture
def new_topic(
    kafka_config: dict[str, str], unique_topic: Callable[[str], str]
) -> Iterator[Callable[..., str]]:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(kafka_config)
    created: list[str] = []

    def make(name: str = "topic", partitions: int = 1, config: dict[str, str] | None = None) -> str:
        topic = unique_topic(name)
        fut = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic]
        fut.result(timeout=30)
        created.append(topic)
        # Creation returns before every partition has a leader: wait so the test starts on a usable topic.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(topic, timeout=10).topics.get(topic)
            ready = md is not None and md.error is None and len(md.partitions) == partitions
            if ready and all(p.leader >= 0 for p in md.partitions.values()):
                return topic
            time.sleep(0.1)
        raise TimeoutError(f"topic {topic} has no leader for every partition after 30 s")

    yield make
    if created:
        for fut in admin.delete_topics(created).values():
            with contextlib.suppress(Exception):  # best effort: topic names are unique anyway
                fut.result(timeout=30)


# ------------------------------------------------------------------------------------------------
# Settings


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    state = tmp_path / "state"
    state.mkdir()
    return Settings(
        state_dir=state,
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap),
        broker=BrokerSettings(enabled=False),
    )
