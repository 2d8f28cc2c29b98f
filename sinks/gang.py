"""A gang is judged whole before it is reclaimed (issue 18).

The pods of one Kueue Workload, JobSet, Volcano PodGroup or MPIJob/PyTorchJob carry one `gang_id` in their
job events (`producers/kube.py`), and reclaiming any of them reclaims all: Kueue deactivates the whole
Workload (`sinks/kube_owner.py`). So the executor's re-check of an idle pod extends to its gang: every
member still holding devices must be idle too; one busy member (or one without telemetry) keeps the gang.

Pure core: `gang_verdict(gang_id, job_id, members)`; the adapter `ClickHouseGang` finds the members in
`job_events` (bound parameters) and reads each one's state with the executor's `JobState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sinks.reclaim import JobNow, JobState, Recheck, recheck

HOLDING = ("STARTED", "RESUMED", "UPDATED")  # events that name devices: a member of the gang holds some


def gang_verdict(gang_id: str, job_id: str, members: Mapping[str, JobNow]) -> Recheck:
    """Whether the gang may be reclaimed, given the state of its members other than `job_id` (which passed
    its own re-check): each must be idle, or have released its devices (ended)."""
    for member in sorted(members):
        if member == job_id:
            continue
        v = recheck(members[member])
        if v.ok or v.reason == "ended":
            continue
        return Recheck(False, f"gang-{v.reason}", f"gang {gang_id}: member {member}: {v.detail}"[:500])
    return Recheck(True, "ok", f"gang {gang_id}: all {len(members)} member(s) idle or ended")


class ClickHouseGang:
    """`(cluster, job_id) -> Recheck` for the executor: the job's latest gang id, its members (jobs of that
    gang whose events named devices: the gang object's own events, a Workload's, hold none), each member's
    state through `job_state`. A job in no gang passes."""

    def __init__(self, client: Any, job_state: JobState) -> None:
        self._client = client
        self._job_state = job_state

    def members(self, cluster: str, job_id: str) -> tuple[str | None, list[str]]:
        params: dict[str, Any] = {"cluster": cluster, "job": job_id, "holding": list(HOLDING)}
        gang = self._client.query(
            "SELECT gang_id FROM job_events FINAL WHERE cluster = {cluster:String} AND job_id = {job:String} "
            "AND gang_id IS NOT NULL ORDER BY ts_ms DESC LIMIT 1",
            parameters=params,
        ).result_rows
        if not gang:
            return None, []
        params["gang"] = gang[0][0]
        rows = self._client.query(
            "SELECT DISTINCT job_id FROM job_events FINAL WHERE cluster = {cluster:String} "
            "AND gang_id = {gang:String} AND event_type IN {holding:Array(String)} AND allocations != '[]' "
            "ORDER BY job_id",
            parameters=params,
        ).result_rows
        return str(gang[0][0]), [str(r[0]) for r in rows]

    def __call__(self, cluster: str, job_id: str) -> Recheck:
        gang, members = self.members(cluster, job_id)
        if gang is None or len(members) <= 1:
            return Recheck(True, "ok", "not in a gang")
        return gang_verdict(gang, job_id, {m: self._job_state(cluster, m) for m in members if m != job_id})
