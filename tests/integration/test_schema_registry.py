"""The local stack's schema registry (Apicurio Registry, real process) as Confluent clients see it:
`gpuledger schemas register`, BACKWARD compatibility, ids across a restart, confluent-kafka's own
AvroSerializer/AvroDeserializer through the real broker, and `status`."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from typer.testing import CliRunner

from base.settings import KafkaSettings, RegistrySettings, Settings
from schemas import DEFAULT_STORE, load_schema
from schemas.cli import register
from schemas.codec import AvroCodec, registry_client
from schemas.registry_sync import RegistryApi, plan, register_all, schema_text
from schemas.topics import ALERTS, Topic, all_topics
from stack import jvm_archive, registry
from stack.broker import find_java
from stack.registry import LocalRegistry
from stack.supervisor import Supervisor

pytestmark = pytest.mark.integration

HEADERS = {"Content-Type": "application/vnd.schemaregistry.v1+json"}
ALERT: dict[str, Any] = {
    "alert_id": "idle-1", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "sim", "job_id": "88",
    "node": "n1", "device_uuids": ["GPU-aa11"], "user": "bob", "team": "nlp", "project": "p-nlp",
    "idle_minutes": 40, "cost_so_far": 2.17, "action": "REQUEUE", "action_at_ms": 1_795_000_900_000,
    "dry_run": True, "message": "Job 88 has held 1 GPU idle for 40 minutes.", "appeal_route": "reply here",
    "emitted_ts_ms": None,
}  # fmt: skip


def _register_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, prefix: str) -> list[dict[str, Any]]:
    app = typer.Typer()
    register(app, typer.Typer())
    monkeypatch.setenv("GPULEDGER_CONFIG", str(tmp_path / "absent.toml"))
    env = {"GPULEDGER_KAFKA__TOPIC_PREFIX": prefix, "GPULEDGER_BROKER__ENABLED": "false"}
    args = ["schemas", "register", "--url", url, "--json", "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, (result.output, result.exception)
    rows: list[dict[str, Any]] = json.loads(result.output)
    return rows


def _millis(value: Any) -> Any:
    """AvroDeserializer gives timestamp-millis fields as datetimes; the codec keeps epoch milliseconds."""
    return round(value.timestamp() * 1000) if isinstance(value, datetime) else value


def test_register_publishes_every_subjects_history_in_order_backward_idempotent(
    tmp_path, monkeypatch, registry_url, registry_prefix
):
    first = _register_cli(tmp_path, monkeypatch, registry_url, registry_prefix)
    assert all(row["created"] and row["compatibility"] == "BACKWARD" for row in first)
    expected = {f"{registry_prefix}{t.name}-value" for t in all_topics()}
    assert {row["subject"] for row in first} == expected
    with RegistryApi(registry_url) as api:
        assert expected <= set(api.subjects())
        assert {api.compatibility(s) for s in expected} == {"BACKWARD"}
        # Every version, in history order, exactly as schemas/ holds it.
        for topic in all_topics():
            subject = f"{registry_prefix}{topic.name}-value"
            history = DEFAULT_STORE.versions(topic.subject)
            assert api.versions(subject) == list(range(1, len(history) + 1)), subject
        jobs = f"{registry_prefix}sched.job-events.v1-value"
        for number, schema in enumerate(DEFAULT_STORE.versions("sched.job-events"), start=1):
            got = httpx.get(f"{registry_url}/subjects/{jobs}/versions/{number}").json()
            assert json.loads(got["schema"]) == schema
        # BACKWARD: a new required field (no default) cannot read old records: refused with 409.
        breaking = load_schema("sched.job-events")
        breaking["fields"].append({"name": "gpu_budget", "type": "int", "doc": "no default"})
        resp = httpx.post(
            f"{registry_url}/subjects/{jobs}/versions", headers=HEADERS, json={"schema": json.dumps(breaking)}
        )
        assert resp.status_code == 409, resp.text
        assert api.versions(jobs) == list(range(1, len(DEFAULT_STORE.versions("sched.job-events")) + 1))
    # Again: nothing new, the same ids.
    again = _register_cli(tmp_path, monkeypatch, registry_url, registry_prefix)
    assert not any(row["created"] for row in again)
    ids = {(r["subject"], r["version"]): r["schema_id"] for r in first}
    assert {(r["subject"], r["version"]): r["schema_id"] for r in again} == ids
    # One schema, one id: every DLQ subject holds the same dead-letter ids, in the same order.
    dlq_ids = {tuple(i for (s, _), i in sorted(ids.items()) if s == f"{registry_prefix}{t.name}-value")
               for t in all_topics() if t.name.endswith(".dlq")}  # fmt: skip
    assert len(dlq_ids) == 1


def test_schema_ids_survive_a_registry_restart(local_registry: LocalRegistry, registry_url, registry_prefix):
    plans = plan(DEFAULT_STORE, all_topics(), registry_prefix, KafkaSettings().registry_subject)
    with RegistryApi(registry_url) as api:
        before = register_all(api, plans)
    schemas = {r.schema_id: httpx.get(f"{registry_url}/schemas/ids/{r.schema_id}").json() for r in before}
    local_registry.stop()
    started = time.monotonic()
    local_registry.start()
    assert time.monotonic() - started < 90
    # It starts on the class archive its first start made (stack.jvm_archive): mapped in its address space.
    app = registry.app_cache_dir(local_registry.cfg.version) / "app"
    archive = jvm_archive.archive_path(
        app.parent, find_java(), str(registry.runner_jar(app, local_registry.cfg.version))
    )
    assert str(archive) in Path(f"/proc/{local_registry.pid}/maps").read_text()
    with RegistryApi(registry_url) as api:
        after = register_all(api, plans)
    assert not any(r.created for r in after)
    assert [(r.subject, r.version, r.schema_id) for r in after] == [(r.subject, r.version, r.schema_id) for r in before]
    for schema_id, body in schemas.items():
        assert httpx.get(f"{registry_url}/schemas/ids/{schema_id}").json() == body


def _consume_one(kafka_config: dict[str, str], topic: str) -> bytes:
    consumer = Consumer({**kafka_config, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                value = msg.value()
                assert value is not None
                return bytes(value)
        raise AssertionError(f"nothing on {topic} within 30 s")
    finally:
        consumer.close()


def test_confluent_serializer_and_deserializer_round_trip_through_the_broker(registry_url, kafka_config, new_topic):
    # Confluent's serializer, its defaults but no auto-registration: it finds the subject `gpuledger
    # schemas register` made (<topic>-value) and writes its id; our codec reads it, and the reverse.
    topic = new_topic("registry")
    with RegistryApi(registry_url) as api:
        done = register_all(
            api, plan(DEFAULT_STORE, [Topic(topic, ALERTS.subject, "k")], "", KafkaSettings().registry_subject)
        )
    [registered] = [r for r in done if r.version == DEFAULT_STORE.latest_version(ALERTS.subject)]
    client = SchemaRegistryClient({"url": registry_url})
    serializer = AvroSerializer(client, schema_text(load_schema(ALERTS.subject)), conf={"auto.register.schemas": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    value = serializer(ALERT, ctx)
    assert value is not None and value[:1] == b"\x00" and int.from_bytes(value[1:5], "big") == registered.schema_id
    codec = AvroCodec(registry_client(registry_url))
    producer = Producer(kafka_config)
    producer.produce(topic, key=b"sim/88", value=value)
    producer.flush(30)
    # the fields ALERT does not name (alerts v2's policy-drift fields) read back as the schema's defaults
    drift_defaults = {"drift_lines": [], "engine": None}
    assert codec.decode(_consume_one(kafka_config, topic), ALERTS.subject).record == {**ALERT, **drift_defaults}

    ours = new_topic("registry-ours")
    producer.produce(ours, key=b"sim/89", value=codec.encode(ALERTS.subject, {**ALERT, "alert_id": "idle-2"}))
    producer.flush(30)
    decoded = AvroDeserializer(client)(_consume_one(kafka_config, ours), SerializationContext(ours, MessageField.VALUE))
    assert decoded is not None
    assert {k: _millis(v) for k, v in decoded.items()} == {**ALERT, **drift_defaults, "alert_id": "idle-2"}


def test_status_shows_the_registry_and_the_subjects_it_lacks(
    tmp_path, kafka_bootstrap, local_registry: LocalRegistry, registry_url, registry_prefix
):
    settings = Settings(
        state_dir=tmp_path,
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=registry_prefix),
        registry=RegistrySettings(port=local_registry.cfg.port),
    )
    assert settings.registry_local and settings.registry_url == registry_url
    st = Supervisor(settings).status()
    comp = next(c for c in st.components if c.name == "registry")
    assert comp.state == "ready" and "subject(s)" in comp.detail, comp  # served, not by this state dir
    assert st.registry_reachable and st.registry_subjects is not None
    ours = {f"{registry_prefix}{t.name}-value" for t in all_topics()}
    assert set(st.missing_subjects) == ours and not st.healthy

    with RegistryApi(registry_url) as api:
        register_all(api, plan(DEFAULT_STORE, all_topics(), registry_prefix, settings.kafka.registry_subject))
    data = Supervisor(settings).status().to_json()
    assert data["registry_reachable"] is True and data["missing_subjects"] == []
    assert data["registry_subjects"] >= len(ours) and data["registry_url"] == registry_url

    # A registry that does not answer is reported, and the stack is not healthy.
    gone = Settings(
        state_dir=tmp_path,
        kafka=KafkaSettings(
            bootstrap_servers=kafka_bootstrap, schema_registry_url="http://127.0.0.1:9/apis/ccompat/v7"
        ),
    )
    down = Supervisor(gone).status()
    assert down.registry_reachable is False and "ConnectError" in down.registry_detail and not down.healthy
