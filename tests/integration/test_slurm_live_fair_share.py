"""Fair share as the policy says, on the live Slurm (fixture `slurm`; issue 41 item 2). `gpuledger policy apply
--engine slurm` writes the policy's priority settings into the cluster's slurm.conf and has slurmctld reread it;
then Slurm itself shows the policy at work:

- a team that used nothing is admitted ahead: its job starts before an earlier job of a team that has used
  GPUs, when the node frees (sprio's fair-share factors say why);
- decay (half-life one minute): the heavy team's usage (sshare's RawUsage) falls at slurmctld's next decay pass;
- accumulate: at the next pass it does not.

The passes come once per PriorityCalcPeriod (a minute on the test cluster, the shortest Slurm has), seen as the
mtime of `priority_last_decay_ran` in slurmctld's state directory: the test waits for them, it does not sleep.
Names carry a suffix: the cluster is shared by the session's tests."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from fixtures_cli import run_gpuledger

from stack.slurm.cluster import SlurmClient

pytestmark = pytest.mark.integration

DECAY_PASS_S = 75  # PriorityCalcPeriod=1 (minute) plus slack


def policy_text(s: str, mode: str) -> str:
    fair = "{mode: decay, half_life_days: 0.0007" if mode == "decay" else "{mode: accumulate"
    return f"""\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 2}}
tiers:
  - {{name: std-{s}, priority: 100}}
fair_share: {fair}, weight_fairshare: 100000, weight_age: 0, weight_qos: 0}}
teams:
  - {{name: heavy-{s}, members: [root], quota: {{hopper: 1}}, borrowing_limit: {{hopper: 1}}}}
  - {{name: idle-{s}, members: [root], quota: {{hopper: 1}}, borrowing_limit: {{hopper: 1}}}}
"""


def cli(slurm: SlurmClient, policy: Path, verb: str) -> tuple[int, str, str]:
    done = run_gpuledger(["policy", verb, "--engine", "slurm", "--policy", str(policy)], env=slurm.env, timeout=120)
    return done.returncode, done.stdout, done.stderr


def raw_usage(slurm: SlurmClient, account: str) -> float:
    """sshare's RawUsage of the account's own row (the one without a user)."""
    out = slurm.run("sshare", "-n", "-P", "-A", account, "-o", "Account,User,RawUsage").stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return float(next(r[2] for r in rows if r[0].strip() == account and not r[1]))


def decay_pass(slurm: SlurmClient, after: float) -> float:
    """Wait for slurmctld's next decay pass after mtime `after`; returns its mtime."""
    marker = slurm.cfg.path("ctld", "priority_last_decay_ran")
    deadline = time.monotonic() + DECAY_PASS_S
    while time.monotonic() < deadline:
        if marker.is_file() and marker.stat().st_mtime > after:
            return marker.stat().st_mtime
        time.sleep(0.5)
    raise AssertionError(f"no decay pass within {DECAY_PASS_S} s ({marker})")


def wait_until(probe: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if probe():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def test_the_engine_decays_or_accumulates_usage_as_the_policy_says(slurm: SlurmClient, tmp_path: Path) -> None:
    s = uuid.uuid4().hex[:6]
    heavy, idle, qos = f"heavy-{s}", f"idle-{s}", f"std-{s}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(s, "decay"))
    rc, out, err = cli(slurm, policy, "apply")
    assert rc == 0, out + err
    assert cli(slurm, policy, "diff")[:2] == (0, "no drift\n")
    config = slurm.run("scontrol", "show", "config").stdout
    assert "PriorityDecayHalfLife   = 00:01:00" in config and "PriorityUsageResetPeriod = NONE" in config

    # The heavy team computes for a while; usage is charged when the job ends.
    used = slurm.submit(f"--account={heavy}", f"--qos={qos}", "--gres=gpu:h100:2", "-c", "8", wrap="sleep 2")
    slurm.wait_for_state(used, "COMPLETED", timeout=60)
    wait_until(lambda: raw_usage(slurm, heavy) > 0, f"{heavy} charged usage")
    assert raw_usage(slurm, idle) == 0

    # Decay: at the next pass the heavy team's usage is down (half-life one minute, passes a minute apart). The
    # same pass computes every association's fair-share factor (before it, a new team's factor is 0).
    marker = slurm.cfg.path("ctld", "priority_last_decay_ran")
    before = raw_usage(slurm, heavy)
    seen = decay_pass(slurm, marker.stat().st_mtime if marker.is_file() else 0.0)
    decayed = raw_usage(slurm, heavy)
    assert decayed < 0.9 * before, (before, decayed)

    # The node busy; the heavy team asks first, the idle team second.
    blocker = slurm.submit("--account=research", "--gres=gpu:h100:2")
    slurm.wait_for_state(blocker, "RUNNING", timeout=60)
    first = slurm.submit(f"--account={heavy}", f"--qos={qos}", "--gres=gpu:h100:2")
    second = slurm.submit(f"--account={idle}", f"--qos={qos}", "--gres=gpu:h100:2")
    factors = dict(line.split("|") for line in slurm.run("sprio", "-h", "-j", f"{first},{second}", "-o",
                                                         "%i|%F").stdout.split())  # fmt: skip
    assert float(factors[second]) > float(factors[first]), factors
    slurm.run("scancel", blocker)
    assert slurm.wait_for_state(second, "RUNNING", timeout=60) == "RUNNING"
    assert slurm.state(first) == "PENDING"  # submitted earlier, behind the team that had used nothing
    slurm.run("scancel", first, second)

    # Accumulate: the same cluster reconfigured by apply; at the next pass the usage stays.
    policy.write_text(policy_text(s, "accumulate"))
    rc, out, err = cli(slurm, policy, "apply")
    assert rc == 0 and "slurm.conf PriorityDecayHalfLife=0 (slurmctld ran 00:01:00)" in out, out + err
    assert cli(slurm, policy, "diff")[:2] == (0, "no drift\n")
    kept = raw_usage(slurm, heavy)
    decay_pass(slurm, seen)
    assert raw_usage(slurm, heavy) == kept, (kept, raw_usage(slurm, heavy))
    print(f"{heavy}: usage {before:g} -> {decayed:g} at a pass under decay; {kept:g} -> {raw_usage(slurm, heavy):g} "
          "at a pass under accumulate")  # fmt: skip
