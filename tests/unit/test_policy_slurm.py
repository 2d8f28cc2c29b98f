"""The policy on Slurm (producers/policy_slurm.py): the desired QOS and associations, the rendered
commands and slurm.conf fragment, and drift read from sacctmgr's own `-P` answers (captured from a real
slurmdbd, tests/fixtures/slurm/sacctmgr/PROVENANCE.md) including the fix that an `apply` runs."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import pytest

from base.errors import ParseError
from producers import policy_slurm as ps
from producers.policy_engine import slurm_apply, slurm_drift
from schemas.policy import PolicyError, load_policy, parse_policy

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
    # each QOS and account the apply creates carries its mark (issue 41: what `apply --prune` may remove)
    assert cmds.index("sacctmgr -i add qos sweeps Description=gpuledger-policy") < cmds.index(
        "sacctmgr -i add qos production Description=gpuledger-policy")
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


SHOW_CONFIG = (ROOT / "tests" / "fixtures" / "slurm" / "scontrol-config" / "multifactor-halflife-1min.txt").read_text()


def one_minute_policy(mode: str = "decay") -> object:
    text = (ROOT / "deploy" / "policy.example.yaml").read_text()
    if mode == "accumulate":
        return parse_policy(text.replace("mode: decay", "mode: accumulate").replace("  half_life_days: 7\n", ""))
    return parse_policy(text.replace("half_life_days: 7", "half_life_days: 0.0007"))


def test_half_life_rounds_to_the_minute_and_under_a_minute_is_refused() -> None:
    # 0.0007 days is 1.008 minutes: one minute. Flooring 0.00069 days (0.99 min) gave 0-00:00: no decay at all.
    assert ps.half_life_text(Decimal("0.0007")) == "0-00:01"
    assert ps.half_life_text(Decimal("0.00069")) == "0-00:01"
    assert ps.half_life_text(Decimal("7")) == "7-00:00"
    assert ps.half_life_text(Decimal("1.5")) == "1-12:00"
    text = (ROOT / "deploy" / "policy.example.yaml").read_text().replace("half_life_days: 7", "half_life_days: 0.0003")
    with pytest.raises(PolicyError, match=r"half_life_days 0.0003 is under a minute"):
        parse_policy(text)


def test_slurm_durations_in_every_form_slurm_writes() -> None:
    assert [ps.slurm_minutes(t) for t in ("00:01:00", "7-00:00:00", "7-00:00", "7-0", "0", "90", "01:30", "x", "1-a")] \
        == [1, 7 * 1440, 7 * 1440, 7 * 1440, 0, 90, 1, None, None]  # fmt: skip


def test_conf_drift_reads_what_slurmctld_runs() -> None:
    # The captured controller runs half-life 1 minute, QOS weight 0; the example policy says 7 days and 10000.
    assert [str(d) for d in ps.conf_drift(POLICY, SHOW_CONFIG)] == [
        "slurm.conf PriorityWeightQOS: slurmctld runs 0, policy says 10000",
        "slurm.conf PriorityDecayHalfLife: slurmctld runs 00:01:00, policy says 7-00:00",
    ]
    one = one_minute_policy()
    assert [d.setting for d in ps.conf_drift(one, SHOW_CONFIG)] == ["PriorityWeightQOS"]
    acc = [str(d) for d in ps.conf_drift(one_minute_policy("accumulate"), SHOW_CONFIG)]
    assert "slurm.conf PriorityDecayHalfLife: slurmctld runs 00:01:00, policy says 0" in acc


def test_the_block_replaces_the_settings_it_manages_and_is_replaced_itself() -> None:
    conf = "ClusterName=c\npriorityweightage=5\nPriorityCalcPeriod=1\n# PriorityDecayHalfLife=1 (a comment)\n"
    once = ps.write_conf(conf, POLICY, 1_000, "priority/multifactor")
    lines = once.splitlines()
    assert lines[:4] == ["ClusterName=c", "#gpuledger-policy: priorityweightage=5", "PriorityCalcPeriod=1",
                         "# PriorityDecayHalfLife=1 (a comment)"]  # fmt: skip
    block = lines[lines.index(ps.BLOCK_BEGIN) + 1 : lines.index(ps.BLOCK_END)]
    assert block == [f"{k}={v}" for k, v in ps.conf_settings(POLICY).items()]  # no stamp: the plugin was already it
    again = ps.write_conf(once, one_minute_policy(), 2_000, "priority/multifactor")
    assert again.count(ps.BLOCK_BEGIN) == 1 and "PriorityDecayHalfLife=0-00:01" in again.splitlines()
    assert "PriorityDecayHalfLife=7-00:00" not in again


def test_a_priority_type_change_is_drift_until_slurmctld_restarts() -> None:
    # Measured: after a reconfigure show config names the new PriorityType while the old plugin runs. The block
    # stamps when it changed the plugin; a slurmctld that booted before the stamp still runs the old one.
    basic = SHOW_CONFIG.replace("priority/multifactor", "priority/basic")
    boot = time.mktime(time.strptime("2026-12-07T13:27:46", "%Y-%m-%dT%H:%M:%S"))
    written = ps.write_conf("ClusterName=c\n", POLICY, boot + 60, "priority/basic")
    assert f"{ps.RESTART_STAMP}{boot + 60:.0f}" in written
    after_reconfigure = SHOW_CONFIG.replace("00:01:00", "7-00:00:00").replace("PriorityWeightQOS       = 0",
                                                                             "PriorityWeightQOS       = 10000")
    found = ps.conf_drift(POLICY, after_reconfigure, written)
    assert [str(d) for d in found] == [
        "slurm.conf PriorityType: slurmctld started before it was set to priority/multifactor; `scontrol "
        "reconfigure` does not load another priority plugin: restart slurmctld"]
    restarted = after_reconfigure.replace("BOOT_TIME               = 2026-12-07T13:27:46",
                                          "BOOT_TIME               = 2026-12-07T13:30:00")
    assert ps.conf_drift(POLICY, restarted, written) == []
    # A later apply that finds the plugin right keeps the stamp (still no restart) rather than dropping it
    assert ps.block_stamp(ps.write_conf(written, POLICY, boot + 120, "priority/multifactor")) == boot + 60
    assert ps.conf_drift(POLICY, basic, None)[0].setting == "PriorityType"


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
    assert commands[:2] == [["add", "account", "nlp", "Fairshare=1", "Description=gpuledger-policy"], [
                            "modify", "account", "where", "name=nlp",
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
