"""The simulated organisation as the registry, the directory and the policy a real site would configure.

The simulator's people (`model._build_people`) as a project registry (`producers.projects.Registry`: each
team's projects, open to the team's members, with cost centres and each user's default) and an identity
directory (`producers.identity.DirectoryEntry`: teams, the first user of each team its lead, an operator
and a finance user). `gpuledger web` uses them under `up` with the simulator when no registry or directory
is configured, so the demo can check a correction and scope a page like a real site. `sim_policy_text()` is
`deploy/policy.sim.yaml` (a unit test keeps them equal): its teams and members, one tier, and governance with
the operator deciding appeals; `GPULEDGER_POLICY_PATH=deploy/policy.sim.yaml` gives the demo appeals.
"""

from __future__ import annotations

from producers.identity import DirectoryEntry
from producers.projects import Project, Registry
from producers.simulator.model import TEAMS, _build_people

OPERATOR_GROUP = "gpuledger-operators"
FINANCE_GROUP = "gpuledger-finance"
OPERATOR, FINANCE = "ops00", "fin00"


def sim_registry() -> Registry:
    projects = {
        pid: Project(id=pid, cost_centre=cc, description=f"{team} project", teams=frozenset({team}))
        for team, pids, cc in TEAMS
        for pid in pids
    }
    return Registry(projects, {p.user: p.default_project for p in _build_people()})


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
    out[OPERATOR] = DirectoryEntry(user=OPERATOR, groups=(OPERATOR_GROUP,))
    out[FINANCE] = DirectoryEntry(user=FINANCE, groups=(FINANCE_GROUP,))
    return out


# The simulator's GPU models by generation, with the gres type and Kueue flavor a policy names them by.
_GENERATIONS = {"hopper": "h100", "ampere": "a100", "ada": "l40s", "volta": "v100"}


def sim_policy_text() -> str:
    """A policy.yaml for the simulated organisation (schemas/policy.py reads it)."""
    import yaml

    people = _build_people()
    data = {
        "version": 1,
        "generations": {g: {"slurm_gres": gres, "kueue_flavor": gres} for g, gres in _GENERATIONS.items()},
        "tiers": [{"name": "standard", "priority": 100}],
        "governance": {
            "operators": [OPERATOR],
            "appeals": {"deciders": [OPERATOR], "deadline_hours": 72, "window_days": 60, "max_credit": "500.00",
                        "max_exemption_hours": 168},
        },
        "teams": [
            {"name": team, "members": sorted(p.user for p in people if p.team == team)} for team, _, _ in TEAMS
        ],
    }
    header = ("# The simulated organisation's policy (producers/simulator/org.py writes it; a test keeps it equal):\n"
              "# GPULEDGER_POLICY_PATH=deploy/policy.sim.yaml gives the demo appeals, decided by ops00.\n")
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)
