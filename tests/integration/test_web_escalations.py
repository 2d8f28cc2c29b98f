"""The deciders' page for escalations on the real broker (issue 41 item 5): a request asked with `escalate ask`'s
own rules waits on /escalations; the policy's decider grants it there (the step published on escalations.v1 as
`escalate decide` would, the escalation service then applies it); a second decision is the rules' one line; a
member may neither see the page nor decide (403 naming the deciders), finance sees it and decides nothing, and a
post without the decider's form token is refused."""

from __future__ import annotations

import csv
import html
import io
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import PERIOD, make_client, small_ledger, web_ledger

from base.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.simulator import SimConfig

pytestmark = pytest.mark.integration
__all__ = ["small_ledger", "web_ledger"]
DECIDER, MEMBER, FINANCE = "ops00", "vis01", "fin00"  # producers/simulator/org.py
POLICY = """\
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: urgent, priority: 1000}, {name: standard, priority: 100}]
governance:
  operators: [ops00]
  escalations: {tier: urgent, deciders: [ops00], decide_within_hours: 4, max_hours: 8}
teams:
  - {name: vision, members: [vis00, vis01, vis02, vis03]}
"""


def who(user: str) -> dict[str, str]:
    return {"X-Forwarded-User": user}


def decide(client: Any, user: str, eid: str, decision: str, token: str | None = None) -> Any:
    from web.access import csrf_token

    form = {"escalation_id": eid, "decision": decision, "note": "the demo is at noon",
            "token": token or csrf_token(client.app.state.ctx.secret, user)}  # fmt: skip
    return client.post("/escalations/decide", data=form, headers=who(user))


def text(resp: Any) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", resp.text).split())


def page_settings(ch: ClickHouseSettings, kafka_bootstrap: str, tmp_path: Path) -> Settings:
    """The page's settings with POLICY, topics of the test's own (escalations.v1 made)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.topics import ESCALATIONS

    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY, encoding="utf-8")
    settings = Settings(
        state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
        policy_path=policy_file, kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap,
                                                     topic_prefix=f"t{uuid.uuid4().hex[:8]}."),
        sinks=SinksSettings(group_id=f"web-esc-{uuid.uuid4().hex[:8]}"), web=WebSettings(demo=False),
    )  # fmt: skip
    topic = settings.kafka.topic(ESCALATIONS.name)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})  # held: a dropped client ends its requests
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return settings


def test_a_decider_grants_an_escalation_on_the_page_and_nobody_else_may(
    web_ledger: tuple[ClickHouseSettings, SimConfig], kafka_bootstrap: str, tmp_path: Path
) -> None:
    from schemas.governance_escalations import Job, ask_event, fold, step_key
    from schemas.policy import load_policy
    from schemas.topics import ESCALATIONS
    from streams.eventlog import read_events
    from streams.publish import RecordPublisher

    ch, _ = web_ledger
    settings = page_settings(ch, kafka_bootstrap, tmp_path)
    policy_file = settings.policy_path
    assert policy_file is not None
    policy = load_policy(policy_file)
    asked = ask_event({}, policy, Job("sim", "4242", MEMBER, "vision", 2), MEMBER, 2, "the demo is at noon",
                      int(time.time() * 1000))  # fmt: skip
    eid = asked["escalation_id"]
    pub = RecordPublisher(settings.kafka)
    pub.publish(ESCALATIONS, step_key(asked), asked)
    pub.flush()
    client = make_client(settings, now_ms=int(time.time() * 1000))

    refused = client.get("/escalations", headers=who(MEMBER))
    assert refused.status_code == 403 and (
        "vis01 does not decide escalations (policy governance.escalations.deciders: ops00)" in text(refused))
    page = client.get("/escalations", headers=who(DECIDER))
    assert page.status_code == 200 and f'id="decide-{eid}"' in page.text and 'id="nav-escalations"' in page.text
    assert "tier urgent for the hours asked (at most 8)" in text(page)
    seen = client.get("/escalations", headers=who(FINANCE))
    assert seen.status_code == 200 and "/escalations/decide" not in seen.text
    assert "deciding them is for the policy's deciders (ops00)" in text(seen)

    assert decide(client, MEMBER, eid, "grant").status_code == 403
    assert decide(client, FINANCE, eid, "grant").status_code == 403
    assert decide(client, DECIDER, eid, "grant", token="x" * 64).status_code == 403  # not the decider's form
    assert decide(client, DECIDER, eid, "maybe").status_code == 400
    assert read_events(settings.kafka, ESCALATIONS)[0] == [asked]  # nothing published by any of those

    granted = decide(client, DECIDER, eid, "grant")
    assert granted.status_code == 303 and granted.headers["location"] == f"/escalations?decided={eid}"
    again = decide(client, DECIDER, eid, "deny")
    assert again.status_code == 400 and f"escalation {eid} was already decided (GRANTED by ops00)" in text(again)
    events = read_events(settings.kafka, ESCALATIONS)[0]
    assert [(e["event_type"], e["actor"]) for e in events] == [("REQUESTED", MEMBER), ("GRANTED", DECIDER)]
    esc = fold(events, policy)[0][eid]
    assert esc.state == "GRANTED" and esc.until_ms == events[1]["ts_ms"] + 2 * 3_600_000
    live = client.get("/escalations?csv=live", headers=who(DECIDER))
    assert [(r["escalation_id"], r["state"], r["decided_by"]) for r in csv.DictReader(io.StringIO(live.text))] == [
        (eid, "GRANTED", DECIDER)]  # fmt: skip


def test_the_job_page_asks_for_escalation_for_whoever_the_policy_lets_ask(
    small_ledger: ClickHouseSettings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The job page's form (issue 41): the job's user asks (the step on escalations.v1 as `escalate ask` publishes
    it, the job's team and GPUs from the ledger); a teammate who is not its user, a lead or an operator sees the
    rules' one line instead of the form and gets 403 with it; a form without the asker's token, too many hours and a
    second request are refused with nothing published; a job the ledger saw end is refused on its page."""
    from schemas.topics import ESCALATIONS
    from sinks.db import connect
    from streams.eventlog import read_events
    from web.access import csrf_token

    ch = small_ledger
    settings = page_settings(ch, kafka_bootstrap, tmp_path)
    # The test's own small ledger: its last vision job (1009, vis03's 2 GPUs) has not ended as far as the ledger knows
    # (its ENDED event taken out: the ledger read mid-run); 1010 (vis02's) ended.
    job_id, user, gpus, ended_id = "1009", "vis03", 2, "1010"
    writer = connect(ch)
    try:
        writer.command("ALTER TABLE job_events DELETE WHERE cluster = 'sim' AND job_id = {j:String} AND "
                       "event_type = 'ENDED' SETTINGS mutations_sync = 2", parameters={"j": job_id})  # fmt: skip
    finally:
        writer.close()
    mate = next(u for u in ("vis00", "vis01", "vis02", "vis03") if u != user)
    client = make_client(settings, now_ms=int(time.time() * 1000))
    url = f"/jobs/sim/{job_id}?period={PERIOD}"

    def ask(by: str, hours: str = "2", token: str | None = None) -> Any:
        form = {"cluster": "sim", "job_id": job_id, "hours": hours, "reason": "the demo is at noon",
                "period": PERIOD, "token": token or csrf_token(client.app.state.ctx.secret, by)}  # fmt: skip
        return client.post("/escalations/ask", data=form, headers=who(by))

    page = client.get(url, headers=who(user))
    assert page.status_code == 200 and 'id="escalate-form"' in page.text
    assert "Run at tier urgent for (hours)" in text(page) and 'max="8"' in page.text
    refusal = (f"'{mate}' may not ask to raise job {job_id}: it is '{user}''s, team vision (policy "
               "governance.escalations.askers: its user, the team's leads, the operators may)")
    other = client.get(url, headers=who(mate))
    assert 'id="escalate-form"' not in other.text and refusal in html.unescape(text(other))
    denied = ask(mate)
    assert denied.status_code == 403 and refusal in html.unescape(text(denied))
    assert ask(user, token="x" * 64).status_code == 403  # not the asker's form
    too_long = ask(user, hours="9")
    assert too_long.status_code == 400 and "must be 1..8 (policy governance.escalations.max_hours)" in text(too_long)
    assert read_events(settings.kafka, ESCALATIONS)[0] == []  # nothing published by any of those

    asked = ask(user)
    assert asked.status_code == 303
    (event,) = read_events(settings.kafka, ESCALATIONS)[0]
    assert asked.headers["location"].endswith(f"escalated={event['escalation_id']}")
    assert (event["event_type"], event["actor"], event["user"], event["team"], event["gpus"], event["tier"],
            event["hours"]) == ("REQUESTED", user, user, "vision", gpus, "urgent", 2)  # fmt: skip
    again = ask(user)
    assert again.status_code == 400 and "nothing asked twice" in text(again)
    assert len(read_events(settings.kafka, ESCALATIONS)[0]) == 1
    shown = client.get(asked.headers["location"], headers=who(user))
    assert f"Escalation {event['escalation_id']} asked" in text(shown)
    # an operator may ask, not for a job that ended
    ended = client.get(f"/jobs/sim/{ended_id}?period={PERIOD}", headers=who(DECIDER))
    assert 'id="escalate-form"' not in ended.text and f"job {ended_id} on sim has ended" in text(ended)
