"""The job page's resume button (issue 41 item 3) on the real broker and the embedded ClickHouse: the web app holds
no scheduler credentials, so the button publishes a RESUME_ASKED step on appeals.v1 and `reclaim run`'s appeal
handler (the worker that holds them) judges it again and resumes the job with the one Resumer the command uses.

Who may: the job's user, a lead of its team (policy teams[].leads), an operator (governance.operators); a
teammate who is none of those gets 403 and one line, and a step forged on the topic in such a person's name is
refused by the worker too. The engine's answer here is Slurm's for a requeue-held job (`scontrol show job -o`),
and the commands it would run are recorded: the real release on a live Slurm is test_slurm_live_resume.py's.
"""

from __future__ import annotations

import html
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures_web import END_MS, PERIOD, REPO, SMALL, make_client, small_ledger

from base.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.simulator import expected_ledger

pytestmark = pytest.mark.integration
__all__ = ["small_ledger"]
OPS = "ops00"


def who(user: str) -> dict[str, str]:
    return {"X-Forwarded-User": user}


def token(client: Any, user: str) -> str:
    from web.access import csrf_token

    return csrf_token(client.app.state.ctx.secret, user)


def test_the_resume_button_asks_the_reclaim_worker_which_resumes_the_job_once_for_its_owner_lead_or_operator(
    small_ledger: ClickHouseSettings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.policy import load_policy
    from schemas.topics import APPEALS, job_key
    from sinks.db import connect
    from sinks.reclaim import ClickHouseRecorder, Outcome
    from sinks.reclaim_resume import Resumer, appeal_handler, resume_asked_event
    from streams.eventlog import read_events
    from streams.publish import RecordPublisher

    ch = small_ledger
    jobs = sorted(expected_ledger(SMALL).values(), key=lambda j: -j.allocated_s)
    job = next(j for j in jobs if j.user and j.team and j.job_id.isdigit())  # a Slurm job of a person
    other = next(j for j in jobs if j.job_id.isdigit() and j.job_id != job.job_id)  # never reclaimed
    data = yaml.safe_load((REPO / "deploy" / "policy.sim.yaml").read_text(encoding="utf-8"))
    team = next(t for t in data["teams"] if t["name"] == job.team)
    lead, mate = [m for m in team["members"] if m != job.user][:2]
    team["leads"] = [lead]
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    settings = Settings(
        state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
        policy_path=policy_path, kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap,
                                                     topic_prefix=f"t{uuid.uuid4().hex[:8]}."),
        sinks=SinksSettings(group_id=f"web-resume-{uuid.uuid4().hex[:8]}"), web=WebSettings(demo=False),
    )  # fmt: skip
    topic = settings.kafka.topic(APPEALS.name)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    writer = connect(ch)
    recorder = ClickHouseRecorder(writer)
    reclaim_id = f"act-{uuid.uuid4().hex[:8]}"
    recorder.record([Outcome(reclaim_id, 1, END_MS - 60_000, "sim", job.job_id, "SLURM", "REQUEUE",
                             f"scontrol requeuehold {job.job_id}", False, "ok", "")])  # fmt: skip

    client = make_client(settings)
    url = f"/jobs/sim/{job.job_id}?period={PERIOD}"
    assert 'id="resume-form"' in client.get(url, headers=who(job.user)).text
    mate_page = client.get(url, headers=who(mate)).text  # sees the team's job, may not resume it
    assert 'id="resume-form"' not in mate_page and 'id="resume-refused"' in mate_page

    form = {"cluster": "sim", "job_id": job.job_id, "period": PERIOD}
    refused = client.post("/resume", data={**form, "token": token(client, mate)}, headers=who(mate))
    line = html.unescape(refused.text)
    assert refused.status_code == 403 and f"'{mate}' may not resume job {job.job_id}" in line
    assert f"the team's leads ({lead}) and the operators may" in line
    # an operator may ask for any job, not one gpuledger never stopped
    never = client.post("/resume", data={**form, "job_id": other.job_id, "token": token(client, OPS)},
                        headers=who(OPS))  # fmt: skip
    assert never.status_code == 400 and "not reclaimed by gpuledger" in never.text
    asked = []
    for person in (job.user, lead, OPS):  # the owner, the lead, an operator: each may ask
        resp = client.post("/resume", data={**form, "token": token(client, person)}, headers=who(person))
        assert resp.status_code == 303, resp.text
        asked.append(resp.headers["location"])
    assert "resume=" in asked[0] and 'id="resume-asked"' in client.get(asked[0], headers=who(job.user)).text
    # A step forged on the topic in the teammate's name (anyone with the page's login could write one).
    forged = resume_asked_event("sim", job.job_id, mate, None, END_MS)
    publisher = RecordPublisher(settings.kafka)
    publisher.publish(APPEALS, job_key("sim", job.job_id), forged)
    publisher.flush(15.0)

    # The worker: reclaim run's appeal handler over what the broker holds, Slurm answering "requeue-held".
    ran: list[tuple[str, ...]] = []
    held = {"JobState": "PENDING", "Reason": "job_requeued_in_held_state"}
    engine = Resumer(recorder, clock_ms=lambda: END_MS, show_job=lambda _job: held,
                     run=lambda argv: (ran.append(argv), (0, ""))[1])  # fmt: skip
    handle = appeal_handler(writer, settings.kafka, load_policy(policy_path), True, lambda: END_MS, engine=engine)
    events, unreadable = read_events(settings.kafka, APPEALS)
    assert not unreadable and [e["actor"] for e in events] == [job.user, lead, OPS, mate]
    for event in events:
        handle(event)
    assert ran == [("scontrol", "release", job.job_id), ("scontrol", "update", f"jobid={job.job_id}",
                                                          "StartTime=now+2")]  # once, for the first ask  # fmt: skip
    steps = writer.query(
        "SELECT step, action, status, detail FROM action_outcomes FINAL WHERE action_id = {a:String} ORDER BY step",
        parameters={"a": f"resume-{reclaim_id}"},
    ).result_rows
    assert [(s, a, st) for s, a, st, _ in steps] == [(0, "RESUME", "started"), (1, "RESUME", "ok"), (2, "RESUME", "ok")]
    assert steps[0][3].startswith(f"asked by {job.user} on the job's page")
    page = client.get(url, headers=who(job.user)).text
    assert 'id="resume-steps"' in page and f"scontrol release {job.job_id}: ok" in page
