"""policy.yaml (schemas/policy.py): the shipped example loads; a bad file gives one `file:line: what` per
problem, the line being the one the problem is on, and nothing else."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from fixtures_cli import run_gpuledger

from schemas.policy import MAX_FILE_BYTES, PolicyError, load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "policy.example.yaml"

GOOD = """\
version: 1
generations:
  hopper: {slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 4}
tiers:
  - {name: prod, priority: 1000, preempts: [sweeps]}
  - {name: sweeps, priority: 10}
preemptible: {tier: sweeps, discount: "0.25"}
teams:
  - {name: a, namespaces: [a], quota: {hopper: 2}, borrowing_limit: {hopper: 2}}
  - {name: b, quota: {hopper: 2}}
"""


def problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, "p.yaml")
    return caught.value.problems


def test_the_shipped_example_loads_with_its_decisions() -> None:
    policy = load_policy(EXAMPLE)
    assert policy.preemptible_discount == Decimal("0.40")
    order = [t.name for t in policy.tiers_by_priority()]
    assert order == ["production", "training", "interactive", "research", "sweeps"]
    vision = policy.team("vision")
    assert vision.account == "vision" and vision.quota == {"hopper": 1, "ampere": 1}
    assert policy.team_tiers(vision) == ("production", "training", "interactive", "sweeps")
    assert policy.fair_share.half_life == Decimal(7)


def test_a_good_policy_defaults() -> None:
    policy = parse_policy(GOOD)
    assert policy.team("b").account == "b" and policy.team_tiers(policy.team("b")) == ("prod", "sweeps")
    assert policy.team("b").borrowing_limit == {}
    assert policy.fair_share.mode == "decay" and policy.fair_share.half_life == Decimal(7)


def test_each_problem_is_one_line_with_its_own_line_number() -> None:
    text = """\
version: 1
generations:
  hopper: {slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 2}
  pascalx: {slurm_gres: p100, kueue_flavor: p100}
tiers:
  - {name: a, priority: 10, preempts: [b]}
  - {name: b, priority: 5, preempts: [a]}
teams:
  - name: t1
    quota: {hopper: 3, volta: 1}
    borrowing_limit: {hopper: -1}
  - name: t2
    tiers: [zzz]
"""
    found = problems(text)
    assert found == [
        "p.yaml:3: guaranteed hopper quota 3 GPUs (t1 3) is above the fleet's 2",
        "p.yaml:4: unknown generation 'pascalx' (known: ada, ampere, blackwell, cdna2, cdna3, hopper, kepler, maxwell, "
        "pascal, turing, volta)",
        "p.yaml:6: preemption cycle: a -> b -> a",
        "p.yaml:10: team 't1': quota for unknown generation 'volta'",
        "p.yaml:11: team 't1': borrowing_limit.hopper must be 0..1000000, got -1",
        "p.yaml:13: team 't2' names unknown tier 'zzz'",
    ]


@pytest.mark.parametrize(
    ("edit", "line", "fragment"),
    [
        (("priority: 10}", "priority: 2000}"), 5, "preempts 'sweeps' of priority 2000: a tier preempts only lower"),
        (("tier: sweeps,", "tier: nope,"), 7, "preemptible.tier names unknown tier 'nope'"),
        (('discount: "0.25"', 'discount: "1.5"'), 7, "preemptible.discount: Input should be less than 1"),
        (("{name: b, quota", "{name: b, slurm_account: a, quota"), 10, "account 'a' of team 'b' is already team 'a''s"),
        (("quota: {hopper: 2}}", "quota: {hopper: 2}, shoe_size: 9}"), 10, "teams.1.shoe_size: Extra inputs"),
        (("slurm_gres: h100", "slurm_gres: a100"), 3, "gres type 'a100' is a ampere GPU, not hopper"),
        (("borrowing_limit: {hopper: 2}", "borrowing_limit: {hopper: 3}"), 9, "team 'a' may hold 5 hopper GPUs, the "
         "fleet has 4"),
        (("namespaces: [a]", "namespaces: [A_b]"), 9, "'A_b' is not a Kubernetes namespace name"),
    ],
)
def test_each_kind_of_problem_points_at_its_line(edit: tuple[str, str], line: int, fragment: str) -> None:
    old, new = edit
    assert old in GOOD
    found = problems(GOOD.replace(old, new, 1))
    assert len(found) == 1, found
    assert found[0].startswith(f"p.yaml:{line}: ") and fragment in found[0], found


def test_yaml_errors_aliases_and_size_are_refused_with_a_place() -> None:
    assert problems("version: 1\nteams: [\n")[0].startswith("p.yaml:3: not valid YAML")
    bomb = "version: 1\nx: &a [1, 2]\ny: [*a, *a]\n"
    assert problems(bomb) == ["p.yaml:2: YAML aliases are not allowed in a policy"] * 2
    assert problems("x" * (MAX_FILE_BYTES + 1)) == [f"p.yaml: larger than {MAX_FILE_BYTES} bytes"]
    assert problems("version: 1\nversion: 1\n")[0] == "p.yaml:2: duplicate key 'version'"
    assert problems("- 1\n") == ["p.yaml:1: the policy must be a mapping (version, generations, tiers, teams)"]
    assert problems("version: 1\nx: " + "[" * 20 + "]" * 20 + "\n") == ["p.yaml:2: nested deeper than 16 levels"]
    assert problems("x: " + "[" * 5000 + "]" * 5000) == ["p.yaml: nested deeper than YAML can be read"]


def test_the_cli_prints_the_problems_exits_2_and_renders_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(GOOD.replace("{name: b, quota: {hopper: 2}}", "{name: b, quota: {hopper: 2}, tiers: [gold]}"))
    out = tmp_path / "out"
    done = run_gpuledger(["policy", "render", "--engine", "slurm", "--out", str(out), "--policy", str(bad)],
                         env=dict(os.environ), timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"{bad}:10: team 'b' names unknown tier 'gold'"]
    assert not out.exists()


def test_robots_name_their_owners_and_bad_entries_point_at_their_lines() -> None:
    policy = parse_policy(GOOD + """\
robots:
  - {account: "system:serviceaccount:a:ci-robot", team: a, project: p-a}
  - {account: svc-etl, team: b}
""")
    robot = policy.robot("system:serviceaccount:a:ci-robot")
    assert robot is not None and (robot.team, robot.project, robot.service_account) == ("a", "p-a", ("a", "ci-robot"))
    slurm = policy.robot("svc-etl")
    assert slurm is not None and slurm.service_account is None and slurm.project is None
    assert policy.robot("system:serviceaccount:a:other") is None  # nobody owns it
    found = problems(GOOD + """\
robots:
  - {account: "system:serviceaccount:A_B:x", team: a}
  - {account: svc-etl, team: nobody}
  - {account: svc-etl, team: b}
  - {account: svc-x, team: b, owner: me}
""")
    assert found == [
        "p.yaml:15: robots.3.owner: Extra inputs are not permitted",
    ]
    found = problems(GOOD + """\
robots:
  - {account: "system:serviceaccount:A_B:x", team: a}
  - {account: svc-etl, team: nobody}
  - {account: svc-etl, team: b}
""")
    assert found == [
        "p.yaml:12: 'system:serviceaccount:A_B:x' is neither system:serviceaccount:<namespace>:<name> nor a user name",
        "p.yaml:13: robot 'svc-etl' names unknown team 'nobody'",
        "p.yaml:14: robot 'svc-etl' is already robots[1]",
    ]
