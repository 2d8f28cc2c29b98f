"""Helpers (no tests here) for the processor integration tests and bench: topics, publish, run, read, and a
broker of a test module's own."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from base.kafka import watermarks
from base.settings import KafkaSettings, Settings
from schemas.codec import AvroCodec
from schemas.topics import CATALOGUE, DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, Topic
from stack.broker import BrokerConfig, LocalBroker
from streams.publish import RecordPublisher

REPO = Path(__file__).resolve().parents[2]
CLI = "from gpuledger.cli import main; main()"
# Idle thresholds short enough for the simulated runs' idle jobs to be warned and reclaimed.
SIM_IDLE = {"IDLE__IDLE_AFTER_MIN_INTERACTIVE": "10", "IDLE__IDLE_AFTER_MIN_BATCH": "15", "IDLE__GRACE_MIN": "5"}


@contextlib.contextmanager
def own_broker(root: Path) -> Iterator[LocalBroker]:
    """A broker of the calling module's own (never the session's: the tests stop or freeze it), under `root`."""
    cfg = BrokerConfig.on_free_ports(root / "kafka", Settings().broker.kafka_version, jit="quick")
    b = LocalBroker(cfg, log_path=root / "broker.log").start(timeout=180)
    try:
        yield b
    finally:
        b.stop()


def create_topics(bootstrap: str, prefix: str, partitions: int, timeout_s: float = 120.0) -> None:
    """Every topic of the catalogue under `prefix`. Creations that fail or time out are tried again until
    `timeout_s`: a single KRaft node thawed after a freeze may answer one creation and then fence itself
    for a while (a clean-clone CI run timed out here right after a probe topic had been created)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [prefix + t.name for t in CATALOGUE] + [prefix + t.dlq for t in (DEVICE_SAMPLES, JOB_EVENTS, INVENTORY)]
    names += [prefix + "sched.allocations.v1.dlq", prefix + "usage.device-minutes.v1.dlq"]
    names += [prefix + "processors.job-device-minutes.v1.dlq"]
    missing = set(names)
    deadline = time.monotonic() + timeout_s
    while missing:
        new = [
            NewTopic(n, partitions, 1, config={"cleanup.policy": "compact"} if n == prefix + INVENTORY.name else {})
            for n in sorted(missing)
        ]
        failure: BaseException | None = None
        for name, fut in admin.create_topics(new, request_timeout=15).items():
            try:
                fut.result(timeout=30)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    failure = e
                    continue
            except TimeoutError as e:
                failure = e
                continue
            missing.discard(name)
        if missing and time.monotonic() > deadline:
            raise RuntimeError(f"{len(missing)} topics not created in {timeout_s:.0f} s: {failure!r}")
        if missing:
            time.sleep(1.0)


def publish(bootstrap: str, prefix: str, records: Iterable[tuple[Topic, bytes, dict[str, Any]]]) -> int:
    pub = RecordPublisher(KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix))
    n = 0
    for topic, key, record in records:
        pub.publish(topic, key, record)
        n += 1
    pub.flush()
    return n


def worker_env(bootstrap: str, prefix: str, state_dir: Path, **processor: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "GPULEDGER_CONFIG": str(state_dir / "none.toml"),
            "GPULEDGER_STATE_DIR": str(state_dir),
            "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
            "GPULEDGER_PROCESSOR__GROUP_ID": prefix + "processors",
            "GPULEDGER_PROCESSOR__REALTIME": "false",
        }
    )
    for k, v in processor.items():
        env["GPULEDGER_PROCESSOR__" + k.upper()] = v
    return env


# Unless a test names its stages, the runtime runs all three: its job stage is the reference the faust
# agents (`processors agents`, the product's job stage) are held to (tests/integration/test_idle_faust.py).
ALL_STAGES = ("--stage", "rekey", "--stage", "node", "--stage", "job")


def start_worker(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    stages = () if "--stage" in args else ALL_STAGES
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "processors", "run", "--instance", "w1", *stages, *args],
        env=env,
        cwd=REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def read_all(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[tuple[bytes | None, bytes]]:
    """Every record of the topic, partition by partition, up to the end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        out: list[tuple[bytes | None, bytes]] = []
        for p in sorted(md.partitions):
            lo, hi = watermarks(c, TopicPartition(topic, p))
            if hi <= lo:
                continue
            c.assign([TopicPartition(topic, p, lo)])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                msgs = c.consume(1000, 1.0)
                done = False
                for m in msgs:
                    if m.error():
                        continue
                    out.append((m.key(), m.value() or b""))
                    if (m.offset() or 0) + 1 >= hi:
                        done = True
                if done:
                    break
        return out
    finally:
        c.close()


def decode_all(raw: list[tuple[bytes | None, bytes]], subject: str) -> list[tuple[bytes, dict[str, Any]]]:
    codec = AvroCodec()
    return [(value, codec.decode(value, subject).record) for _, value in raw]


def wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
