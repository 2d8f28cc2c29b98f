"""Fault injection on a replicated broker (issue 21): three KRaft nodes from the project's launcher
(`stack.broker.LocalCluster`), every topic with three replicas and `min.insync.replicas` 2
(`GPULEDGER_KAFKA__REPLICATION_FACTOR=3`, as `broker.nodes = 3` sets it), the producers acks=all and
idempotent (`base/kafka.py`).

Both runs have three processes of each kind (`processors run`, `processors agents`), as
`processor.instances = 3` makes `up` start them: they share every stage's partitions through their consumer
groups, and a node stage waits for job events another process re-keys through the group's commits.

A run in which the node leading the samples topic's first partition is killed -9 mid-run (the simulator
publishing, the processors, agents and sink reading and committing) and started again 15 s later, after
which a fourth process of each kind joins and, while the groups rebalance for it, the third of each kind is
killed -9. That run must leave in ClickHouse exactly the suite's undisturbed run's ledger (one broker, one
process of each kind: `conftest.baseline`), device-minute by device-minute, with nothing dead-lettered,
nothing late and no re-emitted record that differs from its first copy: neither the replicas nor the number
of processes changes a second of it.

Run: `.venv/bin/pytest -m fault tests/fault/test_fault_replicated.py`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from fault_harness import (
    INSTANCES,
    SIM,
    Baseline,
    PipelineRun,
    ReplicatedRun,
    ReplicatedStack,
    assert_same_ledger,
    check_consistent,
    finish_and_read,
    log,
    wait_until,
)

from producers.simulator import simulate
from schemas.topics import DEVICE_SAMPLES

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

DOWN_S = 15.0  # longer than the controller's broker session timeout (9 s): the node is fenced, leaders move
REBALANCING_S = 4.0  # a joining process is imported and asking to join by then: the groups are rebalancing


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedStack]:
    s = ReplicatedStack(tmp_path_factory.mktemp("fault-replicated")).start()
    try:
        yield s
    finally:
        s.close()


def _assert_replicated(stack: ReplicatedStack, run: PipelineRun) -> None:
    """Every topic of the run has three replicas on the broker (the catalogue's and the changelog)."""
    admin = AdminClient({"bootstrap.servers": stack.bootstrap})
    topics = {n: t for n, t in admin.list_topics(timeout=10).topics.items() if n.startswith(run.prefix)}
    assert run.topic(DEVICE_SAMPLES) in topics and run.topic("processors.idle-state.v1") in topics
    for name, t in topics.items():
        assert all(len(p.replicas) == 3 for p in t.partitions.values()), name


def test_one_node_of_three_killed_9_and_restarted_mid_run(
    replicated: ReplicatedStack, baseline: Baseline, tmp_path: Any
) -> None:
    with ReplicatedRun(replicated, "rep-kill", tmp_path) as run:
        run.start_pipeline()
        total = sum(1 for r in simulate(SIM) if r[0] is DEVICE_SAMPLES)
        wait_until(lambda: run.samples_published() > total // 3, 180, "the simulator to publish a third", 0.1)
        wait_until(lambda: run.stored("device_minutes") > 0, 180, "the first device-minutes in ClickHouse", 0.1)
        admin = AdminClient({"bootstrap.servers": replicated.bootstrap})
        samples = run.topic(DEVICE_SAMPLES)
        victim = admin.list_topics(samples, timeout=10).topics[samples].partitions[0].leader
        published = run.samples_published()
        replicated.cluster.kill(victim)
        log(f"rep-kill: node {victim} killed -9 after {published} of {total} samples published")
        time.sleep(DOWN_S)
        run.check_alive(run.sink, run.processors, run.agents)  # two nodes serve: nobody noticed a failure
        during = run.samples_published()
        replicated.cluster.start_node(victim)
        log(f"rep-kill: node {victim} back; {during} samples published while it was down")
        run.check_alive(run.sink, run.processors, run.agents, *run.more)  # (the simulator may have finished)
        # A fourth process of each kind joins; while the groups rebalance for it, the third of each is killed -9.
        joining = [run.start_more(kind, INSTANCES + 1) for kind in ("processors", "agents")]
        time.sleep(REBALANCING_S)
        victims = [p for p in run.more if p.name in (f"processors-{INSTANCES}", f"agents-{INSTANCES}")]
        for proc in victims:
            run.kill(proc)
        log(f"rep-kill: {[p.name for p in joining]} joined, {[p.name for p in victims]} killed -9 "
            f"after {run.samples_published()} of {total} samples published")  # fmt: skip
        led = finish_and_read(run)
        _assert_replicated(replicated, run)
        assert run.samples_published() == total
        assert run.dlq_counts() == {}, "records were dead-lettered"
        assert run.late_count() == 0
        run.assert_reemitted_identical()
        check_consistent(led)
        assert_same_ledger(led, baseline.ledger)
        assert led.jobs == baseline.expected
