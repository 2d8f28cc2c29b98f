"""What if (issue 43): a stored month's job-minutes replayed through the live idle state machine under another
idle policy. Pure: plain rows in, the alerts and reclaim actions `processors.idle.step` emits out.

The replay is the job stage's own sequence (`stages.JobPartition.drain`): per job, a fresh `IdleState` carrying
the exemptions granted on appeal (`granted_exemptions`, as `JobPartition.grant` puts them), then `step` over
the job's JobMinutes in minute order. The month comes as runs (`sinks.whatif.load_month`): contiguous minutes
alike to the machine (class, allocated seconds, generation, devices), each a row with its first minute and
`minutes`, stepped by `idle.step_run`, which is `step` over each of them (tests/unit/test_idle_runs.py). Nothing
here decides what idle means, when to warn or what a reclaim is: `idle.step` does, so the replay cannot drift
from the pipeline. What the stored month cannot give back:
- a job's identity is its job-minutes' (snapshotted at start, never rewritten), its scheduler, partition and
  flags its latest job event's; the devices the live alert lists are not replayed (`devices` empty);
- a job reclaimed by the replay keeps running in the stored month: its later minutes are stepped as they were
  (RECLAIMED holds until a busy minute, as live), so nothing after a reclaim moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

from base.processor_settings import Exemption, IdlePolicy
from processors.attribution import JobInfo
from processors.classify import JobMinuteClass, classify_job_minute
from processors.idle import Output, granted_exemptions, new_state, step_run
from schemas.governance_appeals import fold
from schemas.policy import Policy
from schemas.topics import qualified_job


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One job of the month: its flags and its JobMinutes or runs of them (`minutes`: how many, default 1; any
    order, replayed in minute order)."""

    info: JobInfo
    minutes: Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Replayed:
    alerts: list[dict[str, Any]]
    actions: list[dict[str, Any]]


def job_info(flags: Mapping[str, Any], minute: Mapping[str, Any]) -> JobInfo:
    """The `JobInfo` the job stage held: identity as the job-minutes carry it (the job stage wrote them from
    it; the warehouse stores a missing name as ''), scheduler, partition and flags from the job's event.
    `sinks.whatif.load_month` gives both in one mapping per job (pass it twice)."""

    def name(value: Any) -> str | None:
        return None if value in (None, "") else str(value)

    return JobInfo(
        cluster=str(minute["cluster"]),
        job_id=str(minute["job_id"]),
        scheduler=str(flags.get("scheduler") or "SIMULATOR"),
        user=name(minute.get("user")),
        project=name(minute.get("project")),
        team=name(minute.get("team")),
        cost_centre=name(minute.get("cost_centre")),
        partition=name(flags.get("partition")),
        preemptible=bool(minute.get("preemptible")),
        interactive=bool(flags.get("interactive")),
        checkpointable=bool(flags.get("checkpointable")),
        pricing_tier=str(minute.get("pricing_tier") or "on-prem"),
        gang_size=int(flags.get("gang_size") or 0),
    )


def appeal_grants(
    appeal_events: Iterable[Mapping[str, Any]], policy: Policy | None
) -> dict[str, tuple[Exemption, ...]]:
    """The exemptions granted on appeal, by "cluster/job_id", as the job stage folds them (none without a policy:
    the stage reads appeals only with one, `idle_agents.JobStageAgents`)."""
    if policy is None:
        return {}
    appeals, _ = fold(appeal_events, policy)
    return granted_exemptions(appeals.values())


def replay(jobs: Iterable[ReplayJob], policy: IdlePolicy, granted: Mapping[str, tuple[Exemption, ...]]) -> Replayed:
    """Every alert and action `idle.step` emits for `jobs` under `policy`, jobs in the order given."""
    alerts: list[dict[str, Any]] = []
    actions: list[dict[str, Any]] = []
    for job in jobs:
        st = new_state(job.info)
        exemptions = granted.get(qualified_job(job.info.cluster, job.info.job_id))
        if exemptions:
            st = replace(st, granted=exemptions)
        outs: list[Output] = []
        for jm in sorted(job.minutes, key=_START):
            st, emitted = step_run(st, jm, jm.get("minutes", 1), policy)
            if emitted:
                outs += emitted
        for out in outs:
            (alerts if out.kind == "alert" else actions).append(out.record)
    return Replayed(alerts, actions)


_START = itemgetter("minute_start_ms")


def replay_month(
    minutes: Mapping[tuple[str, str], Sequence[Mapping[str, Any]]],
    jobs: Mapping[tuple[str, str], Mapping[str, Any]],
    appeal_events: Iterable[Mapping[str, Any]],
    policy: IdlePolicy,
    in_force: Policy | None,
) -> Replayed:
    """A month as `sinks.whatif.load_month` reads it (runs of job-minutes, and each job's identity and flags, by
    (cluster, job_id); appeal steps) replayed under `policy`, with the appeals decided under the policy in force:
    what the command and the fleet page hand to `sinks.whatif.whatif` (one replay for both)."""
    replayed = []
    for key, mins in sorted(minutes.items()):
        job = jobs.get(key, {})
        replayed.append(ReplayJob(job_info(job, job if "user" in job else mins[0]), mins))
    return replay(replayed, policy, appeal_grants(appeal_events, in_force))


RUN_CODES = {JobMinuteClass.BUSY: 1, JobMinuteClass.DARK: 2, JobMinuteClass.IDLE: 3}


def run_classes() -> tuple[int, ...]:
    """For `sinks.whatif.load_month`: per sign pattern of a job-minute's (active_s, starved_s, idle_s) (bits 4, 2,
    1), the code of its class as `classify_job_minute` answers on those signs: a run is contiguous minutes of one
    code (and one allocated seconds, generation and device count). The classifier reads only whether each is above
    zero (tests/unit/test_whatif_runs.py holds it to that), so the table is its answer for every minute."""
    return tuple(RUN_CODES[classify_job_minute((bits >> 2) & 1, (bits >> 1) & 1, bits & 1)] for bits in range(8))
