"""The topic catalogue and the pure planning behind `gpuledger topics apply`."""

from __future__ import annotations

from base.settings import KafkaSettings
from schemas.topics import CATALOGUE, DEVICE_SAMPLES, INVENTORY, all_topics, topic_named
from streams.topics_admin import TopicState, desired_topics, plan


def test_every_topic_has_a_dead_letter_topic_carrying_dead_letters():
    topics = all_topics()
    assert len(topics) == 2 * len(CATALOGUE)
    names = {t.name for t in topics}
    for topic in CATALOGUE:
        assert topic.name.split(".v")[-1][0].isdigit()  # major version in the name
        dlq = topic.dead_letter_topic()
        assert dlq.name == f"{topic.name}.dlq" in names
        assert dlq.subject == "deadletter" and dlq.cleanup_policy == "delete"


def test_topic_named_strips_the_prefix():
    assert topic_named("p.inventory.devices.v1", "p.") == INVENTORY
    assert topic_named("inventory.devices.v1", "p.") is None
    assert topic_named("p.nothing", "p.") is None


def test_desired_topics_use_the_prefix_and_optional_replication():
    wanted = {d.name: d for d in desired_topics(KafkaSettings(topic_prefix="x."), replication=3)}
    samples = wanted["x.telemetry.device-samples.v1"]
    assert samples.partitions == DEVICE_SAMPLES.partitions and samples.replication == 3
    assert samples.configs == {
        "cleanup.policy": "delete",
        "retention.ms": str(DEVICE_SAMPLES.retention_ms),
        "min.insync.replicas": "2",  # 2 of 3: one replica may be down and acks=all writes still land
    }
    assert wanted["x.inventory.devices.v1"].configs["cleanup.policy"] == "compact"


def test_replication_and_min_insync_come_from_the_settings():
    one = {d.replication for d in desired_topics(KafkaSettings())}
    assert one == {1}
    assert {d.configs["min.insync.replicas"] for d in desired_topics(KafkaSettings())} == {"1"}
    three = desired_topics(KafkaSettings(replication_factor=3))
    assert {(d.replication, d.configs["min.insync.replicas"]) for d in three} == {(3, "2")}
    five = desired_topics(KafkaSettings(replication_factor=5, min_insync_replicas=4))
    assert {(d.replication, d.configs["min.insync.replicas"]) for d in five} == {(5, "4")}
    # A min ISR above the replicas would refuse every acks=all write: capped at the replication.
    capped = desired_topics(KafkaSettings(min_insync_replicas=3), replication=2)
    assert {(d.replication, d.configs["min.insync.replicas"]) for d in capped} == {(2, "2")}


def test_plan():
    kafka = KafkaSettings()
    wanted = [d for d in desired_topics(kafka) if d.name in ("telemetry.device-samples.v1", "inventory.devices.v1")]
    samples, inventory = wanted[0], wanted[1]
    assert [p.create for p in plan(wanted, {})] == [True, True]

    in_sync = {d.name: TopicState(d.name, d.partitions, d.replication, dict(d.configs)) for d in wanted}
    assert all(p.in_sync and p.status(applied=True) == "ok" for p in plan(wanted, in_sync))

    actual = dict(in_sync)
    actual[samples.name] = TopicState(
        samples.name, 2, 1, {"cleanup.policy": "delete", "retention.ms": "5", "min.insync.replicas": "1"}
    )
    actual[inventory.name] = TopicState(inventory.name, 8, 3, dict(inventory.configs))
    grow, shrink = plan(wanted, actual)
    assert grow.add_partitions == 4 and grow.set_configs == {"retention.ms": str(DEVICE_SAMPLES.retention_ms)}
    assert grow.changes == ["partitions 2 -> 4", f"retention.ms 5 -> {DEVICE_SAMPLES.retention_ms}"]
    assert grow.status(applied=False) == "differs" and grow.status(applied=True) == "updated"
    assert shrink.changes == [] and len(shrink.drift) == 2 and shrink.status(applied=True) == "drift"
    assert shrink.as_json(applied=True)["partitions"] == {"actual": 8, "desired": 4}
