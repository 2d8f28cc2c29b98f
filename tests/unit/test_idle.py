"""The idle state machine, minute by minute."""

from __future__ import annotations

import dataclasses
from typing import Any

from base.processor_settings import Exemption, IdlePolicy
from processors.attribution import JobInfo
from processors.idle import (
    IdleState,
    Status,
    exemption_for,
    granted_exemptions,
    idle_after_min,
    mark_ended,
    new_state,
    on_tick,
    step,
)
from processors.testing import T0
from schemas.governance_appeals import HOUR_MS, Subject, decide_event, file_event, fold
from schemas.policy import parse_policy

M = 60_000
NOTEBOOK = JobInfo(cluster="c1", job_id="nb", user="ana", project="p1", interactive=True, partition="interactive")
BATCH = JobInfo(cluster="c1", job_id="b", user="bo", project="p2", checkpointable=True, partition="gpu")
POLICY = IdlePolicy(idle_after_min_interactive=3, idle_after_min_batch=5, grace_min=2)


def jm(minute: int, *, active: int = 0, starved: int = 0, idle: int = 0, dark: int = 0) -> dict[str, Any]:
    return {
        "minute_start_ms": T0 + minute * M,
        "active_s": active,
        "starved_s": starved,
        "idle_s": idle,
        "dark_s": dark,
        "allocated_s": active + starved + idle + dark,
        "device_count": 2,
        "generation": "hopper",
    }


def run(state: IdleState, minutes: list[dict[str, Any]], policy: IdlePolicy = POLICY) -> tuple[IdleState, list[Any]]:
    outs: list[Any] = []
    for m in minutes:
        state, o = step(state, m, policy)
        outs.extend(o)
    return state, outs


def test_warn_after_idle_after_then_reclaim_after_grace_dry_run() -> None:
    st, outs = run(new_state(NOTEBOOK, ("GPU-1", "GPU-2")), [jm(i, idle=120) for i in range(5)])
    assert [(o.kind, o.record.get("kind")) for o in outs] == [
        ("alert", "IDLE_WARNING"),
        ("alert", "RECLAIM_NOTICE"),
        ("action", None),
    ]
    warn, notice, action = (o.record for o in outs)
    assert warn["ts_ms"] == T0 + 3 * M  # end of the 3rd idle minute
    assert warn["idle_minutes"] == 3 and warn["device_uuids"] == ["GPU-1", "GPU-2"]
    assert warn["action"] == "CANCEL" and warn["action_at_ms"] == T0 + 5 * M
    assert warn["cost_so_far"] is None  # no rate known
    assert warn["appeal_route"] and warn["dry_run"] is True
    assert notice["ts_ms"] == T0 + 5 * M
    assert action["action"] == "CANCEL" and action["dry_run"] is True and action["device_uuids"] == ["GPU-1", "GPU-2"]
    assert st.status is Status.RECLAIMED
    # staying idle after the action does not repeat it
    st, more = run(st, [jm(5, idle=120), jm(6, idle=120)])
    assert more == []


def test_activity_resolves_and_restarts_the_count() -> None:
    st, outs = run(new_state(NOTEBOOK), [jm(0, idle=60), jm(1, idle=60), jm(2, idle=60), jm(3, active=1, idle=59)])
    assert [o.record["kind"] for o in outs] == ["IDLE_WARNING", "IDLE_RESOLVED"]
    assert st.status is Status.OK and st.idle_minutes == 0


def test_gang_with_one_busy_device_is_not_idle() -> None:
    _, outs = run(new_state(NOTEBOOK), [jm(i, active=60, idle=7 * 60) for i in range(10)])
    assert outs == []


def test_starved_is_never_idle_and_dark_is_never_idle() -> None:
    _, outs = run(new_state(NOTEBOOK), [jm(i, starved=120) for i in range(10)])
    assert outs == []
    st, outs = run(new_state(NOTEBOOK), [jm(i, dark=120) for i in range(10)])
    assert outs == [] and st.idle_minutes == 0
    # idle minutes split by a dark minute are not consecutive
    _, outs = run(new_state(NOTEBOOK), [jm(0, idle=60), jm(1, idle=60), jm(2, dark=60), jm(3, idle=60), jm(4, idle=60)])
    assert outs == []


def test_checkpointable_batch_is_requeued_with_checkpoint_or_suspended() -> None:
    _, outs = run(new_state(BATCH), [jm(i, idle=60) for i in range(7)])
    assert outs[-1].kind == "action" and outs[-1].record["action"] == "CHECKPOINT_THEN_REQUEUE"
    suspend = POLICY.model_copy(update={"reclaim_mode": "SUSPEND", "dry_run": False})
    _, outs = run(new_state(BATCH), [jm(i, idle=60) for i in range(7)], suspend)
    assert outs[-1].record["action"] == "SUSPEND" and outs[-1].record["dry_run"] is False
    # A Slurm job is requeued even then: Slurm's suspend keeps its GPUs allocated.
    slurm_job = dataclasses.replace(BATCH, scheduler="SLURM")
    _, outs = run(new_state(slurm_job), [jm(i, idle=60) for i in range(7)], suspend)
    assert outs[-1].record["action"] == "CHECKPOINT_THEN_REQUEUE"


def test_idle_after_overrides_by_partition_then_project() -> None:
    p = POLICY.model_copy(update={"idle_after_min_by_partition": {"gpu": 2}, "idle_after_min_by_project": {"p2": 1}})
    assert idle_after_min(NOTEBOOK, POLICY) == 3 and idle_after_min(BATCH, POLICY) == 5
    assert idle_after_min(BATCH, p.model_copy(update={"idle_after_min_by_project": {}})) == 2
    assert idle_after_min(BATCH, p) == 1


def test_exemptions_are_data_with_expiry() -> None:
    ex = Exemption(kind="user", value="ana", reason="demo day", expires_ms=T0 + 6 * M)
    policy = POLICY.model_copy(update={"exemptions": (ex,)})
    _, outs = run(new_state(NOTEBOOK), [jm(i, idle=60) for i in range(5)], policy)
    assert outs == []
    _, outs = run(new_state(NOTEBOOK), [jm(i, idle=60) for i in range(6)], policy)
    assert [o.record["kind"] for o in outs] == ["IDLE_WARNING"]  # minute 5 ends at expiry


def test_cost_so_far_when_a_rate_is_known() -> None:
    policy = POLICY.model_copy(update={"rate_per_device_hour": {"hopper": 3.6}})
    _, outs = run(new_state(NOTEBOOK), [jm(i, idle=120) for i in range(3)], policy)
    assert outs[0].record["cost_so_far"] == 0.36  # 360 device-seconds at 3.6 per device-hour


def test_replayed_minutes_are_ignored_and_ids_are_deterministic() -> None:
    minutes = [jm(i, idle=60) for i in range(4)]
    st1, outs1 = run(new_state(NOTEBOOK), minutes)
    st2, outs2 = run(st1, minutes)
    assert outs2 == [] and st2 == st1
    _, again = run(new_state(NOTEBOOK), minutes)
    assert [o.record["alert_id"] for o in again] == [o.record["alert_id"] for o in outs1]
    assert IdleState.from_json(st1.to_json()) == st1


def test_on_tick_forgets_ended_jobs() -> None:
    st = mark_ended(new_state(NOTEBOOK), T0)
    kept, _ = on_tick(st, T0 + M, POLICY)
    assert kept is not None
    gone, _ = on_tick(st, T0 + 10 * M, POLICY)
    assert gone is None
    running, _ = on_tick(new_state(NOTEBOOK), T0 + 10**9, POLICY)
    assert running is not None


APPEALS_POLICY = parse_policy("""
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: research, priority: 100}]
governance:
  operators: [ops1]
  appeals: {deadline_hours: 72, window_days: 30, max_credit: "100.00", max_exemption_hours: 48}
teams: [{name: vision, members: [ana]}]
""")


def granted_at(decided_ms: int, hours: int, *, by: str = "ops1") -> tuple[Exemption, ...]:
    """NOTEBOOK's exemptions after ana appeals its warning and `by` grants one of `hours` at `decided_ms`."""
    subject = Subject("c1", "nb", "al-nb", "ana", "vision", "p1", None, T0)
    filed = file_event({}, APPEALS_POLICY, subject, "ana", "demo at 3pm", decided_ms - M)
    appeals, _ = fold([filed], APPEALS_POLICY)
    decided = decide_event(appeals, APPEALS_POLICY, filed["appeal_id"], "ops1", "EXEMPTION", "ok", decided_ms,
                           exemption_hours=hours)  # fmt: skip
    decided["actor"] = by  # as written on the topic: the fold checks it again
    appeals, _ = fold([filed, decided], APPEALS_POLICY)
    return granted_exemptions(appeals.values()).get("c1/nb", ())


def test_an_exemption_granted_on_appeal_stops_what_is_due_after_it_and_restarts_the_count() -> None:
    st, outs = run(new_state(NOTEBOOK), [jm(i, idle=60) for i in range(3)])
    assert [o.record["kind"] for o in outs] == ["IDLE_WARNING"] and st.action_at_ms == T0 + 5 * M
    t = T0 + 3 * M + 30_000  # granted during minute 3, for one hour
    granted = granted_at(t, 1)
    assert [(ex.kind, ex.value, ex.starts_ms, ex.expires_ms) for ex in granted] == [("job", "nb", t, t + HOUR_MS)]
    assert exemption_for(NOTEBOOK, t - 1, POLICY, granted) is None  # nothing before the decision
    assert exemption_for(BATCH, t, POLICY, granted) is None  # another job
    st = dataclasses.replace(st, granted=granted)
    assert IdleState.from_json(st.to_json()) == st  # kept in the state: restored after a restart

    # Minute 3 ends after t: the reclaim due at minute 5 never comes while exempt; the warning is withdrawn.
    st, outs = run(st, [jm(i, idle=60) for i in range(3, 63)])
    assert outs == [] and st.status is Status.OK and st.idle_minutes == 0
    # Minute 63 ends at t + 1 h 30 s, past the expiry: the count starts again, a fresh warning, a full grace.
    st, outs = run(st, [jm(i, idle=60) for i in range(63, 68)])
    kinds = [(o.record.get("kind"), o.record["ts_ms"]) for o in outs]
    assert kinds == [("IDLE_WARNING", T0 + 66 * M), ("RECLAIM_NOTICE", T0 + 68 * M), (None, T0 + 68 * M)]


def test_only_a_valid_decision_grants_and_no_appeal_changes_nothing() -> None:
    assert granted_at(T0 + 3 * M, 1, by="ana") == ()  # ana may not decide her own appeal: the fold ignores it
    st, outs = run(new_state(NOTEBOOK), [jm(i, idle=60) for i in range(5)])
    assert [o.record.get("kind") for o in outs] == ["IDLE_WARNING", "RECLAIM_NOTICE", None]
    assert "granted" not in st.to_json()  # a state without appeals is written as before
