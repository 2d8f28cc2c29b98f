"""`gpuledger up / status / down` through the real command, on non-default ports and a tmp state dir."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger

from base.settings import Settings
from stack import broker
from stack.components import COMPONENTS
from stack.supervisor import expected_topics

pytestmark = pytest.mark.integration


_run = run_gpuledger


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
    port, controller_port, ch_port, registry_port = broker.free_ports(4)
    bootstrap = f"127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(controller_port),
        "GPULEDGER_REGISTRY__PORT": str(registry_port),
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
        # The schema registry: after the broker, before the topics; `schemas` registered every subject.
        assert _component(st, "registry")["state"] == "ready", _component(st, "registry")
        assert st["registry_reachable"] is True and st["registry_url"].startswith(f"http://127.0.0.1:{registry_port}/")
        if _component(st, "schemas")["state"] == "done":
            assert st["missing_subjects"] == [] and st["registry_subjects"] >= len(expected_topics(Settings()))
        pids.update(c["pid"] for c in st["components"] if c["pid"])
    finally:
        down = _run(["down", "--state-dir", str(state)], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "broker" in down.stdout
    assert not any(broker.pid_alive(pid) for pid in pids)
    assert not list((state / "run").glob("*.json"))
    assert _port_free(port) and _port_free(controller_port) and _port_free(registry_port)

    rc, st = _status(state, env)
    assert rc == 1
    assert _component(st, "broker")["state"] == "stopped"
    assert st["broker_reachable"] is False

    # `down` again is harmless too.
    assert _run(["down", "--state-dir", str(state)], env).returncode == 0


def test_up_generates_clickhouse_passwords_that_serve_requires(tmp_path):
    """`clickhouse serve` refuses empty passwords; `up` generates them (0600, state dir 0700) and every
    command logs in with them: the analyst connects with its password, never with an empty one."""
    import stat
    from urllib.parse import unquote, urlsplit

    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    (ch_port,) = broker.free_ports(1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
        "GPULEDGER_CLICKHOUSE__URL": f"http://127.0.0.1:{ch_port}",
        "GPULEDGER_CONFIG": str(tmp_path / "absent.toml"),
        "COLUMNS": "200",
    }
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    security_dir = state / "security"

    refused = _run(["clickhouse", "serve", "--state-dir", str(state), "--port", "0"], env, timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: refusing to serve with an empty password")
    assert len(refused.stderr.strip().splitlines()) == 1 and "gpuledger up" in refused.stderr
    assert not (state / "clickhouse").exists()  # refused before touching the data

    try:
        up = _run(["up", "--state-dir", str(state), "--only", "clickhouse"], env)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "generated the ClickHouse analyst password" in up.stdout
        assert stat.S_IMODE(state.stat().st_mode) == 0o700  # an existing state dir is tightened
        assert stat.S_IMODE(security_dir.stat().st_mode) == 0o700
        writer_pw = (security_dir / "clickhouse-writer.password").read_text().strip()
        analyst_pw = (security_dir / "clickhouse-analyst.password").read_text().strip()
        for name in ("clickhouse-writer.password", "clickhouse-analyst.password"):
            assert stat.S_IMODE((security_dir / name).stat().st_mode) == 0o600
        assert writer_pw and analyst_pw and writer_pw not in up.stdout + up.stderr

        dsn = _run(["clickhouse", "dsn", "--state-dir", str(state)], env, timeout=60)
        assert dsn.returncode == 0, dsn.stderr
        url = urlsplit(dsn.stdout.splitlines()[0])
        assert (url.username, unquote(url.password or ""), url.port) == ("analyst", analyst_pw, ch_port)
        analyst = clickhouse_connect.get_client(host="127.0.0.1", port=ch_port, username="analyst",
                                                password=analyst_pw)  # fmt: skip
        assert analyst.command("SELECT 42") == 42
        analyst.close()
        for user in ("analyst", "gpuledger"):
            with pytest.raises(ClickHouseError):
                clickhouse_connect.get_client(host="127.0.0.1", port=ch_port, username=user, password="")

        # `sql` runs as the analyst (read-only) unless --writer.
        st = ["--state-dir", str(state)]
        ddl = "CREATE DATABASE IF NOT EXISTS scratch_by_sql"
        as_analyst = _run(["sql", ddl, *st], env, timeout=60)
        assert as_analyst.returncode == 2 and as_analyst.stderr.startswith("error:"), as_analyst.stderr
        assert _run(["sql", ddl, "--writer", *st], env, timeout=60).returncode == 0
        count = "SELECT count() FROM system.databases WHERE name = 'scratch_by_sql'"
        exists = _run(["sql", count, "--format", "csv", *st], env, timeout=60)
        assert exists.stdout.splitlines()[-1] == "1", exists.stdout + exists.stderr
        # What a cell holds is printed, not interpreted as markup or a spreadsheet formula.
        markup = _run(["sql", "SELECT '[/]' AS a, '[red]x' AS b", *st], env, timeout=60)
        assert markup.returncode == 0 and "[/]" in markup.stdout and "[red]x" in markup.stdout, markup.stderr
        formula = _run(["sql", "SELECT '=1+1' AS f, -2 AS n", "--format", "csv", *st], env, timeout=60)
        assert formula.stdout.splitlines()[1] == '"\'=1+1",-2', formula.stdout
    finally:
        down = _run(["down", "--state-dir", str(state)], env)
    assert down.returncode == 0 and "clickhouse" in down.stdout, down.stdout + down.stderr
