"""docker-compose.yml checked structurally (no Docker engine here): it runs exactly `gpuledger up`'s
components for `broker.nodes = 3` (the same names, the same arguments), the Kafka nodes configured as
the launcher configures them, the registry as the registry launcher runs it, ClickHouse's analyst user
on the migrations' role; pinned images, settings by environment that the settings object really has,
and ports that agree with the local stack's."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from manifests import COMPOSE, SERVICES, compose_env
from pydantic import BaseModel

from base.settings import BrokerSettings, ClickHouseSettings, Settings
from stack import broker, registry
from stack.components import COMPONENTS, Component

ROOT = Path(__file__).resolve().parents[2]
PROJECT = [name for name, svc in SERVICES.items() if "build" in svc]
# Services of a profile run only with `--profile`: the components `up` runs only when something is configured.
PROFILED = {name: svc["profiles"] for name, svc in SERVICES.items() if svc.get("profiles")}
DEFAULT = set(SERVICES) - set(PROFILED)
STATE_DIR = Path("/var/lib/gpuledger")  # the image's GPULEDGER_STATE_DIR (deploy/Dockerfile)
KAFKA_NODES = ("broker", "broker-2", "broker-3")
# Launcher properties that name an address or a path: the containers have their own (checked apart).
KAFKA_ADDRESSING = {"listeners", "advertised.listeners", "listener.security.protocol.map", "controller.quorum.voters",
                    "log.dirs"}  # fmt: skip


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


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for key in list(os.environ):
        if key.startswith("GPULEDGER_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # no gpuledger.toml of the checkout
    return monkeypatch


@pytest.fixture
def local(clean_env: pytest.MonkeyPatch) -> Settings:
    """The local stack compose stands for: the simulator, no chat route, the three-node broker."""
    return Settings(state_dir=STATE_DIR, cluster="sim", broker=BrokerSettings(nodes=3))


def _up(settings: Settings) -> dict[str, Component]:
    return {c.name: c for c in COMPONENTS if c.enabled(settings)}


def _kafka_env_name(prop: str) -> str:
    """The apache/kafka image's mapping: `a.b` is KAFKA_A_B, `a_b` is KAFKA_A__B, `a-b` is KAFKA_A___B."""
    return "KAFKA_" + prop.replace("_", "__").replace("-", "___").replace(".", "_").upper()


def _configured(clean_env: pytest.MonkeyPatch, name: str) -> Settings:
    """The local stack with what a profiled service configures (its settings beyond the shared ones) set as
    `up` would read them: from the environment."""
    shared = compose_env({"environment": COMPOSE["x-gpuledger"]["environment"]})
    for key, value in compose_env(SERVICES[name]).items():
        if shared.get(key) != value:
            clean_env.setenv(key, value)
    return Settings(state_dir=STATE_DIR, cluster="sim", broker=BrokerSettings(nodes=3))


def test_compose_runs_exactly_the_components_of_up(local: Settings) -> None:
    assert set(_up(local)) == DEFAULT, "compose and `gpuledger up` (broker.nodes = 3) run different sets"


def _profile_services(profile: str) -> set[str]:
    """What `docker compose --profile <profile> up` starts beyond the default services."""
    return {name for name, profiles in PROFILED.items() if profile in profiles}


def test_each_profile_adds_exactly_the_components_its_configuration_enables(clean_env: pytest.MonkeyPatch) -> None:
    """A profile is named as its service, and starts exactly what `up` adds with that service's configuration:
    the reservations profile configures a policy, so the appeals service (which needs only the policy) too."""
    assert PROFILED == {"reservations": ["reservations"],
                        "appeals": ["appeals", "reservations", "policy-watch", "escalations"],
                        "policy-watch": ["policy-watch"], "escalations": ["escalations"]}  # fmt: skip
    local = Settings(state_dir=STATE_DIR, cluster="sim", broker=BrokerSettings(nodes=3))
    expected = {"reservations": {"reservations", "appeals"}, "appeals": {"appeals"},
                "policy-watch": {"policy-watch", "appeals"}, "escalations": {"escalations", "appeals"}}  # fmt: skip
    for profile, added in expected.items():
        with pytest.MonkeyPatch.context() as env:
            for key in [k for k in os.environ if k.startswith("GPULEDGER_")]:
                env.delenv(key)
            settings = _configured(env, profile)
        assert settings.policy_path is not None, profile
        assert set(_up(settings)) - set(_up(local)) == added == _profile_services(profile), profile
        assert set(_up(local)) <= set(_up(settings))
    reserving = _configured(clean_env, "reservations")
    assert reserving.sinks.reservations.engines == ["kueue"]
    assert _configured(clean_env, "policy-watch").policy_watch.engines == ["kueue"]
    assert _configured(clean_env, "escalations").sinks.escalations.engines == ["kueue"]


def test_project_services_run_the_components_with_their_arguments(
    local: Settings, clean_env: pytest.MonkeyPatch
) -> None:
    up = _up(local)
    for name in PROJECT:
        comp = up[name] if name in up else _up(_configured(clean_env, name))[name]
        assert comp.command is not None, name
        argv = comp.argv(local, lambda _: None)
        assert argv[:3] == [argv[0], "-c", "from gpuledger.cli import main; main()"], name
        assert SERVICES[name]["command"] == argv[3:], name
    # What the image runs and what `up` runs locally are the non-project services.
    assert set(SERVICES) - set(PROJECT) == {*KAFKA_NODES, "registry", "clickhouse"}
    assert SERVICES["reservations"]["command"] == ["reserve", "run"]
    assert SERVICES["escalations"]["command"] == ["escalate", "run"]
    # The arguments the issue found missing are there.
    assert "--event-time" in SERVICES["processors"]["command"] and "--event-time" in SERVICES["agents"]["command"]
    assert SERVICES["simulator"]["command"][:3] == ["simulate", "run", "--backfill"]


def test_oneshots_do_not_restart(local: Settings) -> None:
    for name, comp in _up(local).items():
        if name in PROJECT:
            assert (SERVICES[name].get("restart") == "no") == comp.oneshot, name


@pytest.mark.parametrize("node", [1, 2, 3])
def test_kafka_nodes_are_configured_as_the_launcher_configures_them(local: Settings, node: int) -> None:
    props = broker.BrokerConfig.from_settings(local, node).properties()
    env = compose_env(SERVICES[KAFKA_NODES[node - 1]])
    for key, value in props.items():
        if key not in KAFKA_ADDRESSING:
            assert env.get(_kafka_env_name(key)) == value, key
    known = {_kafka_env_name(k) for k in props}
    assert {k for k in env if k.startswith("KAFKA_")} - known == {"KAFKA_HEAP_OPTS"}
    # The same quorum: node ids 1..3 at their services' controller listener.
    listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
    voters = [v.split("@") for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")]
    launcher_voters = [v.split("@")[0] for v in props["controller.quorum.voters"].split(",")]
    assert [i for i, _ in voters] == launcher_voters == ["1", "2", "3"]
    assert voters[node - 1][1] == f"{KAFKA_NODES[node - 1]}:{listeners['CONTROLLER'].rsplit(':', 1)[1]}"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_kafka_nodes_share_one_cluster_id_and_distinct_volumes() -> None:
    ids = {compose_env(SERVICES[n])["CLUSTER_ID"] for n in KAFKA_NODES}
    assert len(ids) == 1
    (cid,) = ids
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", cid) and not cid.startswith("-")  # a base64url UUID
    volumes = [SERVICES[n]["volumes"][0].split(":")[0] for n in KAFKA_NODES]
    assert len(set(volumes)) == 3 and set(volumes) <= set(COMPOSE["volumes"])


def test_official_images_pinned(local: Settings) -> None:
    for name in KAFKA_NODES:
        assert SERVICES[name]["image"] == f"apache/kafka:{local.broker.kafka_version}"
    assert SERVICES["registry"]["image"] == f"apicurio/apicurio-registry:{local.registry.version}"
    assert SERVICES["clickhouse"]["image"].startswith("clickhouse/clickhouse-server:")
    for name, svc in SERVICES.items():
        image = svc["image"]
        tag = image.rsplit(":", 1)[1] if ":" in image else ""
        assert re.fullmatch(r"\d+(\.\d+)+", tag), f"{name}: image {image!r} is not pinned to a version"


def test_registry_runs_as_the_registry_launcher_runs_it(tmp_path: Path) -> None:
    """Every Apicurio property of the local registry, in Quarkus's environment spelling; paths on the
    registry's volume (H2 in a file: schema ids survive a restart)."""
    props = registry.RegistryConfig.from_settings(Settings(state_dir=tmp_path)).properties()
    svc = SERVICES["registry"]
    env = compose_env(svc)
    volume_path = svc["volumes"][0].split(":")[1]
    for key, value in props.items():
        if not key.startswith("apicurio."):
            continue
        name = re.sub(r"[^A-Za-z0-9]", "_", key).upper()
        if key == "apicurio.datasource.url":
            assert env[name].startswith(f"jdbc:h2:file:{volume_path}/"), env[name]
        elif key == "apicurio.storage.snapshot.location":
            assert env[name].startswith(volume_path + "/")
        else:
            assert env[name] == value, key


def test_every_project_env_name_is_a_settings_field() -> None:
    for name in PROJECT:
        env = compose_env(SERVICES[name])
        assert env, name
        for key in env:
            assert key.startswith("GPULEDGER_"), f"{name}: {key}"
            assert _field_exists(key), f"{name}: {key} is not a field of base.settings.Settings"


def test_project_env_builds_settings_that_point_at_the_compose_services(clean_env: pytest.MonkeyPatch) -> None:
    for name in PROJECT:
        for key in list(os.environ):
            if key.startswith("GPULEDGER_"):
                clean_env.delenv(key)
        for key, value in compose_env(SERVICES[name]).items():
            clean_env.setenv(key, value)
        s = Settings()
        assert s.broker.enabled is False and s.clickhouse.embedded is False
        hosts = [h.split(":") for h in s.kafka.bootstrap_servers.split(",")]
        assert [h for h, _ in hosts] == list(KAFKA_NODES), name  # every node: a client starts with one down
        for host, port in hosts:
            assert f"PLAINTEXT://{host}:{port}" in compose_env(SERVICES[host])["KAFKA_ADVERTISED_LISTENERS"]
        assert s.kafka.topic_replication == 3 and s.kafka.topic_min_insync() == 2
        assert s.registry_url == "http://registry:8080/apis/ccompat/v7"
        assert s.clickhouse.host in SERVICES and s.clickhouse.port == 8123
        assert s.clickhouse.analyst_password.get_secret_value(), name  # reports log in as the analyst


def test_ports_consistent_and_loopback_only(local: Settings) -> None:
    published: dict[str, tuple[int, int]] = {}
    for name, svc in SERVICES.items():
        for mapping in svc.get("ports", []):
            bind, host_port, container_port = mapping.split(":")
            assert bind == "127.0.0.1", f"{name} publishes {mapping} beyond loopback"
            published[name] = (int(host_port), int(container_port))
    # Host tools reach the brokers at the local cluster's node ports, as the default settings do.
    for node, name in enumerate(KAFKA_NODES, 1):
        env = compose_env(SERVICES[name])
        listeners = dict(item.split("://") for item in env["KAFKA_LISTENERS"].split(","))
        advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
        for listener, addr in advertised.items():
            assert addr.rsplit(":", 1)[1] == listeners[listener].rsplit(":", 1)[1], (name, listener)
        port = local.broker.node_ports(node)[0]
        assert advertised["HOST"] == f"127.0.0.1:{port}" and published[name] == (port, port)
    host_bootstrap = ",".join(f"127.0.0.1:{published[n][0]}" for n in KAFKA_NODES)
    assert local.kafka.bootstrap_servers == host_bootstrap
    assert published["clickhouse"] == (ClickHouseSettings().port, 8123)
    assert published["registry"][0] == local.registry.port
    assert published["web"] == (local.web.port, local.web.port)
    assert compose_env(SERVICES["web"])["GPULEDGER_WEB__HOST"] == "0.0.0.0"  # reachable through the published port


def test_clickhouse_analyst_user_holds_the_migrations_role() -> None:
    """The analyst user the init script makes is the one the project services log in as, and the role it
    gets is the one migration 004 creates and grants SELECT on the ledger database to."""
    svc = SERVICES["clickhouse"]
    mount = next(v for v in svc["volumes"] if v.endswith(":/docker-entrypoint-initdb.d:ro"))
    initdb = ROOT / mount.split(":")[0]
    script = (initdb / "analyst.sh").read_text()
    assert os.access(initdb / "analyst.sh", os.X_OK)  # the image runs executable scripts, sources others
    assert subprocess.run(["bash", "-n", str(initdb / "analyst.sh")], check=False).returncode == 0
    migration = (ROOT / "sinks" / "migrations" / "004_analyst_role.sql").read_text()
    (role,) = re.findall(r"CREATE ROLE IF NOT EXISTS (\w+);", migration)
    assert re.search(rf"GRANT SELECT ON {{database}}\.\* TO {role};", migration)
    assert f"GRANT {role} TO ${{user}};" in script and f"SET DEFAULT ROLE {role} TO ${{user}};" in script
    assert "GRANT SELECT" not in script and "GRANT ALL" not in script  # its rights are the migrations'
    ch_env, project_env = compose_env(svc), compose_env(SERVICES["sinks"])
    assert ch_env["GPULEDGER_ANALYST_USER"] == project_env["GPULEDGER_CLICKHOUSE__ANALYST_USER"]
    assert ch_env["GPULEDGER_ANALYST_PASSWORD"] == project_env["GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD"]
    assert ch_env["CLICKHOUSE_USER"] == project_env["GPULEDGER_CLICKHOUSE__USER"]
    assert ch_env["CLICKHOUSE_DB"] == project_env["GPULEDGER_CLICKHOUSE__DATABASE"]
    assert ch_env["CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT"] == "1"  # the writer may create the role


@pytest.mark.parametrize("name", ["clickhouse", "registry", *KAFKA_NODES])
def test_healthchecks_and_volumes(name: str) -> None:
    svc = SERVICES[name]
    assert svc["healthcheck"]["test"]
    volume = svc["volumes"][0].split(":")[0]
    assert volume in COMPOSE["volumes"]


def test_dependencies_exist_and_wait(local: Settings) -> None:
    order = [c.name for c in COMPONENTS]
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_completed_successfully", "service_started")
            assert order.index(dep) < order.index(name), f"{name} waits for {dep}, which `up` starts later"
    network = SERVICES["chat"].get("network_mode", "")
    # chat posts to the receiver on 127.0.0.1: it must share the receiver's network namespace.
    assert network == "service:chat-receiver" and "chat-receiver" in SERVICES["chat"]["depends_on"]


def test_the_image_holds_every_package() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in packages["include"]:
        package = pattern.rstrip("*")
        assert re.search(rf"^COPY {package} \./{package}$", dockerfile, re.M), f"the image lacks {package}/"
    for name in PROJECT:
        build = SERVICES[name]["build"]
        assert (ROOT / build["context"] / build["dockerfile"]).is_file(), name
