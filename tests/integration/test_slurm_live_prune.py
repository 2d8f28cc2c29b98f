"""`policy apply --prune` on the live Slurm (issue 41 item 1): it removes what the tool itself created and the policy
no longer names, never anything it did not create.

Slurm keeps no record of who made a QOS or an account, so `policy apply` writes one: each QOS and account it creates
carries the Description `gpuledger-policy` (producers/policy_slurm.MARK), and only marked objects are ever pruned.
A prune by an OS user the policy's governance.pruners does not name is one line and applies nothing. A team and a
tier dropped from the policy lose their account and QOS; a QOS and an account made by hand (unmarked), and what the
policy still names, stay. The cluster is shared by the session's tests, which also apply policies: their marked
objects are the tool's too, and a prune removes them as well (they are re-applied by each test that needs them)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fixtures_cli import run_gpuledger

from stack.slurm.cluster import SlurmClient

pytestmark = pytest.mark.integration


def policy_text(s: str, *, with_sweeps: bool, pruners: str) -> str:
    sweeps = f"  - {{name: sweep-{s}, members: [root], tiers: [sweep-{s}]}}\n" if with_sweeps else ""
    tier = f"  - {{name: sweep-{s}, priority: 10}}\n" if with_sweeps else ""
    return f"""\
version: 1
generations: {{hopper: {{slurm_gres: h100, kueue_flavor: h100}}}}
tiers:
  - {{name: prod-{s}, priority: 1000}}
{tier}governance: {{operators: [ops1], pruners: [{pruners}]}}
teams:
  - {{name: serve-{s}, members: [root], tiers: [prod-{s}]}}
{sweeps}"""


def names(slurm: SlurmClient, what: str) -> dict[str, str]:
    """QOS or accounts -> their Description."""
    field = "Name" if what == "qos" else "Account"
    out = slurm.run("sacctmgr", "-n", "-P", "show", what, f"format={field},Description").stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def test_prune_removes_the_marked_qos_and_accounts_the_policy_dropped_and_nothing_unmarked(
    slurm: SlurmClient, tmp_path: Path
) -> None:
    s = uuid.uuid4().hex[:6]
    policy = tmp_path / "policy.yaml"

    def apply(*extra: str) -> tuple[int, str, str]:
        done = run_gpuledger(["policy", "apply", "--engine", "slurm", "--policy", str(policy), *extra],
                             env=slurm.env, timeout=120)  # fmt: skip
        return done.returncode, done.stdout, done.stderr

    policy.write_text(policy_text(s, with_sweeps=True, pruners="ops1"))
    code, out, err = apply("--prune")
    assert code == 2 and out == "", out
    assert err.strip().splitlines()[-1].endswith("'root' may not prune: policy governance.pruners names who may (ops1)")
    assert f"prod-{s}" not in names(slurm, "qos")  # nothing applied

    policy.write_text(policy_text(s, with_sweeps=True, pruners="root"))
    code, out, err = apply("--prune")
    assert code == 0, out + err
    qos, accounts = names(slurm, "qos"), names(slurm, "account")
    assert qos[f"prod-{s}"] == qos[f"sweep-{s}"] == "gpuledger-policy", qos
    assert accounts[f"serve-{s}"] == accounts[f"sweep-{s}"] == "gpuledger-policy", accounts
    slurm.run("sacctmgr", "-i", "add", "qos", f"hand-{s}")  # made by someone else: unmarked
    slurm.run("sacctmgr", "-i", "add", "account", f"hand-{s}")

    policy.write_text(policy_text(s, with_sweeps=False, pruners="root"))
    code, out, err = apply("--prune")
    assert code == 0, out + err
    lines = out.splitlines()
    assert f"sacctmgr -i delete account where name=sweep-{s}" in lines, out
    assert f"sacctmgr -i delete qos where name=sweep-{s}" in lines, out
    assert lines.index(f"sacctmgr -i delete account where name=sweep-{s}") < lines.index(
        f"sacctmgr -i delete qos where name=sweep-{s}")  # the account (whose associations name the QOS) first
    assert not any(f"hand-{s}" in line or f"prod-{s}" in line or f"serve-{s}" in line
                   for line in lines if "delete" in line)  # fmt: skip
    qos, accounts = names(slurm, "qos"), names(slurm, "account")
    assert f"sweep-{s}" not in qos and f"sweep-{s}" not in accounts
    assert {f"prod-{s}", f"hand-{s}"} <= set(qos) and {f"serve-{s}", f"hand-{s}"} <= set(accounts)
    assert run_gpuledger(["policy", "diff", "--engine", "slurm", "--policy", str(policy)], env=slurm.env,
                         timeout=120).stdout == "no drift\n"  # fmt: skip
    print("pruned:", [line for line in lines if "delete" in line])
