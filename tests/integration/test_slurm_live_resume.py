"""Reclaim with a way back on the live Slurm (issue 41 item 3), through the `gpuledger` command, the real Slurm and
the embedded ClickHouse: a job reclaimed by `reclaim exec` is requeued held (it does not start again by itself);
`reclaim resume` by someone the policy does not allow, or for a job the ledger does not know, is one line and
changes nothing; by its owner it is released and runs again; asked twice, nothing is applied twice. Reclaimed a
second time, an appeal granted as an exemption (the appeals.v1 steps the `appeal` commands write, folded under the
policy) resumes it: it runs again. A job that ended says so."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from contract_records import job_event
from fixtures_cli import run_gpuledger
from test_chargeback_ledger import cli_env

from base.settings import ClickHouseSettings
from schemas import topics
from schemas.governance_appeals import Subject, decide_event, file_event, fold
from schemas.policy import load_policy
from sinks.db import connect
from sinks.reclaim import ClickHouseRecorder
from sinks.reclaim_resume import Resumer, exemption_request, latest_reclaim
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from stack.slurm.cluster import SlurmClient

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
POLICY = """\
version: 1
generations:
  hopper: {slurm_gres: h100, kueue_flavor: h100}
tiers:
  - {name: std, priority: 100}
governance: {operators: [ops1], appeals: {deciders: [ops1]}}
teams:
  - {name: research, members: [root], leads: [dana]}
"""


def gpuledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_gpuledger(list(args), env, timeout=180, cwd=REPO)


@pytest.fixture
def env(slurm: SlurmClient, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path) -> dict[str, str]:
    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    out = {**os.environ, **cli_env(ch), **slurm.cfg.env, "GPULEDGER_CLUSTER": "gpuledger",
           "GPULEDGER_POLICY_PATH": str(policy)}  # fmt: skip
    migrated = gpuledger(out, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    return out


def client_of(env: dict[str, str]) -> Any:
    return connect(ClickHouseSettings(url=env["GPULEDGER_CLICKHOUSE__URL"],
                                      database=env["GPULEDGER_CLICKHOUSE__DATABASE"],
                                      password=env["GPULEDGER_CLICKHOUSE__PASSWORD"]))  # fmt: skip


def in_the_ledger(client: Any, job_id: str) -> None:
    """The job's start as the Slurm producer would record it: root's job on account research."""
    events, identities = SINKS[topics.JOB_EVENTS.name]
    rec = job_event("STARTED", int(time.time() * 1000), cluster="gpuledger", job_id=job_id, user="root",
                    account="research", event_id=f"e-{job_id}")  # fmt: skip
    LedgerWriter(client).write([Pending(spec, row, Origin("e", 0, 0)) for spec in (events, identities)
                                for row in spec.rows(rec)])  # fmt: skip


def held(slurm: SlurmClient, job: str) -> bool:
    info = slurm.show_job(job)
    return (info.get("JobState"), info.get("Reason")) == ("PENDING", "job_requeued_in_held_state")


def wait_for(probe: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.3)


def reclaim(env: dict[str, str], slurm: SlurmClient, job: str) -> None:
    done = gpuledger(env, "reclaim", "exec", "--scheduler", "SLURM", "--job", job, "--action", "REQUEUE",
                     "--cluster", "gpuledger", "--execute")  # fmt: skip
    assert done.returncode == 0 and f"scontrol requeuehold {job}: ok" in done.stdout, done.stdout + done.stderr
    wait_for(lambda: held(slurm, job), f"job {job} requeued held")


def test_a_reclaimed_job_runs_again_when_its_owner_asks_or_an_appeal_exempts_it(
    slurm: SlurmClient, env: dict[str, str]
) -> None:
    client = client_of(env)
    job = slurm.submit("--account=research", "--gres=gpu:h100:2")
    slurm.wait_for_state(job, "RUNNING", timeout=60)
    in_the_ledger(client, job)
    reclaim(env, slurm, job)
    time.sleep(3)  # a plain requeue would be eligible again after its credential lifetime; held, it stays
    assert held(slurm, job)

    refused = gpuledger(env, "reclaim", "resume", job, "--by", "mallory")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1].endswith(
        f"'mallory' may not resume job {job}: it is 'root''s, team research (its user, the team's leads (dana) and "
        "the operators may)")
    unknown = gpuledger(env, "reclaim", "resume", "999999", "--by", "root")
    assert unknown.returncode == 2 and "no job 999999 in the ledger" in unknown.stderr
    assert held(slurm, job)

    asked = time.monotonic()
    resumed = gpuledger(env, "reclaim", "resume", job, "--by", "root")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == (f"job {job} resumed (asked by root): scontrol release {job}; scontrol update "
                                      f"jobid={job} StartTime=now+2")  # fmt: skip
    slurm.wait_for_state(job, "RUNNING", timeout=60)
    runs_again_s = time.monotonic() - asked
    again = gpuledger(env, "reclaim", "resume", job, "--by", "dana")  # the lead, after the owner: nothing twice
    assert again.returncode == 0 and "was resumed already" in again.stdout and "nothing applied twice" in again.stdout
    rows = client.query("SELECT action, step, status FROM action_outcomes WHERE job_id = {j:String} "
                        "AND action = 'RESUME' ORDER BY step", parameters={"j": job}).result_rows  # fmt: skip
    assert rows == [("RESUME", 0, "started"), ("RESUME", 1, "ok"), ("RESUME", 2, "ok")]

    # Reclaimed again; its owner appeals and the decider grants an exemption: the appeal resumes it.
    reclaim(env, slurm, job)
    policy = load_policy(Path(env["GPULEDGER_POLICY_PATH"]))
    now = int(time.time() * 1000)
    subject = Subject("gpuledger", job, None, "root", "research", None, time.strftime("%Y-%m"), now)
    filed = file_event({}, policy, subject, "root", "it was waiting for its data", now)
    granted = decide_event(fold([filed], policy)[0], policy, filed["appeal_id"], "ops1", "EXEMPTION",
                           "data arrives at noon", now + 1, exemption_hours=4)  # fmt: skip
    request = exemption_request(granted, fold([filed, granted], policy)[0])
    assert request is not None and request.asker == "ops1"
    resumer = Resumer(ClickHouseRecorder(client), clock_ms=lambda: int(time.time() * 1000))
    status, line = resumer.resume(request, latest_reclaim(client, "gpuledger", job))
    assert status == "resumed", line
    slurm.wait_for_state(job, "RUNNING", timeout=60)

    # Reclaimed a third time and cancelled while held: its way back says it has ended, and applies nothing.
    reclaim(env, slurm, job)
    slurm.run("scancel", job)
    slurm.wait_for_state(job, "CANCELLED", timeout=60)
    ended = gpuledger(env, "reclaim", "resume", job, "--by", "root")
    assert ended.returncode == 2 and f"job {job} has ended (CANCELLED): nothing to resume" in ended.stderr
    client.close()
    print(f"job {job}: running again {runs_again_s:.1f} s after `reclaim resume`")
