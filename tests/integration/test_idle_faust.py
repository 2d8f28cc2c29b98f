"""The job stage as faust agents (`processors/idle_agents.py`) against the runtime's job stage, on the real broker.

The same job events and device-minutes go to two topic sets; the runtime's job stage (`processors run
--stage job`) reads one, a faust worker the other. Their job-minutes, alerts and actions must be the same
sets, keyed as the sinks dedupe them (job-minute: cluster/job/minute; alert: alert_id; action: action_id),
every copy of a key identical (`emitted_ts_ms`, the wall clock, aside). Then the faust worker is killed
with SIGKILL mid-run, twice, while input keeps arriving, and restarted: the same sets again, the idle
states recovered from the Table's changelog.

Throughput, recovery and memory of both, measured on a larger input, are in docs/benchmarks.md ("The job
stage on faust").
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from test_processor_harness import REPO, create_topics, decode_all, publish, read_all, start_worker, worker_env

from processors.testing import T0, job_event, job_rows
from schemas.codec import AvroCodec
from schemas.topics import (
    ALERTS,
    DEVICE_MINUTES,
    JOB_DEVICE_MINUTES,
    JOB_EVENTS,
    JOB_MINUTES,
    RECLAIM_ACTIONS,
    Topic,
    job_key,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
POLICY = {
    "IDLE__IDLE_AFTER_MIN_BATCH": "3",
    "IDLE__IDLE_AFTER_MIN_INTERACTIVE": "2",
    "IDLE__GRACE_MIN": "2",
    "IDLE__RATE_PER_DEVICE_HOUR": '{"hopper": 2.5}',
    "COMMIT_INTERVAL_MS": "500",
}
Record = tuple[Topic, bytes, dict[str, Any]]


# ------------------------------------------------------------------------------------------------ input
def _row(job: str, node: str, dev: str, minute_ms: int, kind: str) -> dict[str, Any]:
    """A DeviceMinute as the node stage writes it; `kind`: busy, idle or dark."""
    active, idle, dark = {"busy": (60, 0, 0), "idle": (0, 60, 0), "dark": (0, 0, 60)}[kind]
    measured = kind != "dark"
    return {
        "cluster": "c1", "node": node, "device_uuid": dev, "mig_instance_id": None, "minute_start_ms": minute_ms,
        "model": "NVIDIA H100 80GB HBM3", "generation": "hopper", "job_id": job, "user": "ana",
        "project": "proj-a", "team": "vision", "cost_centre": "cc-1", "preemptible": False,
        "pricing_tier": "on-prem", "unallocated_s": 0, "allocated_s": 60, "active_s": active, "starved_s": 0,
        "idle_s": idle, "dark_s": dark, "sm_weighted_s": 45.0 if active else 0.0,
        "sample_count": 60 if measured else 0, "activity_mean_ratio": (0.75 if active else 0.0) if measured else None,
        "activity_max_ratio": (0.9 if active else 0.0) if measured else None,
        "fb_used_mib_max": 1024.0 if measured else None, "power_w_mean": 100.0 if measured else None,
        "mapping_version": "dcgm-3.x/1", "classifier_version": "c1",
    }  # fmt: skip


def _kind(i: int, m: int) -> str:
    """Job i's activity in minute m: four patterns (always idle; busy; idle then busy; idle with dark gaps)."""
    pattern = i % 4
    if pattern == 0:
        return "idle"
    if pattern == 1:
        return "busy"
    if pattern == 2:
        return "busy" if (m // 7) % 2 else "idle"
    return "dark" if m % 9 == 8 else "idle"


def workload(jobs: int, minutes: int, chunks: int = 1) -> list[list[Record]]:
    """Job starts, then device-minutes minute by minute (every job: 1, 2 or 4 devices on 1 or 2 nodes), then
    the ends; split into `chunks` consecutive parts of the minutes."""
    layout: dict[str, dict[str, list[str]]] = {}
    for i in range(jobs):
        width = (1, 2, 4)[i % 3]
        nodes = [f"n{(i * 2 + k) % 97}" for k in range(1 if width == 1 else 2)]
        devs = [f"GPU-{i}-{d}" for d in range(width)]
        layout[f"j{i}"] = {n: devs[k :: len(nodes)] for k, n in enumerate(nodes)}
    starts: list[Record] = []
    for i, (job, alloc) in enumerate(layout.items()):
        ev = job_event("STARTED", job, T0, alloc, interactive=i % 4 == 3, checkpointable=i % 8 == 0)
        starts.append((JOB_EVENTS, job_key("c1", job), ev))
    parts: list[list[Record]] = [[] for _ in range(chunks)]
    parts[0].extend(starts)
    for m in range(minutes):
        chunk = parts[min(chunks - 1, m * chunks // minutes)]
        for i, (job, alloc) in enumerate(layout.items()):
            for node, devs in alloc.items():  # one bundle a node, as the node stage sends them
                rows = [_row(job, node, dev, T0 + m * 60_000, _kind(i, m)) for dev in devs]
                chunk.append((JOB_DEVICE_MINUTES, job_key("c1", job), job_rows(rows)))
    for job in layout:
        parts[-1].append((JOB_EVENTS, job_key("c1", job), job_event("ENDED", job, T0 + minutes * 60_000)))
    return parts


# ------------------------------------------------------------------------------------------------ outputs
Outputs = dict[str, dict[Any, str]]


def outputs(bootstrap: str, prefix: str) -> tuple[Outputs, dict[str, int]]:
    """Job-minutes, alerts and actions keyed as the sinks dedupe them, each value the record as JSON (an
    alert without `emitted_ts_ms`); raises if two copies of one key differ. Also the raw record counts."""
    keyed: Outputs = {}
    raw: dict[str, int] = {}
    for topic, key_of in (
        (JOB_MINUTES, lambda r: (r["cluster"], r["job_id"], r["minute_start_ms"])),
        (ALERTS, lambda r: r["alert_id"]),
        (RECLAIM_ACTIONS, lambda r: r["action_id"]),
    ):
        records = decode_all(read_all(bootstrap, prefix + topic.name), topic.subject)
        raw[topic.name] = len(records)
        seen: dict[Any, str] = {}
        for _, rec in records:
            rec = {k: v for k, v in rec.items() if k != "emitted_ts_ms"}
            k, v = key_of(rec), json.dumps(rec, sort_keys=True)
            assert seen.setdefault(k, v) == v, f"two different {topic.name} records for {k}:\n{seen[k]}\n{v}"
        keyed[topic.name] = seen
    return keyed, raw


NO_LEADER_YET = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)


def count(bootstrap: str, prefix: str, topic: Topic) -> int:
    """Records in the topic (sum of its partitions' end offsets): cheap enough to poll while a worker runs.
    0 while a partition has no leader yet (a topic just created on a busy broker): the callers poll."""
    name = prefix + topic.name
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "counter"})
    try:
        parts = c.list_topics(name, timeout=10).topics[name].partitions
        return sum(c.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1] for p in parts)
    except KafkaException as exc:
        if exc.args[0].code() not in NO_LEADER_YET:
            raise
        return 0
    finally:
        c.close()


# ------------------------------------------------------------------------------------------------ workers
def faust_env(bootstrap: str, prefix: str, state: Path) -> dict[str, str]:
    env = worker_env(bootstrap, prefix, state, **{k.lower(): v for k, v in POLICY.items()})
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_faust(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "processors.idle_agents", "--event-time", "-l", "info"],
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


def peak_rss_mib(proc: subprocess.Popen[bytes]) -> float | None:
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def until(cond: Callable[[], bool], what: str, timeout_s: float, log: Path | None = None, step_s: float = 0.2) -> float:
    """Seconds until `cond()`; fails after `timeout_s` with the worker's log tail."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            tail = log.read_text(errors="replace")[-4000:] if log is not None and log.exists() else ""
            pytest.fail(f"timed out waiting for {what}\n{tail}")
        time.sleep(step_s)
    return time.monotonic() - t0


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_reference(bootstrap: str, prefix: str, state: Path, log: Path, n_jm: int) -> dict[str, float | None]:
    """The runtime's job stage over the whole input (it exits once idle); when its first and its last
    (the `n_jm`-th) job-minute were out, its peak memory."""
    env = worker_env(bootstrap, prefix, state, **{k.lower(): v for k, v in POLICY.items()})
    t0 = time.monotonic()
    proc = start_worker(env, "--stage", "job", "--exit-when-idle", "3", log=log)
    peak = first = last = None
    while proc.poll() is None:
        peak = peak_rss_mib(proc) or peak
        if last is None:
            n = count(bootstrap, prefix, JOB_MINUTES)
            first = first if first is not None or n == 0 else time.monotonic() - t0
            last = time.monotonic() - t0 if n >= n_jm else None
        time.sleep(0.05)
        assert time.monotonic() - t0 < 600, log.read_text()[-3000:]
    assert proc.returncode == 0, log.read_text()[-3000:]
    return {"first_s": first, "all_s": last, "peak_rss_mib": peak}


# ------------------------------------------------------------------------------------------------ tests
def _prefixes() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"ref-{tag}.", f"fst-{tag}."


def test_faust_job_stage_matches_the_runtime_and_survives_kill_9(kafka_bootstrap: str, tmp_path: Path) -> None:
    ref, fst = _prefixes()
    for prefix in (ref, fst):
        create_topics(kafka_bootstrap, prefix, PARTITIONS)
    chunks = workload(jobs=40, minutes=30, chunks=3)
    publish(kafka_bootstrap, ref, [r for c in chunks for r in c])
    run_reference(kafka_bootstrap, ref, tmp_path / "ref", tmp_path / "ref.log", 40 * 30)
    want, want_raw = outputs(kafka_bootstrap, ref)
    n_jm = len(want[JOB_MINUTES.name])
    assert n_jm == 40 * 30 and want[ALERTS.name] and want[RECLAIM_ACTIONS.name], want_raw

    env, log = faust_env(kafka_bootstrap, fst, tmp_path / "fst"), tmp_path / "faust.log"
    publish(kafka_bootstrap, fst, chunks[0])
    proc = start_faust(env, log)
    kills, at_kill = 0, []
    try:
        until(lambda: count(kafka_bootstrap, fst, JOB_MINUTES) > 0, "first outputs", 180, log)
        for chunk in chunks[1:]:
            # The next part arrives while the worker runs; it is killed as soon as that part's outputs start
            # to flow: mid-input, its newest outputs and states in flight.
            before, running = count(kafka_bootstrap, fst, JOB_MINUTES), proc
            publish(kafka_bootstrap, fst, chunk)

            def flowing(before: int = before, running: subprocess.Popen[bytes] = running) -> bool:
                return count(kafka_bootstrap, fst, JOB_MINUTES) > before or running.poll() is not None

            until(flowing, "outputs", 180, log, step_s=0.02)
            assert proc.poll() is None, log.read_text()[-4000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            at_kill.append(count(kafka_bootstrap, fst, JOB_MINUTES))
            with log.open("a") as f:
                f.write(f"\n---- restart after kill -9 #{kills} ----\n")
            proc = start_faust(env, log)

        def complete() -> bool:
            rows = decode_all(read_all(kafka_bootstrap, fst + JOB_MINUTES.name), JOB_MINUTES.subject)
            return len({(r["job_id"], r["minute_start_ms"]) for _, r in rows}) >= n_jm

        try:
            until(complete, "every job-minute", 300, log, step_s=1.0)
        except pytest.fail.Exception as exc:  # say which job-minutes never came, by job: the next lead
            out = decode_all(read_all(kafka_bootstrap, fst + JOB_MINUTES.name), JOB_MINUTES.subject)
            have = {(r["cluster"], r["job_id"], r["minute_start_ms"]) for _, r in out}
            by_job: dict[str, list[int]] = {}
            for cluster, job, minute in sorted(set(want[JOB_MINUTES.name]) - have):
                by_job.setdefault(f"{cluster}/{job}", []).append(minute)
            lines = [f"{job}: {len(ms)} minute(s) from {ms[0]}" for job, ms in sorted(by_job.items())]
            pytest.fail(f"job-minutes never emitted, {len(lines)} job(s): {lines[:20]}; outputs at each kill "
                        f"{at_kill}\n{exc}")
        time.sleep(3)  # anything still in flight (a duplicate must dedupe, not differ)
    finally:
        stop(proc)
    got, got_raw = outputs(kafka_bootstrap, fst)
    assert kills == 2
    for name in (JOB_MINUTES.name, ALERTS.name, RECLAIM_ACTIONS.name):
        missing = sorted(set(want[name]) - set(got[name]))[:5]
        extra = sorted(set(got[name]) - set(want[name]))[:5]
        assert not missing and not extra, f"{name}: missing {missing}, extra {extra}"
        diff = [k for k in want[name] if want[name][k] != got[name][k]][:3]
        assert not diff, f"{name}: differ at {diff}: {want[name][diff[0]]} vs {got[name][diff[0]]}"
    print(f"\nreference raw counts {want_raw}; faust raw counts after 2 x kill -9 {got_raw}")
    print(f"job-minute records out at each kill -9: {at_kill} of {n_jm}")
    assert "restored" in log.read_text(), "the restarted worker restored no idle state from the changelog"


def test_the_agents_serve_their_metrics_records_lag_and_alert_latency(kafka_bootstrap: str, tmp_path: Path) -> None:
    """`processors agents` serves /metrics (component "agents", what `gpuledger status` reads): every input record
    read, every output sent, each alert's latency, and the lag back to 0 once the input is read."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    _, prefix = _prefixes()
    create_topics(kafka_bootstrap, prefix, PARTITIONS)
    records = [r for c in workload(jobs=8, minutes=12) for r in c]
    publish(kafka_bootstrap, prefix, records)
    env, log = faust_env(kafka_bootstrap, prefix, tmp_path / "state"), tmp_path / "agents.log"
    env["GPULEDGER_METRICS__BASE_PORT"] = "0"
    proc = start_faust(env, log)
    try:
        until(lambda: count(kafka_bootstrap, prefix, JOB_MINUTES) >= 8 * 12, "every job-minute", 180, log)
        port_file = tmp_path / "state" / "metrics" / "agents.port"
        until(port_file.exists, "the agents' metrics port file", 30, log)
        url = f"http://127.0.0.1:{int(port_file.read_text())}/metrics"

        def scraped() -> dict[tuple[str, str], float]:
            """The endpoint as Prometheus's own client library parses the exposition format."""
            out: dict[tuple[str, str], float] = {}
            for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
                for s in family.samples:
                    if s.labels.get("component") == "agents":
                        key = (s.name.removeprefix("gpuledger_"), s.labels.get("topic") or s.labels.get("kind") or "")
                        out[key] = out.get(key, 0.0) + s.value
            return out

        dm, jm, alerts = prefix + JOB_DEVICE_MINUTES.name, prefix + JOB_MINUTES.name, prefix + ALERTS.name
        n_dm = sum(1 for topic, _, _ in records if topic is JOB_DEVICE_MINUTES)

        def read_all_of_it() -> bool:
            now = scraped()
            return now.get(("records_in_total", dm), 0) >= n_dm and now.get(("consumer_lag_records", dm)) == 0

        until(read_all_of_it, "every device-minute read and no lag", 60, log)
        got = scraped()
    finally:
        stop(proc)
    n_alerts = count(kafka_bootstrap, prefix, ALERTS)
    assert n_alerts > 0
    assert got[("records_out_total", jm)] == count(kafka_bootstrap, prefix, JOB_MINUTES)
    assert got[("records_out_total", alerts)] == n_alerts
    assert got[("records_in_total", prefix + JOB_EVENTS.name)] >= 16  # 8 starts and 8 ends
    latencies = sum(v for (name, _), v in got.items() if name == "alert_latency_seconds_count")
    assert latencies == n_alerts, got


def test_hostile_bundles_are_dead_lettered_whole_and_both_job_stages_go_on_exactly(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Bundles that do not decode (a truncated item, a value in no framing, more items than the bound) go to
    `processors.job-device-minutes.v1.dlq` with the reason, from the runtime's job stage and from the agents
    alike; every other bundle makes exactly the job-minutes of a run without them."""
    clean, ref, fst = f"cln-{uuid.uuid4().hex[:8]}.", *_prefixes()
    chunks = workload(jobs=4, minutes=6, chunks=2)
    codec = AvroCodec()
    item = codec.encode(DEVICE_MINUTES.subject, _row("j1", "n2", "GPU-1-0", T0, "idle"))
    hostile = {
        b"c1/j1": (codec.encode(JOB_DEVICE_MINUTES.subject, {"rows": [item, item[:25]]}), "device-minute 1 of"),
        b"c1/j2": (b"\x01 neither framing", "MalformedRecord"),
        b"c1/j3": (codec.encode(JOB_DEVICE_MINUTES.subject, {"rows": [item] * 513}), "at most 512"),
    }
    for prefix in (clean, ref, fst):
        create_topics(kafka_bootstrap, prefix, PARTITIONS)
        publish(kafka_bootstrap, prefix, chunks[0])
        if prefix != clean:
            producer = Producer({"bootstrap.servers": kafka_bootstrap})
            for key, (value, _) in hostile.items():
                producer.produce(prefix + JOB_DEVICE_MINUTES.name, key=key, value=value)
            assert producer.flush(30) == 0
        publish(kafka_bootstrap, prefix, chunks[1])
    n_jm = 4 * 6
    run_reference(kafka_bootstrap, clean, tmp_path / "clean", tmp_path / "clean.log", n_jm)
    run_reference(kafka_bootstrap, ref, tmp_path / "ref", tmp_path / "ref.log", n_jm)
    env, log = faust_env(kafka_bootstrap, fst, tmp_path / "fst"), tmp_path / "faust.log"
    proc = start_faust(env, log)
    try:
        until(lambda: count(kafka_bootstrap, fst, JOB_MINUTES) >= n_jm, "every job-minute", 180, log)
        until(lambda: count(kafka_bootstrap, fst, Topic(JOB_DEVICE_MINUTES.dlq, "deadletter", "")) >= 3,
              "the dead letters", 60, log)  # fmt: skip
    finally:
        stop(proc)
    want, _ = outputs(kafka_bootstrap, clean)
    assert len(want[JOB_MINUTES.name]) == n_jm
    for prefix in (ref, fst):
        got, _ = outputs(kafka_bootstrap, prefix)
        assert got[JOB_MINUTES.name] == want[JOB_MINUTES.name], prefix
        assert got[ALERTS.name].keys() == want[ALERTS.name].keys(), prefix
        dead = decode_all(read_all(kafka_bootstrap, prefix + JOB_DEVICE_MINUTES.dlq), "deadletter")
        by_key = {rec["key"]: rec for _, rec in dead}
        assert by_key.keys() == hostile.keys(), (prefix, [rec["error_message"] for _, rec in dead])
        for key, (value, reason) in hostile.items():
            assert by_key[key]["value"] == value, (prefix, key)
            assert reason in f"{by_key[key]['error_class']}: {by_key[key]['error_message']}", (prefix, by_key[key])
