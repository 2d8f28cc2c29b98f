"""`gpuledger up / status / down` through the real command, on non-default ports and a tmp state dir."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from gpuledger import broker
from gpuledger.components import COMPONENTS
from gpuledger.settings import Settings
from gpuledger.supervisor import expected_topics

pytestmark = pytest.mark.integration


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _status(state: Path, env: dict[str, str]) -> tuple[int, dict]:
    proc = _run(["status", "--json", "--state-dir", str(state)], env, timeout=60)
    return proc.returncode, json.loads(proc.stdout)


def _component(status: dict, name: str) -> dict:
    return next(c for c in status["components"] if c["name"] == name)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_up_status_down_leaves_no_process(tmp_path, unique_topic):
    port, controller_port, ch_port = broker.free_ports(3)
    bootstrap = f"127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(controller_port),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
        "GPULEDGER_CLICKHOUSE__URL": f"http://127.0.0.1:{ch_port}",
        "GPULEDGER_CONFIG": str(tmp_path / "absent.toml"),
    }
    state = tmp_path / "state"
    pids: set[int] = set()
    try:
        up = _run(["up", "--state-dir", str(state), "--only", "broker"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        rc, st = _status(state, env)
        b = _component(st, "broker")
        assert b["state"] == "ready" and b["healthy"], b
        assert st["broker_reachable"] is True
        pids.add(b["pid"])
        assert (state / "logs" / "broker.log").is_file()
        assert (state / "kafka" / "data" / "meta.properties").is_file()

        # Running `up` again is harmless: same broker process.
        again = _run(["up", "--state-dir", str(state), "--only", "broker"], env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "already running" in again.stdout
        assert _component(_status(state, env)[1], "broker")["pid"] == b["pid"]

        # Topics and consumer lag as status reports them.
        topic = unique_topic("status")
        conf = {"bootstrap.servers": bootstrap}
        admin = AdminClient(conf)
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
        producer = Producer(conf)
        for i in range(5):
            producer.produce(topic, value=str(i).encode())
        producer.flush(30)
        del producer
        group = f"g-{topic}"
        consumer = Consumer({**conf, "group.id": group})
        deadline = time.monotonic() + 60
        while True:  # the first commit on a new broker meets the offsets topic still being created
            try:
                consumer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
                break
            except KafkaException as exc:
                err = exc.args[0]
                coordinator_busy = err.code() in (
                    KafkaError.NOT_COORDINATOR,
                    KafkaError.COORDINATOR_NOT_AVAILABLE,
                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                )
                if not (coordinator_busy or err.retriable()) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        consumer.close()
        del admin
        rc, st = _status(state, env)
        assert topic in st["topics"]
        # Only the broker runs: the catalogue's topics are reported missing (and status is not healthy).
        assert set(st["missing_topics"]) == set(expected_topics(Settings())) - set(st["topics"])
        if st["missing_topics"]:
            assert rc == 1 and st["healthy"] is False
        lag = {g["group"]: g["lag"] for g in st["consumer_lag"]}
        assert lag[group] == 3

        # Every registered component is reported, honestly: ClickHouse is not up on its port.
        assert [c["name"] for c in st["components"]] == [c.name for c in COMPONENTS]
        for c in st["components"]:
            assert c["state"] and (c["detail"] or c["state"] == "stopped"), c
        assert st["clickhouse_reachable"] is False
        assert st["healthy"] is (rc == 0)

        # The full `up`: the broker is kept; what cannot start says so in one line.
        full = _run(["up", "--state-dir", str(state)], env, timeout=300)
        if full.returncode != 0:
            assert full.returncode == 2 and full.stderr.startswith("error:"), full.stdout + full.stderr
        rc, st = _status(state, env)
        assert _component(st, "broker")["pid"] == b["pid"]
        if _component(st, "topics")["state"] == "done":
            assert st["missing_topics"] == []
        pids.update(c["pid"] for c in st["components"] if c["pid"])
    finally:
        down = _run(["down", "--state-dir", str(state)], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "broker" in down.stdout
    assert not any(broker.pid_alive(pid) for pid in pids)
    assert not list((state / "run").glob("*.json"))
    assert _port_free(port) and _port_free(controller_port)

    rc, st = _status(state, env)
    assert rc == 1
    assert _component(st, "broker")["state"] == "stopped"
    assert st["broker_reachable"] is False

    # `down` again is harmless too.
    assert _run(["down", "--state-dir", str(state)], env).returncode == 0
