"""Broker configuration as data (no JVM started here; tests/integration/test_broker_*.py run it)."""

from __future__ import annotations

import socket

import pytest

from gpuledger import broker
from gpuledger.errors import ConfigError, PortInUse
from gpuledger.settings import Settings


def test_single_node_kraft_on_loopback(tmp_path):
    cfg = broker.BrokerConfig(data_dir=tmp_path, port=29092, controller_port=29093)
    props = cfg.properties()
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:29092"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["offsets.topic.replication.factor"] == "1"
    assert int(props["num.io.threads"]) <= 2 and int(props["num.network.threads"]) <= 2


def test_extra_listener_is_the_extension_point_for_sasl_tls(tmp_path):
    secured = broker.Listener(
        "SECURE",
        "127.0.0.1",
        29094,
        security_protocol="SASL_SSL",
        extra=(("sasl.enabled.mechanisms", "SCRAM-SHA-512"), ("ssl.keystore.location", "/k.jks")),
    )
    props = broker.BrokerConfig(data_dir=tmp_path, extra_listeners=(secured,)).properties()
    assert "SECURE://127.0.0.1:29094" in props["listeners"]
    assert "SECURE://127.0.0.1:29094" in props["advertised.listeners"]
    assert "SECURE:SASL_SSL" in props["listener.security.protocol.map"]
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"


def test_from_settings(tmp_path):
    s = Settings(state_dir=tmp_path)
    cfg = broker.BrokerConfig.from_settings(s)
    assert cfg.data_dir == tmp_path / "kafka"
    assert (cfg.port, cfg.kafka_version, cfg.heap) == (s.broker.port, s.broker.kafka_version, s.broker.heap)
    assert "-Xmx512m" in broker.jvm_options(cfg)


def test_write_config_and_formatted_marker(tmp_path):
    cfg = broker.BrokerConfig(data_dir=tmp_path / "k")
    path = broker.write_config(cfg)
    assert "process.roles=broker,controller" in path.read_text()
    assert not broker.is_formatted(cfg)
    cfg.log_dir.mkdir()
    (cfg.log_dir / broker.META_PROPERTIES).write_text("node.id=1\n")
    assert broker.is_formatted(cfg)


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(PortInUse, match=f"127.0.0.1:{port} is already taken"):
            broker.check_port_free("127.0.0.1", port, "broker port")


def test_only_loopback(tmp_path):
    with pytest.raises(ConfigError, match="loopback only"):
        broker.prepare(broker.BrokerConfig(data_dir=tmp_path, host="0.0.0.0"))


def test_pom_names_the_broker_artifact_and_its_version():
    pom = (broker.deploy_dir() / "pom.xml").read_text()
    assert "<artifactId>kafka_2.13</artifactId>" in pom
    assert f"<kafka.version>{Settings().broker.kafka_version}</kafka.version>" in pom
    assert "log4j-slf4j-impl" in pom


def test_cluster_id_never_starts_with_a_dash(tmp_path, monkeypatch):
    # urlsafe base64 of a random UUID starts with "-" one time in 64; kafka-storage then reads the id as
    # an option and refuses to format. A stored id like that never formatted anything: replaced.
    import uuid

    dashed = uuid.UUID(bytes=b"\xf8" + bytes(15))  # encodes as "-AAAAAAAAAAAAAAAAAAAAA"
    ids = iter([dashed, dashed, uuid.UUID(int=1)])
    monkeypatch.setattr(broker.uuid, "uuid4", lambda: next(ids))
    cfg = broker.BrokerConfig(data_dir=tmp_path)
    (tmp_path / broker.CLUSTER_ID_FILE).write_text("-AAAAAAAAAAAAAAAAAAAAA\n")
    cid = broker._cluster_id(cfg)
    assert cid == "AAAAAAAAAAAAAAAAAAAAAQ"
    assert broker._cluster_id(cfg) == cid  # kept from then on
