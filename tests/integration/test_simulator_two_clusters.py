"""Both simulated clusters on a real broker: the Slurm-like one and the Kubernetes one beside it (Kueue gang,
MIG pods, pods started while the watcher runs, one whose devices the watcher learns only at its next label
refresh) published by the simulator's `run`, processed by `gpuledger processors run --exit-when-idle`, give the
simulator's expected ledger of both, to the second."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from test_processor_harness import SIM_IDLE, create_topics, decode_all, read_all, start_worker, wait, worker_env

from base.settings import KafkaSettings
from processors.pipeline import LEDGER_FIELDS, ledger_from_job_minutes
from producers.simulator import SimConfig, expected_ledger, run
from producers.simulator.kube import cluster_plan
from producers.simulator.model import clusters
from schemas.topics import JOB_EVENTS
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

CFG = SimConfig(seed=11, nodes=2, duration_s=600, kube_nodes=3)


def test_two_clusters_processed_equal_the_expected_ledger_of_both(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"tc{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 2)
    stats = run(CFG, RecordPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)))
    assert stats.records["sched.job-events.v1"] > 0

    proc = start_worker(
        worker_env(kafka_bootstrap, prefix, tmp_path, **SIM_IDLE), "--exit-when-idle", "3", log=tmp_path / "worker.log"
    )
    assert wait(proc, 120) == 0, (tmp_path / "worker.log").read_text()[-3000:]

    rows = [r for _, r in decode_all(read_all(kafka_bootstrap, prefix + "usage.job-minutes.v1"), "usage.job-minutes")]
    expected = expected_ledger(CFG)
    assert {r["cluster"] for r in rows} == {"sim", "sim-k8s"}
    assert {led.cluster for led in expected.values()} == {"sim", "sim-k8s"}
    kube_pods = [j for j, led in expected.items() if led.cluster == "sim-k8s"]
    assert any(expected[j].gpus == 4 for j in kube_pods) and any(j.count("/") == 1 for j in kube_pods)
    # A pod whose labels the watcher reads only at its next label refresh: a count-only STARTED, then the UPDATED
    # naming its GPUs; the expected ledger holds that many unidentified devices dark over the lag.
    kube = next(c for c in clusters(CFG) if c.scheduler == "kube")
    (lagging,) = [j for j in cluster_plan(kube).jobs if j.labels_s is not None]
    assert lagging.labels_s is not None
    events = [e for _, e in decode_all(read_all(kafka_bootstrap, prefix + JOB_EVENTS.name), JOB_EVENTS.subject)]
    mine = {e["event_type"]: e for e in events if e["job_id"] == lagging.job_id}
    assert set(mine) == {"SUBMITTED", "STARTED", "UPDATED", "ENDED"}
    assert all(d["uuid"] is None for a in mine["STARTED"]["allocations"] for d in a["devices"])
    assert all(d["uuid"] for a in mine["UPDATED"]["allocations"] for d in a["devices"])
    assert mine["UPDATED"]["ts_ms"] - mine["STARTED"]["ts_ms"] == (lagging.labels_s - lagging.start_s) * 1000 > 0
    gpus, lag_s = len(lagging.devices), lagging.labels_s - lagging.start_s
    dark = [c["dark_s"] for n, c in expected[lagging.job_id].devices.items() if "/unidentified:" in n]
    assert dark == [lag_s] * gpus
    assert ledger_from_job_minutes(rows) == {
        j: {f: getattr(led, f) for f in LEDGER_FIELDS} for j, led in expected.items()
    }
