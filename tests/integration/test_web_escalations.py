"""The deciders' page for escalations on the real broker (issue 41 item 5): a request asked with `escalate ask`'s
own rules waits on /escalations; the policy's decider grants it there (the step published on escalations.v1 as
`escalate decide` would, the escalation service then applies it); a second decision is the rules' one line; a
member may neither see the page nor decide (403 naming the deciders), finance sees it and decides nothing, and a
post without the decider's form token is refused."""

from __future__ import annotations

import csv
import io
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import make_client, web_ledger

from base.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.simulator import SimConfig

pytestmark = pytest.mark.integration
__all__ = ["web_ledger"]
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


def test_a_decider_grants_an_escalation_on_the_page_and_nobody_else_may(
    web_ledger: tuple[ClickHouseSettings, SimConfig], kafka_bootstrap: str, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.governance_escalations import Job, ask_event, fold, step_key
    from schemas.policy import load_policy
    from schemas.topics import ESCALATIONS
    from streams.eventlog import read_events
    from streams.publish import RecordPublisher

    ch, _ = web_ledger
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
