"""The policy on Kueue: ResourceFlavors per generation, a Cohort, a ClusterQueue per team (nominal quota,
borrowing and lending limits, preemption), a LocalQueue per team namespace, a WorkloadPriorityClass per
tier; and the drift between those objects and the live ones.

Pure: a `Policy` in, plain manifests (dicts, `kueue.x-k8s.io/v1beta2`) out; the live objects come in as
dicts read by the CLI (producers/policy_cli.py).

How the policy maps onto Kueue:
- a generation is a ResourceFlavor (`kueue_flavor`, with the generation's node labels);
- a team is a ClusterQueue in the policy's cohort, selecting its namespaces, with one flavor per
  generation: `nominalQuota` is the guarantee, `borrowingLimit` (0 unless stated) and `lendingLimit`
  (absent: all of it may be lent) as the policy says, `fairSharing.weight` its shares;
- preemption: a ClusterQueue reclaims its nominal quota from borrowers (`reclaimWithinCohort: Any`),
  preempts lower priorities inside itself (`withinClusterQueue: LowerPriority`) and, while borrowing,
  workloads of the preemptible tier (`borrowWithinCohort: LowerPriority` up to that tier's priority):
  Kueue preempts by priority, which is why the policy loader refuses a tier preempting a higher one;
- a tier is a WorkloadPriorityClass (`value` its priority);
- fair share (issue 41): under `mode: decay` every ClusterQueue orders its workloads by their LocalQueue's past
  usage (`admissionScope.admissionMode: UsageBasedAdmissionFairSharing`), each LocalQueue weighted by its team's
  shares (`fairSharing.weight`), and the controller's Configuration gets `admissionFairSharing` with
  `usageHalfLifeTime` = the half-life and `usageSamplingInterval` = `kueue.usage_sampling_seconds`
  (`kueue_config`; a file the controller reads at start, so applying it means a restart). Kueue keeps usage as a
  moving average that always fades (pkg/util/admissionfairsharing: decayed = old x (1 - a) + now x a): it cannot
  accumulate, so under `mode: accumulate` admission fair sharing is left off (`NoAdmissionFairSharing`, no
  `admissionFairSharing`) and Kueue admits in priority and arrival order; `policy render` says so;
- interactive (issue 41): the interactive tier is a ClusterQueue of its own in the cohort, nominal quota 0 in
  every flavor, borrowing what the teams' queues lend (their unused quota, taken back by their
  `reclaimWithinCohort`), with a LocalQueue named after the tier in every team namespace: the teams share it,
  fairly by past usage under decay. Kueue has no per-user quota and no session limit on a queue, so
  `max_gpus_per_user` and `max_session_hours` are not rendered on Kueue (Slurm's QOS carries them).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from schemas.policy import Policy, Team

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuledger-policy"}

# kind -> (plural, namespaced): what the CLI needs to read and write each object.
KINDS: dict[str, tuple[str, bool]] = {
    "ResourceFlavor": ("resourceflavors", False),
    "Cohort": ("cohorts", False),
    "WorkloadPriorityClass": ("workloadpriorityclasses", False),
    "ClusterQueue": ("clusterqueues", False),
    "LocalQueue": ("localqueues", True),
}
APPLY_ORDER = tuple(KINDS)


def tier_priority_class(tier: str) -> str:
    """The WorkloadPriorityClass a tier is rendered as (its own name)."""
    return tier


def preemptible_priority_classes(policy: Policy) -> frozenset[str]:
    """The WorkloadPriorityClass the policy renders for its preemptible tier (none without a `preemptible`
    section): what the Kubernetes producer prices as preemptible when a policy is configured."""
    if policy.preemptible is None:
        return frozenset()
    return frozenset({tier_priority_class(policy.preemptible.tier)})


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(MANAGED_BY)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _flavors(policy: Policy) -> list[dict[str, Any]]:
    out = []
    for gen in policy.generations.values():
        spec: dict[str, Any] = {"nodeLabels": dict(gen.node_labels)} if gen.node_labels else {}
        out.append({"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(gen.kueue_flavor),
                    "spec": spec})  # fmt: skip
    return out


def _preemption(policy: Policy) -> dict[str, Any]:
    out: dict[str, Any] = {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
    if policy.preemptible is not None:
        out["borrowWithinCohort"] = {
            "policy": "LowerPriority",
            "maxPriorityThreshold": policy.tier(policy.preemptible.tier).priority,
        }
    return out


def cluster_queue(policy: Policy, team: Team) -> dict[str, Any]:
    resource = policy.kueue.resource
    flavors = []
    for name, gen in policy.generations.items():
        quota: dict[str, Any] = {"name": resource, "nominalQuota": team.quota.get(name, 0),
                                 "borrowingLimit": team.borrowing_limit.get(name, 0)}  # fmt: skip
        if name in team.lending_limit:
            quota["lendingLimit"] = team.lending_limit[name]
        flavors.append({"name": gen.kueue_flavor, "resources": [quota]})
    selector: dict[str, Any] = {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(team.namespaces)}]}  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _meta(team.name),
        "spec": {
            "cohortName": policy.kueue.cohort,
            "namespaceSelector": selector,
            "resourceGroups": [{"coveredResources": [resource], "flavors": flavors}],
            "preemption": _preemption(policy),
            "fairSharing": {"weight": team.shares},
            "admissionScope": admission_scope(policy),
        },
    }


AFS_ON, AFS_OFF = "UsageBasedAdmissionFairSharing", "NoAdmissionFairSharing"
CONFIG_KEY = "admissionFairSharing"


def admission_scope(policy: Policy) -> dict[str, Any]:
    return {"admissionMode": AFS_ON if policy.fair_share.half_life is not None else AFS_OFF}


def kueue_config(policy: Policy) -> dict[str, Any] | None:
    """The policy's part of Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): `admissionFairSharing` under
    decay, None under accumulate (Kueue's usage always fades: it is left off)."""
    half_life = policy.fair_share.half_life
    if half_life is None:
        return None
    seconds = int((half_life * 86_400).to_integral_value())
    return {"usageHalfLifeTime": f"{seconds}s", "usageSamplingInterval": f"{policy.kueue.usage_sampling_seconds}s"}


def go_seconds(text: Any) -> float | None:
    """Seconds of a Go duration as Kueue's Configuration holds it (`168h0m0s`, `60s`, `1m30s`, `500ms`)."""
    import re

    if not isinstance(text, str) or not re.fullmatch(r"(\d+(\.\d+)?(h|m|s|ms))+", text):
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, _, u in re.findall(r"(\d+(\.\d+)?)(ms|h|m|s)", text))


def config_drift(policy: Policy, config: Mapping[str, Any]) -> list[str]:
    """What the controller's Configuration says about admission fair sharing against the policy (one line each)."""
    want, have = kueue_config(policy), config.get(CONFIG_KEY)
    if want is None:
        return [] if have is None else [f"Kueue Configuration: {CONFIG_KEY} is set, policy says off (fair_share "
                                        "accumulate: Kueue's usage always fades)"]  # fmt: skip
    if not isinstance(have, Mapping):
        return [f"Kueue Configuration: {CONFIG_KEY} is missing, policy says {want}"]
    out = []
    for key, value in want.items():
        if go_seconds(have.get(key)) != go_seconds(value):
            out.append(f"Kueue Configuration: {CONFIG_KEY}.{key} is {have.get(key)}, policy says {value}")
    return out


def merged_config(config: Mapping[str, Any], policy: Policy) -> dict[str, Any]:
    """Kueue's Configuration with the policy's admission fair sharing in place (everything else kept)."""
    out = copy.deepcopy(dict(config))
    want = kueue_config(policy)
    if want is None:
        out.pop(CONFIG_KEY, None)
    else:
        out[CONFIG_KEY] = {**(out.get(CONFIG_KEY) or {}), **want}
    return out


def interactive_objects(policy: Policy) -> list[dict[str, Any]]:
    """The interactive tier's shared ClusterQueue and its LocalQueue in every team namespace (none without an
    `interactive` section or team namespaces)."""
    if policy.interactive is None:
        return []
    namespaces = sorted(ns for t in policy.teams for ns in t.namespaces)
    if not namespaces:
        return []
    name, resource = tier_priority_class(policy.interactive.tier), policy.kueue.resource
    flavors = [{"name": g.kueue_flavor, "resources": [{"name": resource, "nominalQuota": 0}]}
               for g in policy.generations.values()]  # fmt: skip
    objs: list[dict[str, Any]] = [{
        "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _meta(name),
        "spec": {
            "cohortName": policy.kueue.cohort,
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]},
            "resourceGroups": [{"coveredResources": [resource], "flavors": flavors}],
            "admissionScope": admission_scope(policy),
        },
    }]  # fmt: skip
    for team in policy.teams:
        for ns in sorted(team.namespaces):
            objs.append({"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": _meta(name, ns),
                         "spec": {"clusterQueue": name, "fairSharing": {"weight": team.shares}}})  # fmt: skip
    return objs


def render_objects(policy: Policy) -> list[dict[str, Any]]:
    """Every Kueue object of the policy, in an order the API server accepts them in."""
    objs = _flavors(policy)
    objs.append({"apiVersion": API_VERSION, "kind": "Cohort", "metadata": _meta(policy.kueue.cohort), "spec": {}})
    for tier in policy.tiers_by_priority():
        about = tier.description or f"gpuledger tier {tier.name}"
        objs.append({"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass",
                     "metadata": _meta(tier_priority_class(tier.name)),
                     "value": tier.priority, "description": about})  # fmt: skip
    for team in policy.teams:
        if not team.namespaces:
            continue  # a Slurm-only team: nothing to queue on Kubernetes
        objs.append(cluster_queue(policy, team))
        for ns in sorted(team.namespaces):
            objs.append({"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": _meta(team.name, ns),
                         "spec": {"clusterQueue": team.name, "fairSharing": {"weight": team.shares}}})  # fmt: skip
    cqs = [o for o in objs if o["kind"] == "ClusterQueue"]
    lqs = [o for o in objs if o["kind"] == "LocalQueue"]
    extra = interactive_objects(policy)
    rest = [o for o in objs if o["kind"] not in ("ClusterQueue", "LocalQueue")]
    return [*rest, *cqs, *(o for o in extra if o["kind"] == "ClusterQueue"), *lqs,
            *(o for o in extra if o["kind"] == "LocalQueue")]  # fmt: skip


def render_yaml(objs: Iterable[Mapping[str, Any]]) -> str:
    import yaml

    head = "# Generated by `gpuledger policy render --engine kueue` from policy.yaml.\n"
    return head + yaml.safe_dump_all([dict(o) for o in objs], sort_keys=False)


# -- drift ----------------------------------------------------------------------------------------


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata", {})
    return (str(obj.get("kind")), str(meta.get("namespace") or ""), str(meta.get("name")))


def _owned(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The part of an object the policy decides (spec, or value and description)."""
    if obj.get("kind") == "WorkloadPriorityClass":
        return {"value": obj.get("value"), "description": obj.get("description")}
    return dict(obj.get("spec") or {})


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Flatten to path -> scalar (lists of named items are keyed by name, so order does not matter)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            tag = v.get("name") if isinstance(v, Mapping) and "name" in v else str(i)
            out.update(_leaves(v, f"{path}[{tag}]"))
        return out
    return {path: value}


def _same(want: Any, have: Any) -> bool:
    """Equal as Kubernetes means it: the server hands quantities back as strings ("2" for 2)."""
    if want == have:
        return True
    if isinstance(want, int) and isinstance(have, str):
        return have == str(want)
    return False


def _text(value: Any) -> str:
    return "(none)" if value is None else str(value)


def _label(key: tuple[str, str, str]) -> str:
    kind, ns, name = key
    return f"{kind} {ns + '/' if ns else ''}{name}"


@dataclass(frozen=True)
class KueueDrift:
    key: tuple[str, str, str]
    path: str  # "" when the whole object is missing
    want: Any
    have: Any
    reserved: tuple[Bump, ...] = ()  # the active reservations `want` includes (a team's quota)

    def __str__(self) -> str:
        label = _label(self.key)
        if not self.path:
            return f"{label}: missing"
        # Plain text: the server may hand a quantity back as "5" or 5, the same value either way.
        if self.reserved:
            policy = self.want - sum(b.gpus for b in self.reserved)
            parts = " + ".join(str(b) for b in self.reserved)
            return (f"{label}: {self.path} is {_text(self.have)}, policy and active reservations say "
                    f"{_text(self.want)} (policy {policy} + {parts})")  # fmt: skip
        return f"{label}: {self.path} is {_text(self.have)}, policy says {_text(self.want)}"


def drift(
    want: Iterable[Mapping[str, Any]], live: Mapping[tuple[str, str, str], Mapping[str, Any]]
) -> list[KueueDrift]:
    """What the live objects lack or hold differently from the policy's. Fields the server adds (defaults
    the policy leaves unset) are not drift; a value the policy sets and the live object changed, or a
    field the policy sets that the live object lost, is."""
    out: list[KueueDrift] = []
    for obj in want:
        key = object_key(obj)
        have = live.get(key)
        if have is None:
            out.append(KueueDrift(key, "", None, None))
            continue
        mine, theirs = _leaves(_owned(obj)), _leaves(_owned(have))
        for path, value in sorted(mine.items()):
            if not _same(value, theirs.get(path)):
                out.append(KueueDrift(key, path, value, theirs.get(path)))
    return out


# -- reservations ---------------------------------------------------------------------------------
# While a reservation is active the reservation service adds its GPUs to the team's ClusterQueue nominalQuota of
# the generation's flavor (sinks/reservations.py, KueueQuota). That bump is not drift: the live quota is
# compared with the policy's plus every active reservation's, and a difference from the policy alone that the
# reservations account for exactly is reported apart, as explained.


def _utc(ms: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%MZ")


@dataclass(frozen=True)
class Bump:
    """An active reservation's GPUs on a team's ClusterQueue, in a flavor, until an instant (epoch ms)."""

    reservation_id: str
    team: str
    flavor: str
    gpus: int
    until_ms: int

    def __str__(self) -> str:
        return f"reservation {self.reservation_id} {self.gpus} until {_utc(self.until_ms)}"


@dataclass(frozen=True)
class ExplainedDrift:
    """A difference from the policy that active reservations account for exactly."""

    drift: KueueDrift
    by: tuple[Bump, ...]

    def __str__(self) -> str:
        why = ", ".join(f"reservation {b.reservation_id} (+{b.gpus}) until {_utc(b.until_ms)}" for b in self.by)
        return f"{_label(self.drift.key)}: {self.drift.path} is {_text(self.drift.have)}, policy says " \
               f"{_text(self.drift.want)}: explained by {why}"  # fmt: skip


def bumps(policy: Policy, reservations: Iterable[Any], cluster: str, now_ms: int) -> list[Bump]:
    """The active reservations of `cluster` (schemas/governance_reservations.py `Reservation`s) as quota bumps
    on the teams' ClusterQueues (teams with namespaces: the others have no queue)."""
    queued = {t.name for t in policy.teams if t.namespaces}
    return [Bump(r.reservation_id, r.team, policy.generations[r.generation].kueue_flavor, r.gpus, r.end_ms)
            for r in sorted(reservations, key=lambda r: r.reservation_id)
            if r.cluster == cluster and r.active(now_ms) and r.team in queued
            and r.generation in policy.generations]  # fmt: skip


def _behind(d: KueueDrift, by: Sequence[Bump], resource: str) -> tuple[Bump, ...]:
    """The bumps on the quota `d` is about: its team's ClusterQueue, a flavor's nominalQuota of the resource (the
    leaf path as `_leaves` names it)."""
    return tuple(b for b in by if d.key == ("ClusterQueue", "", b.team) and d.path.startswith("resourceGroups[")
                 and d.path.endswith(f".flavors[{b.flavor}].resources[{resource}].nominalQuota"))  # fmt: skip


def _reserved(objs: Sequence[Mapping[str, Any]], resource: str, by: Sequence[Bump]) -> list[dict[str, Any]]:
    """The policy's objects with each team's active reservations added to its ClusterQueue's quota."""
    out = []
    for obj in objs:
        mine = [b for b in by if obj.get("kind") == "ClusterQueue" and b.team == obj["metadata"]["name"]]
        if mine:
            obj = copy.deepcopy(dict(obj))
            for group in obj["spec"]["resourceGroups"]:
                for flavor in group["flavors"]:
                    for res in flavor["resources"]:
                        if res["name"] == resource:
                            res["nominalQuota"] += sum(b.gpus for b in mine if b.flavor == flavor["name"])
        out.append(dict(obj))
    return out


def drift_with_reservations(policy: Policy, want: Sequence[Mapping[str, Any]],
                            live: Mapping[tuple[str, str, str], Mapping[str, Any]],
                            by: Sequence[Bump]) -> tuple[list[KueueDrift], list[ExplainedDrift]]:  # fmt: skip
    """(drift the active reservations do not explain, differences from the policy they do). A quota where
    reservations apply is expected at the policy's plus theirs: a bump missing (not put on yet, or taken back by
    a `policy apply`) or of another size is drift, with the reservations named."""
    resource = policy.kueue.resource
    unexplained = []
    for d in drift(_reserved(want, resource, by), live):
        mine = _behind(d, by, resource)
        unexplained.append(KueueDrift(d.key, d.path, d.want, d.have, mine) if mine else d)
    flagged = {(d.key, d.path) for d in unexplained}
    explained = []
    for d in drift(want, live):
        if (d.key, d.path) not in flagged:
            explained.append(ExplainedDrift(d, _behind(d, by, resource)))
    return unexplained, explained
