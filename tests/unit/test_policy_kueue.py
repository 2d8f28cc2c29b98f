"""The policy on Kueue (producers/policy_kueue.py): every rendered object validates against the real CRD
schema of its served version (Kueue v0.19.2's CRDs, tests/fixtures/kubernetes/crds/PROVENANCE.md), with
no field the schema does not declare; quota, limits and preemption say what the policy says; drift
ignores server defaults and catches edits."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from producers import policy_kueue as pk
from schemas.policy import load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "fixtures" / "kubernetes" / "crds"
POLICY = load_policy(ROOT / "deploy" / "policy.example.yaml")


def crd_for(kind: str) -> dict[str, Any]:
    for path in CRDS.glob("kueue-v0.19.2_*.yaml"):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return dict(crd)
    raise AssertionError(f"no CRD for {kind}")


def served_schema(obj: dict[str, Any]) -> dict[str, Any]:
    crd = crd_for(obj["kind"])
    group, version = obj["apiVersion"].split("/")
    assert group == crd["spec"]["group"]
    served = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    assert served, f"{obj['kind']} {version} is not served"
    return dict(served[0]["schema"]["openAPIV3Schema"])


def undeclared(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not declare (the API server's pruning would drop them; JSON Schema lets them be)."""
    out: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                out.append(f"{path}.{key}")
            else:
                out += undeclared(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            out += undeclared(item, schema["items"], f"{path}[{i}]")
    return out


OBJECTS = pk.render_objects(POLICY)
# The demo's policy (producers/simulator/org.py writes it) renders too: a ClusterQueue per team with its quota.
SIM_OBJECTS = pk.render_objects(load_policy(ROOT / "deploy" / "policy.sim.yaml"))


@pytest.mark.parametrize("obj", [
    *(pytest.param(o, id=f"{o['kind']}-{o['metadata']['name']}") for o in OBJECTS),
    *(pytest.param(o, id=f"sim-{o['kind']}-{o['metadata']['name']}") for o in SIM_OBJECTS),
])  # fmt: skip
def test_every_object_validates_against_its_crd(obj: dict[str, Any]) -> None:
    schema = served_schema(obj)
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(obj)
    assert undeclared({k: v for k, v in obj.items() if k != "metadata"}, schema) == []


def test_the_validator_would_catch_a_wrong_object() -> None:
    cq = copy.deepcopy(next(o for o in OBJECTS if o["kind"] == "ClusterQueue"))
    cq["spec"]["preemption"]["reclaimWithinCohort"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError, match="Sometimes"):
        jsonschema.Draft7Validator(served_schema(cq)).validate(cq)
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["bogus"] = 1
    assert undeclared(cq, served_schema(cq)) == [".spec.resourceGroups[0].flavors[0].resources[0].bogus"]


def test_kinds_and_counts() -> None:
    kinds = [o["kind"] for o in OBJECTS]
    assert kinds.count("ResourceFlavor") == 2 and kinds.count("Cohort") == 1
    assert kinds.count("WorkloadPriorityClass") == 5 and kinds.count("ClusterQueue") == 3  # 2 teams, interactive
    assert kinds.count("LocalQueue") == 4  # a team's own and the interactive one, in each team namespace
    assert kinds.index("ResourceFlavor") < kinds.index("ClusterQueue") < kinds.index("LocalQueue")


def test_cluster_queue_says_what_the_policy_says() -> None:
    nlp = pk.cluster_queue(POLICY, POLICY.team("nlp"))
    spec = nlp["spec"]
    assert spec["cohortName"] == "gpuledger"
    assert spec["namespaceSelector"]["matchExpressions"][0]["values"] == ["nlp"]
    flavors = {f["name"]: f["resources"][0] for f in spec["resourceGroups"][0]["flavors"]}
    assert flavors["h100"] == {"name": "nvidia.com/gpu", "nominalQuota": 1, "borrowingLimit": 0}
    assert flavors["a100"] == {"name": "nvidia.com/gpu", "nominalQuota": 1, "borrowingLimit": 1, "lendingLimit": 1}
    assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority",
                                  "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 10}}
    priorities = {o["metadata"]["name"]: o["value"] for o in OBJECTS if o["kind"] == "WorkloadPriorityClass"}
    assert priorities == {"production": 1000, "training": 500, "interactive": 300, "research": 100, "sweeps": 10}


def test_drift_ignores_server_defaults_and_string_quantities_and_sees_edits() -> None:
    live = {pk.object_key(o): copy.deepcopy(o) for o in OBJECTS}
    cq_key = ("ClusterQueue", "", "nlp")
    live[cq_key]["spec"]["queueingStrategy"] = "BestEffortFIFO"  # a default the server adds
    live[cq_key]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "1"
    assert pk.drift(OBJECTS, live) == []
    live[cq_key]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "5"
    del live[("LocalQueue", "vision", "vision")]
    assert [str(d) for d in pk.drift(OBJECTS, live)] == [
        "ClusterQueue nlp: resourceGroups[0].flavors[h100].resources[nvidia.com/gpu].nominalQuota is 5, "
        "policy says 1",
        "LocalQueue vision/vision: missing",
    ]


def test_render_writes_each_engines_files(tmp_path: Path) -> None:
    import os

    from fixtures_cli import run_gpuledger

    policy = ROOT / "deploy" / "policy.example.yaml"
    for engine in ("kueue", "slurm"):
        done = run_gpuledger(["policy", "render", "--engine", engine, "--out", str(tmp_path), "--policy", str(policy)],
                             env=dict(os.environ), timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert list(yaml.safe_load_all((tmp_path / "kueue-policy.yaml").read_text())) == OBJECTS
    assert yaml.safe_load((tmp_path / "kueue-config.yaml").read_text()) == {
        "admissionFairSharing": {"usageHalfLifeTime": "604800s", "usageSamplingInterval": "300s"}}
    assert (tmp_path / "sacctmgr-policy.sh").read_text().startswith("#!/bin/sh\n")
    assert "PreemptType=preempt/qos" in (tmp_path / "slurm-policy.conf").read_text().splitlines()
    bad = run_gpuledger(["policy", "render", "--engine", "lsf", "--out", str(tmp_path), "--policy", str(policy)],
                        env=dict(os.environ), timeout=60)  # fmt: skip
    assert bad.returncode == 2 and "--engine must be one of slurm, kueue, got 'lsf'" in bad.stderr


# -- drift and reservations (hand-built reservations; the service's own bump from sinks/reservations.py) --------

NOW = 1_796_000_000_000
HOUR = 3_600_000
QUOTA = "resourceGroups[0].flavors[{}].resources[nvidia.com/gpu].nominalQuota"


def reservation(rid: str, gpus: int, *, team: str = "vision", generation: str = "hopper", cluster: str = "c1",
                start: int = NOW - HOUR, end: int = NOW + HOUR, approved: bool = True) -> Any:  # fmt: skip
    from schemas.governance_reservations import Reservation

    return Reservation(rid, cluster, team, generation, gpus, (), start, end, "alice", start, "launch",
                       approved_by="ops1" if approved else None)  # fmt: skip


def quota_of(live: dict[Any, Any], team: str, flavor: str) -> Any:
    flavors = live[("ClusterQueue", "", team)]["spec"]["resourceGroups"][0]["flavors"]
    return next(f for f in flavors if f["name"] == flavor)["resources"][0]


def test_a_quota_raised_by_active_reservations_is_explained_not_drift() -> None:
    live = {pk.object_key(o): copy.deepcopy(o) for o in OBJECTS}
    quota_of(live, "vision", "h100")["nominalQuota"] = "4"  # policy 1 + 2 + 1 reserved, as the server returns it
    held = [reservation("rsv-a", 2), reservation("rsv-b", 1, end=NOW + 2 * HOUR)]
    by = pk.bumps(POLICY, held, "c1", NOW)
    found, explained = pk.drift_with_reservations(POLICY, OBJECTS, live, by)
    assert found == [] and pk.drift(OBJECTS, live)  # without the reservations, the same quota is drift
    assert [str(e) for e in explained] == [
        f"ClusterQueue vision: {QUOTA.format('h100')} is 4, policy says 1: explained by reservation rsv-a (+2) "
        "until 2026-11-30T01:53Z, reservation rsv-b (+1) until 2026-11-30T02:53Z"
    ]


def test_reservations_explain_only_their_exact_bump() -> None:
    live = {pk.object_key(o): copy.deepcopy(o) for o in OBJECTS}
    held = [reservation("rsv-a", 2), reservation("rsv-nlp", 1, team="nlp", generation="ampere")]
    # Ended, not yet approved, of another cluster: no bump.
    ignored = [reservation("rsv-old", 2, start=NOW - 3 * HOUR, end=NOW - HOUR),
               reservation("rsv-new", 2, approved=False), reservation("rsv-far", 2, cluster="c2")]  # fmt: skip
    by = pk.bumps(POLICY, [*held, *ignored], "c1", NOW)
    assert [b.reservation_id for b in by] == ["rsv-a", "rsv-nlp"]
    quota_of(live, "vision", "h100")["nominalQuota"] = 5  # 1 + 2 reserved + 2 more by hand
    quota_of(live, "nlp", "a100")["nominalQuota"] = 1  # the nlp bump not on (yet, or taken back by policy apply)
    live[("ClusterQueue", "", "vision")]["spec"]["fairSharing"]["weight"] = 7  # an edit elsewhere
    found, explained = pk.drift_with_reservations(POLICY, OBJECTS, live, by)
    assert explained == []
    assert [str(d) for d in found] == [
        "ClusterQueue vision: fairSharing.weight is 7, policy says 2",
        f"ClusterQueue vision: {QUOTA.format('h100')} is 5, policy and active reservations say 3 "
        "(policy 1 + reservation rsv-a 2 until 2026-11-30T01:53Z)",
        f"ClusterQueue nlp: {QUOTA.format('a100')} is 1, policy and active reservations say 2 "
        "(policy 1 + reservation rsv-nlp 1 until 2026-11-30T01:53Z)",
    ]


def test_the_reservation_services_own_bump_is_what_diff_explains() -> None:
    """sinks/reservations.py raises the quota; producers/policy_kueue.py must read that raise as explained."""
    from sinks.reservations import KueueQuota

    class Api:
        def __init__(self, cq: dict[str, Any]) -> None:
            self.cq = cq

        def get_cluster_custom_object(self, *args: Any) -> dict[str, Any]:
            return copy.deepcopy(self.cq)

        def patch_cluster_custom_object(self, group: str, version: str, plural: str, name: str, body: Any) -> None:
            self.cq["spec"].update(copy.deepcopy(body["spec"]))

    live = {pk.object_key(o): copy.deepcopy(o) for o in OBJECTS}
    api = Api(live[("ClusterQueue", "", "vision")])
    held = reservation("rsv-a", 2)
    engine = KueueQuota(POLICY, api)
    engine.sync([held], NOW)
    engine.render(held)
    assert quota_of(live, "vision", "h100")["nominalQuota"] == 3
    found, explained = pk.drift_with_reservations(POLICY, OBJECTS, live, pk.bumps(POLICY, [held], "c1", NOW))
    assert found == [] and len(explained) == 1
    later = NOW + 2 * HOUR  # past its end, the service not yet run: the raise is drift again
    found, explained = pk.drift_with_reservations(POLICY, OBJECTS, live, pk.bumps(POLICY, [held], "c1", later))
    assert explained == [] and [d.path for d in found] == [QUOTA.format("h100")]


def test_fair_share_decay_is_admission_fair_sharing_and_accumulate_leaves_it_off() -> None:
    # Decay: every ClusterQueue orders by past usage, each LocalQueue weighted by its team's shares, and the
    # controller's Configuration carries the half-life (7 days) and the sampling interval (Kueue's default 5 min).
    cqs = {o["metadata"]["name"]: o for o in OBJECTS if o["kind"] == "ClusterQueue"}
    assert {n: cq["spec"]["admissionScope"] for n, cq in cqs.items()} == {
        n: {"admissionMode": "UsageBasedAdmissionFairSharing"} for n in ("vision", "nlp", "interactive")}
    lqs = {(o["metadata"]["namespace"], o["metadata"]["name"]): o["spec"] for o in OBJECTS if o["kind"] == "LocalQueue"}
    assert lqs[("vision", "interactive")] == {"clusterQueue": "interactive", "fairSharing": {"weight": 2}}
    assert lqs[("nlp", "nlp")] == {"clusterQueue": "nlp", "fairSharing": {"weight": 1}}
    assert pk.kueue_config(POLICY) == {"usageHalfLifeTime": "604800s", "usageSamplingInterval": "300s"}
    text = (ROOT / "deploy" / "policy.example.yaml").read_text()
    acc = parse_policy(text.replace("mode: decay", "mode: accumulate").replace("  half_life_days: 7\n", ""))
    assert pk.kueue_config(acc) is None
    assert {o["spec"]["admissionScope"]["admissionMode"] for o in pk.render_objects(acc)
            if o["kind"] == "ClusterQueue"} == {"NoAdmissionFairSharing"}  # fmt: skip


def test_the_interactive_queue_borrows_what_the_teams_lend() -> None:
    (cq,) = [o for o in OBJECTS if o["kind"] == "ClusterQueue" and o["metadata"]["name"] == "interactive"]
    assert cq["spec"]["cohortName"] == POLICY.kueue.cohort
    assert cq["spec"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["nlp", "vision"]
    for flavor in cq["spec"]["resourceGroups"][0]["flavors"]:
        assert flavor["resources"] == [{"name": "nvidia.com/gpu", "nominalQuota": 0}]  # no borrowingLimit: any


def test_the_controllers_configuration_is_merged_and_its_drift_read() -> None:
    config = {"apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": "kueue-system"}
    assert pk.config_drift(POLICY, config) == [
        "Kueue Configuration: admissionFairSharing is missing, policy says "
        "{'usageHalfLifeTime': '604800s', 'usageSamplingInterval': '300s'}"]
    merged = pk.merged_config(config, POLICY)
    assert merged["namespace"] == "kueue-system" and pk.config_drift(POLICY, merged) == []
    merged["admissionFairSharing"]["usageHalfLifeTime"] = "168h0m0s"  # the same, as Go writes it
    assert pk.config_drift(POLICY, merged) == []
    merged["admissionFairSharing"]["usageHalfLifeTime"] = "1h"
    assert pk.config_drift(POLICY, merged) == [
        "Kueue Configuration: admissionFairSharing.usageHalfLifeTime is 1h, policy says 604800s"]
    text = (ROOT / "deploy" / "policy.example.yaml").read_text()
    acc = parse_policy(text.replace("mode: decay", "mode: accumulate").replace("  half_life_days: 7\n", ""))
    assert pk.config_drift(acc, merged)[0].startswith(
        "Kueue Configuration: admissionFairSharing is set, policy says off")
    assert "admissionFairSharing" not in pk.merged_config(merged, acc)
    seconds = [pk.go_seconds(t) for t in ("168h0m0s", "60s", "1m30s", "500ms", "x", 5)]
    assert seconds == [604800, 60, 90, 0.5, None, None]
