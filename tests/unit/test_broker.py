"""Broker configuration as data (no JVM started here; tests/integration/test_broker_*.py run it)."""

from __future__ import annotations

import socket

import pytest

from base.errors import ConfigError, PortInUse
from base.settings import Settings
from stack import broker


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
    assert cfg.jit == s.broker.jit


def test_jvm_options_name_the_compiler_and_the_class_archive(tmp_path):
    full = broker.BrokerConfig(data_dir=tmp_path)
    quick = broker.BrokerConfig(data_dir=tmp_path, jit="quick", archive_at_exit=tmp_path / "a.part")
    assert not [o for o in broker.jvm_options(full) if o.startswith(("-XX:TieredStop", "-XX:Shared", "-XX:Archive"))]
    opts = broker.jvm_options(quick, tmp_path / "a.jsa")
    assert "-XX:TieredStopAtLevel=1" in opts
    assert f"-XX:SharedArchiveFile={tmp_path / 'a.jsa'}" in opts
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'a.part'}" in opts


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


def test_default_is_one_node_and_its_topics_one_replica(tmp_path):
    s = Settings(state_dir=tmp_path)
    assert s.broker.nodes == 1
    assert s.kafka.bootstrap_servers == f"127.0.0.1:{s.broker.port}"
    assert s.kafka.topic_replication == 1 and s.kafka.topic_min_insync() == 1
    (cfg,) = broker.cluster_configs(s)
    props = cfg.properties()
    assert props["node.id"] == "1" and props["controller.quorum.voters"] == f"1@127.0.0.1:{s.broker.controller_port}"
    assert props["min.insync.replicas"] == "1" and props["transaction.state.log.min.isr"] == "1"


def test_three_nodes_form_one_quorum_with_replicated_internal_topics(tmp_path):
    s = Settings(state_dir=tmp_path, broker={"nodes": 3, "port": 30000, "controller_port": 30001})
    cfgs = broker.cluster_configs(s)
    assert [c.node_id for c in cfgs] == [1, 2, 3]
    assert [(c.port, c.controller_port) for c in cfgs] == [(30000, 30001), (30010, 30011), (30020, 30021)]
    voters = "1@127.0.0.1:30001,2@127.0.0.1:30011,3@127.0.0.1:30021"
    for c in cfgs:
        props = c.properties()
        assert props["node.id"] == str(c.node_id)
        assert props["controller.quorum.voters"] == voters
        assert props["process.roles"] == "broker,controller"
        assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{c.port},CONTROLLER://127.0.0.1:{c.controller_port}"
        for key in (
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "share.coordinator.state.topic.replication.factor",
            "default.replication.factor",
        ):
            assert props[key] == "3", key
        assert props["transaction.state.log.min.isr"] == "2" and props["min.insync.replicas"] == "2"
        assert c.cluster_id_file == tmp_path / "kafka-cluster" / broker.CLUSTER_ID_FILE
    # Each node its own data; none of them the single node's (switching never reuses the other's log).
    assert len({c.data_dir for c in cfgs}) == 3 and tmp_path / "kafka" not in {c.data_dir for c in cfgs}
    # Clients bootstrap from every node, and topics are replicated on three, 2 in sync.
    assert s.kafka.bootstrap_servers == "127.0.0.1:30000,127.0.0.1:30010,127.0.0.1:30020"
    assert s.kafka.topic_replication == 3 and s.kafka.topic_min_insync() == 2


def test_cluster_settings_an_explicit_bootstrap_and_replication_win(tmp_path):
    s = Settings(state_dir=tmp_path, broker={"nodes": 3}, kafka={"bootstrap_servers": "h:1", "replication_factor": 2})
    assert s.kafka.bootstrap_servers == "h:1" and s.kafka.topic_replication == 2 and s.kafka.topic_min_insync() == 1


def test_only_one_or_three_nodes_and_a_cluster_is_not_secured(tmp_path):
    with pytest.raises(ConfigError, match=r"broker\.nodes"):
        Settings(state_dir=tmp_path, broker={"nodes": 2})
    with pytest.raises(ConfigError, match="plaintext only"):
        Settings(state_dir=tmp_path, broker={"nodes": 3, "security": "sasl_ssl"})
    with pytest.raises(ConfigError, match=r"nodes 1\.\.1"):
        broker.BrokerConfig.from_settings(Settings(state_dir=tmp_path), 2)


def test_cluster_on_free_ports_shares_one_quorum(tmp_path):
    cfgs = broker.cluster_on_free_ports(tmp_path, "4.1.1")
    voters = {c.properties()["controller.quorum.voters"] for c in cfgs}
    assert len(voters) == 1
    assert sorted(int(v.split("@")[0]) for v in voters.pop().split(",")) == [1, 2, 3]
    assert len({c.port for c in cfgs} | {c.controller_port for c in cfgs}) == 6
