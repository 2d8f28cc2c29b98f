"""The policy on Slurm (producers/policy_slurm.py): the desired QOS and associations, the rendered
commands and slurm.conf fragment, and drift read from sacctmgr's own `-P` answers (captured from a real
slurmdbd, tests/fixtures/slurm/sacctmgr/PROVENANCE.md) including the fix that an `apply` runs."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from base.errors import ParseError
from producers import policy_slurm as ps
from producers.policy_cli import slurm_apply, slurm_drift
from schemas.policy import load_policy, parse_policy

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "slurm" / "sacctmgr"
POLICY = load_policy(ROOT / "deploy" / "policy.example.yaml")


def live(kind: str) -> ps.SlurmState:
    return ps.parse_live((FIX / f"show-qos-{kind}.txt").read_text(), (FIX / f"show-assoc-{kind}.txt").read_text())


def test_desired_state_of_the_example() -> None:
    state = ps.desired_state(POLICY)
    assert state.qos["production"] == ps.Qos("production", 1000, frozenset({"sweeps"}))
    assert state.qos["interactive"].max_tres_per_user == "gres/gpu=1"
    assert state.qos["interactive"].max_wall == "08:00:00"
    nlp = state.associations[("nlp", "")]
    # quota + borrowing per gres type: hopper 1 + 0, ampere 1 + 1
    assert dict(nlp.grp_tres) == {"gres/gpu:h100": 1, "gres/gpu:a100": 2}
    assert nlp.default_qos == "training" and nlp.qos == {"training", "interactive", "research", "sweeps"}
    assert state.associations[("vision", "")].fairshare == 2


def test_desired_state_of_the_demo_policy() -> None:
    """deploy/policy.sim.yaml: an account per simulated team holding its quota of every generation (no borrowing)."""
    demo = load_policy(ROOT / "deploy" / "policy.sim.yaml")
    state = ps.desired_state(demo)
    gres = {g: spec.slurm_gres for g, spec in demo.generations.items()}
    for team in demo.teams:
        assoc = state.associations[(team.name, "")]
        assert dict(assoc.grp_tres) == {f"gres/gpu:{gres[g]}": n for g, n in team.quota.items()}
        assert assoc.default_qos == "standard"
    assert dict(state.associations[("vision", "")].grp_tres) == {
        "gres/gpu:h100": 4, "gres/gpu:a100": 3, "gres/gpu:l40s": 3, "gres/gpu:v100": 4}


def test_the_script_is_sacctmgr_commands_preempted_qos_first() -> None:
    script = ps.render_script(ps.desired_state(POLICY)).splitlines()
    assert script[0] == "#!/bin/sh"
    cmds = [line for line in script if line.startswith("sacctmgr")]
    assert all(c.startswith("sacctmgr -i ") for c in cmds)
    assert cmds.index("sacctmgr -i add qos sweeps") < cmds.index("sacctmgr -i add qos production")
    assert ("sacctmgr -i modify account where name=nlp set QOS=interactive,research,sweeps,training "
            "DefaultQOS=training GrpTRES=gres/gpu:a100=2,gres/gpu:h100=1 Fairshare=1") in cmds  # fmt: skip
    assert ("sacctmgr -i modify qos where name=interactive set Priority=300 PreemptMode=requeue "
            "MaxTRESPerUser=gres/gpu=1 MaxWall=08:00:00") in cmds  # fmt: skip


def test_conf_fragment_decay_and_accumulate() -> None:
    conf = ps.render_conf(POLICY).splitlines()
    assert "PriorityType=priority/multifactor" in conf and "PreemptType=preempt/qos" in conf
    assert "PriorityDecayHalfLife=7-00:00" in conf
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:h100,gres/gpu:a100" in conf
    text = (ROOT / "deploy" / "policy.example.yaml").read_text()
    acc = parse_policy(text.replace("mode: decay", "mode: accumulate").replace("  half_life_days: 7\n", ""))
    conf = ps.render_conf(acc).splitlines()
    assert "PriorityDecayHalfLife=0" in conf and "PriorityUsageResetPeriod=NONE" in conf


def test_sacctmgr_answer_after_apply_is_no_drift() -> None:
    have = live("applied")
    assert have.qos["normal"] == ps.Qos("normal", 0, frozenset(), "cluster", "", "")
    assert have.associations[("vision", "root")].user == "root"  # a member row Slurm shows is parsed, not judged
    assert ps.drift(ps.desired_state(POLICY), have) == []


def test_hand_edits_show_as_drift_and_the_fix_undoes_them() -> None:
    want = ps.desired_state(POLICY)
    found = ps.drift(want, live("edited"))
    assert [str(d) for d in found] == [
        "qos research: Priority is 150, policy says 100",
        "qos training: Preempt is (none), policy says sweeps",
        "association nlp: GrpTRES is gres/gpu:a100=2,gres/gpu:h100=3, policy says gres/gpu:a100=2,gres/gpu:h100=1",
    ]
    assert ps.fix_commands(want, found) == [
        ["modify", "qos", "where", "name=research", "set", "Priority=100"],
        ["modify", "qos", "where", "name=training", "set", "Preempt=sweeps"],
        ["modify", "account", "where", "name=nlp", "set", "GrpTRES=gres/gpu:a100=2,gres/gpu:h100=1"],
    ]


def test_missing_objects_are_created_by_apply_and_a_cleared_limit_is_set_back() -> None:
    qos_text = (FIX / "show-qos-applied.txt").read_text().replace("|gres/gpu=1|08:00:00", "||")
    assoc_text = "".join(line + "\n" for line in (FIX / "show-assoc-applied.txt").read_text().splitlines()
                         if not line.startswith("nlp|"))  # fmt: skip
    answers = {"qos": qos_text, "assoc": assoc_text}
    ran: list[list[str]] = []

    def run(argv: Sequence[str]) -> str:
        ran.append(list(argv))
        return answers[argv[4]] if argv[1:4] == ["-n", "-P", "show"] else ""

    commands = slurm_apply(POLICY, run, sacctmgr="/opt/slurm/bin/sacctmgr")
    assert commands[:2] == [["add", "account", "nlp", "Fairshare=1"], ["modify", "account", "where", "name=nlp",
                            "set", "QOS=interactive,research,sweeps,training", "DefaultQOS=training",
                            "GrpTRES=gres/gpu:a100=2,gres/gpu:h100=1", "Fairshare=1"]]  # fmt: skip
    assert ["modify", "qos", "where", "name=interactive", "set", "MaxTRESPerUser=gres/gpu=1"] in commands
    assert ["modify", "qos", "where", "name=interactive", "set", "MaxWall=08:00:00"] in commands
    assert ran[0][:5] == ["/opt/slurm/bin/sacctmgr", "-n", "-P", "show", "qos"]
    assert ran[1][5:7] == ["where", "account=nlp,vision"]
    assert [argv[:2] for argv in ran[2:]] == [["/opt/slurm/bin/sacctmgr", "-i"]] * len(commands)
    assert slurm_drift(POLICY, lambda argv: answers[argv[4]]) != []


def test_a_policy_clearing_a_setting_clears_it_on_slurm() -> None:
    have = live("applied")
    text = (ROOT / "deploy" / "policy.example.yaml").read_text()
    want = ps.desired_state(parse_policy(text.replace("preempts: [sweeps]}\n  - {name: research", "preempts: []}\n"
                                                      "  - {name: research")))  # fmt: skip
    found = ps.drift(want, have)
    assert [str(d) for d in found] == ["qos training: Preempt is sweeps, policy says (none)"]
    assert ps.fix_commands(want, found) == [["modify", "qos", "where", "name=training", "set", "Preempt="]]


@pytest.mark.parametrize(
    ("line", "message"),
    [("nlp||root|gres/gpu:a100=2|1|x", "sacctmgr show assoc line 1: 6 fields, expected 7"),
     ("a|b|c|gres/gpu:h100=two|1|q|q", "TRES 'gres/gpu:h100=two' is not name=count")],
)  # fmt: skip
def test_a_malformed_answer_is_a_parse_error_naming_the_line(line: str, message: str) -> None:
    with pytest.raises(ParseError, match=re.escape(message)):
        ps.parse_live("", line + "\n")
