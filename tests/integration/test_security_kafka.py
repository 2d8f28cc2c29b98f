"""The local broker with `broker.security = "sasl_ssl"`: a SASL/SCRAM-SHA-512 listener over TLS.

One real broker for the module, secured with stack/security.py exactly as `gpuledger up` does
it (local CA, broker certificate, admin user added at format time, the pipeline's user created
through the admin login). Clients without the right credentials, or without trusting the CA, are
refused; with them, records round-trip; and the simulator -> processors -> sink pipeline runs
through the listener with nothing but the state directory and `broker.security` to go on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pydantic import SecretStr

from base.settings import BrokerSettings, KafkaSettings, Settings
from schemas.codec import AvroCodec
from schemas.topics import ALERTS, DEVICE_MINUTES, JOB_EVENTS, JOB_MINUTES, RECLAIM_ACTIONS, all_topics
from stack import broker, security

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLI = "from gpuledger.cli import main; main()"


@dataclass
class SecureBroker:
    bootstrap: str
    port: int
    state: Path
    materials: security.Materials
    user: str
    password: str = ""

    def conf(self, **overrides: str) -> dict[str, str]:
        base = {
            "bootstrap.servers": self.bootstrap,
            **security.client_config(self.materials.ca_cert, self.user, self.password),
        }
        base.update(overrides)
        return base

    def conf_as(self, component: str, **overrides: str) -> dict[str, str]:
        """A client logged in as one component's principal (its generated password)."""
        user = security.PRINCIPALS[component]
        password = security.read_secret(security.password_file(self.materials, user))
        return {"bootstrap.servers": self.bootstrap, **security.client_config(self.materials.ca_cert, user, password),
                **overrides}  # fmt: skip

    def env(self, **extra: str) -> dict[str, str]:
        """What a component of `gpuledger up` would get: the state dir and broker.security, no login."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
        env.update(
            {
                "GPULEDGER_CONFIG": str(self.state / "absent.toml"),
                "GPULEDGER_STATE_DIR": str(self.state),
                "GPULEDGER_BROKER__SECURITY": "sasl_ssl",
                "GPULEDGER_BROKER__PORT": str(self.port),
                "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
            }
        )
        env.update(extra)
        return env


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    state = tmp_path_factory.mktemp("secure-state")
    port, controller_port = broker.free_ports(2)
    m = security.ensure_materials(state)
    cfg = security.authorized_broker_config(
        security.secure_broker_config(
            broker.BrokerConfig(data_dir=state / "kafka", port=port, controller_port=controller_port), m
        )
    )
    with broker.LocalBroker(cfg) as b:
        sb = SecureBroker(b.bootstrap, port, state, m, security.DEFAULT_CLIENT_USER, security.new_password())
        security.write_secret(m.client_password, sb.password + "\n")
        security.ensure_client_user(b.client_config(), sb.user, sb.password)
        settings = Settings(
            state_dir=state,
            broker=BrokerSettings(security="sasl_ssl", port=port),
            kafka=KafkaSettings(bootstrap_servers=b.bootstrap),
        )
        security.ensure_component_principals(settings)  # what `gpuledger up` does once the broker answers
        yield sb


def _errors_of(conf: dict[str, Any], wait_s: float = 10.0) -> tuple[list[KafkaError], bool]:
    """Errors a client reports while trying to read metadata, and whether it ever got any."""
    errors: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": errors.append, "socket.connection.setup.timeout.ms": 3000})
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if admin.list_topics(timeout=2).brokers:
                return errors, True
        except KafkaException as exc:
            errors.append(exc.args[0])
        admin.poll(0.2)  # serves error_cb: the specific reason (authentication, TLS) arrives there
        if any(e.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL) for e in errors):
            break
    return errors, False


def test_only_the_sasl_ssl_listener_serves_clients(secure_broker: SecureBroker) -> None:
    props = (secure_broker.state / "kafka" / "server.properties").read_text()
    listeners = next(line for line in props.splitlines() if line.startswith("listeners="))
    assert listeners.startswith(f"listeners=SASL_SSL://{secure_broker.bootstrap},CONTROLLER://")
    assert "PLAINTEXT://" not in listeners
    m = secure_broker.materials
    for secret in (m.ca_key, m.broker_pem, m.admin_password, m.client_password, secure_broker.state / "kafka" /
                   "server.properties"):  # fmt: skip
        assert secret.stat().st_mode & 0o077 == 0, secret  # owner only
    assert m.dir.stat().st_mode & 0o077 == 0
    assert not (secure_broker.state / "kafka" / "format.args").exists()  # the --add-scram argument file is gone


def test_plaintext_client_is_refused(secure_broker: SecureBroker) -> None:
    errors, got = _errors_of({"bootstrap.servers": secure_broker.bootstrap})
    assert not got and errors


def test_client_without_credentials_is_refused(secure_broker: SecureBroker) -> None:
    conf = secure_broker.conf()
    del conf["sasl.username"], conf["sasl.password"]
    try:
        errors, got = _errors_of(conf)
    except KafkaException as exc:  # librdkafka may refuse the configuration itself
        errors, got = [exc.args[0]], False
    assert not got and errors


def test_wrong_password_is_refused(secure_broker: SecureBroker) -> None:
    errors, got = _errors_of(secure_broker.conf(**{"sasl.password": "not-" + secure_broker.password}))
    assert not got
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    unknown_user, got = _errors_of(secure_broker.conf(**{"sasl.username": "mallory"}))
    assert not got and any(e.code() == KafkaError._AUTHENTICATION for e in unknown_user), unknown_user


def test_certificate_from_another_ca_is_refused(secure_broker: SecureBroker, tmp_path: Path) -> None:
    other = security.ensure_materials(tmp_path)  # a CA the broker's certificate was not signed by
    errors, got = _errors_of(secure_broker.conf(**{"ssl.ca.location": str(other.ca_cert)}))
    assert not got
    assert any(e.code() in (KafkaError._SSL, KafkaError._TRANSPORT) for e in errors), errors


def test_records_round_trip_over_tls(secure_broker: SecureBroker) -> None:
    conf = secure_broker.conf_as("admin")
    topic = f"test.secure.{uuid.uuid4().hex[:12]}"
    admin = AdminClient(conf)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(20)}
    producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
    for key, value in sent.items():
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0
    consumer = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got: dict[bytes, bytes] = {}
    deadline = time.monotonic() + 60
    try:
        while len(got) < len(sent) and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got[msg.key()] = msg.value()  # type: ignore[index]
    finally:
        consumer.close()
    assert got == sent
    # Someone with the wrong password reads nothing of it.
    intruder = Consumer(
        {**secure_broker.conf_as("admin", **{"sasl.password": "guess"}), "group.id": "intruder",
         "auto.offset.reset": "earliest"}
    )  # fmt: skip
    intruder.subscribe([topic])
    try:
        stolen = [m for m in (intruder.poll(1.0) for _ in range(5)) if m is not None and m.error() is None]
    finally:
        intruder.close()
    assert stolen == []


def _cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


def _read_topic(conf: dict[str, str], topic: str, timeout_s: float = 60) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                         "enable.partition.eof": True})  # fmt: skip
    partitions = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.subscribe([topic])
    out: list[bytes] = []
    done: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition() or 0)
                continue
            out.append(msg.value() or b"")
    finally:
        consumer.close()
    return out


def test_pipeline_runs_through_sasl_ssl(secure_broker: SecureBroker, clickhouse_server: Any, tmp_path: Path) -> None:
    """Topics, simulator, processors and the ClickHouse sink, each a `gpuledger` process that only
    knows the state directory and `broker.security=sasl_ssl` (what `gpuledger up` gives them)."""
    database = "sec_" + uuid.uuid4().hex[:12]
    env = secure_broker.env(
        GPULEDGER_PROCESSOR__REALTIME="false",
        # The processors' group is the configured one: its principal may use only groups prefixed by it.
        GPULEDGER_CLICKHOUSE__URL=clickhouse_server.url,
        GPULEDGER_CLICKHOUSE__DATABASE=database,
        GPULEDGER_CLICKHOUSE__PASSWORD=clickhouse_server.password,
        GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD=clickhouse_server.analyst_password,
    )
    settings = json.loads(_cli(env, "settings").stdout)
    assert settings["kafka"]["config"]["security.protocol"] == "SASL_SSL"
    assert settings["kafka"]["sasl_password"] == "**********"

    def as_(component: str) -> dict[str, str]:  # what the supervisor adds for each component
        return {**env, **security.component_env(Settings(broker=BrokerSettings(security="sasl_ssl")), component)}

    for component, args in (("admin", ("topics", "apply")),
                            ("producers", ("simulate", "run", "--fast", "--nodes", "1", "--duration", "600",
                                           "--kube-nodes", "0"))):  # the Slurm-like cluster only
        proc = _cli(as_(component), *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _cli(as_("processors"), "processors", "run", "--instance", "sec", "--exit-when-idle", "3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    assert stats["device_minutes"] > 0, stats

    records = _read_topic(secure_broker.conf_as("admin"), DEVICE_MINUTES.name)
    assert len(records) == stats["device_minutes"]
    # The job stage, as `up` runs it: the faust agents, logged in as the processors (their group, the
    # idle-state topic as the Table's changelog, job-minutes, alerts and actions out).
    agents = _cli(as_("processors"), "processors", "agents", "--event-time", "--exit-when-idle", "3")
    assert agents.returncode == 0, agents.stdout[-2000:] + agents.stderr[-3000:]
    agent_stats = json.loads(agents.stdout.strip().splitlines()[-1])
    assert agent_stats["job_minutes"] > 0 and agent_stats["state_writes"] > 0, agent_stats
    assert len(_read_topic(secure_broker.conf_as("admin"), JOB_MINUTES.name)) == agent_stats["job_minutes"]
    first = AvroCodec.from_settings(KafkaSettings()).decode(records[0], DEVICE_MINUTES.subject).record
    assert first["cluster"] == "sim" and first["minute_start_ms"] > 0

    migrate = _cli(env, "db", "migrate")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    # Chat and reclaim, faust agents as `up` runs them, each logged in as itself: its topic, its group and
    # its dead letters suffice (a record that does not decode goes to `<topic>.dlq`).
    garbage = Producer(secure_broker.conf_as("processors"))
    for topic in (ALERTS, RECLAIM_ACTIONS):
        garbage.produce(topic.name, key=b"c1/j1", value=b"not a record")
    assert garbage.flush(30) == 0
    for component, topic in (("chat", ALERTS), ("reclaim", RECLAIM_ACTIONS)):
        worker = _cli(as_(component), component, "run", "--max-idle-s", "3")
        assert worker.returncode == 0, worker.stdout[-2000:] + worker.stderr[-3000:]
        assert len(_read_topic(secure_broker.conf_as("admin"), topic.dlq)) >= 1, worker.stderr[-3000:]
    sink = _cli(as_("sinks"), "sink", "run", "--topic", DEVICE_MINUTES.name, "--max-idle-s", "5")
    assert sink.returncode == 0, sink.stdout[-2000:] + sink.stderr[-3000:]
    analyst = clickhouse_server.analyst_client(database=database)
    try:
        rows = analyst.query("SELECT count() FROM device_minutes FINAL").result_rows[0][0]
    finally:
        analyst.close()
    assert rows > 0


def _settings_for(sb: SecureBroker, user: str, password: str) -> Settings:
    return Settings(
        state_dir=sb.state,
        broker=BrokerSettings(security="sasl_ssl", port=sb.port),
        kafka=KafkaSettings(bootstrap_servers=sb.bootstrap, sasl_username=user, sasl_password=SecretStr(password)),
    )


def test_status_never_changes_a_password_up_does(secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPULEDGER_CONFIG", str(secure_broker.state / "absent.toml"))
    user, first, second = "rotating", security.new_password(), security.new_password()
    assert security.broker_ready(_settings_for(secure_broker, user, first), create_user=True)[0]  # as `up`
    # A wrong password, as `status` sees it: refused, and the stored credential is left alone.
    ok, detail = security.broker_ready(_settings_for(secure_broker, user, second))
    assert not ok and "login refused" in detail
    assert security.broker_ready(_settings_for(secure_broker, user, first))[0]
    # The next `up` with a changed password updates the user: the new one works, the old one no longer.
    assert security.broker_ready(_settings_for(secure_broker, user, second), create_user=True)[0]
    assert not security.broker_ready(_settings_for(secure_broker, user, first))[0]


def test_a_plaintext_state_dir_is_not_switched_silently(tmp_path: Path) -> None:
    port, controller_port, ch_port = broker.free_ports(3)
    state = tmp_path / "state"
    cfg = broker.BrokerConfig(data_dir=state / "kafka", port=port, controller_port=controller_port)
    broker.format_storage(cfg, broker.ensure_jars(cfg.kafka_version))  # formatted without SCRAM users
    env = SecureBroker(f"127.0.0.1:{port}", port, state, security.materials(state), "gpuledger").env(
        GPULEDGER_BROKER__CONTROLLER_PORT=str(controller_port), GPULEDGER_CLICKHOUSE__URL=f"http://127.0.0.1:{ch_port}"
    )
    proc = _cli(env, "up", "--only", "broker", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: broker: ") or proc.stderr.startswith("error: the Kafka data"), proc.stderr
    assert "formatted without SCRAM users" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (state / "run" / "broker.json").exists()  # nothing was started


# -- authorisation: one principal per component, ACLs on the broker's StandardAuthorizer -----------


def _produce_error(conf: dict[str, str], topic: str) -> int | None:
    """Produce one record; the delivery error code (None: delivered)."""
    errors: list[int | None] = []
    producer = Producer({**conf, "message.timeout.ms": 15000, "log_level": 0})
    producer.produce(topic, key=b"k", value=b"v", on_delivery=lambda err, _m: errors.append(err and err.code()))
    producer.flush(20)
    assert len(errors) == 1
    return errors[0]


@pytest.fixture(scope="module")
def catalogue_topics(secure_broker: SecureBroker) -> None:
    admin = AdminClient(secure_broker.conf_as("admin"))
    wanted = [NewTopic(t.name, 1, 1) for t in all_topics()]
    for fut in admin.create_topics(wanted).values():
        try:
            fut.result(timeout=30)
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


def test_only_the_processors_write_usage_and_alerts(secure_broker: SecureBroker, catalogue_topics: None) -> None:
    denied = KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert _produce_error(secure_broker.conf_as("sinks"), ALERTS.name) == denied
    assert _produce_error(secure_broker.conf_as("producers"), DEVICE_MINUTES.name) == denied
    assert _produce_error(secure_broker.conf_as("chat"), RECLAIM_ACTIONS.name) == denied
    assert _produce_error(secure_broker.conf(), ALERTS.name) == denied  # the default login only describes
    for topic in (ALERTS.name, DEVICE_MINUTES.name, RECLAIM_ACTIONS.name):
        assert _produce_error(secure_broker.conf_as("processors"), topic) is None
    # Only producers write telemetry and job events; the processors only read them.
    assert _produce_error(secure_broker.conf_as("producers"), JOB_EVENTS.name) is None
    assert _produce_error(secure_broker.conf_as("processors"), JOB_EVENTS.name) == denied
    # The sinks dead-letter what they cannot store, and nothing else.
    assert _produce_error(secure_broker.conf_as("sinks"), DEVICE_MINUTES.dlq) is None


def test_a_component_reads_only_its_topics_in_its_group(secure_broker: SecureBroker, catalogue_topics: None) -> None:
    def read_error(component: str, topic: str, group: str) -> int | None:
        consumer = Consumer({**secure_broker.conf_as(component), "group.id": group, "auto.offset.reset": "earliest",
                             "log_level": 0})  # fmt: skip
        consumer.subscribe([topic])
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
                    return int(msg.error().code())
                if msg is not None and msg.error() is None:
                    return None
            return None
        finally:
            consumer.close()

    assert _produce_error(secure_broker.conf_as("processors"), RECLAIM_ACTIONS.name) is None
    assert read_error("reclaim", RECLAIM_ACTIONS.name, "gpuledger-sinks-reclaim") is None
    assert read_error("chat", RECLAIM_ACTIONS.name, "gpuledger-sinks-chat") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert read_error("reclaim", RECLAIM_ACTIONS.name, "someone-elses-group") == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_component_passwords_are_private_and_settings_pick_the_principal(
    secure_broker: SecureBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = secure_broker.materials
    for user in security.PRINCIPALS.values():
        assert security.password_file(m, user).stat().st_mode & 0o077 == 0, user
    env = secure_broker.env(**security.component_env(Settings(broker=BrokerSettings(security="sasl_ssl")), "sinks"))
    settings = json.loads(_cli(env, "settings").stdout)
    assert (settings["kafka"]["sasl_username"], settings["kafka"]["sasl_password"]) == ("gpuledger-sinks", "**********")
    monkeypatch.setenv("GPULEDGER_CONFIG", str(secure_broker.state / "absent.toml"))
    assert security.component_env(Settings(), "sinks") == {}  # plaintext (the default): nothing changes
