"""`gpuledger topics apply`: make the broker's topics match the catalogue, idempotently.

Pure part: `plan(desired, actual)` compares the catalogue with what the broker has and says, per
topic, what to do (create, raise partitions, set configs) and what cannot be fixed automatically
(fewer partitions wanted than exist, a different replication factor). Adapter part: `BrokerTopics`
reads the broker's state and applies a plan with confluent-kafka's AdminClient.

Only the configs the catalogue and the settings own are compared and set (`cleanup.policy`,
`retention.ms`, and `min.insync.replicas` from `kafka.min_insync_replicas`, or 2 of 3 replicas), with
incremental alters, so other configs an operator set stay as they are. The replication factor is
`kafka.replication_factor` (the local cluster's size by default, `broker.nodes`), or `--replication`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from base.errors import ServiceError
from base.settings import KafkaSettings
from schemas.topics import Topic, all_topics

MANAGED_CONFIGS = ("cleanup.policy", "retention.ms", "min.insync.replicas")


@dataclass(frozen=True, slots=True)
class TopicState:
    """What the broker has for one topic."""

    name: str
    partitions: int
    replication: int
    configs: dict[str, str]


@dataclass(frozen=True, slots=True)
class DesiredTopic:
    """A catalogue topic with its broker-side name (prefix applied) and replication."""

    name: str
    partitions: int
    replication: int
    configs: dict[str, str]

    @classmethod
    def of(cls, topic: Topic, kafka: KafkaSettings, replication: int | None = None) -> DesiredTopic:
        rf = replication or kafka.replication_factor or topic.replication
        return cls(
            kafka.topic(topic.name),
            topic.partitions,
            rf,
            {
                "cleanup.policy": topic.cleanup_policy,
                "retention.ms": str(topic.retention_ms),
                "min.insync.replicas": str(kafka.topic_min_insync(rf)),
            },
        )


@dataclass(slots=True)
class TopicPlan:
    """What to do with one topic, and afterwards what was done."""

    name: str
    desired: DesiredTopic
    actual: TopicState | None
    create: bool = False
    add_partitions: int | None = None  # new total
    set_configs: dict[str, str] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)  # differences apply cannot fix
    error: str | None = None

    @property
    def changes(self) -> list[str]:
        out: list[str] = []
        if self.create:
            out.append("create")
        if self.add_partitions is not None and self.actual is not None:
            out.append(f"partitions {self.actual.partitions} -> {self.add_partitions}")
        for key, value in self.set_configs.items():
            old = self.actual.configs.get(key) if self.actual else None
            out.append(f"{key} {old} -> {value}")
        return out

    @property
    def in_sync(self) -> bool:
        return not self.changes and not self.drift

    def as_json(self, applied: bool) -> dict[str, Any]:
        return {
            "topic": self.name,
            "status": self.status(applied),
            "partitions": {
                "actual": self.actual.partitions if self.actual else None,
                "desired": self.desired.partitions,
            },
            "replication": {
                "actual": self.actual.replication if self.actual else None,
                "desired": self.desired.replication,
            },
            "configs": {
                key: {"actual": self.actual.configs.get(key) if self.actual else None, "desired": value}
                for key, value in self.desired.configs.items()
            },
            "changes": self.changes,
            "drift": self.drift,
            "error": self.error,
        }

    def status(self, applied: bool) -> str:
        if self.error:
            return "error"
        if self.create:
            return "created" if applied else "missing"
        if self.changes:
            return "updated" if applied else "differs"
        if self.drift:
            return "drift"
        return "ok"


def plan(desired: Iterable[DesiredTopic], actual: dict[str, TopicState]) -> list[TopicPlan]:
    """Per desired topic: what to create or change, and the drift that needs a person."""
    out: list[TopicPlan] = []
    for want in desired:
        have = actual.get(want.name)
        item = TopicPlan(want.name, want, have)
        if have is None:
            item.create = True
        else:
            if have.partitions < want.partitions:
                item.add_partitions = want.partitions
            elif have.partitions > want.partitions:
                item.drift.append(
                    f"has {have.partitions} partitions, catalogue says {want.partitions} (Kafka cannot reduce them)"
                )
            if have.replication != want.replication:
                item.drift.append(f"replication {have.replication}, catalogue says {want.replication}")
            item.set_configs = {k: v for k, v in want.configs.items() if have.configs.get(k) != v}
        out.append(item)
    return out


def desired_topics(kafka: KafkaSettings, replication: int | None = None) -> list[DesiredTopic]:
    return [DesiredTopic.of(t, kafka, replication) for t in all_topics()]


def _kafka_message(exc: BaseException) -> str:
    """The text of a KafkaError inside a KafkaException, else the exception's own text."""
    inner = exc.args[0] if exc.args else None
    text = getattr(inner, "str", None)
    return str(text()) if callable(text) else str(exc)


class BrokerTopics:
    """Reads and changes topics on the broker named by the settings."""

    def __init__(self, kafka: KafkaSettings, timeout_s: float = 10.0) -> None:
        from base.kafka import new_admin

        # librdkafka's own connection errors go to a silent logger: the command reports one line.
        quiet = logging.getLogger("base.kafka.admin")
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        self._bootstrap = kafka.bootstrap_servers
        self._timeout = timeout_s
        self._admin = new_admin(kafka, logger=quiet)

    def _fail(self, what: str, exc: BaseException) -> ServiceError:
        return ServiceError(f"Kafka at {self._bootstrap}: {what}: {_kafka_message(exc)}")

    def state(self, names: Iterable[str]) -> dict[str, TopicState]:
        """The broker's partitions, replication and managed configs of those `names` that exist."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource, ResourceType

        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise self._fail("unreachable", exc) from exc
        present = [n for n in names if n in metadata.topics and metadata.topics[n].error is None]
        if not present:
            return {}
        futures = self._admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in present])
        states: dict[str, TopicState] = {}
        for resource, future in futures.items():
            try:
                entries = future.result(timeout=self._timeout)
            except KafkaException as exc:
                if _error_name(exc) == "UNKNOWN_TOPIC_OR_PART":
                    # In a cluster, metadata from one broker can name a topic another has not learnt yet:
                    # not there for this caller (a create tolerates it exists; a wait asks again).
                    continue
                raise self._fail(f"cannot describe {resource.name}", exc) from exc
            except Exception as exc:
                raise self._fail(f"cannot describe {resource.name}", exc) from exc
            topic = metadata.topics[resource.name]
            replicas = {len(p.replicas) for p in topic.partitions.values()}
            states[resource.name] = TopicState(
                resource.name,
                len(topic.partitions),
                min(replicas) if replicas else 0,
                {k: entries[k].value for k in MANAGED_CONFIGS if k in entries},
            )
        return states

    def apply(self, plans: list[TopicPlan]) -> None:
        """Create, grow and reconfigure; each topic's failure is recorded on its plan, not raised."""
        from confluent_kafka.admin import (
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            NewPartitions,
            NewTopic,
            ResourceType,
        )

        by_name = {p.name: p for p in plans}
        new = [
            NewTopic(p.name, p.desired.partitions, p.desired.replication, config=dict(p.desired.configs))
            for p in plans
            if p.create
        ]
        if new:
            for name, future in self._admin.create_topics(new, request_timeout=self._timeout).items():
                self._settle(by_name[name], future, tolerate="TOPIC_ALREADY_EXISTS")
        grow = [NewPartitions(p.name, p.add_partitions) for p in plans if p.add_partitions is not None]
        if grow:
            for name, future in self._admin.create_partitions(grow, request_timeout=self._timeout).items():
                self._settle(by_name[name], future)
        alter = [
            ConfigResource(
                ResourceType.TOPIC,
                p.name,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in p.set_configs.items()
                ],
            )
            for p in plans
            if p.set_configs and not p.create
        ]
        if alter:
            for resource, future in self._admin.incremental_alter_configs(alter).items():
                self._settle(by_name[resource.name], future)

    def wait_until_visible(self, plans: list[TopicPlan], poll_s: float = 0.2) -> bool:
        """Wait (up to the timeout) until the broker reports the applied changes, so the next reader
        sees them (metadata and configs propagate asynchronously). True when everything is visible."""
        pending = [p.desired for p in plans if p.changes and not p.error]
        deadline = time.monotonic() + self._timeout
        while pending:
            state = self.state(d.name for d in pending)
            pending = [item.desired for item in plan(pending, state) if item.changes]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(poll_s)
        return not pending

    def _settle(self, item: TopicPlan, future: Any, tolerate: str | None = None) -> None:
        try:
            future.result(timeout=self._timeout)
        except Exception as exc:
            code = _error_name(exc)
            if tolerate is not None and code == tolerate:
                return
            message = _kafka_message(exc)
            item.error = f"{item.error}; {message}" if item.error else message


def _error_name(exc: BaseException) -> str | None:
    """The Kafka error code's name of a client exception (`UNKNOWN_TOPIC_OR_PART`), None when it has none."""
    return getattr(exc.args[0], "name", lambda: None)() if exc.args else None
