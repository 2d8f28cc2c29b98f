"""Real Slurm 22.05 outputs from the live cluster of the tests (tests/fixtures/slurm/live-22.05, see its
PROVENANCE.md): what they hold, and what the poller makes of them.

- `sacct --json` over a window without jobs exits 0 with slurmdbd's "Nothing found" error (9003) and no
  jobs: an empty answer, not a failure (the poller's first cycle on a quiet cluster failed on it).
- Without `gres/gpu` in AccountingStorageTRES (Slurm's default), squeue's `tres_alloc_str` and sacct's TRES
  carry no GPUs; squeue's `tres_per_node` says `gres:gpu:a100:2`, a spelling the parser did not read.
- A job last seen pending whose accounting names its node but carries no GPU TRES keeps that node, with
  the GPUs it asked for.
- Without accounting (`AccountingStorageType=accounting_storage/none`, as `scontrol show config` says),
  sacct exits 1: the poller warns once and polls without it; any other sacct failure fails the cycle.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from fixtures_events import ListSink

from base.errors import ServiceError
from producers.jobevents import EventContext
from producers.slurm import parse_capture
from producers.slurm_poller import PollState, SlurmPoller, accounting_storage_type, step

LIVE = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "live-22.05"
CTX = EventContext("notres")


def jobs_of(name: str) -> dict[str, Any]:
    return {j.job_id: j for j in parse_capture((LIVE / name).read_text(encoding="utf-8")).jobs}


def held(event: dict[str, Any]) -> dict[str, int]:
    return {a["node"]: len(a["devices"]) for a in event["allocations"]}


def test_sacct_nothing_found_is_an_empty_answer() -> None:
    cap = parse_capture((LIVE / "sacct-empty.json").read_text(encoding="utf-8"))
    assert (cap.kind, cap.jobs, cap.slurm_version) == ("sacct-json", (), "22.05.8")


def test_squeue_gpu_request_without_gpu_tres() -> None:
    jobs = jobs_of("squeue-notres-pending.json")
    running, pending = jobs["1"], jobs["2"]
    assert (running.state, [(g.node, g.indices, g.gpu_type) for g in running.gpus]) == (
        "RUNNING", [("gpu-node-1", (2, 3), "a100")])  # fmt: skip
    assert (pending.state, pending.gpu_count, pending.gpus) == ("PENDING", 2, ())  # from `gres:gpu:a100:2`
    for job in jobs_of("squeue-noacct-completed.json").values():
        assert job.state == "COMPLETED" and [(g.node, g.count) for g in job.gpus] == [("gpu-node-1", 2)]


def test_accounting_without_gpu_tres_keeps_the_nodes_of_a_job_last_seen_pending() -> None:
    state = PollState()
    listing = list(parse_capture((LIVE / "squeue-notres-pending.json").read_text(encoding="utf-8")).jobs)
    first = step(state, listing, [], 1_796_190_100_000, CTX)
    assert [(e["job_id"], e["event_type"]) for e in first] == [("1", "STARTED"), ("2", "SUBMITTED")]
    accounting = list(parse_capture((LIVE / "sacct-notres-completed.json").read_text(encoding="utf-8")).jobs)
    assert all(j.gpu_count == 0 and j.nodes == ("gpu-node-1",) for j in accounting)  # no GPU TRES, a node
    second = step(state, [], accounting, 1_796_190_160_000, CTX)
    got = {(e["job_id"], e["event_type"]): e for e in second}
    assert sorted(got) == [("1", "ENDED"), ("2", "ENDED"), ("2", "STARTED")]
    started = got[("2", "STARTED")]
    assert held(started) == {"gpu-node-1": 2} and started["requested_devices"] == 2
    assert got[("2", "ENDED")]["exit_state"] == got[("1", "ENDED")]["exit_state"] == "COMPLETED"
    by_id = {j.job_id: j for j in accounting}
    assert started["ts_ms"] == by_id["2"].start_ms and got[("2", "ENDED")]["ts_ms"] == by_id["2"].end_ms


class Cluster:
    """squeue answers with a live capture; sacct fails as it did on the live cluster; scontrol show config
    answers with the live cluster's configuration (or fails)."""

    def __init__(self, config: str | None) -> None:
        self.config = config
        self.calls: list[str] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.calls.append(argv[0] if argv[0] != "scontrol" else " ".join(argv[:3]))
        if argv[0] == "squeue":
            return (LIVE / "squeue-noacct-pending.json").read_text(encoding="utf-8")
        if argv[0] == "sacct":
            raise ServiceError(f"{' '.join(argv)} exited 1: Slurm accounting storage is disabled")
        if list(argv[:3]) == ["scontrol", "show", "config"] and self.config is not None:
            return self.config
        raise ServiceError(f"{' '.join(argv)} exited 1: Unable to contact slurm controller")


def test_without_accounting_the_poller_warns_once_and_polls_on(caplog: pytest.LogCaptureFixture) -> None:
    config = (LIVE / "scontrol-show-config-noacct.txt").read_text(encoding="utf-8")
    assert accounting_storage_type(config) == "accounting_storage/none"
    runner = Cluster(config)
    poller = SlurmPoller(CTX, ListSink(), runner=runner, clock=lambda: 1_796_190_100_000)
    with caplog.at_level(logging.WARNING, logger="producers.slurm_poller"):
        events = poller.poll_once() + poller.poll_once()
    assert [(e["job_id"], e["event_type"]) for e in events] == [("1", "STARTED"), ("2", "SUBMITTED")]
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["Slurm accounting is disabled on this cluster"]
    assert runner.calls.count("sacct") == 1 and runner.calls.count("scontrol show config") == 1


def test_any_other_sacct_failure_still_fails_the_cycle() -> None:
    for config in (None, "AccountingStorageType   = accounting_storage/slurmdbd\n"):
        poller = SlurmPoller(CTX, ListSink(), runner=Cluster(config), clock=lambda: 1_796_190_100_000)
        with pytest.raises(ServiceError, match="sacct"):
            poller.poll_once()
        assert not poller.accounting_disabled
