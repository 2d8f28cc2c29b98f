"""docker-compose.yml checked structurally (no Docker engine here): services, pinned images,
settings by environment that the settings object really has, and ports that agree."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from gpuledger.components import COMPONENTS
from gpuledger.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
PROJECT = [name for name, svc in SERVICES.items() if "build" in svc]


def _resolve(value: str) -> str:
    """`${VAR:-default}` as compose substitutes it when VAR is unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


def _env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: _resolve(v) for k, v in env.items()}


def _field_exists(name: str) -> bool:
    parts = name.removeprefix("GPULEDGER_").lower().split("__")
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        if i < len(parts) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return False
            model = annotation
    return True


def test_services_present():
    assert {"kafka", "clickhouse", "topics", "processors", "sinks", "simulator"} <= set(SERVICES)


def test_official_images_pinned():
    assert SERVICES["kafka"]["image"].startswith("apache/kafka:")
    assert SERVICES["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    for name, svc in SERVICES.items():
        image = svc["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image else ""
        assert re.fullmatch(r"\d+(\.\d+)+", tag), f"{name}: image {image!r} is not pinned to a version"


def test_kafka_image_matches_local_broker_version():
    assert SERVICES["kafka"]["image"] == f"apache/kafka:{Settings().broker.kafka_version}"


def test_project_services_built_from_deploy_dockerfile():
    assert PROJECT
    for name in PROJECT:
        build = SERVICES[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
        assert build["dockerfile"].startswith("deploy/")


def test_every_project_env_name_is_a_settings_field():
    for name in PROJECT:
        env = _env(SERVICES[name])
        assert env, name
        for key in env:
            assert key.startswith("GPULEDGER_"), f"{name}: {key}"
            assert _field_exists(key), f"{name}: {key} is not a field of gpuledger.settings.Settings"


def test_project_env_builds_settings_that_point_at_the_compose_services(monkeypatch):
    for name in PROJECT:
        for key in list(os.environ):
            if key.startswith("GPULEDGER_"):
                monkeypatch.delenv(key)
        for key, value in _env(SERVICES[name]).items():
            monkeypatch.setenv(key, value)
        s = Settings()
        assert s.broker.enabled is False and s.clickhouse.embedded is False
        host, port = s.kafka.bootstrap_servers.split(":")
        assert host in SERVICES, f"{name}: bootstrap names no service"
        assert f"PLAINTEXT://{host}:{port}" in SERVICES[host]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        assert s.clickhouse.host in SERVICES and s.clickhouse.port == 8123


def test_ports_consistent_and_loopback_only():
    kafka_env = SERVICES["kafka"]["environment"]
    listeners = dict(item.split("://") for item in kafka_env["KAFKA_LISTENERS"].split(","))
    advertised = dict(item.split("://") for item in kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    for name, addr in advertised.items():
        assert addr.rsplit(":", 1)[1] == listeners[name].rsplit(":", 1)[1], name
    assert kafka_env["KAFKA_CONTROLLER_QUORUM_VOTERS"].endswith(":" + listeners["CONTROLLER"].rsplit(":", 1)[1])
    published = {}
    for name, svc in SERVICES.items():
        for mapping in svc.get("ports", []):
            bind, host_port, container_port = mapping.split(":")
            assert bind == "127.0.0.1", f"{name} publishes {mapping} beyond loopback"
            published[name] = (int(host_port), int(container_port))
    # Host tools reach the broker the way the local stack's default settings do.
    assert advertised["HOST"] == f"127.0.0.1:{published['kafka'][0]}"
    assert published["kafka"][0] == BrokerSettings().port
    assert KafkaSettings().bootstrap_servers == f"127.0.0.1:{published['kafka'][0]}"
    assert published["clickhouse"] == (ClickHouseSettings().port, 8123)


@pytest.mark.parametrize("name", ["kafka", "clickhouse"])
def test_healthchecks_and_volumes(name):
    svc = SERVICES[name]
    assert svc["healthcheck"]["test"]
    volume = svc["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


def test_dependencies_exist_and_wait_for_health():
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_completed_successfully")


def test_project_services_run_the_supervisors_components():
    """The same processes `gpuledger up` runs locally (broker/clickhouse come from images)."""
    local = {c.name: c for c in COMPONENTS}
    for name in PROJECT:
        assert name in local, f"{name} is not a component of the local stack"
        assert local[name].command == tuple(SERVICES[name]["command"])
