"""The local broker launcher (stack.broker): restart keeps data, one-line errors, jar cache reuse."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger

from base.errors import DependencyMissing, PortInUse
from base.settings import Settings
from stack import broker

pytestmark = pytest.mark.integration

KAFKA_VERSION = Settings().broker.kafka_version


def _cfg(data_dir: Path) -> broker.BrokerConfig:
    port, controller_port = broker.free_ports(2)
    return broker.BrokerConfig(
        data_dir=data_dir, port=port, controller_port=controller_port, kafka_version=KAFKA_VERSION
    )


def _path_without(bin_dir: Path, *tools: str, keep: tuple[str, ...] = ()) -> str:
    """A PATH holding only links to `keep`, so `tools` cannot be found on it."""
    bin_dir.mkdir()
    for tool in keep:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    for tool in tools:
        assert shutil.which(tool, path=str(bin_dir)) is None
    return str(bin_dir)


def _gpuledger(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return run_gpuledger(args, env, timeout)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_restart_keeps_topics_and_records(tmp_path, unique_topic):
    cfg = _cfg(tmp_path / "kafka")
    topic = unique_topic("durable")
    with broker.LocalBroker(cfg) as b:
        first_pid = b.pid
        admin = AdminClient(b.client_config())
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(timeout=30)
        producer = Producer({**b.client_config(), "acks": "all"})
        for i in range(20):
            producer.produce(topic, key=str(i % 4).encode(), value=f"r{i}".encode())
        assert producer.flush(30) == 0
        del producer
    assert first_pid is not None and not broker.pid_alive(first_pid)
    cluster_id = (cfg.data_dir / broker.CLUSTER_ID_FILE).read_text()
    meta = (cfg.log_dir / broker.META_PROPERTIES).read_text()

    with broker.LocalBroker(cfg) as b:
        # Not reformatted: same cluster, same storage.
        assert (cfg.log_dir / broker.META_PROPERTIES).read_text() == meta
        assert cluster_id.strip() in meta
        md = AdminClient(b.client_config()).list_topics(timeout=10)
        assert topic in md.topics and len(md.topics[topic].partitions) == 2
        consumer = Consumer({**b.client_config(), "group.id": "after-restart", "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        values: set[bytes] = set()
        deadline = time.monotonic() + 30
        while len(values) < 20 and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None:
                    values.add(msg.value())
        consumer.close()
    assert values == {f"r{i}".encode() for i in range(20)}


def test_port_taken_is_a_one_line_error(tmp_path):
    cfg = _cfg(tmp_path / "kafka")
    with socket.socket() as blocker:
        blocker.bind((cfg.host, cfg.port))
        blocker.listen()
        with pytest.raises(PortInUse) as info:
            broker.LocalBroker(cfg).start()
        assert "\n" not in str(info.value)
        assert f"{cfg.host}:{cfg.port} is already taken" in str(info.value)
        assert not cfg.config_path.exists(), "nothing is prepared or started when the port is taken"

        env = {
            **os.environ,
            "GPULEDGER_BROKER__PORT": str(cfg.port),
            "GPULEDGER_BROKER__CONTROLLER_PORT": str(cfg.controller_port),
            "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": cfg.bootstrap,
        }
        proc = _gpuledger(["up", "--state-dir", str(tmp_path / "state"), "--only", "broker"], env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _one_line(proc.stderr).startswith(f"error: broker port {cfg.host}:{cfg.port} is already taken")
    assert "Traceback" not in proc.stderr


def test_missing_java_is_a_one_line_error(tmp_path, monkeypatch):
    path = _path_without(tmp_path / "bin", "java", keep=("mvn",))
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(DependencyMissing, match="Java is not installed"):
        broker.LocalBroker(_cfg(tmp_path / "kafka")).start()

    port, controller_port = broker.free_ports(2)
    env = {
        **os.environ,
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(controller_port),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
    }
    proc = _gpuledger(["up", "--state-dir", str(tmp_path / "state"), "--only", "broker"], env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert _one_line(proc.stderr).startswith("error: Java is not installed")
    assert not (tmp_path / "state" / "run" / "broker.json").exists()


def test_missing_maven_with_empty_cache_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", _path_without(tmp_path / "bin", "mvn", keep=("java",)))
    with pytest.raises(DependencyMissing, match="Maven is not installed") as info:
        broker.ensure_jars(KAFKA_VERSION, tmp_path / "empty-cache")
    assert "\n" not in str(info.value)


def test_jar_cache_is_reused_without_maven(tmp_path, monkeypatch):
    libs = broker.ensure_jars(KAFKA_VERSION)  # fetched by the session broker already, or now
    monkeypatch.setenv("PATH", _path_without(tmp_path / "bin", "mvn", keep=("java",)))
    assert broker.ensure_jars(KAFKA_VERSION) == libs
    assert (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file()
    assert list(libs.glob("log4j-slf4j*-impl-*.jar")), "the broker needs an slf4j binding to log"


def test_the_first_start_archives_the_classes_and_every_broker_maps_them(tmp_path):
    """AppCDS: a cache without an archive gets one from a throwaway broker life (validated by the JVM with
    -Xshare:on before it is kept), and the broker then started has it mapped in its address space."""
    cache = tmp_path / "cache"
    jars = broker.jar_cache_dir(KAFKA_VERSION, cache)
    jars.mkdir(parents=True)
    (jars / "libs").symlink_to(broker.ensure_jars(KAFKA_VERSION))
    cfg = replace(_cfg(tmp_path / "k"), cache_root=cache)
    with broker.LocalBroker(cfg) as b:
        archives = [p.name for p in jars.iterdir() if ".jsa" in p.name]
        assert archives == [broker.class_archive_path(jars / "libs").name]  # no part file left behind
        assert str(jars / archives[0]) in Path(f"/proc/{b.pid}/maps").read_text()
