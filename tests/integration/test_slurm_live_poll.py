"""`slurm poll` against the live Slurm (tests/fixtures_slurm.py): the real squeue, scontrol and sacct.

Jobs are submitted, finish, fail, are cancelled and requeued; the events the poller publishes, their
nodes and GPU indices, their times and exit states are compared with what Slurm itself says
(`scontrol show job -d` GRES IDX, sacct's State and Start/End). A cluster whose accounting is disabled
(`AccountingStorageType=accounting_storage/none`: sacct exits 1) is polled without reconciliation.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fixtures_cli import run_gpuledger
from fixtures_events import ListSink

from producers.jobevents import EventContext
from producers.slurm_poller import SlurmPoller
from stack.slurm.cluster import NODE, SlurmClient


def events_of(sink: ListSink, job_id: str) -> list[dict[str, Any]]:
    return [r for _, _, r in sink.records if r["job_id"] == job_id]


def types_of(sink: ListSink, job_id: str) -> list[str]:
    return [r["event_type"] for r in events_of(sink, job_id)]


def held(event: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {a["node"]: tuple(d["index"] for d in a["devices"]) for a in event["allocations"]}


def sacct_row(slurm: SlurmClient, job_id: str) -> dict[str, str]:
    """sacct's view of the job's latest run: State, Start, End (epoch seconds), NodeList, AllocTRES."""
    fields = ("State", "Start", "End", "NodeList", "AllocTRES")
    out = slurm.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", ",".join(fields),
                    env={**slurm.env, "SLURM_TIME_FORMAT": "%s"}).stdout.strip().splitlines()  # fmt: skip
    return dict(zip(fields, out[-1].split("|"), strict=True))


def poll_until(poller: SlurmPoller, done: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poller.poll_once()
        if done():
            return
        time.sleep(0.5)
    raise AssertionError(f"not seen within {timeout:g} s: {what}")


def test_poll_follows_jobs_that_run_finish_fail_are_requeued_and_cancelled(slurm: SlurmClient) -> None:
    sink = ListSink()
    poller = SlurmPoller(EventContext(slurm.cfg.cluster_name), sink)
    train = slurm.submit("--gres=gpu:h100:2", "--requeue", "-J", "train")
    slurm.wait_for_state(train, "RUNNING")
    poller.poll_once()
    idx_first = slurm.gres_indices(train)
    assert types_of(sink, train) == ["STARTED"]
    (started,) = events_of(sink, train)
    assert held(started) == idx_first and set(idx_first[NODE]) <= {0, 1}  # the h100 are indices 0-1
    # The uid beside the name: squeue's own `user_id` for the job, and `id -u` of its user.
    # squeue --json prints every job whatever the filters (Debian's Slurm 22.05), so the job is picked by its id.
    (listed,) = [j for j in json.loads(slurm.run("squeue", "--json").stdout)["jobs"] if str(j["job_id"]) == train]
    assert (started["user"], started["user_uid"]) == (listed["user_name"], str(listed["user_id"]))
    assert started["ts_ms"] == int(sacct_row(slurm, train)["Start"]) * 1000

    # Started and ended between two polls: slurmctld still lists them (MinJobAge) with Slurm's times, but no
    # longer which GPUs they held (no gres_detail once finished): one GPU each, index unknown.
    quick = slurm.submit("--gres=gpu:a100:1", wrap="sleep 1")
    broken = slurm.submit("--gres=gpu:a100:1", wrap="exit 3")
    slurm.wait_for_state(quick, "COMPLETED", timeout=30)
    slurm.wait_for_state(broken, "FAILED")
    poll_until(poller, lambda: "ENDED" in types_of(sink, quick) and "ENDED" in types_of(sink, broken),
               "the quick and the failed job ended")  # fmt: skip
    for job, state in ((quick, "COMPLETED"), (broken, "FAILED")):
        row = sacct_row(slurm, job)
        assert row["State"] == state and row["NodeList"] == NODE
        assert "gres/gpu:a100=1" in row["AllocTRES"]
        assert types_of(sink, job) == ["STARTED", "ENDED"], events_of(sink, job)
        start, end = events_of(sink, job)
        assert start["ts_ms"] == int(row["Start"]) * 1000 and end["ts_ms"] == int(row["End"]) * 1000
        assert end["exit_state"] == state
        assert held(start) == {NODE: (None,)}

    # Requeued: back in the queue (REQUEUED), then running again (STARTED) on the devices Slurm says.
    slurm.run("scontrol", "requeue", train)
    slurm.wait_for_state(train, "PENDING")
    poll_until(poller, lambda: types_of(sink, train)[-1:] == ["REQUEUED"], "the requeue")
    slurm.run("scontrol", "update", f"jobid={train}", "StartTime=now")  # a requeued job waits ~2 min otherwise
    slurm.wait_for_state(train, "RUNNING", timeout=30)
    poll_until(poller, lambda: types_of(sink, train) == ["STARTED", "REQUEUED", "STARTED"], "the restart")
    restarted = events_of(sink, train)[-1]
    assert held(restarted) == slurm.gres_indices(train)
    assert restarted["ts_ms"] == int(sacct_row(slurm, train)["Start"]) * 1000

    # Cancelled: ENDED with Slurm's own state and end time.
    slurm.run("scancel", train)
    slurm.wait_for_state(train, "CANCELLED")
    poll_until(poller, lambda: types_of(sink, train)[-1:] == ["ENDED"], "the cancellation")
    ended = events_of(sink, train)[-1]
    row = sacct_row(slurm, train)
    assert ended["exit_state"] == "CANCELLED" == row["State"].split()[0]
    assert ended["ts_ms"] == int(row["End"]) * 1000

    # Nothing twice: a few more polls add nothing.
    before = len(sink.records)
    for _ in range(2):
        poller.poll_once()
    assert len(sink.records) == before
    # Every event of every job carries the uid `id -u` gives for its user, from the scheduler.
    uids = {u: subprocess.run(["id", "-u", u], capture_output=True, text=True, check=True).stdout.strip()
            for u in {r["user"] for _, _, r in sink.records}}  # fmt: skip
    assert {(r["user_uid"], r["user_source"]) == (uids[r["user"]], "SCHEDULER") for _, _, r in sink.records} == {True}


def test_pending_job_is_submitted_and_cpu_jobs_are_not_followed(slurm: SlurmClient) -> None:
    sink = ListSink()
    poller = SlurmPoller(EventContext(slurm.cfg.cluster_name), sink)
    hog = slurm.submit("--gres=gpu:h100:2")
    waiting = slurm.submit("--gres=gpu:h100:1")
    cpu = slurm.submit(wrap="sleep 300")
    slurm.wait_for_state(hog, "RUNNING")
    slurm.wait_for_state(cpu, "RUNNING")
    assert slurm.state(waiting) == "PENDING"
    poller.poll_once()
    assert types_of(sink, waiting) == ["SUBMITTED"]
    assert events_of(sink, waiting)[0]["requested_devices"] == 1
    assert types_of(sink, cpu) == []  # GPU jobs only
    slurm.run("scancel", hog)
    slurm.wait_for_state(waiting, "RUNNING", timeout=30)
    poll_until(poller, lambda: "STARTED" in types_of(sink, waiting), "the waiting job's start")
    assert held(events_of(sink, waiting)[-1]) == slurm.gres_indices(waiting)


def test_poll_without_accounting_warns_once_and_keeps_polling(live_slurm_noacct: SlurmClient,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    """A cluster without slurmdbd (`AccountingStorageType=accounting_storage/none`): sacct exits 1 there,
    and the poller goes on with squeue and scontrol alone, after one warning."""
    slurm = live_slurm_noacct
    monkeypatch.setenv("SLURM_CONF", str(slurm.cfg.slurm_conf))
    refused = slurm.run("sacct", "--json", "-X", check=False)
    assert refused.returncode == 1 and "accounting storage is disabled" in refused.stderr
    sink = ListSink()
    poller = SlurmPoller(EventContext(slurm.cfg.cluster_name), sink)
    job = slurm.submit("--gres=gpu:a100:2", wrap="sleep 4")
    try:
        slurm.wait_for_state(job, "RUNNING")
        with caplog.at_level(logging.WARNING, logger="producers.slurm_poller"):
            poll_until(poller, lambda: types_of(sink, job) == ["STARTED"], "the start")
            slurm.wait_for_state(job, "COMPLETED", timeout=30)
            poll_until(poller, lambda: types_of(sink, job) == ["STARTED", "ENDED"], "the end, from the listing")
            poller.poll_once()
    finally:
        slurm.cancel_all()
    warnings = [r for r in caplog.records if "accounting is disabled" in r.getMessage()]
    assert len(warnings) == 1 and poller.accounting_disabled
    assert held(events_of(sink, job)[0]) == {NODE: (2, 3)}
    assert events_of(sink, job)[1]["exit_state"] == "COMPLETED"


def test_slurm_poll_command_dry_run_reads_the_cluster_of_slurm_conf(slurm: SlurmClient, live_slurm_noacct: SlurmClient,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    """The command as deployed: `gpuledger slurm poll --once --dry-run` finds the cluster through SLURM_CONF
    alone, with accounting and without (where it says so on stderr and still prints the events)."""
    for cluster, gres in ((slurm, "gpu:h100:1"), (live_slurm_noacct, "gpu:a100:1")):
        job = cluster.submit(f"--gres={gres}")
        try:
            cluster.wait_for_state(job, "RUNNING")
            expected = cluster.gres_indices(job)
            proc = run_gpuledger(["slurm", "poll", "--once", "--dry-run", "--state-dir", str(tmp_path)], cluster.env)
        finally:
            cluster.cancel_all()
        assert proc.returncode == 0, proc.stderr
        events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        (started,) = [e for e in events if e["job_id"] == job]
        assert started["event_type"] == "STARTED" and held(started) == expected
        assert ("accounting is disabled" in proc.stderr) == (cluster is live_slurm_noacct), proc.stderr
