"""Which jobs the producers mark preemptible (and the rate card then charges at the policy's discount).

The names come from one place, in this order:
1. `scheduler.preemptible_qos`, when set: an explicit override, matched against the Slurm QOS and the Kubernetes
   priority classes (a pod's `priorityClassName`, a Kueue Workload's WorkloadPriorityClass);
2. else the policy (settings' `policy_path`): the QOS `policy render --engine slurm` makes for its preemptible
   tier and the WorkloadPriorityClass `policy render --engine kueue` makes for it (producers/policy_slurm.py,
   producers/policy_kueue.py); a policy without a `preemptible` section prices nothing as preemptible;
3. else, with no policy, the conventional names `DEFAULT_PREEMPTIBLE` (what the producers used before policies).

`pricing_drift` is what `policy diff` adds: where the engine's preemptible tier and the pricing disagree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from producers.jobevents import DEFAULT_PREEMPTIBLE
from producers.policy_kueue import preemptible_priority_classes
from producers.policy_slurm import preemptible_qos
from schemas.policy import Policy

Source = Literal["scheduler.preemptible_qos", "policy", "default"]
OVERRIDE: Source = "scheduler.preemptible_qos"


@dataclass(frozen=True)
class PreemptibleNames:
    slurm_qos: frozenset[str]
    priority_classes: frozenset[str]
    source: Source

    @property
    def names(self) -> frozenset[str]:
        """Every name priced as preemptible: the producers' `EventContext.preemptible_qos` (the policy renders
        a tier under the same name on both engines, so one set serves both)."""
        return self.slurm_qos | self.priority_classes


def resolve(override: Iterable[str], policy: Policy | None) -> PreemptibleNames:
    explicit = frozenset(n for n in override if n)
    if explicit:
        return PreemptibleNames(explicit, explicit, OVERRIDE)
    if policy is not None:
        return PreemptibleNames(preemptible_qos(policy), preemptible_priority_classes(policy), "policy")
    return PreemptibleNames(DEFAULT_PREEMPTIBLE, DEFAULT_PREEMPTIBLE, "default")


def pricing_drift(policy: Policy, override: Iterable[str], engine: str) -> list[str]:
    """One line per disagreement between the policy's preemptible tier on `engine` (slurm, kueue) and what the
    producers price as preemptible: only an explicit override can disagree (without one the pricing is the
    policy's)."""
    priced = resolve(override, policy)
    if priced.source != OVERRIDE:
        return []
    kind = "QOS" if engine == "slurm" else "WorkloadPriorityClass"
    rendered = preemptible_qos(policy) if engine == "slurm" else preemptible_priority_classes(policy)
    names = priced.slurm_qos if engine == "slurm" else priced.priority_classes
    tier = policy.preemptible.tier if policy.preemptible is not None else None
    theirs = "the policy has no preemptible tier"
    if tier is not None:
        theirs = f"the policy's preemptible tier {tier} is {kind} {', '.join(sorted(rendered))}"
    out = [f"pricing: {OVERRIDE} prices {kind} {n} as preemptible, but {theirs}" for n in sorted(names - rendered)]
    out += [f"pricing: {kind} {name} is the policy's preemptible tier {tier}, but {OVERRIDE} "
            f"({', '.join(sorted(names))}) does not price it as preemptible: its jobs are charged full price"
            for name in sorted(rendered - names)]  # fmt: skip
    return out
