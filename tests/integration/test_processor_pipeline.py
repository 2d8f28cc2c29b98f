"""The processors on a real broker: the simulator's expected ledger, 1 vs 4 partitions, kill -9 replays.

Every run publishes the same simulated cluster (plus one undecodable record) to fresh topics, runs
`gpuledger processors run --exit-when-idle` as a separate process and reads what it wrote.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from test_processor_harness import (
    SIM_IDLE,
    create_topics,
    decode_all,
    publish,
    read_all,
    start_worker,
    wait,
    worker_env,
)

from processors.pipeline import LEDGER_FIELDS, ledger_from_job_minutes
from producers.simulator import SimConfig, expected_ledger, simulate

pytestmark = pytest.mark.integration

CFG = SimConfig(seed=3, nodes=4, duration_s=3600)


@pytest.fixture(scope="module")
def records() -> list[Any]:
    return list(simulate(CFG))


class Run:
    def __init__(self, bootstrap: str, prefix: str, state: Path) -> None:
        self.bootstrap, self.prefix, self.state = bootstrap, prefix, state

    def raw(self, topic: str) -> list[tuple[bytes | None, bytes]]:
        return read_all(self.bootstrap, self.prefix + topic)

    def unique(self, topic: str, subject: str, key: tuple[str, ...]) -> dict[tuple[Any, ...], bytes]:
        """Output records by their identity; re-emitted copies must be byte-identical."""
        out: dict[tuple[Any, ...], bytes] = {}
        for value, rec in decode_all(self.raw(topic), subject):
            k = tuple(rec[f] for f in key)
            assert out.setdefault(k, value) == value, f"re-emitted {topic} record {k} differs"
        return out

    def job_minutes(self) -> list[dict[str, Any]]:
        return [r for _, r in decode_all(self.raw("usage.job-minutes.v1"), "usage.job-minutes")]


def _setup(bootstrap: str, records: list[Any], partitions: int, tmp: Path) -> Run:
    prefix = f"pt{uuid.uuid4().hex[:8]}."
    create_topics(bootstrap, prefix, partitions)
    bad = Producer({"bootstrap.servers": bootstrap})
    bad.produce(prefix + "telemetry.device-samples.v1", key=b"sim/garbage", value=b"\x00not avro")
    bad.flush(10)
    publish(bootstrap, prefix, records)
    state = tmp / prefix
    state.mkdir()
    return Run(bootstrap, prefix, state)


def _run_to_end(run: Run, timeout_s: float = 240) -> None:
    env = worker_env(run.bootstrap, run.prefix, run.state, **SIM_IDLE)
    proc = start_worker(env, "--exit-when-idle", "3", log=run.state / "worker.log")
    assert wait(proc, timeout_s) == 0, (run.state / "worker.log").read_text()[-3000:]


def _expected() -> dict[str, dict[str, int]]:
    return {j: {f: getattr(led, f) for f in LEDGER_FIELDS} for j, led in expected_ledger(CFG).items()}


DM_KEY = ("cluster", "node", "device_uuid", "minute_start_ms", "job_id")
JM_KEY = ("cluster", "job_id", "minute_start_ms")


@pytest.fixture(scope="module")
def four(kafka_bootstrap: str, records: list[Any], tmp_path_factory: pytest.TempPathFactory) -> Run:
    run = _setup(kafka_bootstrap, records, 4, tmp_path_factory.mktemp("four"))
    _run_to_end(run)
    return run


def test_ledger_matches_simulator_over_four_partitions(four: Run) -> None:
    jm = four.unique("usage.job-minutes.v1", "usage.job-minutes", JM_KEY)
    assert len(jm) == len(four.job_minutes())  # nothing emitted twice without a crash
    assert ledger_from_job_minutes(four.job_minutes()) == _expected()
    alerts = decode_all(four.raw("alerts.v1"), "alerts")
    kinds = Counter(r["kind"] for _, r in alerts)
    assert kinds["IDLE_WARNING"] >= 1 and kinds["COVERAGE_GAP"] >= 1
    actions = decode_all(four.raw("actions.reclaim.v1"), "actions.reclaim")
    assert actions and all(r["dry_run"] for _, r in actions)


def test_bad_record_is_dead_lettered_not_fatal(four: Run) -> None:
    (dlq,) = decode_all(four.raw("telemetry.device-samples.v1.dlq"), "deadletter")
    assert dlq[1]["source_topic"] == four.prefix + "telemetry.device-samples.v1"
    assert dlq[1]["value"] == b"\x00not avro"


def test_one_partition_gives_the_same_ledger(
    kafka_bootstrap: str, records: list[Any], four: Run, tmp_path: Path
) -> None:
    one = _setup(kafka_bootstrap, records, 1, tmp_path)
    _run_to_end(one)
    assert ledger_from_job_minutes(one.job_minutes()) == _expected()
    assert one.unique("usage.device-minutes.v1", "usage.device-minutes", DM_KEY) == four.unique(
        "usage.device-minutes.v1", "usage.device-minutes", DM_KEY
    )
    assert one.unique("usage.job-minutes.v1", "usage.job-minutes", JM_KEY) == four.unique(
        "usage.job-minutes.v1", "usage.job-minutes", JM_KEY
    )


def _committed(run: Run) -> int:
    c = Consumer({"bootstrap.servers": run.bootstrap, "group.id": run.prefix + "processors.node"})
    try:
        tps = [TopicPartition(run.prefix + "telemetry.device-samples.v1", p) for p in range(4)]
        return sum(max(tp.offset, 0) for tp in c.committed(tps, timeout=10))
    finally:
        c.close()


def test_kill_9_five_times_gives_the_undisturbed_ledger(
    kafka_bootstrap: str, records: list[Any], four: Run, tmp_path: Path
) -> None:
    run = _setup(kafka_bootstrap, records, 4, tmp_path)
    env = worker_env(run.bootstrap, run.prefix, run.state, COMMIT_INTERVAL_MS="300", **SIM_IDLE)
    rng = random.Random(5)
    kills = 0
    last = -1
    for _ in range(5):
        proc = start_worker(env, log=run.state / "worker.log")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _committed(run) <= last:
            time.sleep(0.2)
        time.sleep(rng.uniform(0.1, 0.6))  # somewhere inside a minute window
        last = _committed(run)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
    assert kills == 5
    _run_to_end(run)
    for topic, subject, key in (
        ("usage.device-minutes.v1", "usage.device-minutes", DM_KEY),
        ("usage.job-minutes.v1", "usage.job-minutes", JM_KEY),
        ("usage.coverage-minutes.v1", "usage.coverage-minutes", ("cluster", "node", "minute_start_ms")),
    ):
        assert run.unique(topic, subject, key) == four.unique(topic, subject, key), topic
    dedup = {tuple(r[f] for f in JM_KEY): r for r in run.job_minutes()}
    assert ledger_from_job_minutes(dedup.values()) == _expected()
    ids = {r["alert_id"] for _, r in decode_all(run.raw("alerts.v1"), "alerts") if r["job_id"]}
    assert ids == {r["alert_id"] for _, r in decode_all(four.raw("alerts.v1"), "alerts") if r["job_id"]}
    actions = {r["action_id"] for _, r in decode_all(run.raw("actions.reclaim.v1"), "actions.reclaim")}
    assert actions == {r["action_id"] for _, r in decode_all(four.raw("actions.reclaim.v1"), "actions.reclaim")}
