"""Fault injection, end to end: the real broker, the embedded ClickHouse server, the simulator (its two
clusters: Slurm-like and Kubernetes, `fault_harness.SIM`), the processors and the sinks as separate processes
(tests/fault/fault_harness.py).

One undisturbed run is computed once for the session (`conftest.py`) and checked against the simulator's expected
ledger. Each fault then gets its own run (own topics, groups and database) and must leave in
ClickHouse exactly the undisturbed ledger (per job allocated/active/starved/idle/dark seconds, and
every device-, job- and coverage-minute row), with nothing in any dead-letter topic:

1. the processors (rekey and node) and the job-stage agents killed -9 five times each during the run
   (restarted each time);
2. the broker stopped and restarted while the simulator publishes;
3. the ClickHouse server down for GPULEDGER_FAULT_OUTAGE_S seconds (default 60) mid-run;
4. the sink killed -9 mid-batch, three times;
5. duplicated, out-of-order and late events;
6. the exporter upgrade mid-run (mapping versions change in ClickHouse, ledger still exact).

Run: `make fault` (or `.venv/bin/pytest -m fault tests/fault`).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import pytest
from fault_harness import (
    LEDGER_FIELDS,
    SIM,
    Baseline,
    Ledger,
    PipelineRun,
    Stack,
    assert_same_ledger,
    check_consistent,
    finish_and_read,
    log,
    wait_until,
)

from producers.simulator import simulate
from producers.simulator.run import WithinGrace
from producers.simulator.stream import exporter_version_at
from producers.simulator.telemetry import exporter_profile
from schemas.topics import DEVICE_SAMPLES, JOB_EVENTS, Topic

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

OUTAGE_S = float(os.environ.get("GPULEDGER_FAULT_OUTAGE_S", "60"))


def _assert_clean(run: PipelineRun, led: Ledger, base: Baseline, late: int = 0) -> None:
    assert run.dlq_counts() == {}, "records were dead-lettered"
    assert len(set(run.late_records())) == late
    run.assert_reemitted_identical()
    assert_same_ledger(led, base.ledger)
    assert led.jobs == base.expected


def test_undisturbed_run_matches_the_simulator(baseline: Baseline) -> None:
    led = baseline.ledger
    check_consistent(led)
    assert baseline.cli_expected == baseline.expected  # `simulate run --ledger` wrote the same ledger
    assert led.jobs == baseline.expected
    assert baseline.dlq == {} and baseline.late == 0
    totals = led.totals()
    # The run exercises every class: the dead exporter and the silent device leave dark seconds.
    assert all(totals[f] > 0 for f in LEDGER_FIELDS), totals
    assert totals["allocated_s"] == sum(totals[f] for f in LEDGER_FIELDS[1:])


def test_processors_killed_9_five_times(stack: Stack, baseline: Baseline, tmp_path: Any) -> None:
    rng = random.Random(9)
    with PipelineRun(stack, "kill-proc", tmp_path) as run:
        run.start_pipeline()
        wait_until(lambda: run.samples_published() > 0, 120, "the simulator to start publishing", 0.1)
        last = 0
        for i in range(5):
            # Each kill lands after the worker made progress (a commit moved), inside a window; once
            # the input is all read the commits stop moving (live jobs hold them) and it is killed anyway.
            deadline = time.monotonic() + 15
            while run.node_committed() <= last and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.1, 0.8))
            last = run.node_committed()
            run.kill(run.processors)
            log(f"kill-proc: kill -9 #{i + 1} at committed offset {last} of {run.samples_published()} samples")
            run.start_processors()
            # The job stage's worker too, once it has processed input (it restarts in about 10 s: the next
            # kill may land while it recovers its Table, which is a fault too).
            deadline = time.monotonic() + 15
            while run.agents_events() == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.1, 0.8))
            events = run.agents_events()
            run.kill(run.agents)
            log(f"kill-proc: agents kill -9 #{i + 1} after {events} input records")
            run.start_agents()
        led = finish_and_read(run)
        _assert_clean(run, led, baseline)


def test_broker_stop_and_restart_mid_run(stack: Stack, baseline: Baseline, tmp_path: Any) -> None:
    with PipelineRun(stack, "broker", tmp_path) as run:
        run.start_pipeline()
        total = sum(1 for r in simulate(SIM) if r[0] is DEVICE_SAMPLES)
        wait_until(lambda: run.samples_published() > total // 4, 120, "the simulator to publish a quarter", 0.1)
        wait_until(lambda: run.stored("device_minutes") > 0, 120, "the first device-minutes in ClickHouse", 0.1)
        published = run.samples_published()
        t0 = time.monotonic()
        stack.stop_broker()
        log(f"broker: stopped after {published} of {total} samples published ({time.monotonic() - t0:.1f} s)")
        time.sleep(5)
        t1 = time.monotonic()
        stack.start_broker()
        log(f"broker: restarted ({time.monotonic() - t1:.1f} s; down {time.monotonic() - t0:.1f} s)")
        run.check_alive(run.sink, run.processors, run.agents)  # every client rides out the outage
        led = finish_and_read(run)
        assert run.samples_published() == total
        _assert_clean(run, led, baseline)


def test_clickhouse_down_mid_run(stack: Stack, baseline: Baseline, tmp_path: Any) -> None:
    with PipelineRun(stack, "clickhouse", tmp_path) as run:
        try:
            run.start_pipeline()
            wait_until(lambda: run.stored("device_minutes") > 0, 120, "the first device-minutes in ClickHouse", 0.1)
            stack.stop_clickhouse()
            log(f"clickhouse: stopped for {OUTAGE_S:.0f} s")
            time.sleep(OUTAGE_S)
            run.check_alive(run.sink)  # the sink waits for ClickHouse rather than exiting
            assert run.sink_lag() > 0  # records arrived during the outage and wait for the warehouse
            stack.start_clickhouse()
            log("clickhouse: back")
            led = finish_and_read(run)
            assert run.sink is not None
            assert "ClickHouse unavailable, retrying" in run.tail(run.sink, 10**7)
            _assert_clean(run, led, baseline)
        finally:
            if stack.ch is None:
                stack.start_clickhouse()


def test_sink_killed_9_mid_batch(stack: Stack, baseline: Baseline, tmp_path: Any) -> None:
    # The sink starts on a backlog (the simulator done, the processors' output waiting) and lands it 50 records a
    # batch: however fast or loaded the machine, many batches still wait at each kill. (Killed while the pipeline
    # still ran, a restarted sink on a loaded CI machine once drained the rest before the third kill.)
    with PipelineRun(stack, "kill-sink", tmp_path, sink_batch=50) as run:
        run.start_simulator()
        run.start_processors()
        run.start_agents()
        run.wait_simulator()
        wait_until(lambda: run.sink_lag() >= 3000, 180, "a backlog of 3,000 records for the sink", 0.5)
        run.start_sink()
        kills = 0
        last = 0
        deadline = time.monotonic() + 240
        while kills < 3 and time.monotonic() < deadline:
            # Kill right after a batch landed (its offsets moved) while more wait: the next one is mid-way.
            done = run.sink_committed()
            if done > last and run.sink_lag() > 0:
                run.kill(run.sink)
                kills += 1
                last = run.sink_committed()
                log(f"kill-sink: kill -9 #{kills} at {last} records committed, lag {run.sink_lag()}")
                run.start_sink()
            time.sleep(0.02)
        assert kills == 3
        led = finish_and_read(run)
        _assert_clean(run, led, baseline)


def _reordered(records: list[tuple[Topic, bytes, dict[str, Any]]], rng: random.Random, events_twice: bool) -> list[Any]:
    """Out of order within the grace (samples shuffled in 5 s blocks) and duplicated (a tenth of the
    samples again up to 8 s later; job events twice when asked): all inside the 10 s grace."""
    blocks: dict[int, list[Any]] = {}
    for rec in records:
        blocks.setdefault(rec[2]["ts_ms"] // 5000, []).append(rec)
    out: list[Any] = []
    carry: list[tuple[int, Any]] = []  # (block index to emit in, record)
    for b in sorted(blocks):
        events = [r for r in blocks[b] if r[0] is not DEVICE_SAMPLES]
        samples = [r for r in blocks[b] if r[0] is DEVICE_SAMPLES]
        rng.shuffle(samples)
        out.extend(events)
        if events_twice:
            out.extend(events)
        out.extend(samples)
        for s in samples:
            if rng.random() < 0.1:
                carry.append((b + rng.randint(0, 1), s))
        due = [r for when, r in carry if when <= b]
        carry = [(when, r) for when, r in carry if when > b]
        out.extend(due)
    out.extend(r for _, r in carry)
    return out


def test_duplicated_out_of_order_and_late_events(stack: Stack, baseline: Baseline, tmp_path: Any) -> None:
    rng = random.Random(5)
    with PipelineRun(stack, "dup-late", tmp_path) as run:
        run.start_sink()
        run.start_processors()
        run.start_agents()
        records = list(simulate(SIM))
        mid_ms = SIM.start_ms + SIM.duration_s * 1000 // 2
        first = _reordered([r for r in records if r[2]["ts_ms"] < mid_ms], rng, True)
        second = _reordered([r for r in records if r[2]["ts_ms"] >= mid_ms], rng, True)
        pub = run.publisher()
        ordered = WithinGrace(pub)  # "within the grace" holds at the broker, not just in this list
        for topic, key, rec in first:
            ordered.publish(topic, key, rec)
        pub.flush()
        n_first = sum(1 for r in first if r[0] is DEVICE_SAMPLES)
        stats = run.root / "processors-stats.json"

        def read_first() -> bool:
            try:
                s = json.loads(stats.read_text())
            except (OSError, ValueError):
                return False
            return bool(s["scrapes"] >= n_first and s["lag_records"] == 0)

        wait_until(read_first, 120, "the processors to read the first half")
        # Late beyond the grace: copies of samples from the first three minutes, published when the
        # watermark is half-way through the run. They go to the late topic, counted; the ledger does
        # not change (those seconds were counted from the originals).
        early = [r for r in records if r[0] is DEVICE_SAMPLES and r[2]["ts_ms"] < SIM.start_ms + 180_000]
        late = rng.sample(early, 25)
        for topic, key, rec in late:
            pub.publish(topic, key, rec)
        for topic, key, rec in second:
            ordered.publish(topic, key, rec)
        pub.flush()
        dup_samples = len([r for r in first + second if r[0] is DEVICE_SAMPLES]) - len(
            [r for r in records if r[0] is DEVICE_SAMPLES]
        )
        dup_events = len([r for r in first + second if r[0] is JOB_EVENTS]) - len(
            [r for r in records if r[0] is JOB_EVENTS]
        )
        log(f"dup-late: {dup_samples} duplicated samples, {dup_events} duplicated job events, {len(late)} late")
        assert dup_samples > 500
        run.finish()
        led = run.ledger()
        log(f"dup-late: {run.timings} rows {led.rows_final}")
        assert run.dlq_counts() == {}, "records were dead-lettered"
        assert len(set(run.late_records())) == len(late)
        assert led.jobs == baseline.ledger.jobs == baseline.expected  # the per-job ledger (job_minutes)
        assert led.job_minutes == baseline.ledger.job_minutes
        assert_same_ledger(led, baseline.ledger)


def test_exporter_upgrade_mid_run(baseline: Baseline) -> None:
    """The simulator upgrades dcgm-exporter half-way (3.4.0 -> 4.7.1: renamed labels and fields, new
    units); ClickHouse shows the mapping version change at that minute and the ledger stays exact."""
    assert SIM.upgrade_second is not None and SIM.upgrade_to is not None
    old = exporter_profile(SIM.exporter_version).mapping_version
    new = exporter_profile(SIM.upgrade_to).mapping_version
    assert old != new
    assert exporter_version_at(SIM, SIM.upgrade_second) == SIM.upgrade_to
    upgrade_ms = SIM.start_ms + SIM.upgrade_second * 1000
    before = {v for m, v in baseline.ledger.mapping_versions if m + 60_000 <= upgrade_ms}
    after = {v for m, v in baseline.ledger.mapping_versions if m >= upgrade_ms}
    assert before == {old}
    assert after == {new}
    # Both sides of the upgrade carry allocated, classified seconds, and the ledger is the expected one.
    minutes = baseline.ledger.device_minutes
    assert any(r[4] + 60_000 <= upgrade_ms and r[6] > 0 for r in minutes)
    assert any(r[4] >= upgrade_ms and r[6] > 0 for r in minutes)
    assert baseline.ledger.jobs == baseline.expected
