"""Faults at scale (issue 44 item 5): 10,000 GPUs (a simulated cluster of 125 nodes of 8 GPUs sent as 10 clusters,
recorded once and replayed at 1 Hz, `scale_harness`), three KRaft nodes (every topic three replicas,
min.insync.replicas 2), three processes of `processors run` (the node stage split over its consumer group) and of
`processors agents`, one sink, the embedded ClickHouse server.

One undisturbed run at scale (`conftest.scale_baseline`) is checked against the simulator's own ledger, cluster by
cluster. Each
scenario then gets its own run under the same load and must leave in ClickHouse exactly the undisturbed ledger
(`fault_harness.assert_same_ledger`: per job seconds, every device-, job- and coverage-minute row, the alert ids),
with nothing dead-lettered, nothing late and no re-emitted record that differs from its first copy:

a. one broker (the samples topic's first leader) killed -9 a third of the way in, started again 15 s later;
b. two brokers killed -9 at once, for 30 s: every partition below min.insync.replicas (the load's publisher, the
   exporters' own, holds and retries; nothing fails delivery);
c. the ClickHouse server down for GPULEDGER_FAULT_SCALE_OUTAGE_S (default 60 s), its catch-up timed;

Each scenario's figures (records the load's publisher held, time below min ISR, catch-up) are logged and appended
to GPULEDGER_FAULT_SCALE_FIGURES when set.

Run: `make fault-scale`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from fault_harness import (
    LEDGER_FIELDS,
    Baseline,
    Ledger,
    ReplicatedStack,
    assert_same_ledger,
    check_consistent,
    finish_and_read,
    log,
    wait_until,
)
from scale_harness import (
    SCALE_SECONDS,
    Recording,
    ScaleRun,
    committed_past,
    end_offsets,
    figures_line,
    per_cluster_jobs,
    under_replicated,
)

from schemas.topics import DEVICE_SAMPLES
from stack.broker import metadata_ok

pytestmark = [pytest.mark.fault_scale, pytest.mark.timeout(1500)]

AT_S = SCALE_SECONDS // 3  # the run second a fault begins at
DOWN_S = 15.0  # longer than the controller's broker session timeout (9 s): the node is fenced, leaders move
DOWN2_S = 30.0  # two nodes down: 37,500 node scrapes the cluster cannot take
OUTAGE_S = float(os.environ.get("GPULEDGER_FAULT_SCALE_OUTAGE_S", "60"))  # ClickHouse down


def _assert_clean(run: ScaleRun, led: Ledger, base: Baseline) -> None:
    assert run.dlq_counts() == {}, "records were dead-lettered"
    assert run.late_count() == 0
    run.assert_reemitted_identical()
    assert_same_ledger(led, base.ledger)


def _held_between(run: ScaleRun, t0: float, t1: float) -> int:
    """The most records the load's publisher held between `t0` and `t1` (monotonic clock)."""
    assert run.load is not None
    start = run.load.started_at
    return max((held for at, held in run.load.figures.queued if t0 - start <= at <= t1 - start), default=0)


def test_undisturbed_run_at_scale_matches_the_simulator(scale_baseline: Baseline, recording: Recording) -> None:
    led = scale_baseline.ledger
    check_consistent(led)
    assert per_cluster_jobs(led) == dict.fromkeys(recording.clusters, recording.expected)
    assert scale_baseline.dlq == {} and scale_baseline.late == 0
    gpus = recording.copies * recording.config.nodes * recording.config.gpus_per_node
    assert len({(r[0], r[2]) for r in led.device_minutes}) == gpus == 10_000
    totals = led.totals()
    assert totals["allocated_s"] == sum(totals[f] for f in LEDGER_FIELDS[1:])
    assert totals["dark_s"] > 0  # the dead exporter's nodes


def test_one_broker_killed_9_and_back_at_scale(
    scale_stack: ReplicatedStack, scale_baseline: Baseline, recording: Recording, tmp_path: Any
) -> None:
    with ScaleRun(scale_stack, "scale-kill1", tmp_path, recording) as run:
        run.start_pipeline()
        run.wait_second(AT_S)
        samples = run.topic(DEVICE_SAMPLES)
        admin = AdminClient({"bootstrap.servers": scale_stack.bootstrap})
        victim = admin.list_topics(samples, timeout=10).topics[samples].partitions[0].leader
        t0 = time.monotonic()
        scale_stack.cluster.kill(victim)
        log(f"scale-kill1: node {victim} killed -9 at run second {run.second}")
        time.sleep(DOWN_S)
        run.check_alive(run.sink, run.processors, run.agents, *run.more)  # two nodes serve: nobody noticed
        scale_stack.cluster.start_node(victim)
        t1 = time.monotonic()
        topics = run.run_topics()
        wait_until(lambda: under_replicated(scale_stack.bootstrap, topics, 3) == 0, 240, "every replica in sync", 0.5)
        t2 = time.monotonic()
        log(f"scale-kill1: node {victim} back at run second {run.second}, every replica in sync {t2 - t1:.1f} s later")
        led = finish_and_read(run)
        assert run.load is not None
        figures_line("a one broker killed and back", {
            "down_s": round(t1 - t0, 1), "in_sync_after_s": round(t2 - t1, 1),
            "held_most_while_down": _held_between(run, t0, t1), "held_most": run.load.figures.most_queued,
            "overran_s": run.load.figures.overran, "load_cpu_s": round(run.load.figures.cpu_s, 2),
            "records": run.load.figures.sent, "timings": run.timings,
        })  # fmt: skip
        _assert_clean(run, led, scale_baseline)


def test_two_brokers_down_at_once_at_scale(
    scale_stack: ReplicatedStack, scale_baseline: Baseline, recording: Recording, tmp_path: Any
) -> None:
    """Two of the three nodes killed -9 together: every partition is below its min.insync.replicas (and the KRaft
    quorum, combined nodes, is lost with them), so no record can be acknowledged. The load's publisher holds its
    records and retries (none fails delivery: `Load` raises if one does); the processes keep running; once the
    nodes are back everything held is delivered and the ledger is the undisturbed one."""
    with ScaleRun(scale_stack, "scale-kill2", tmp_path, recording) as run:
        run.start_pipeline()
        run.wait_second(AT_S)
        victims = sorted(scale_stack.cluster.nodes)[1:]
        topics = run.run_topics()
        t0 = time.monotonic()
        for node in victims:
            scale_stack.cluster.kill(node)
        log(f"scale-kill2: nodes {victims} killed -9 at run second {run.second}")
        time.sleep(DOWN2_S)
        run.check_alive(run.sink, run.processors, run.agents, *run.more)  # waiting, not dead
        t1 = time.monotonic()
        # One after the other, from this thread: the first back makes a quorum with the survivor. (Started together
        # from two pool threads, both nodes exited before writing a line, once; not diagnosed.) `start_node` returns
        # at once here: without a quorum nothing fenced them, so the survivor's metadata still lists both; each is
        # serving once it answers on its own address, and only then do the in-sync replicas the metadata shows mean
        # anything.
        for node in victims:
            scale_stack.cluster.start_node(node)
        for node in victims:
            own = {"bootstrap.servers": scale_stack.cluster.nodes[node].bootstrap}
            wait_until(lambda own=own: metadata_ok(own), 240, f"node {node} to answer", 0.2)
        t2 = time.monotonic()
        wait_until(lambda: under_replicated(scale_stack.bootstrap, topics, 2) == 0, 240, "min.insync.replicas", 0.2)
        t3 = time.monotonic()
        load = run.load
        assert load is not None
        # The publisher's backlog acknowledged: it holds no more than two seconds of the load again.
        drained = 2 * recording.scrapes_per_second
        wait_until(lambda: load.publisher.queued <= drained, 300, "the publisher's backlog to be acknowledged", 0.2)
        t4 = time.monotonic()
        wait_until(lambda: under_replicated(scale_stack.bootstrap, topics, 3) == 0, 240, "every replica in sync", 0.5)
        t5 = time.monotonic()
        held = _held_between(run, t0, t4)
        log(f"scale-kill2: nodes answer {t2 - t0:.1f} s after the kill, min ISR met {t3 - t0:.1f} s after it, "
            f"the publisher's {held:,} held records acknowledged {t4 - t0:.1f} s after it")  # fmt: skip
        led = finish_and_read(run)
        figures_line("b two brokers down at once", {
            "down_s": round(t1 - t0, 1), "answering_after_kill_s": round(t2 - t0, 1),
            "below_min_isr_s": round(t3 - t0, 1), "acknowledged_again_after_kill_s": round(t4 - t0, 1),
            "all_in_sync_after_kill_s": round(t5 - t0, 1), "held_most": held,
            "held_most_run": load.figures.most_queued, "overran_s": load.figures.overran,
            "load_cpu_s": round(load.figures.cpu_s, 2), "records": load.figures.sent, "timings": run.timings,
        })  # fmt: skip
        # The publisher held what it could not send: about the seconds the cluster took nothing, whole.
        assert held >= recording.scrapes_per_second * int(DOWN2_S) // 2
        _assert_clean(run, led, scale_baseline)


def test_clickhouse_down_at_scale(
    scale_stack: ReplicatedStack, scale_baseline: Baseline, recording: Recording, tmp_path: Any
) -> None:
    """The ClickHouse server stopped a third of the way in for OUTAGE_S (default 60; the issue's 5 minutes is
    measured by bench/fault_scale_outage.py): the sink retries and commits nothing it has not stored; once the
    server is back it catches up (every record the topics held at that moment stored and committed: the
    catch-up time) and the ledger is the undisturbed one."""
    with ScaleRun(scale_stack, "scale-ch", tmp_path, recording) as run:
        run.start_pipeline()
        run.wait_second(AT_S)
        wait_until(lambda: run.stored("device_minutes") > 0, 240, "the first device-minutes in ClickHouse", 0.2)
        lag_before = run.sink_lag()
        t0 = time.monotonic()
        scale_stack.stop_clickhouse()
        log(f"scale-ch: ClickHouse stopped at run second {run.second} (sink lag {lag_before:,})")
        time.sleep(OUTAGE_S)
        run.check_alive(run.sink)
        behind = run.sink_lag()
        scale_stack.start_clickhouse()
        t1 = time.monotonic()
        ends = end_offsets(scale_stack.bootstrap, [run.topic(t) for t in run.SINK_TOPICS])
        wait_until(lambda: committed_past(scale_stack.bootstrap, run.sink_group, ends), 600, "the sink's catch-up", 0.5)
        t2 = time.monotonic()
        log(f"scale-ch: back at run second {run.second}, {behind:,} records behind; caught up in {t2 - t1:.1f} s")
        led = finish_and_read(run)
        assert run.load is not None
        figures_line("c ClickHouse down", {
            "outage_s": round(t1 - t0, 1), "records_behind_at_return": behind, "catch_up_s": round(t2 - t1, 1),
            "overran_s": run.load.figures.overran, "records": run.load.figures.sent, "timings": run.timings,
        })  # fmt: skip
        assert behind >= recording.scrapes_per_second * int(OUTAGE_S) // 2  # the sink stored nothing while it was down
        _assert_clean(run, led, scale_baseline)
