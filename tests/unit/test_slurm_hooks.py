"""Prolog/Epilog hook (spool, never blocks) and the spool drain; jobcomp/kafka records."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures_events import ListSink

from base.errors import ServiceError
from producers.devicemap import InMemoryDeviceMap
from producers.jobevents import EventContext
from producers.slurm_jobcomp import StartIndex, jobcomp_events, parse_jobcomp
from producers.slurm_spool import drain

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "deploy" / "slurm" / "gpuledger_hook.py"


PROLOG_ENV = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_ACCOUNT": "physics",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURMD_NODENAME": "gpu1",
    "SLURM_CLUSTER_NAME": "hpc",
    "SLURM_JOB_GPUS": "0,2-3",
    "SLURM_JOB_START_TIME": "1762529652",
    "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
}


def _run_script(script: str, kind_env: dict, spool: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "GPULEDGER_SPOOL": str(spool), "GPULEDGER_HOOK": str(HOOK),
           "GPULEDGER_PYTHON": sys.executable, **kind_env}
    return subprocess.run(["sh", str(ROOT / "deploy" / "slurm" / script)], env=env, capture_output=True, timeout=30)


def test_prolog_and_epilog_spool_and_exit_zero(tmp_path):
    spool = tmp_path / "spool"
    started = time.monotonic()
    assert _run_script("prolog.sh", PROLOG_ENV, spool).returncode == 0
    epilog_env = {**PROLOG_ENV, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURM_JOB_EXIT_CODE2": "0:0"}
    assert _run_script("epilog.sh", epilog_env, spool).returncode == 0
    assert time.monotonic() - started < 10
    files = sorted(spool.glob("*.json"))
    assert [json.loads(f.read_text())["kind"] for f in files] == ["start", "end"]
    assert json.loads(files[0].read_text())["env"]["SLURM_JOB_GPUS"] == "0,2-3"


def test_hook_never_fails_even_when_the_spool_is_unwritable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert _run_script("prolog.sh", PROLOG_ENV, blocker / "spool").returncode == 0
    spec = importlib.util.spec_from_file_location("gpuledger_hook", HOOK)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    assert hook.main(["hook", "start", "--spool", str(blocker / "spool")]) == 0


def _spool(tmp_path: Path, envs: list[tuple[str, dict]]) -> Path:
    spec = importlib.util.spec_from_file_location("gpuledger_hook", HOOK)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    spool = tmp_path / "spool"
    for i, (kind, env) in enumerate(envs):
        hook.spool(hook.build(kind, env, 1762529700 + i * 60), str(spool))
    return spool


def test_drain_publishes_then_deletes(tmp_path):
    spool = _spool(tmp_path, [("start", PROLOG_ENV), ("end", {**PROLOG_ENV, "SLURM_JOB_EXIT_CODE2": "1:0"})])
    (spool / "junk.json").write_text("{not json")
    devmap = InMemoryDeviceMap()
    devmap.set("hpc", "gpu1", 2, "GPU-two")
    sink = ListSink()
    sent, bad = drain(spool, EventContext("hpc", devices=devmap), sink, flush=lambda: None)
    assert (sent, bad) == (2, 1)
    start, end = (r for _, _, r in sink.records)
    assert (start["event_type"], start["ts_ms"], start["job_id"], start["user"]) == (
        "STARTED", 1762529652000, "4242", "alice")
    assert start["allocations"] == [{"node": "gpu1", "devices": [
        {"index": 0, "uuid": None, "mig_instance_id": None, "mig_profile": None},
        {"index": 2, "uuid": "GPU-two", "mig_instance_id": None, "mig_profile": None},
        {"index": 3, "uuid": None, "mig_instance_id": None, "mig_profile": None}]}]
    assert (end["event_type"], end["exit_state"], end["exit_code"]) == ("ENDED", "FAILED", 1)
    assert list(spool.glob("*.json")) == []
    assert (spool / "bad" / "junk.json").exists() and (spool / "bad" / "junk.json.reason").exists()


def test_drain_keeps_files_when_kafka_is_down(tmp_path):
    spool = _spool(tmp_path, [("start", PROLOG_ENV)])

    def down():
        raise ServiceError("1 records not delivered within 30s")

    with pytest.raises(ServiceError):
        drain(spool, EventContext("hpc"), ListSink(), flush=down)
    assert len(list(spool.glob("*.json"))) == 1
    sent, _ = drain(spool, EventContext("hpc"), ListSink(), flush=lambda: None)
    assert sent == 1 and list(spool.glob("*.json")) == []


def test_cuda_visible_devices_uuids(tmp_path):
    env = {k: v for k, v in PROLOG_ENV.items() if k != "SLURM_JOB_GPUS"}
    env["CUDA_VISIBLE_DEVICES"] = "GPU-aaa,GPU-bbb"
    sink = ListSink()
    drain(_spool(tmp_path, [("start", env)]), EventContext("hpc"), sink, flush=lambda: None)
    (rec,) = [r for _, _, r in sink.records]
    assert [d["uuid"] for d in rec["allocations"][0]["devices"]] == ["GPU-aaa", "GPU-bbb"]


# jobcomp/kafka: a record with the 23.11 field list (SOURCES.md), describing fixture job 9 once finished
JOBCOMP_2311 = {
    "jobid": 9, "container": "", "username": "dperez", "user_id": 10004, "groupname": "scientists",
    "group_id": 10001, "@start": "2025-11-07T15:34:12", "@end": "2025-11-07T15:35:12", "elapsed": 60,
    "partition": "gpu", "alloc_node": "login", "nodes": "gpu1", "total_cpus": 1, "total_nodes": 1,
    "derived_ec": "0:0", "exit_code": "0:0", "state": "COMPLETED", "failed_node": "", "cpu_hours": 0.016,
    "array_job_id": 0, "array_task_id": 4294967294, "pack_job_id": 0, "pack_job_offset": 4294967294,
    "het_job_id": 0, "het_job_offset": 4294967294, "@submit": "2025-11-07T15:34:12",
    "@eligible": "2025-11-07T15:34:12", "@queue_wait": 0, "work_dir": "/home/dperez", "std_err": "",
    "std_in": "/dev/null", "std_out": "", "cluster": "hpc", "qos": "normal", "ntasks": 1, "ntasks_per_node": 0,
    "ntasks_per_tres": 0, "cpus_per_task": 1, "orig_dependency": "", "excluded_nodes": "", "features": "",
    "time_limit": 1, "job_name": "wrap", "reservation_name": "", "wc_key": "*atlas",
    "tres_req": "cpu=1,mem=512M,node=1,billing=1,gres/gpu=4",
    "tres_alloc": "cpu=1,mem=512M,node=1,billing=1,gres/gpu=4", "account": "acoustic", "script": "",
    "parent_accounts": "/root/acoustic",
}


def test_jobcomp_parse_and_events_join_with_start():
    job = parse_jobcomp(JOBCOMP_2311)
    assert (job.job_id, job.state, job.user, job.gpu_count, job.nodes, job.wckey) == (
        "9", "COMPLETED", "dperez", 4, ("gpu1",), "atlas")
    assert (job.start_ms, job.end_ms, job.exit_code) == (1762529652000, 1762529712000, 0)
    ctx = EventContext("hpc")
    # no start seen: STARTED (indices unknown) + ENDED with the real times
    evs = jobcomp_events(JOBCOMP_2311, ctx)
    assert [(e["event_type"], e["ts_ms"]) for e in evs] == [("STARTED", 1762529652000), ("ENDED", 1762529712000)]
    assert [d["index"] for d in evs[0]["allocations"][0]["devices"]] == [None] * 4
    # start seen with indices (e.g. from the poller): ENDED only, same id as the poller's ENDED
    starts = StartIndex()
    devices = [{"index": i, "uuid": None, "mig_instance_id": None, "mig_profile": None} for i in range(4)]
    starts.observe({"event_type": "STARTED", "cluster": "hpc", "job_id": "9",
                    "allocations": [{"node": "gpu1", "devices": devices}]})
    (ended,) = jobcomp_events(JOBCOMP_2311, ctx, starts)
    assert ended["event_type"] == "ENDED" and ended["exit_state"] == "COMPLETED"


def test_jobcomp_node_map_fills_indices_for_whole_node_jobs():
    devmap = InMemoryDeviceMap()
    for i in range(4):
        devmap.set("hpc", "gpu1", i, f"GPU-{i}")
    started, _ = jobcomp_events(JOBCOMP_2311, EventContext("hpc", devices=devmap))
    assert [d["uuid"] for d in started["allocations"][0]["devices"]] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]


def test_jobcomp_2505_start_record_and_array_ids():
    rec = {**JOBCOMP_2311, "state": "RUNNING", "@end": None, "array_job_id": 8, "array_task_id": 1, "jobid": 9}
    rec.pop("@queue_wait")
    (ev,) = jobcomp_events(rec, EventContext("hpc"))
    assert (ev["event_type"], ev["job_id"], ev["array_job_id"], ev["array_task_id"]) == ("STARTED", "8_1", "8", 1)
