"""Which jobs are preemptible comes from policy.yaml (issue 38 item 3): the QOS `policy render --engine slurm`
makes for the preemptible tier, the WorkloadPriorityClass `--engine kueue` makes for it (read from the Kueue
Workload, v1beta1 and v1beta2 shapes, and the pod's own priority class); `scheduler.preemptible_qos` only as an
explicit override, the conventional names only without a policy; `policy diff` names where the two disagree."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
from fixtures_events import ListSink
from test_kube import WORKLOAD, _pod_lifecycle, _workload_lifecycle
from test_slurm_hooks import PROLOG_ENV, _spool
from test_slurm_uid import FIX

from base.producer_settings import SchedulerSettings
from producers import policy_kueue, policy_slurm
from producers.jobevents import DEFAULT_PREEMPTIBLE, EventContext
from producers.kube import KubeTracker, workload_priority_class
from producers.preemptible import pricing_drift, resolve
from producers.scheduler_service import preemptible_names
from producers.slurm import parse_capture
from producers.slurm_events import slurm_event
from producers.slurm_spool import drain
from schemas.policy import load_policy, parse_policy

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml"


@pytest.fixture(scope="module")
def policy():
    return load_policy(EXAMPLE)


def test_the_example_policys_sweeps_tier_is_what_both_engines_render_and_price(policy) -> None:
    names = resolve([], policy)
    assert (names.slurm_qos, names.priority_classes, names.source) == ({"sweeps"}, {"sweeps"}, "policy")
    # what the renderers actually emit for that tier, not a name re-derived here
    rendered_qos = policy_slurm.desired_state(policy).qos
    assert rendered_qos["sweeps"].priority == 10 and "sweeps" in rendered_qos["production"].preempt
    wpcs = {o["metadata"]["name"]: o["value"] for o in policy_kueue.render_objects(policy)
            if o["kind"] == "WorkloadPriorityClass"}  # fmt: skip
    assert wpcs["sweeps"] == 10
    assert "sweeps" not in DEFAULT_PREEMPTIBLE  # the bug of issue 38: the old static list charged it full price


def test_override_wins_and_no_policy_falls_back_to_the_conventional_names(policy) -> None:
    assert resolve(["spot", ""], policy).names == {"spot"}
    assert resolve(["spot"], policy).source == "scheduler.preemptible_qos"
    assert resolve([], None).names == DEFAULT_PREEMPTIBLE and resolve([], None).source == "default"
    text = EXAMPLE.read_text().replace('preemptible:\n  tier: sweeps\n  discount: "0.40"', "")
    assert "preemptible:" not in text.split("tiers:")[1].split("interactive:")[0]
    assert resolve([], parse_policy(text)).names == frozenset()  # a policy without the section


def test_settings_default_is_empty_and_the_producers_read_the_configured_policy(policy, tmp_path: Path) -> None:
    assert SchedulerSettings().preemptible_qos == []

    class S:
        policy_path: Path | None = EXAMPLE

    assert preemptible_names(S(), SchedulerSettings()).names == {"sweeps"}
    assert preemptible_names(S(), SchedulerSettings(preemptible_qos=["low"])).names == {"low"}
    S.policy_path = None
    assert preemptible_names(S(), SchedulerSettings()).names == DEFAULT_PREEMPTIBLE


def test_policy_diff_says_where_pricing_and_engine_disagree(policy) -> None:
    assert pricing_drift(policy, [], "slurm") == [] and pricing_drift(policy, ["sweeps"], "kueue") == []
    assert pricing_drift(policy, ["scavenger"], "slurm") == [
        "pricing: scheduler.preemptible_qos prices QOS scavenger as preemptible, but the policy's preemptible "
        "tier sweeps is QOS sweeps",
        "pricing: QOS sweeps is the policy's preemptible tier sweeps, but scheduler.preemptible_qos (scavenger) "
        "does not price it as preemptible: its jobs are charged full price",
    ]
    assert pricing_drift(policy, ["sweeps", "low"], "kueue") == [
        "pricing: scheduler.preemptible_qos prices WorkloadPriorityClass low as preemptible, but the policy's "
        "preemptible tier sweeps is WorkloadPriorityClass sweeps",
    ]


def test_slurm_events_preemptible_by_the_policys_qos(policy) -> None:
    (job,) = parse_capture((FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json").read_text()).jobs
    ctx = EventContext("hpc", preemptible_qos=resolve([], policy).names)
    assert slurm_event(replace(job, qos="sweeps"), "STARTED", 1, ctx)["preemptible"] is True
    assert slurm_event(replace(job, qos="production"), "STARTED", 1, ctx)["preemptible"] is False
    assert slurm_event(replace(job, qos="scavenger"), "STARTED", 1, ctx)["preemptible"] is False  # not the policy's


def test_workload_priority_class_in_both_api_versions() -> None:
    assert workload_priority_class(WORKLOAD["spec"]) is None  # captured: priorityClassSource ""
    v1b1 = {"priorityClassName": "sweeps", "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass"}
    assert workload_priority_class(v1b1) == "sweeps"
    assert workload_priority_class({**v1b1, "priorityClassSource": "scheduling.k8s.io/priorityclass"}) is None
    ref = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "sweeps"}
    assert workload_priority_class({"priorityClassRef": ref}) == "sweeps"
    assert workload_priority_class({"priorityClassRef": {**ref, "kind": "PriorityClass"}}) is None
    assert workload_priority_class({"priorityClassRef": {**ref, "name": "x" * 1000}}) == "x" * 253
    assert workload_priority_class({"priorityClassRef": "sweeps"}) is None


def _tracked_pod(workload_spec: dict, pod_class: str | None = None) -> tuple[dict, list[dict]]:
    tracker = KubeTracker(EventContext("gke", preemptible_qos=frozenset({"sweeps"})))
    queued, stream = _workload_lifecycle()
    queued["spec"].update(workload_spec)
    admitted = copy.deepcopy(stream[0][1])
    admitted["spec"].update(workload_spec)
    gang_events = tracker.on_workload("ADDED", queued, 0) + tracker.on_workload("MODIFIED", admitted, 0)
    pending, running, _, _ = (copy.deepcopy(obj) for _, obj in _pod_lifecycle())
    if pod_class:
        for p in (pending, running):
            p["spec"]["priorityClassName"] = pod_class
    tracker.on_pod("ADDED", pending, 0)
    (started,) = tracker.on_pod("MODIFIED", running, 0)
    return started, gang_events


def test_a_pod_is_preemptible_by_its_workloads_class_or_its_own() -> None:
    wpc = {"priorityClassName": "sweeps", "priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
           "priority": 10}
    started, gang = _tracked_pod(wpc)
    assert (started["preemptible"], started["qos"]) == (True, "sweeps")
    assert gang and all(e["preemptible"] and e["qos"] == "sweeps" for e in gang)
    started, gang = _tracked_pod({**wpc, "priorityClassName": "production"})
    assert (started["preemptible"], started["qos"]) == (False, "production")
    assert not any(e["preemptible"] for e in gang)
    started, _ = _tracked_pod({}, pod_class="sweeps")  # a pod PriorityClass the policy's tier is named as
    assert started["preemptible"] is True
    started, _ = _tracked_pod({}, pod_class="scavenger")  # not the policy's: full price
    assert started["preemptible"] is False


def test_the_hooks_events_are_preemptible_by_the_policys_qos(policy, tmp_path: Path) -> None:
    sink = ListSink()
    ctx = EventContext("hpc", preemptible_qos=resolve([], policy).names)
    envs = [("start", {**PROLOG_ENV, "SLURM_JOB_QOS": "sweeps"}),
            ("start", {**PROLOG_ENV, "SLURM_JOB_ID": "4243", "SLURM_JOB_QOS": "production"})]  # fmt: skip
    drain(_spool(tmp_path, envs), ctx, sink, flush=lambda: None)
    assert sorted((r["job_id"], r["preemptible"]) for _, _, r in sink.records) == [("4242", True), ("4243", False)]
