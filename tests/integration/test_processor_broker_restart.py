"""`gpuledger processors run --instance w1` keeps consuming through a broker restart and a fenced consumer,
against a broker of this module's own (stopped and started with the same data dir, as the fault suite does).

Before: the broker away longer than the 6 s session made each consumer clear its member id; the commits it
had queued went out with the empty id and the broker answered FENCED_INSTANCE_ID, a fatal error the loops
logged and stepped over, so the process ran on without consuming (a wedged component)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from test_processor_harness import create_topics, own_broker, publish, start_worker, worker_env

from base.kafka import watermarks
from processors.testing import T0, device, inventory, job_event, scrape
from schemas.topics import DEVICE_MINUTES, DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, Topic, job_key, node_key
from stack.broker import LocalBroker

pytestmark = pytest.mark.integration

RESUME_WITHIN_S = 60.0  # from the broker (or the group) being back to new device-minutes out
BROKER_DOWN_S = 8.0  # longer than the dynamic members' 6 s session, as the fault suite's restart is


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    with own_broker(tmp_path_factory.mktemp("restart-broker")) as b:
        yield b


def _samples(first_s: int, n: int) -> list[tuple[Topic, bytes, dict[str, object]]]:
    return [
        (DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", T0 + s * 1000, [device("GPU-a", 0, sm=0.5)]))
        for s in range(first_s, first_s + n)
    ]


def _count(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "restart-reader", "enable.auto.commit": False})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        total = 0
        for p in md.partitions:
            lo, hi = watermarks(c, TopicPartition(topic, p))
            total += hi - lo
        return total
    finally:
        c.close()


class Worker:
    """`processors run --instance w1 --event-time` on its own topics, with 4 minutes closed already."""

    def __init__(self, b: LocalBroker, tmp_path: Path) -> None:
        self.b = b
        self.prefix = f"restart-{uuid.uuid4().hex[:8]}."
        self.group = self.prefix + "processors"
        create_topics(b.bootstrap, self.prefix, 2)
        publish(
            b.bootstrap,
            self.prefix,
            [
                (INVENTORY, node_key("c1", "n1"), inventory("n1", ["GPU-a"])),
                (JOB_EVENTS, job_key("c1", "j1"), job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]})),
                *_samples(0, 300),
            ],
        )
        env = worker_env(b.bootstrap, self.prefix, tmp_path, COMMIT_INTERVAL_MS="200")
        env["GPULEDGER_METRICS__BASE_PORT"] = "0"
        self.state_dir = tmp_path
        self.log = tmp_path / "processors.log"
        self.proc = start_worker(env, "--event-time", log=self.log)
        self.topic = self.prefix + DEVICE_MINUTES.name
        self.before = self.wait_for_minutes(0, 120, "the first device-minutes")
        time.sleep(1.0)  # commits in flight, as in a running pipeline

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def minutes(self) -> int:
        return _count(self.b.bootstrap, self.topic)

    def wait_for_minutes(self, more_than: int, timeout_s: float, what: str) -> int:
        deadline = time.monotonic() + timeout_s
        while (n := self.minutes()) <= more_than:
            assert self.proc.poll() is None, f"processors exited {self.proc.returncode}: {self.tail()}"
            assert time.monotonic() < deadline, f"{what}: none within {timeout_s:.0f} s\n{self.tail()}"
            time.sleep(0.25)
        return n

    def metric(self, name: str) -> str:
        port = (self.state_dir / "metrics" / "processors.port").read_text().strip()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return "\n".join(line for line in text.splitlines() if line.startswith(name))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
            assert rc == 0, self.tail()


@pytest.fixture
def worker(broker: LocalBroker, tmp_path: Path) -> Iterator[Worker]:
    w = Worker(broker, tmp_path)
    try:
        yield w
    finally:
        with contextlib.suppress(Exception):
            w.stop()
        if w.proc.poll() is None:
            os.kill(w.proc.pid, signal.SIGKILL)


def test_processors_resume_after_a_broker_restart(broker: LocalBroker, worker: Worker) -> None:
    broker.stop()
    time.sleep(BROKER_DOWN_S)
    broker.start(timeout=180)
    back = time.monotonic()
    publish(broker.bootstrap, worker.prefix, _samples(300, 240))  # minutes 5 to 8
    n = worker.wait_for_minutes(worker.before, RESUME_WITHIN_S, "device-minutes of input published after the restart")
    resumed_s = time.monotonic() - back
    print(f"device-minutes {worker.before} -> {n}, {resumed_s:.1f} s after the broker was back")
    assert worker.proc.poll() is None, worker.tail()
    assert "Fatal error" not in worker.log.read_text(errors="replace")


def test_a_fenced_consumer_is_replaced_in_process(broker: LocalBroker, worker: Worker) -> None:
    """A real fatal error: a second member takes the node consumer's group.instance.id. The runtime is
    closed and rebuilt from the committed offsets; the process stays up and counts the recovery."""
    intruder = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": worker.group + ".node",
            "group.instance.id": worker.group + ".node.w1",
            "partition.assignment.strategy": "range",
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
        }
    )
    try:
        intruder.subscribe([worker.prefix + DEVICE_SAMPLES.name])
        deadline = time.monotonic() + 60
        while not intruder.assignment():
            assert time.monotonic() < deadline, "the intruder got no assignment"
            intruder.poll(0.2)
    finally:
        intruder.close()  # a static member does not leave: the rebuilt runtime takes its place
    fenced = time.monotonic()
    publish(broker.bootstrap, worker.prefix, _samples(300, 240))
    n = worker.wait_for_minutes(worker.before, RESUME_WITHIN_S, "device-minutes after the node consumer was fenced")
    print(f"device-minutes {worker.before} -> {n}, {time.monotonic() - fenced:.1f} s after the fence")
    assert worker.proc.poll() is None, worker.tail()
    text = worker.log.read_text(errors="replace")
    assert "node consumer failed: Fatal error" in text and "rebuilding the runtime in" in text, worker.tail()
    assert 'gpuledger_processor_recoveries_total{stage="node"} 1.0' in worker.metric("gpuledger_processor_rec")
