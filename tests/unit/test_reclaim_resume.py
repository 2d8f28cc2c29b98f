"""The way back from a reclaim (sinks/reclaim_resume.py): who may ask, what each engine's answer means, and that a
repeated request applies nothing twice. The engines themselves: tests/integration/test_slurm_live_resume.py and
test_kube_live_resume.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from unit.test_reclaim import Recorder

from base.errors import ServiceError
from schemas.governance_appeals import Subject as AppealSubject
from schemas.governance_appeals import decide_event, file_event, fold
from schemas.policy import load_policy
from sinks.kube_owner import Owner
from sinks.reclaim_doubt import scontrol_show_job
from sinks.reclaim_resume import (
    JobOwner,
    Reclaimed,
    Request,
    Resumer,
    exemption_request,
    kueue_verdict,
    may_resume,
    slurm_verdict,
)

ROOT = Path(__file__).resolve().parents[2]
POLICY = load_policy(ROOT / "deploy" / "policy.example.yaml")


def test_the_owner_a_lead_and_an_operator_may_ask_nobody_else() -> None:
    vision = next(t for t in POLICY.teams if t.name == "vision")
    owner = JobOwner("alice", "vision")
    assert may_resume(POLICY, owner, "alice", "42") is None
    assert may_resume(POLICY, owner, POLICY.governance.operators[0], "42") is None
    if vision.leads:
        assert may_resume(POLICY, owner, vision.leads[0], "42") is None
    refusal = may_resume(POLICY, owner, "mallory", "42")
    assert refusal is not None and refusal.startswith("'mallory' may not resume job 42: it is 'alice''s, team vision")
    assert "the operators may" in refusal
    assert may_resume(POLICY, None, "alice", "42") == (
        "no job 42 in the ledger (an operator may still resume a job the ledger has not seen)")


def test_slurm_answers_held_ended_gone_and_running() -> None:
    held = slurm_verdict("7", {"JobState": "PENDING", "Reason": "job_requeued_in_held_state"})
    assert held.status == "resume"
    assert held.argv == (("scontrol", "release", "7"), ("scontrol", "update", "jobid=7", "StartTime=now+2"))
    assert slurm_verdict("7", {"JobState": "PENDING", "Reason": "JobHeldAdmin"}).status == "resume"
    assert slurm_verdict("7", {"JobState": "COMPLETED", "Reason": "None"}).detail == (
        "job 7 has ended (COMPLETED): nothing to resume")
    assert slurm_verdict("7", {}).status == "gone"
    assert slurm_verdict("7", {"JobState": "PENDING", "Reason": "Resources"}).status == "running"


def test_kueue_answers_inactive_finished_gone_and_active() -> None:
    def wl(active: bool, finished: bool = False) -> Owner:
        conds = [{"type": "Finished", "status": "True"}] if finished else []
        return Owner({"metadata": {"name": "job-x", "namespace": "ns"}, "spec": {"active": active},
                      "status": {"conditions": conds}}, ("Pod ns/p", "Workload job-x"))  # fmt: skip

    assert kueue_verdict("ns/p", wl(False)).status == "resume"
    assert kueue_verdict("ns/p", wl(True)).status == "running"
    assert kueue_verdict("ns/p", wl(False, finished=True)).status == "ended"
    assert kueue_verdict("ns/p", None).detail == (
        "job ns/p does not exist on Kubernetes (no pod or Workload of that name)")


def test_a_resume_runs_once_per_reclaim_and_is_recorded_with_the_reclaims() -> None:
    recorder, ran = Recorder(), []
    held = {"JobState": "PENDING", "Reason": "job_requeued_in_held_state"}

    def run(argv: tuple[str, ...]) -> tuple[int, str]:
        ran.append(" ".join(argv))
        return 0, ""

    resumer = Resumer(recorder, clock_ms=lambda: 1_000, show_job=lambda _: held, run=run)
    reclaimed = Reclaimed("act-1", "SLURM", "CHECKPOINT_THEN_REQUEUE", 500)
    status, line = resumer.resume(Request("c", "7", "alice", "asked by alice"), reclaimed)
    assert status == "resumed" and line.startswith("job 7 resumed (asked by alice)")
    assert ran == ["scontrol release 7", "scontrol update jobid=7 StartTime=now+2"]
    assert [(o.action_id, o.action, o.step, o.status) for o in recorder.outcomes] == [
        ("resume-act-1", "RESUME", 0, "started"), ("resume-act-1", "RESUME", 1, "ok"),
        ("resume-act-1", "RESUME", 2, "ok")]  # fmt: skip
    assert resumer.resume(Request("c", "7", "alice", "again"), reclaimed)[0] == "already"
    assert len(ran) == 2  # nothing applied twice
    assert resumer.resume(Request("c", "7", "alice", "x"), None)[0] == "not-reclaimed"
    # A later reclaim of the same job has its own way back.
    assert resumer.resume(Request("c", "7", "alice", "x"), Reclaimed("act-2", "SLURM", "REQUEUE", 900))[0] == "resumed"


def test_a_failed_release_is_recorded_and_said() -> None:
    recorder = Recorder()
    held = {"JobState": "PENDING", "Reason": "JobHeldAdmin"}
    resumer = Resumer(recorder, clock_ms=lambda: 1, show_job=lambda _: held,
                      run=lambda argv: (1, "Access/permission denied"))
    status, line = resumer.resume(Request("c", "7", "bob", "x"), Reclaimed("a", "SLURM", "REQUEUE", 1))
    assert (status, line) == ("failed", "job 7: scontrol release 7 failed: Access/permission denied")
    assert recorder.outcomes[-1].status == "failed"


def test_slurm_that_cannot_be_asked_is_not_a_job_that_is_gone() -> None:
    """The probe is the reclaim's own (sinks/reclaim_doubt.scontrol_show_job): a slurmctld that does not answer
    raises, so nothing is recorded and the request is not answered "no such job"."""
    recorder = Recorder()

    def unreachable(job_id: str) -> dict[str, str]:
        raise ServiceError(f"scontrol show job {job_id}: exit 1: Unable to contact slurm controller")

    resumer = Resumer(recorder, clock_ms=lambda: 1, show_job=unreachable, run=lambda argv: (0, ""))
    with pytest.raises(ServiceError, match="Unable to contact"):
        resumer.resume(Request("c", "7", "bob", "x"), Reclaimed("a", "SLURM", "REQUEUE", 1))
    assert recorder.outcomes == []
    assert Resumer.__init__.__kwdefaults__["show_job"] is scontrol_show_job


def test_only_an_exemption_the_appeal_rules_took_asks_for_a_resume() -> None:
    subject = AppealSubject("c", "7", "al-1", "alice", "vision", "vision-seg", "2026-12", 1_000)
    filed = file_event({}, POLICY, subject, "alice", "it was loading data", 2_000)
    appeals, _ = fold([filed], POLICY)
    decider = POLICY.governance.deciders[0]
    granted = decide_event(appeals, POLICY, filed["appeal_id"], decider, "EXEMPTION", "fine", 3_000, exemption_hours=2)
    appeals, _ = fold([filed, granted], POLICY)
    request = exemption_request(granted, appeals)
    assert request == Request("c", "7", decider, f"appeal {filed['appeal_id']} granted an exemption ({decider})")
    forged = {**granted, "event_id": "x", "actor": "mallory", "ts_ms": 4_000}
    appeals, _ = fold([filed, granted, forged], POLICY)
    assert exemption_request(forged, appeals) is None  # the fold refused it: not the decision
    assert exemption_request(filed, appeals) is None


@pytest.mark.parametrize("job", ["../etc", "a" * 300])
def test_a_malformed_kubernetes_job_id_is_one_line(job: str) -> None:
    from base.errors import ConfigError

    resumer = Resumer(Recorder(), clock_ms=lambda: 1, kueue_owner=lambda ns, n: None, kueue_patch=lambda *a: None)
    with pytest.raises(ConfigError, match="a Kubernetes job id is <namespace>/<pod or workload>"):
        resumer.resume(Request("c", job, "x", "x"), Reclaimed("a", "KUEUE", "SUSPEND", 1))


def test_a_resume_asked_on_the_page_is_a_valid_appeals_record_the_appeal_fold_passes_over() -> None:
    from schemas.models import validate
    from schemas.topics import APPEALS
    from sinks.reclaim_resume import asked_request, resume_asked_event

    asked = resume_asked_event("c", "7", "dana", JobOwner("alice", "research"), 5_000)
    validate(APPEALS.subject, asked)  # what the page publishes is the contract's
    assert asked_request(asked) == Request("c", "7", "dana", "asked by dana on the job's page")
    assert asked_request({**asked, "job_id": "7" * 300}) is None  # bounded
    subject = AppealSubject("c", "7", None, "alice", "research", None, "2026-03", 1_000)
    filed = file_event({}, POLICY, subject, "alice", "it was loading data", 2_000)
    appeals, ignored = fold([filed, asked], POLICY)
    assert list(appeals) == [filed["appeal_id"]] and not ignored  # neither an appeal nor a refused step
    assert exemption_request(asked, appeals) is None and asked_request(filed) is None
