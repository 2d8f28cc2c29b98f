"""`idle.step_run` over a run of alike minutes is `idle.step` over each of them: same outputs, same state; and a job
whose idle streaks are all shorter than `sinks.whatif.shortest_warning` gets nothing from `step`.

Any policy (thresholds by class and project, grace, mode, dry run, rates, exemptions of the policy that start and
expire at any millisecond), exemptions granted on appeal, runs of busy, idle and dark minutes with gaps between
them and a first run that was partly applied already (a replay)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from base.processor_settings import Exemption, IdlePolicy
from processors.attribution import JobInfo
from processors.idle import IdleState, idle_after_min, new_state, step, step_run
from processors.testing import T0
from sinks.whatif import shortest_warning

M = 60_000
SECONDS = {"busy": (20, 10, 30, 0), "idle": (0, 0, 50, 10), "dark": (0, 0, 0, 60)}  # active, starved, idle, dark

instants = st.one_of(st.none(), st.integers(0, 240 * 60).map(lambda s: T0 + s * 1000))


@st.composite
def exemptions(draw: Any, kinds: tuple[str, ...]) -> Exemption:
    kind = draw(st.sampled_from(kinds))
    value = draw(st.sampled_from({"job": ("j1", "j2"), "user": ("ana", "bo"), "project": ("p1", "p2")}[kind]))
    return Exemption(kind=kind, value=value, reason="t", starts_ms=draw(instants), expires_ms=draw(instants))


@st.composite
def cases(draw: Any) -> tuple[IdleState, IdlePolicy, list[dict[str, Any]]]:
    job = JobInfo(cluster="c1", job_id="j1", user=draw(st.sampled_from(("ana", "bo"))),
                  project=draw(st.sampled_from(("p1", "p2"))), scheduler=draw(st.sampled_from(("SLURM", "KUEUE"))),
                  interactive=draw(st.booleans()), checkpointable=draw(st.booleans()))  # fmt: skip
    policy = IdlePolicy(
        idle_after_min_interactive=draw(st.integers(1, 8)),
        idle_after_min_batch=draw(st.integers(1, 8)),
        idle_after_min_by_project=draw(st.sampled_from(({}, {"p1": 2}, {"p2": 12}))),
        grace_min=draw(st.integers(0, 5)),
        reclaim_mode=draw(st.sampled_from(("REQUEUE", "SUSPEND"))),
        dry_run=draw(st.booleans()),
        rate_per_device_hour=draw(st.sampled_from(({}, {"hopper": 2.5}))),
        exemptions=tuple(draw(st.lists(exemptions(("job", "user", "project")), max_size=2))),
    )
    state = new_state(job, draw(st.sampled_from(((), ("GPU-a", "GPU-b")))))
    granted = tuple(draw(st.lists(exemptions(("job",)), max_size=2)))
    if granted:
        state = IdleState(job=job, devices=state.devices, granted=granted)
    runs = []
    at = T0
    for _ in range(draw(st.integers(1, 10))):
        at += draw(st.sampled_from((0, 0, 0, 1, 3))) * M  # a gap: minutes not held
        cls = draw(st.sampled_from(("busy", "idle", "idle", "dark")))
        n = draw(st.integers(1, 25))
        scale = draw(st.sampled_from((1, 2, 4)))
        active, starved, idle, dark = (scale * s for s in SECONDS[cls])
        runs.append({"minute_start_ms": at, "minutes": n, "active_s": active, "starved_s": starved, "idle_s": idle,
                     "dark_s": dark, "allocated_s": active + starved + idle + dark, "device_count": scale,
                     "generation": draw(st.sampled_from(("hopper", "ampere")))})  # fmt: skip
        at += n * M
    replayed = draw(st.integers(-1, runs[0]["minutes"] + 1))
    if replayed >= 0:  # minutes up to this one of the first run were applied before (a restart's replay)
        state = IdleState(job=job, devices=state.devices, granted=granted, last_minute_ms=T0 + replayed * M - M)
    return state, policy, runs


@settings(max_examples=400, deadline=None, derandomize=True)
@given(cases())
def test_a_run_steps_as_its_minutes(case: tuple[IdleState, IdlePolicy, list[dict[str, Any]]]) -> None:
    first, policy, runs = case
    by_minute, minute_outs = first, []
    by_run, run_outs = first, []
    for run in runs:
        for i in range(run["minutes"]):
            by_minute, outs = step(by_minute, {**run, "minute_start_ms": run["minute_start_ms"] + i * M}, policy)
            minute_outs += outs
        by_run, outs = step_run(by_run, run, run["minutes"], policy)
        run_outs += outs
    assert run_outs == minute_outs
    assert by_run == by_minute
    # the what-if loads no minutes of a job whose idle streaks are all shorter than `shortest_warning`: silent
    longest, streak, last = 0, 0, None
    for run in runs:
        for i in range(run["minutes"]):
            minute = run["minute_start_ms"] + i * M
            idle = run["idle_s"] > 0 and run["active_s"] + run["starved_s"] == 0
            streak = streak + 1 if idle and last == minute - M else int(idle)
            longest, last = max(longest, streak), minute
    assert idle_after_min(first.job, policy) >= shortest_warning(policy)
    if longest < shortest_warning(policy):
        assert minute_outs == []


def test_a_long_idle_run_warns_and_reclaims_once_each() -> None:
    """Worked: 10-minute threshold, 5-minute grace, one idle run of 200 minutes: a warning at the end of minute 10,
    a reclaim notice and action at the end of minute 15, then nothing while it stays idle."""
    job = JobInfo(cluster="c1", job_id="j1", interactive=True, checkpointable=True, scheduler="SLURM")
    policy = IdlePolicy(idle_after_min_interactive=10, grace_min=5, rate_per_device_hour={"hopper": 3.0})
    run = {"minute_start_ms": T0, "active_s": 0, "starved_s": 0, "idle_s": 120, "dark_s": 0, "allocated_s": 120,
           "device_count": 2, "generation": "hopper"}  # fmt: skip
    state, outs = step_run(new_state(job), run, 200, policy)
    assert [(o.kind, o.record.get("kind"), o.record["ts_ms"]) for o in outs] == [
        ("alert", "IDLE_WARNING", T0 + 10 * M),
        ("alert", "RECLAIM_NOTICE", T0 + 15 * M),
        ("action", None, T0 + 15 * M),
    ]
    assert state.idle_minutes == 200 and state.idle_device_s == 200 * 120 and state.cost_so_far == 20.0
    assert state.last_minute_ms == T0 + 199 * M and state.idle_since_ms == T0
