"""Escalations (schemas/governance_escalations.py, sinks/escalations.py): who may ask and decide, by when, for how
long; a repeated request refused; the service raising, lapsing and lowering with engine stand-ins; the policy
section's one-line errors; the priced raise on the statement. Live engines: tests/integration/
test_slurm_live_escalation.py and test_kube_live_escalation.py."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from base.errors import ConfigError
from producers.policy_kueue import tier_priority_class
from producers.policy_slurm import tier_qos
from schemas.governance_appeals import HOUR_MS
from schemas.governance_escalations import (
    SERVICE_ACTOR,
    Job,
    applied_event,
    ask_event,
    decide_event,
    due,
    fold,
    may_ask,
)
from schemas.models import validate
from schemas.policy import PolicyError, parse_policy
from sinks.escalations import (
    KueuePriority,
    SlurmPriority,
    Standing,
    engine_of,
    escalation_charges,
    kueue_standing,
    reconcile,
    slurm_standing,
)
from sinks.kube_owner import Owner

TEXT = """
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: production, priority: 1000}, {name: std, priority: 100}]
governance:
  operators: [ops1]
  escalations: {tier: production, askers: [user, leads, operators], deciders: [boss], decide_within_hours: 4,
                max_hours: 8, price_per_gpu_hour: "1.50"}
teams:
  - {name: vision, members: [alice, bob], leads: [carol]}
"""
POLICY = parse_policy(TEXT)
T0 = 1_796_000_000_000
JOB = Job("c1", "4242", "alice", "vision", 2)


def state(*events: dict[str, Any]) -> dict[str, Any]:
    return fold(events, POLICY)[0]


def asked(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = dict(job=JOB, asker="alice", hours=4, reason="paper deadline", now_ms=T0)
    args.update(kw)
    return ask_event(state(*kw.pop("before", ())), POLICY, **args)


def test_who_may_ask_is_the_policys_and_a_refusal_says_who_may() -> None:
    assert may_ask(POLICY, JOB, "alice") is None  # its user
    assert may_ask(POLICY, JOB, "carol") is None  # a lead of its team
    assert may_ask(POLICY, JOB, "ops1") is None  # an operator
    assert may_ask(POLICY, JOB, "bob") == (
        "'bob' may not ask to raise job 4242: it is 'alice''s, team vision (policy governance.escalations.askers: "
        "its user, the team's leads, the operators may)")
    with pytest.raises(ConfigError, match=r"^'mallory' may not ask to raise job 4242"):
        asked(asker="mallory")
    members = parse_policy(TEXT.replace("askers: [user, leads, operators]", "askers: [members]"))
    assert may_ask(members, JOB, "bob") is None and may_ask(members, JOB, "ops1") is not None
    none = parse_policy(TEXT.replace("  escalations:", "  x_escalations:").replace("x_escalations: {tier: production, "
                        "askers: [user, leads, operators], deciders: [boss], decide_within_hours: 4,\n                "
                        "max_hours: 8, price_per_gpu_hour: \"1.50\"}", ""))  # fmt: skip
    with pytest.raises(ConfigError, match=r"^the policy allows no escalations \(governance.escalations is not set\)$"):
        ask_event({}, none, JOB, "alice", 1, "x", T0)


def test_a_request_is_a_valid_record_bounded_by_max_hours_and_never_asked_twice() -> None:
    first = asked()
    validate("escalations", first)
    assert (first["event_type"], first["tier"], first["hours"], first["gpus"]) == ("REQUESTED", "production", 4, 2)
    assert first["deadline_ms"] == T0 + 4 * HOUR_MS
    with pytest.raises(ConfigError, match=r"^--hours must be 1..8 \(policy governance.escalations.max_hours\), got 9"):
        asked(hours=9)
    with pytest.raises(ConfigError, match=r"^escalation esc-[0-9a-f]{12} of job 4242 is already requested \(asked by "
                                          r"alice\): nothing asked twice$"):  # fmt: skip
        ask_event(state(first), POLICY, JOB, "carol", 2, "again", T0 + 1000)
    other = Job("c1", "4243", "alice", "vision", 1)  # another job: its own request
    assert ask_event(state(first), POLICY, other, "alice", 1, "x", T0)["job_id"] == "4243"
    # once the first lapsed, the job may be asked for again
    assert ask_event(state(first), POLICY, JOB, "alice", 1, "x", T0 + 5 * HOUR_MS)["event_type"] == "REQUESTED"


def test_only_a_decider_who_did_not_ask_decides_once_and_before_the_deadline() -> None:
    first = asked()
    eid = first["escalation_id"]
    with pytest.raises(ConfigError, match=r"^'ops1' may not decide escalations \(policy governance.escalations."
                                          r"deciders: boss\)$"):  # fmt: skip
        decide_event(state(first), POLICY, eid, "ops1", True, "ok", T0 + 1)
    boss_asks = ask_event({}, POLICY, Job("c1", "9", "boss", "vision"), "ops1", 1, "x", T0)
    with pytest.raises(ConfigError, match="no escalation 'esc-nope'"):
        decide_event(state(first), POLICY, "esc-nope", "boss", True, "ok", T0 + 1)
    assert decide_event(state(boss_asks), POLICY, boss_asks["escalation_id"], "boss", False, "no", T0 + 1)
    with pytest.raises(ConfigError, match=r"lapsed at .*: undecided past its deadline"):
        decide_event(state(first), POLICY, eid, "boss", True, "late", T0 + 4 * HOUR_MS)
    granted = decide_event(state(first), POLICY, eid, "boss", True, "go", T0 + 60_000)
    validate("escalations", granted)
    assert granted["until_ms"] == T0 + 60_000 + 4 * HOUR_MS
    with pytest.raises(ConfigError, match="already decided"):
        decide_event(state(first, granted), POLICY, eid, "boss", False, "changed my mind", T0 + 120_000)
    # A step written past the commands (a second decision, a grant by a non-decider) changes nothing.
    forged = {**granted, "event_id": "f", "actor": "ops1", "ts_ms": T0 + 1}
    escalations, ignored = fold([first, forged], POLICY)
    assert escalations[eid].decision is None and "may not decide" in ignored[0].why
    longer = {**granted, "event_id": "g", "until_ms": T0 + 60_000 + 5 * HOUR_MS}
    assert fold([first, longer], POLICY)[0][eid].decision is None


class Stand:
    """An engine stand-in: the job's current value, and the changes asked of it."""

    def __init__(self, engine: str, current: str, status: str = "ok") -> None:
        self.engine, self.current, self.status, self.sets = engine, current, status, []  # type: list[str]

    def target(self, tier: str) -> str:
        return tier

    def standing(self, job_id: str) -> Standing:
        return Standing(self.status, f"job {job_id} is {self.status}", self.current)

    def set(self, job_id: str, value: str) -> str:
        self.sets.append(value)
        self.current = value
        return f"set {job_id} {value}"


def test_the_service_raises_a_grant_once_lowers_it_when_it_expires_and_lapses_the_undecided() -> None:
    first = asked()
    eid = first["escalation_id"]
    granted = decide_event(state(first), POLICY, eid, "boss", True, "go", T0 + 1000)
    slurm = Stand("SLURM", "std")
    steps = reconcile(state(first, granted), T0 + 2000, [slurm], "c1")
    assert [s["event_type"] for s in steps] == ["APPLIED"] and slurm.sets == ["production"]
    assert (steps[0]["engine"], steps[0]["engine_ref"], steps[0]["actor"]) == ("SLURM", "std", SERVICE_ACTOR)
    validate("escalations", steps[0])
    raised = state(first, granted, *steps)
    assert raised[eid].state == "RAISED"
    assert reconcile(raised, T0 + 3000, [slurm], "c1") == []  # nothing applied twice
    assert reconcile(raised, T0 + 3000, [slurm], "other-cluster") == []  # another cluster's service: not its job
    until = granted["until_ms"]
    assert reconcile(raised, until - 1, [slurm], "c1") == []
    lowered = reconcile(raised, until, [slurm], "c1")
    assert [s["event_type"] for s in lowered] == ["REVERTED"] and slurm.sets == ["production", "std"]
    assert lowered[0]["text"] == "fell back to std: set 4242 std"
    assert state(first, granted, *steps, *lowered)[eid].state == "REVERTED"
    # undecided past its deadline: LAPSED, by the service, once
    second = ask_event({}, POLICY, Job("c1", "77", "alice", "vision"), "alice", 1, "x", T0)
    lapsed = due(state(second), T0 + 4 * HOUR_MS).lapsed
    assert [e["event_type"] for e in lapsed] == ["LAPSED"]
    assert state(second, *lapsed)[second["escalation_id"]].state == "LAPSED"
    assert due(state(second, *lapsed), T0 + 5 * HOUR_MS).lapsed == ()


def test_a_job_that_ended_or_was_changed_by_someone_else_is_left_alone() -> None:
    first = asked()
    granted = decide_event(state(first), POLICY, first["escalation_id"], "boss", True, "go", T0 + 1000)
    ended = Stand("SLURM", "", status="ended")
    assert reconcile(state(first, granted), T0 + 2000, [ended], "c1") == [] and ended.sets == []
    applied = applied_event(state(first, granted)[first["escalation_id"]], "SLURM", "std", T0 + 2000, "raised")
    meddled = Stand("SLURM", "std")  # someone put it back by hand meanwhile
    out = reconcile(state(first, granted, applied), granted["until_ms"], [meddled], "c1")
    assert out[0]["text"] == "changed to std meanwhile, not by gpuledger: left as it is" and meddled.sets == []


def test_engines_read_the_job_as_slurm_and_kueue_say() -> None:
    assert engine_of("4242") == "SLURM" and engine_of("vision/train-1") == "KUEUE"
    with pytest.raises(ConfigError, match="not a job id"):
        engine_of("../etc")
    assert slurm_standing("1", {}).status == "gone"
    assert slurm_standing("1", {"JobState": "COMPLETED"}).detail == "job 1 has ended (COMPLETED)"
    assert slurm_standing("1", {"JobState": "PENDING", "QOS": "std"}) == Standing("ok", "job 1 is PENDING, QOS std",
                                                                                   "std")  # fmt: skip
    wl = {"metadata": {"name": "job-train-1", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                                   "name": "train-1"}]}}  # fmt: skip
    owner = Owner(wl, ("Workload job-train-1",))
    job = {"metadata": {"name": "train-1", "labels": {"kueue.x-k8s.io/priority-class": "std"}}}
    assert kueue_standing("ns/train-1", owner, job).current == "std"
    assert kueue_standing("ns/x", None, None).status == "gone"
    done = {**wl, "status": {"conditions": [{"type": "Finished", "status": "True"}]}}
    assert kueue_standing("ns/x", Owner(done, ("Workload x",)), job).status == "ended"
    # the names the policy renders a tier under on each engine
    assert SlurmPriority().target("production") == tier_qos("production")
    assert KueuePriority(None).target("production") == tier_priority_class("production")


def test_a_priced_raise_is_a_line_on_the_teams_statement() -> None:
    first = asked()
    eid = first["escalation_id"]
    granted = decide_event(state(first), POLICY, eid, "boss", True, "go", T0 + 1000)
    applied = applied_event(state(first, granted)[eid], "SLURM", "std", T0 + 2000, "raised")
    raised = state(first, granted, applied)[eid]
    # 2 GPUs raised 90 minutes so far: 3 GPU-h at 1.50 = 4.50
    (line,) = escalation_charges(POLICY, [raised], T0 + 2000 + 90 * 60_000)
    assert (line.kind, line.team, line.cents, line.allocated_s, line.job_id) == ("reservation", "vision", 450,
                                                                                   10_800, "4242")  # fmt: skip
    assert (line.line().cause_kind, line.line().cause_ref) == ("escalation", f"{eid}/2026-11")
    # never past its end, however late the statement is made
    (whole,) = escalation_charges(POLICY, [raised], T0 + 100 * HOUR_MS)
    assert whole.allocated_s == 2 * (granted["until_ms"] - (T0 + 2000)) // 1000
    unpriced = parse_policy(TEXT.replace(', price_per_gpu_hour: "1.50"', ""))
    assert escalation_charges(unpriced, [raised], T0 + HOUR_MS) == []
    assert POLICY.governance.escalations is not None
    assert POLICY.governance.escalations.price_per_gpu_hour == Decimal("1.50")


@pytest.mark.parametrize(("change", "problem"), [
    ("tier: production,", "policy.yaml:7: escalations.tier names unknown tier 'gold'"),
    ("max_hours: 8,", "policy.yaml:8: governance.escalations.max_hours: Input should be greater than or equal to 1"),
    ("askers: [user, leads, operators],", "policy.yaml:7: governance.escalations.askers.1: Input should be 'user', "
                                          "'members', 'leads' or 'operators'"),
])  # fmt: skip
def test_the_policy_section_is_checked_with_one_line_per_problem(change: str, problem: str) -> None:
    bad = {"tier: production,": "tier: gold,", "max_hours: 8,": "max_hours: 0,",
           "askers: [user, leads, operators],": "askers: [user, everyone],"}[change]  # fmt: skip
    with pytest.raises(PolicyError) as err:
        parse_policy(TEXT.replace(change, bad))
    assert len(err.value.problems) == 1 and problem in err.value.problems[0]
