"""Escalation on the live Slurm (issue 41 item 5), through the `gpuledger escalate` commands, the real broker, the
embedded ClickHouse and the real Slurm: an escalation granted on a live engine raises the job, and it falls back
when it expires.

The policy (applied with `policy apply --engine slurm`: its QOS, the team's association, the priority weights) lets
the job's user, the team's leads and the operators ask, and `boss` decide. Someone else asking, a job the ledger does
not know (or Slurm does not), a second request for the same job, a decision by someone who is not a decider and a
request for a job that has ended are one line each and publish nothing. Granted, one pass of the service puts the
waiting job in the tier's QOS and Slurm's own priority for it rises above the job queued ahead of it; a second pass
applies nothing twice. A pass past the grant's end (its clock moved, not waited for) puts the QOS back and Slurm's
priority falls back. The raise is priced on the team's statement (the policy's price per GPU-hour). Names carry a
suffix: the cluster is shared by the session's tests.

Last, Slurm's own answer for a team whose tiers leave out the escalation tier (its association, as `policy apply`
made it, lacks the tier's QOS): the service's change, made with the service's rights (root here, an operator on a
site), is accepted all the same. So no policy or ask-time check refuses such a team (issue 41's question)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from contract_records import job_event
from fixtures_cli import run_gpuledger
from test_statements_close import env as cli_env

from base.settings import ClickHouseSettings, KafkaSettings, Settings
from schemas import topics
from schemas.governance_escalations import fold
from schemas.policy import load_policy
from sinks.db import connect, migrate
from sinks.escalate_cli import reconcile_once
from sinks.escalations import SlurmPriority
from sinks.governance import charges
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from stack.slurm.cluster import SlurmClient
from streams.eventlog import read_events

pytestmark = pytest.mark.integration


def policy_text(s: str) -> str:
    return f"""\
version: 1
generations: {{hopper: {{slurm_gres: h100, kueue_flavor: h100}}}}
tiers: [{{name: prod-{s}, priority: 1000}}, {{name: std-{s}, priority: 10}}]
governance:
  operators: [ops1]
  escalations: {{tier: prod-{s}, deciders: [boss], decide_within_hours: 4, max_hours: 8,
                 price_per_gpu_hour: "2.00"}}
teams:
  - {{name: esc-{s}, members: [root], leads: [dana], tiers: [prod-{s}, std-{s}], quota: {{hopper: 2}}}}
  - {{name: narrow-{s}, members: [root], tiers: [std-{s}]}}
"""


class Stage:
    def __init__(self, settings: Settings, environ: dict[str, str], policy: Path, s: str) -> None:
        self.settings, self.environ, self.policy, self.s = settings, environ, policy, s

    def cli(self, *args: str, code: int = 0) -> str:
        done = run_gpuledger(list(args), self.environ, timeout=120)
        assert done.returncode == code, done.stdout + done.stderr
        if code:
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            return done.stderr.strip()
        return done.stdout.strip()


@pytest.fixture
def stage(slurm: SlurmClient, kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str,
          tmp_path: Path) -> Iterator[Stage]:  # fmt: skip
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + topics.ESCALATIONS.name + suffix for suffix in ("", ".dlq")]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    client.close()
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix), clickhouse=ch,
                        cluster="c1")  # fmt: skip
    s = uuid.uuid4().hex[:6]
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(s))
    applied = run_gpuledger(["policy", "apply", "--engine", "slurm", "--policy", str(policy)], env=slurm.env,
                            timeout=120)  # fmt: skip
    assert applied.returncode == 0, applied.stdout + applied.stderr
    environ = {**cli_env(settings), **slurm.cfg.env, "PATH": slurm.env["PATH"], "GPULEDGER_POLICY_PATH": str(policy)}
    yield Stage(settings, environ, policy, s)


def in_the_ledger(settings: Settings, job_id: str, account: str) -> None:
    """The job as the Slurm producer would record it: root's job on the team's account, 2 GPUs."""
    client = connect(settings.clickhouse)
    events, identities = SINKS[topics.JOB_EVENTS.name]
    rec = job_event("STARTED", int(time.time() * 1000), cluster="c1", job_id=job_id, user="root", account=account,
                    event_id=f"e-{job_id}", requested_devices=2)  # fmt: skip
    LedgerWriter(client).write([Pending(spec, row, Origin("e", 0, 0)) for spec in (events, identities)
                                for row in spec.rows(rec)])  # fmt: skip
    client.close()


def priority(slurm: SlurmClient, job: str) -> int:
    return int(slurm.show_job(job)["Priority"])


def until(probe: Any, what: str, timeout: float = 75) -> Any:
    """probe()'s first truthy value (Slurm's priority pass runs once per PriorityCalcPeriod, 1 minute here)."""
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.5)
    return value


def test_an_escalation_granted_on_the_live_slurm_raises_the_job_and_it_falls_back_when_it_expires(
    slurm: SlurmClient, stage: Stage, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, team = stage.s, f"esc-{stage.s}"
    monkeypatch.setenv("PATH", slurm.env["PATH"])  # the in-process pass below runs scontrol as the service does
    blocker = slurm.submit(f"--account={team}", f"--qos=std-{s}", "--gres=gpu:h100:2")
    slurm.wait_for_state(blocker, "RUNNING", timeout=60)
    ahead = slurm.submit(f"--account={team}", f"--qos=std-{s}", "--gres=gpu:h100:2")
    job = slurm.submit(f"--account={team}", f"--qos=std-{s}", "--gres=gpu:h100:2")
    for waiting in (ahead, job):
        slurm.wait_for_state(waiting, "PENDING", timeout=30)
    in_the_ledger(stage.settings, job, team)
    before = priority(slurm, job)
    assert before <= priority(slurm, ahead)  # queued behind `ahead`

    # Refused, one line each, nothing published.
    ask = ("escalate", "ask", job, "--hours", "1", "--reason", "the paper's deadline is tonight")
    assert stage.cli(*ask, "--by", "mallory", code=2).endswith(
        f"'mallory' may not ask to raise job {job}: it is 'root''s, team {team} (policy governance.escalations.askers: "
        "its user, the team's leads, the operators may)")
    assert stage.cli("escalate", "ask", "999999", "--hours", "1", "--reason", "x", "--by", "root", code=2).endswith(
        "no job 999999 on cluster c1 in the ledger")
    assert read_events(stage.settings.kafka, topics.ESCALATIONS)[0] == []

    out = stage.cli(*ask, "--by", "root")
    eid = out.split()[1].rstrip(":")
    assert out.startswith(f"escalation {eid}: job {job} to prod-{s} for 1 h, decide by ")
    assert "nothing asked twice" in stage.cli(*ask, "--by", "dana", code=2)  # the lead, after the user
    assert stage.cli("escalate", "decide", eid, "--grant", "--note", "ok", "--by", "root", code=2).endswith(
        "'root' may not decide escalations (policy governance.escalations.deciders: boss)")
    assert stage.cli("escalate", "decide", eid, "--grant", "--note", "go ahead", "--by", "boss").startswith(
        f"escalation {eid} granted until ")
    listed = json.loads(stage.cli("escalate", "list", "--format", "json"))
    assert [(r["escalation_id"], r["state"], r["decided_by"]) for r in listed] == [(eid, "GRANTED", "boss")]

    # One pass of the service raises it: Slurm's own priority for it goes above the job queued ahead of it.
    out = stage.cli("escalate", "reconcile", "--engine", "slurm")
    assert out == (f"{eid} applied: job {job}: raised to prod-{s} (was std-{s}): scontrol update jobid={job} "
                   f"QOS=prod-{s}")  # fmt: skip
    raised_at = time.monotonic()
    assert slurm.show_job(job)["QOS"] == f"prod-{s}"
    raised = until(lambda: (p := priority(slurm, job)) > priority(slurm, ahead) and p, "Slurm raised its priority")
    assert raised > before
    assert stage.cli("escalate", "reconcile", "--engine", "slurm") == ""  # nothing applied twice

    # Past the grant's end, the next pass puts it back: the QOS it had, and Slurm's priority falls back.
    policy = load_policy(stage.policy)
    grant = fold(read_events(stage.settings.kafka, topics.ESCALATIONS)[0], policy)[0][eid]
    assert grant.until_ms is not None and grant.before == f"std-{s}"
    assert reconcile_once(stage.settings, policy, [SlurmPriority()], now_ms=grant.until_ms - 1) == []
    (back,) = reconcile_once(stage.settings, policy, [SlurmPriority()], now_ms=grant.until_ms)
    assert (back["event_type"], back["text"]) == ("REVERTED", f"fell back to std-{s}: scontrol update jobid={job} "
                                                               f"QOS=std-{s}")  # fmt: skip
    assert slurm.show_job(job)["QOS"] == f"std-{s}"
    fell = until(lambda: (p := priority(slurm, job)) <= priority(slurm, ahead) and p, "Slurm lowered its priority")
    assert fell < raised
    print(f"job {job}: priority {before} -> {raised} (raised) -> {fell} (fallen back); raised for "
          f"{time.monotonic() - raised_at:.1f} s of wall time")

    # The raise is priced on the team's statement: 2 GPUs for the grant's hour at 2.00 per GPU-hour.
    events, _ = read_events(stage.settings.kafka, topics.ESCALATIONS)
    assert [e["event_type"] for e in events] == ["REQUESTED", "GRANTED", "APPLIED", "REVERTED"]
    client = connect(stage.settings.clickhouse)
    (spec,) = SINKS[topics.ESCALATIONS.name]
    LedgerWriter(client).write([Pending(spec, row, Origin("x", 0, i)) for i, e in enumerate(events)
                                for row in spec.rows(e)])  # fmt: skip
    (line,) = [c for c in charges(client, policy, grant.until_ms + 3_600_000) if c.ref.startswith(eid)]
    client.close()
    gpu_s = 2 * (grant.until_ms - int(grant.applied_ms or 0)) // 1000  # from the raise to the grant's end
    assert (line.team, line.job_id, line.allocated_s, line.line().cause_kind) == (team, job, gpu_s,
                                                                                  "escalation")  # fmt: skip
    assert abs(line.cents - 400) <= 1  # 2 GPU-h at 2.00, less the seconds between the grant and the pass

    # A job the ledger knows that Slurm does not, and one that has ended: each says so, and nothing is asked.
    in_the_ledger(stage.settings, "999998", team)
    assert stage.cli("escalate", "ask", "999998", "--hours", "1", "--reason", "x", "--by", "root", code=2).endswith(
        "job 999998 does not exist on Slurm (or has left its memory: MinJobAge): nothing to raise")
    slurm.run("scancel", job)
    slurm.wait_for_state(job, "CANCELLED", timeout=60)
    assert stage.cli(*ask, "--by", "root", code=2).endswith(f"job {job} has ended (CANCELLED): nothing to raise")
    assert len(read_events(stage.settings.kafka, topics.ESCALATIONS)[0]) == 4

    # A team whose tiers leave out the escalation tier: its association lacks the tier's QOS (AccountingStorageEnforce
    # has qos), yet the service's own change, with an operator's rights, is accepted: the job is at the tier.
    narrow = f"narrow-{s}"
    other = slurm.submit(f"--account={narrow}", f"--qos=std-{s}", "--gres=gpu:h100:1", "--hold")
    allowed = slurm.run("sacctmgr", "-n", "-P", "show", "assoc", f"account={narrow}", "user=root", "format=qos").stdout
    assert f"std-{s}" in allowed and f"prod-{s}" not in allowed, allowed
    assert SlurmPriority().set(other, f"prod-{s}") == f"scontrol update jobid={other} QOS=prod-{s}"
    assert slurm.show_job(other)["QOS"] == f"prod-{s}"
    slurm.run("scancel", other)
