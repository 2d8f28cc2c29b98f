"""policy.yaml on a live Slurm (fixture `slurm`: slurmctld, slurmd, slurmdbd, MariaDB, munge on loopback):
`gpuledger policy apply --engine slurm` puts the QOS, accounts and associations there through sacctmgr;
then Slurm itself enforces them: a team over its GPU quota stays PENDING with Slurm's reason
`AssocGrpGRES`, and a production-tier job preempts a preemptible sweep (requeued). `policy diff` is empty
after apply and shows a hand-made `sacctmgr -i modify` as drift (exit 1); the policy watch, running beside it,
alerts each change within one interval and clears after apply. Names carry a suffix: the cluster is shared by the
session's tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_cli import run_gpuledger
from fixtures_policy_watch import INTERVAL_S, Watch, kinds

from stack.slurm.cluster import SlurmClient

pytestmark = pytest.mark.integration


def policy_text(s: str) -> str:
    return f"""\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 2}}
  ampere: {{slurm_gres: a100, kueue_flavor: a100, fleet_gpus: 2}}
tiers:
  - {{name: prod-{s}, priority: 1000, preempts: [sweep-{s}]}}
  - {{name: sweep-{s}, priority: 10}}
preemptible: {{tier: sweep-{s}, discount: "0.40"}}
fair_share: {{mode: decay, half_life_days: 7}}
teams:
  - {{name: serve-{s}, members: [root], tiers: [prod-{s}], quota: {{hopper: 1}}}}
  - {{name: sweep-{s}, members: [root], tiers: [sweep-{s}], borrowing_limit: {{hopper: 2}}}}
"""


class Applied:
    def __init__(self, slurm: SlurmClient, policy: Path, suffix: str) -> None:
        self.slurm, self.policy, self.s = slurm, policy, suffix

    def cli(self, verb: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        done = run_gpuledger(["policy", verb, "--engine", "slurm", "--policy", str(self.policy)],
                             env={**self.slurm.env, **(env or {})}, timeout=120)  # fmt: skip
        return done.returncode, done.stdout, done.stderr


@pytest.fixture(scope="module")
def applied(live_slurm: SlurmClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Applied]:
    s = uuid.uuid4().hex[:6]
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy.write_text(policy_text(s))
    it = Applied(live_slurm, policy, s)
    rc, out, err = it.cli("apply")
    assert rc == 0, err
    assert out.strip().endswith("applied: 10 sacctmgr commands"), out
    yield it


def test_diff_is_empty_after_apply_and_shows_a_hand_edit(slurm: SlurmClient, applied: Applied, kafka_bootstrap: str,
                                                         tmp_path: Path) -> None:  # fmt: skip
    """Also the policy watch (issue 41 item 1): running beside the edit, it says clean, raises one drift alert with
    the diff's exact lines within one interval of the edit, and clears it once `policy apply` has run."""
    s = applied.s
    assert applied.cli("diff")[:2] == (0, "no drift\n")
    watch = Watch(kafka_bootstrap, tmp_path, ["--engine", "slurm", "--policy", str(applied.policy)])
    try:
        watch.wait("the first pass: clean", lambda a: kinds(a) == ["POLICY_DRIFT_CLEARED"])
        qos = f"qos prod-{s}: Priority is 5, policy says 1000"
        slurm.run("sacctmgr", "-i", "modify", "qos", "where", f"name=prod-{s}", "set", "Priority=5")
        took = watch.wait("the QOS drift alerted", lambda a: kinds(a)[1:] == ["POLICY_DRIFT"])
        assert took < INTERVAL_S + 5  # within one interval (plus the pass itself)
        assert watch.alerts()[1]["drift_lines"] == [qos]
        slurm.run("sacctmgr", "-i", "modify", "account", "where", f"name=serve-{s}", "set", "GrpTRES=gres/gpu:h100=2")
        rc, out, _ = applied.cli("diff")
        assert rc == 1
        assert out.splitlines() == [
            qos,
            f"association serve-{s}: GrpTRES is gres/gpu:a100=0,gres/gpu:h100=2, policy says "
            "gres/gpu:a100=0,gres/gpu:h100=1",
        ]
        # One alert per change: the second edit makes a new drift, alerted with the diff's exact lines.
        watch.wait("the second drift alerted", lambda a: kinds(a)[1:] == ["POLICY_DRIFT"] * 2)
        assert watch.alerts()[2]["drift_lines"] == out.splitlines()
        rc, out, err = applied.cli("apply", watch.env)
        assert rc == 0 and "applied: 2 sacctmgr commands" in out, err
        assert applied.cli("diff")[:2] == (0, "no drift\n")
        # The apply is recorded: who (the OS user sacctmgr ran as), each setting before and after, nothing left.
        (record,) = watch.applies()
        assert (record["engine"], record["actor"], record["actor_source"]) == ("slurm", "root", "os-user")
        assert [(c["object"], c["setting"], c["before"], c["after"]) for c in record["changes"]] == [
            (f"qos prod-{s}", "Priority", "5", "1000"),
            (f"association serve-{s}", "GrpTRES", "gres/gpu:a100=0,gres/gpu:h100=2", "gres/gpu:a100=0,gres/gpu:h100=1"),
        ] and record["still_differs"] == []
        assert f"recorded: apply {record['apply_id'][:12]} by root (os-user), 2 change(s)" in out
        then = ["POLICY_DRIFT", "POLICY_DRIFT", "POLICY_DRIFT_CLEARED"]
        cleared = watch.wait("the drift cleared", lambda a: kinds(a)[1:] == then)
        alerts = watch.alerts()
        assert alerts[3]["alert_id"] == alerts[2]["alert_id"].replace("policy-drift/", "policy-drift-cleared/")
        assert {a["engine"] for a in alerts} == {"slurm"}
        print(f"policy watch (slurm, interval {INTERVAL_S} s): QOS drift alerted {took:.1f} s after the edit, "
              f"cleared {cleared:.1f} s after apply")
    finally:
        watch.stop()


def test_a_team_over_its_gpu_quota_stays_pending_with_slurms_reason(slurm: SlurmClient, applied: Applied) -> None:
    s = applied.s
    first = slurm.submit(f"--account=serve-{s}", f"--qos=prod-{s}", "--gres=gpu:h100:1")
    assert slurm.wait_for_state(first, "RUNNING", timeout=60) == "RUNNING"
    second = slurm.submit(f"--account=serve-{s}", f"--qos=prod-{s}", "--gres=gpu:h100:1")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and slurm.show_job(second).get("Reason") in (None, "None"):
        time.sleep(0.3)
    job = slurm.show_job(second)
    # One h100 of the node's two is free: only the association's GrpTRES holds the job back.
    assert (job["JobState"], job["Reason"]) == ("PENDING", "AssocGrpGRES"), job
    time.sleep(2)
    assert slurm.state(second) == "PENDING"


def test_a_production_job_preempts_a_preemptible_sweep(slurm: SlurmClient, applied: Applied) -> None:
    s = applied.s
    sweep = slurm.submit(f"--account=sweep-{s}", f"--qos=sweep-{s}", "--gres=gpu:h100:2", "--requeue")
    assert slurm.wait_for_state(sweep, "RUNNING", timeout=60) == "RUNNING"
    prod = slurm.submit(f"--account=serve-{s}", f"--qos=prod-{s}", "--gres=gpu:h100:1")
    started = time.monotonic()
    assert slurm.wait_for_state(prod, "RUNNING", timeout=60) == "RUNNING"
    preempted_s = time.monotonic() - started
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and slurm.show_job(sweep).get("Restarts") in (None, "0"):
        time.sleep(0.3)
    job = slurm.show_job(sweep)
    # Requeued, and waiting: the production job holds one of the two h100 the sweep needs.
    assert job["Restarts"] == "1" and job["JobState"] in ("PENDING", "REQUEUED"), job

    def first_run() -> list[str]:
        out = slurm.run("sacct", "-D", "-X", "-n", "-P", "-j", sweep, "-o", "State", check=False).stdout
        return out.split()

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "PREEMPTED" not in first_run():
        time.sleep(0.5)
    assert "PREEMPTED" in first_run(), first_run()  # accounting's word for the sweep's first run
    print(f"production job running {preempted_s:.1f} s after submission; sweep requeued ({job['JobState']}, "
          f"reason {job['Reason']})")  # fmt: skip
