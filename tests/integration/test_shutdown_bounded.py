"""A stop is prompt whatever the broker does: `gpuledger processors run` and the chat/reclaim faust agent
against a broker of their own that is frozen (SIGSTOP: connections open, nothing answered) or gone.

Before the bounds, a synchronous commit to a frozen coordinator held the processors for good (every
call on that consumer waited behind it, the SIGTERM handler too), and with the broker gone the final
commit plus a commit in each consumer's revoke inside close() took 72 s."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_processor_harness import create_topics, own_broker, publish, start_worker, worker_env

from base.settings import BrokerSettings, KafkaSettings, Settings
from base.shutdown import StopSignal
from processors.testing import T0, device, inventory, job_event, scrape
from schemas.topics import ALERTS, DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key
from sinks.worker_agent import consume_records
from stack.broker import LocalBroker

pytestmark = pytest.mark.integration

STOP_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A broker of this module's own: the tests freeze and stop it (never the session's)."""
    with own_broker(tmp_path_factory.mktemp("shutdown-broker")) as b:
        try:
            yield b
        finally:
            if b.pid is not None:  # thawed, so that it can stop
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(b.pid, signal.SIGCONT)


@contextlib.contextmanager
def frozen(b: LocalBroker) -> Iterator[None]:
    """The broker stopped in its tracks (its whole process group: the JVM is the launcher's child)."""
    assert b.pid is not None
    os.killpg(b.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(b.pid, signal.SIGCONT)
        _wait_until_answering(b)


def _wait_until_answering(b: LocalBroker, timeout_s: float = 120.0) -> None:
    """After a freeze the single KRaft node fences itself and takes a while to serve metadata writes
    again: the next test starts once a topic can be created."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    deadline = time.monotonic() + timeout_s
    while True:
        probe = f"probe-{uuid.uuid4().hex[:8]}"
        try:
            admin.create_topics([NewTopic(probe, 1, 1)])[probe].result(timeout=10)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _processors(b: LocalBroker, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`processors run` in its loop with every stage assigned and commits made."""
    prefix = f"stop-{uuid.uuid4().hex[:8]}."
    create_topics(b.bootstrap, prefix, 2)
    records = [
        (INVENTORY, node_key("c1", "n1"), inventory("n1", ["GPU-a"])),
        (JOB_EVENTS, job_key("c1", "j1"), job_event("STARTED", "j1", T0, {"n1": ["GPU-a"]})),
    ]
    records += [
        (DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", T0 + i * 1000, [device("GPU-a", 0, sm=0.5)]))
        for i in range(240)
    ]
    publish(b.bootstrap, prefix, records)
    env = worker_env(b.bootstrap, prefix, tmp_path, COMMIT_INTERVAL_MS="200")
    env["GPULEDGER_METRICS__BASE_PORT"] = "0"
    stats, log = tmp_path / "stats.json", tmp_path / "processors.log"
    proc = start_worker(env, "--event-time", "--stats-file", str(stats), log=log)
    deadline = time.monotonic() + 120
    while not (stats.exists() and '"job_minutes": 0' not in stats.read_text()):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the processors did not emit job-minutes"
        time.sleep(0.2)
    time.sleep(1.0)  # a few commit intervals: commits in flight when the broker stops answering
    return proc, log


def _exit_after(proc: subprocess.Popen[bytes], *signals: signal.Signals, gap_s: float = 1.0) -> tuple[int, float]:
    """Send the signals (gap_s apart); the exit status and the seconds from the first signal to the exit."""
    t0 = time.monotonic()
    for i, sig in enumerate(signals):
        if i:
            time.sleep(gap_s)
        proc.send_signal(sig)
    try:
        rc = proc.wait(timeout=STOP_WITHIN_S * 2)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {STOP_WITHIN_S * 2:.0f} s after {signals[0].name}")
    return rc, time.monotonic() - t0


def test_processors_stop_within_the_deadline_while_the_broker_is_frozen(broker: LocalBroker, tmp_path: Path) -> None:
    proc, log = _processors(broker, tmp_path)
    with frozen(broker):
        time.sleep(1.0)
        rc, took = _exit_after(proc, signal.SIGTERM)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]  # a stop, not a failure: what was not committed is replayed
    assert took < STOP_WITHIN_S, text[-3000:]
    assert "SIGTERM received, stopping within" in text
    assert "stopping without closing" in text  # the closes waited on the frozen coordinator, and were let go


def test_a_second_signal_ends_the_processors_at_once(broker: LocalBroker, tmp_path: Path) -> None:
    proc, log = _processors(broker, tmp_path)
    with frozen(broker):
        rc, took = _exit_after(proc, signal.SIGTERM, signal.SIGINT, gap_s=1.0)
    assert rc == 128 + signal.SIGINT, log.read_text(errors="replace")[-3000:]
    assert took < 1.0 + 3.0


def test_the_chat_and_reclaim_loop_stops_within_the_deadline_while_the_broker_is_frozen(
    broker: LocalBroker, tmp_path: Path
) -> None:
    prefix = f"stop-{uuid.uuid4().hex[:8]}."
    create_topics(broker.bootstrap, prefix, 1)
    alert = {
        "alert_id": "a1", "kind": "IDLE_WARNING", "ts_ms": T0, "cluster": "c1", "job_id": "j1", "node": "n1",
        "device_uuids": ["GPU-a"], "user": None, "team": None, "project": None, "idle_minutes": 45,
        "cost_so_far": None, "action": None, "action_at_ms": None, "dry_run": True, "message": "idle",
        "appeal_route": None, "emitted_ts_ms": None,
    }  # fmt: skip
    settings = Settings(
        state_dir=tmp_path,
        kafka=KafkaSettings(bootstrap_servers=broker.bootstrap, topic_prefix=prefix),
        broker=BrokerSettings(enabled=False),
    )
    handled = threading.Event()
    stop = StopSignal(15.0, name="chat")  # requested below, as SIGTERM would (signals are the processors' test)
    result: list[int] = []
    loop = threading.Thread(
        target=lambda: result.append(consume_records(settings, ALERTS, prefix + "chat", lambda _: handled.set(), stop)),
        daemon=True,
    )
    publish(broker.bootstrap, prefix, [(ALERTS, job_key("c1", "j1"), alert)])
    loop.start()
    assert handled.wait(60), "the alert was not consumed"
    with frozen(broker):
        time.sleep(2.0)  # the commit after the batch, and the heartbeats, now wait on a frozen broker
        t0 = time.monotonic()
        stop.request()
        loop.join(STOP_WITHIN_S * 2)
        took = time.monotonic() - t0
    assert not loop.is_alive(), "consume_records did not return"
    assert result == [1]
    assert took < STOP_WITHIN_S


def test_processors_stop_within_the_deadline_once_the_broker_is_gone(broker: LocalBroker, tmp_path: Path) -> None:
    proc, log = _processors(broker, tmp_path)
    broker.stop()
    try:
        time.sleep(3.0)  # the connections are refused; commits wait for a coordinator
        rc, took = _exit_after(proc, signal.SIGTERM)
    finally:
        broker.start(timeout=180)
    text = log.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert took < STOP_WITHIN_S, text[-3000:]
