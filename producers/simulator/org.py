"""The simulated organisation as the registry, the directory and the policy a real site would configure.

The simulator's people (`model._build_people`) as a project registry (`producers.projects.Registry`: each
team's projects, open to the team's members, with cost centres and each user's default) and an identity
directory (`producers.identity.DirectoryEntry`: teams, the first user of each team its lead, an operator
and a finance user). `gpuledger web` uses them under `up` with the simulator when no registry or directory
is configured, so the demo can check a correction and scope a page like a real site. `sim_policy_text()` is
`deploy/policy.sim.yaml` (a unit test keeps them equal): its teams, members and namespaces, one tier, each team's
guaranteed quota per generation sized from the simulated fleet (`sim_fleet_gpus`), and governance with the operator
deciding appeals and approving reservations; `gpuledger up` on the simulator runs with it when no policy_path is
configured (stack/components.py `demo_policy`), so the demo has quota, appeals and reservations.
"""

from __future__ import annotations

import random
from collections import Counter

from producers.identity import DirectoryEntry
from producers.projects import Project, Registry
from producers.simulator.model import TEAMS, SimConfig, _build_nodes, _build_people, clusters

OPERATOR_GROUP = "gpuledger-operators"
FINANCE_GROUP = "gpuledger-finance"
OPERATOR, FINANCE = "ops00", "fin00"
# The CI robot of sim-k8s: the platform team's service account that submits some of its Jobs (the admission stamp
# names it; producers/simulator/kube.py). The directory and registry name the team and project that own it.
ROBOT_TEAM, ROBOT_PROJECT, ROBOT_NAMESPACE, ROBOT_ACCOUNT = "platform", "infra-bench", "platform", "ci-robot"
CI_ROBOT = f"system:serviceaccount:{ROBOT_NAMESPACE}:{ROBOT_ACCOUNT}"


def _robot_cost_centre() -> str:
    return next(cc for team, _, cc in TEAMS if team == ROBOT_TEAM)


def sim_registry() -> Registry:
    projects = {
        pid: Project(id=pid, cost_centre=cc, description=f"{team} project", teams=frozenset({team}))
        for team, pids, cc in TEAMS
        for pid in pids
    }
    return Registry(projects, {**{p.user: p.default_project for p in _build_people()}, CI_ROBOT: ROBOT_PROJECT})


def sim_directory() -> dict[str, DirectoryEntry]:
    leads = {team: min(p.user for p in _build_people() if p.team == team) for team, _, _ in TEAMS}
    out = {
        p.user: DirectoryEntry(
            user=p.user,
            teams=(p.team,),
            cost_centre=p.cost_centre,
            primary_team=p.team,
            leads=(p.team,) if leads[p.team] == p.user else (),
        )
        for p in _build_people()
    }
    out[CI_ROBOT] = DirectoryEntry(user=CI_ROBOT, teams=(ROBOT_TEAM,), cost_centre=_robot_cost_centre(),
                                   primary_team=ROBOT_TEAM)  # fmt: skip
    out[OPERATOR] = DirectoryEntry(user=OPERATOR, groups=(OPERATOR_GROUP,))
    out[FINANCE] = DirectoryEntry(user=FINANCE, groups=(FINANCE_GROUP,))
    return out


# The simulator's GPU models by generation, with the gres type and Kueue flavor a policy names them by.
_GENERATIONS = {"hopper": "h100", "ampere": "a100", "ada": "l40s", "volta": "v100"}
# The fleet `gpuledger simulate run` (and so `make up`) simulates by default: seed 1, 8 Slurm-like nodes and a
# Kubernetes cluster of 3 beside it (producers/telemetry_cli.py's options).
DEMO_CONFIG = SimConfig(seed=1, nodes=8, kube_nodes=3)
# Reservations within a team's quota for up to two days are approved at once; longer ones wait for ops00.
_AUTO_APPROVE_HOURS = 48


def sim_fleet_gpus(cfg: SimConfig = DEMO_CONFIG) -> dict[str, int]:
    """Whole GPUs per generation over every cluster `cfg` simulates (the nodes its plans build, seeded alike).
    A MIG node's GPUs are left out: its jobs hold slices, and a reservation holds whole GPUs."""

    counts: Counter[str] = Counter()
    for c in clusters(cfg):
        for node in _build_nodes(c, random.Random(c.seed)):  # noqa: S311 (the plans' own reproducible draw)
            counts.update(d.generation for d in node.devices if d.mig_instance_id is None)
    return {g: counts[g] for g in _GENERATIONS}


def sim_policy_text() -> str:
    """A policy.yaml for the simulated organisation (schemas/policy.py reads it)."""
    import yaml

    people = _build_people()
    fleet = sim_fleet_gpus()
    # Each team is guaranteed an equal share of the fleet's whole GPUs of a generation, rounded down (the rest is
    # unguaranteed, for borrowing); a reservation may hold up to the team's quota.
    quota = {g: n // len(TEAMS) for g, n in fleet.items() if n // len(TEAMS)}
    data = {
        "version": 1,
        "generations": {
            g: {"slurm_gres": gres, "kueue_flavor": gres, "fleet_gpus": fleet[g]} for g, gres in _GENERATIONS.items()
        },
        "tiers": [{"name": "standard", "priority": 100}],
        "governance": {
            "operators": [OPERATOR],
            "appeals": {"deciders": [OPERATOR], "deadline_hours": 72, "window_days": 60, "max_credit": "500.00",
                        "max_exemption_hours": 168},
            "reservations": {"max_hours": 168, "max_lead_days": 30, "auto_approve_gpus": max(quota.values()),
                             "auto_approve_hours": _AUTO_APPROVE_HOURS},
        },
        "teams": [
            # sim-k8s runs each team's pods in a namespace named after it (producers/simulator/kube.py).
            {"name": team, "members": sorted(p.user for p in people if p.team == team), "namespaces": [team],
             "quota": dict(quota)}
            for team, _, _ in TEAMS
        ],
    }
    shares = ", ".join(f"{g} {n} // {len(TEAMS)} = {quota.get(g, 0)}" for g, n in fleet.items())
    header = ("# The simulated organisation's policy (producers/simulator/org.py writes it; a test keeps it equal):\n"
              "# `make up` on the simulator runs with it when no policy_path is set (quota, appeals, reservations).\n"
              "# fleet_gpus: the demo fleet's whole GPUs per generation (sim + sim-k8s; MIG slices left out).\n"
              f"# quota: each team's guaranteed share, fleet_gpus // {len(TEAMS)} teams:\n#   {shares}.\n"
              f"# A team reserves up to its quota, approved at once up to {_AUTO_APPROVE_HOURS} h (longer: by ops00).\n"
              "# ops00 decides appeals.\n")
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
