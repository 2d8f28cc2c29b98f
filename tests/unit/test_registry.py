"""The schema registry's launcher, settings and subject plan, without starting anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from base.errors import ConfigError, ContractError
from base.settings import BrokerSettings, KafkaSettings, RegistrySettings, Settings
from schemas import DEFAULT_STORE, SchemaStore
from schemas.registry_sync import plan, schema_text
from schemas.topics import ALERTS, ALLOCATIONS, JOB_EVENTS, Topic, all_topics
from stack.components import COMPONENTS
from stack.registry import RegistryConfig, ensure_app, registry_argv


def test_local_registry_only_with_the_local_broker_and_no_configured_registry(tmp_path):
    local = Settings(state_dir=tmp_path)
    assert local.registry_local and local.kafka.schema_registry_url is None
    assert local.registry_url == "http://127.0.0.1:19081/apis/ccompat/v7"
    assert local.masked()["kafka"]["schema_registry_subject"] == "{topic}-value"  # `gpuledger settings` shows it

    external_cluster = Settings(state_dir=tmp_path, broker=BrokerSettings(enabled=False))
    assert not external_cluster.registry_local and external_cluster.registry_url is None

    configured = Settings(state_dir=tmp_path, kafka=KafkaSettings(schema_registry_url="http://sr:8081"))
    assert not configured.registry_local and configured.registry_url == "http://sr:8081"

    off = Settings(state_dir=tmp_path, registry=RegistrySettings(enabled=False))
    assert not off.registry_local and off.registry_url is None


def test_every_component_up_starts_gets_the_local_registry_url(tmp_path):
    local = Settings(state_dir=tmp_path)
    for comp in COMPONENTS:
        assert comp.env(local)["GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL"] == local.registry.url, comp.name
    # Built from that environment, a component's codec writes Confluent's framing to the local registry.
    child = Settings(state_dir=tmp_path, kafka=KafkaSettings(schema_registry_url=local.registry.url))
    assert child.registry_url == local.registry.url and not child.registry_local
    configured = Settings(state_dir=tmp_path, kafka=KafkaSettings(schema_registry_url="http://sr:8081"))
    assert all("GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL" not in c.env(configured) for c in COMPONENTS)


def test_registry_env_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("GPULEDGER_REGISTRY__PORT", "28081")
    monkeypatch.setenv("GPULEDGER_KAFKA__SCHEMA_REGISTRY_SUBJECT", "{topic}-{record}")
    s = Settings(state_dir=tmp_path)
    assert s.registry_url == "http://127.0.0.1:28081/apis/ccompat/v7"
    assert s.kafka.registry_subject("alerts.v1", "io.x.Alert") == "alerts.v1-io.x.Alert"


@pytest.mark.parametrize("template", ["{name}-value", "value", "{topic", "{0}"])
def test_subject_templates_name_only_known_placeholders(tmp_path, template):
    with pytest.raises(ConfigError, match="schema_registry_subject"):
        Settings(state_dir=tmp_path, kafka={"schema_registry_subject": template})


def test_components_registry_after_broker_register_after_topics(tmp_path):
    names = [c.name for c in COMPONENTS]
    assert names.index("broker") < names.index("registry") < names.index("topics") < names.index("schemas")
    assert names.index("schemas") < names.index("processors")
    by = {c.name: c for c in COMPONENTS}
    local = Settings(state_dir=tmp_path)
    external = Settings(state_dir=tmp_path, kafka=KafkaSettings(schema_registry_url="http://sr:8081"))
    for name in ("registry", "schemas"):
        assert by[name].enabled(local) and not by[name].enabled(external)
    assert by["schemas"].oneshot and by["schemas"].command == ("schemas", "register")


def test_argv_binds_loopback_keeps_ids_in_an_h2_file_and_opens_no_management_port(tmp_path):
    cfg = RegistryConfig(data_dir=tmp_path / "registry", port=28081, heap="192m")
    argv = registry_argv(cfg, tmp_path / "app")
    props = dict(a[2:].split("=", 1) for a in argv if a.startswith("-D"))
    assert props["quarkus.http.host"] == "127.0.0.1" and props["quarkus.http.port"] == "28081"
    assert props["quarkus.management.enabled"] == "false" and props["quarkus.management.host"] == "127.0.0.1"
    assert props["apicurio.storage.kind"] == "sql" and props["apicurio.storage.sql.kind"] == "h2"
    assert props["apicurio.datasource.url"] == f"jdbc:h2:file:{(tmp_path / 'registry').resolve()}/db/registry"
    assert "-Xmx192m" in argv
    assert argv[-2:] == ["-jar", str(tmp_path / "app" / "apicurio-registry-app-3.0.9-runner.jar")]
    assert cfg.url == "http://127.0.0.1:28081/apis/ccompat/v7"


def test_from_settings_keeps_data_under_the_state_dir(tmp_path):
    cfg = RegistryConfig.from_settings(Settings(state_dir=tmp_path, registry=RegistrySettings(port=28082)))
    assert cfg.data_dir == tmp_path / "registry" and cfg.port == 28082


def test_refuses_2x_and_paths_h2_would_misread(tmp_path):
    with pytest.raises(ConfigError, match=r"3\.x"):
        ensure_app("2.6.13.Final", tmp_path)
    with pytest.raises(ConfigError, match="';'"):
        RegistryConfig(data_dir=tmp_path / "a;b").properties()


def test_plan_topic_name_strategy_every_topic_and_dlq_with_history_in_order():
    plans = plan(DEFAULT_STORE, all_topics(), "p.", lambda topic, record: f"{topic}-value")
    assert [p.subject for p in plans] == [f"p.{t.name}-value" for t in all_topics()]
    jobs = next(p for p in plans if p.subject == "p.sched.job-events.v1-value")
    assert jobs.topics == ("p.sched.job-events.v1",)
    history = DEFAULT_STORE.versions("sched.job-events")
    assert len(history) >= 3 and jobs.versions == tuple(schema_text(v) for v in history)
    assert json.loads(jobs.versions[-1]) == DEFAULT_STORE.load("sched.job-events")
    dlq = next(p for p in plans if p.subject == "p.alerts.v1.dlq-value")
    assert dlq.contract == "deadletter" and len(dlq.versions) == DEFAULT_STORE.latest_version("deadletter")


def test_plan_record_strategy_shares_subjects_between_topics_of_one_contract():
    plans = plan(DEFAULT_STORE, [JOB_EVENTS, ALLOCATIONS, ALERTS], "", lambda topic, record: record)
    assert [(p.subject, p.topics) for p in plans] == [
        ("io.gpuledger.v1.JobEvent", ("sched.job-events.v1", "sched.allocations.v1")),
        ("io.gpuledger.v1.Alert", ("alerts.v1",)),
    ]


def test_plan_refuses_one_subject_for_two_contracts(tmp_path: Path):
    store = SchemaStore(tmp_path)
    for subject, name in (("a", "A"), ("b", "B")):
        (tmp_path / f"{subject}.avsc").write_text(json.dumps({"type": "record", "name": name, "fields": []}))
    with pytest.raises(ContractError, match="both 'a'"):
        plan(store, [Topic("x.v1", "a", "k"), Topic("y.v1", "b", "k")], "", lambda topic, record: "same")
