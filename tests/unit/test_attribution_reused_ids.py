"""A job id used again by another job (a reinstalled Slurm counts from 1 again; issue 18): the allocation
table charges the second job to its own user and project, not to the first job's snapshot, and does not
treat it as ended; a requeued job (same id, same submit time) stays the same job."""

from __future__ import annotations

from typing import Any

from processors.attribution import AllocationTable
from processors.testing import T0, job_event

S = 1000


def ev(kind: str, ts: int, user: str, submit: int, gpu: str | None = "GPU-A") -> dict[str, Any]:
    e = job_event(kind, "7", ts, {"n1": [gpu]} if gpu and kind == "STARTED" else None, user=user,
                  project=f"p-{user}")  # fmt: skip
    e["submit_ts_ms"] = submit
    return e


def test_a_reused_id_is_another_job() -> None:
    t = AllocationTable()
    t.apply("n1", ev("STARTED", T0, "ana", T0 - 5 * S))
    t.apply("n1", ev("ENDED", T0 + 60 * S, "ana", T0 - 5 * S, None))
    t.apply("n1", ev("STARTED", T0 + 120 * S, "bob", T0 + 100 * S))  # the reinstalled scheduler's job 7
    first = t.owner_at("n1", "GPU-A", None, None, T0 + 30 * S)
    second = t.owner_at("n1", "GPU-A", None, None, T0 + 150 * S)
    assert second is not None and (second.user, second.project) == ("bob", "p-bob")
    assert first is not None  # ana's seconds stay allocated (to the job id), bob's are bob's
    assert t.owner_at("n1", "GPU-A", None, None, T0 + 90 * S) is None  # between the two jobs: nobody's
    assert t.job_ended_ms("c1/7") is None  # the new job runs


def test_a_requeued_job_keeps_its_snapshot() -> None:
    t = AllocationTable()
    t.apply("n1", ev("STARTED", T0, "ana", T0 - 5 * S))
    t.apply("n1", ev("ENDED", T0 + 60 * S, "ana", T0 - 5 * S, None))
    t.apply("n1", ev("STARTED", T0 + 120 * S, "other", T0 - 5 * S))  # same submit time: the same job again
    again = t.owner_at("n1", "GPU-A", None, None, T0 + 150 * S)
    assert again is not None and again.user == "ana"
