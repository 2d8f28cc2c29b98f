"""Appeal decisions in the warning's thread (issue 19): `gpuledger chat run` on the real broker, ClickHouse and
the real local HTTP receiver, answering Slack-format posts as chat.postMessage does (with a `ts`).

1. An idle warning for job 88 (team vision) is posted to the team's channel: a root post, ts T.
2. Ana appeals it; ops1 grants a credit of 12.34. A "decision" by mallory (not a decider) and a second one by
   ops1 are on the topic too, and an appeal of job 99's charge filed 100 hours ago, escalated by the appeals
   service. The worker posts the credit as a reply in T's thread (`thread_ts` = T) in the vision channel, the
   escalation to the operators' channel, and nothing else: no filing, no refused or second decision.
3. With the appeals (issue 41), on escalations.v1: ana asks to raise job 4242 and ops1 grants it, and a "grant" by
   mallory (not a decider) is on the topic too: the ask and the grant go to the vision channel as posts of their
   own, mallory's not at all.
4. A fresh consumer group reads the topics again from the start: nothing is posted twice.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger

from base.settings import ClickHouseSettings, KafkaSettings
from schemas.governance_appeals import HOUR_MS, Subject, decide_event, escalations, file_event, fold
from schemas.governance_escalations import Job, ask_event
from schemas.governance_escalations import decide_event as decide_escalation
from schemas.governance_escalations import fold as fold_escalations
from schemas.policy import load_policy
from schemas.topics import ALERTS, APPEALS, ESCALATIONS, job_key
from sinks.chat import WebhookReceiver
from sinks.db import connect, migrate
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
POLICY = """
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: research, priority: 100}]
governance:
  operators: [ops1]
  appeals: {deadline_hours: 72, window_days: 30, max_credit: "100.00", max_exemption_hours: 48}
  escalations: {tier: research, max_hours: 8}
teams: [{name: vision, members: [ana]}]
"""
ALERT_ID = "idle-c1-88-1"


def warning(now_ms: int) -> dict[str, Any]:
    return {
        "alert_id": ALERT_ID, "kind": "IDLE_WARNING", "ts_ms": now_ms - 2 * HOUR_MS, "cluster": "c1", "job_id": "88",
        "node": "gpu-n07", "device_uuids": ["GPU-aa11"], "user": "ana", "team": "vision", "project": "p-vision",
        "idle_minutes": 40, "cost_so_far": 2.17, "action": "SUSPEND", "action_at_ms": now_ms, "dry_run": True,
        "message": "Job 88 has held a GPU idle for 40 minutes.", "appeal_route": None, "emitted_ts_ms": None,
    }  # fmt: skip


def appeal_steps(policy_path: Path, now_ms: int) -> list[dict[str, Any]]:
    policy = load_policy(policy_path)
    alert = Subject("c1", "88", ALERT_ID, "ana", "vision", "p-vision", None, now_ms - 2 * HOUR_MS)
    filed = file_event({}, policy, alert, "ana", "the notebook was waiting on a data transfer", now_ms - HOUR_MS)
    appeals, _ = fold([filed], policy)
    credit = decide_event(appeals, policy, filed["appeal_id"], "ops1", "CREDIT", "lost to the transfer", now_ms,
                          credit_cents=1234)  # fmt: skip
    # On the topic past the commands: a non-decider's "grant" and a second decision. The rules count neither.
    forged = {**credit, "event_id": "forged-1", "actor": "mallory", "ts_ms": now_ms + 1, "credit_cents": 9999}
    second = {**credit, "event_id": "second-1", "decision": "DENIED", "credit_cents": None, "ts_ms": now_ms + 2,
              "text": "changed my mind"}  # fmt: skip
    charge = Subject("c1", "99", None, "ana", "vision", "p-vision", "2026-11", now_ms - 101 * HOUR_MS)
    late = file_event({}, policy, charge, "ana", "charged twice for one run", now_ms - 100 * HOUR_MS)
    (escalated,) = escalations(fold([filed, late], policy)[0], now_ms)
    assert escalated["appeal_id"] == late["appeal_id"]
    return [filed, credit, forged, second, late, escalated]


def escalation_steps(policy_path: Path, now_ms: int) -> list[dict[str, Any]]:
    """Asked by ana, granted by ops1 (the operators decide: no deciders named), and mallory's "grant" past the
    commands, which the rules do not count."""
    policy = load_policy(policy_path)
    asked = ask_event({}, policy, Job("c1", "4242", "ana", "vision", 1), "ana", 2, "paper deadline", now_ms)
    granted = decide_escalation(fold_escalations([asked], policy)[0], policy, asked["escalation_id"], "ops1", True,
                                "go ahead", now_ms + 1)  # fmt: skip
    forged = {**granted, "event_id": "forged-esc", "actor": "mallory", "ts_ms": now_ms + 2}
    return [asked, forged, granted]


def test_a_decision_is_a_reply_in_the_warnings_thread_and_posted_once(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    prefix = f"ca{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + t.name + suffix for t in (ALERTS, APPEALS, ESCALATIONS) for suffix in ("", ".dlq")]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    receiver = WebhookReceiver(port=0).start()
    base = f"http://127.0.0.1:{receiver.port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
        "GPULEDGER_CONFIG": str(REPO / "tests" / "no-such-gpuledger.toml"),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
        "GPULEDGER_CLICKHOUSE__URL": ch.url,
        "GPULEDGER_CLICKHOUSE__DATABASE": ch.database,
        "GPULEDGER_CLICKHOUSE__PASSWORD": ch.password.get_secret_value(),
        "GPULEDGER_POLICY_PATH": str(policy),
        "GPULEDGER_SINKS__CHAT__TEAMS": json.dumps(
            {"vision": {"url": f"{base}/slack/vision?token=TOPSECRET", "channel": "#vision-gpu", "format": "slack"}}),
        "GPULEDGER_SINKS__CHAT__DEFAULT": json.dumps(
            {"url": f"{base}/slack/ops", "channel": "#gpu-ops", "format": "slack"}),
    }  # fmt: skip
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)

    def chat_run(group: str) -> None:  # groups of this test's own: the session's broker is shared
        done = run_gpuledger(["chat", "run", "--max-idle-s", "3"], {**env, "GPULEDGER_SINKS__GROUP_ID": group},
                             timeout=240, cwd=REPO)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert "TOPSECRET" not in done.stdout + done.stderr

    try:
        now_ms = int(time.time() * 1000)
        pub = RecordPublisher(kafka)
        pub.publish(ALERTS, job_key("c1", "88"), warning(now_ms))
        pub.flush()
        chat_run(prefix + "chat-a")
        (root,) = receiver.received
        assert root["path"].startswith("/slack/vision") and "thread_ts" not in root["body"]
        assert root["body"]["channel"] == "#vision-gpu" and "job 88 on c1" in root["body"]["text"]

        steps = appeal_steps(policy, now_ms)
        for step in steps:
            pub.publish(APPEALS, job_key(step["cluster"], step["job_id"]), step)
        raise_steps = escalation_steps(policy, now_ms)
        for step in raise_steps:
            pub.publish(ESCALATIONS, job_key(step["cluster"], step["job_id"]), step)
        pub.flush()
        chat_run(prefix + "chat-a")
        posts = receiver.received[1:]
        raised = [p for p in posts if "Escalation esc-" in p["body"]["text"]]
        replies = [p for p in posts if p["path"].startswith("/slack/vision") and p not in raised]
        ops = [p for p in posts if p["path"] == "/slack/ops"]
        assert len(posts) == 4 and len(replies) == 1 and len(ops) == 1 and len(raised) == 2, posts
        eid = raise_steps[0]["escalation_id"]
        assert [(p["path"].split("?")[0], p["body"]["channel"], "thread_ts" in p["body"]) for p in raised] == [
            ("/slack/vision", "#vision-gpu", False)] * 2  # fmt: skip
        asked_text, granted_text = sorted((p["body"]["text"] for p in raised), key=lambda t: "granted" in t)
        assert f"Escalation {eid} asked: job 4242 on c1 to research for 2 h" in asked_text
        assert "asked by ana" in asked_text and "(ops1): gpuledger escalate decide" in asked_text
        assert f"Escalation {eid} granted: job 4242 on c1 runs at research until" in granted_text
        assert "granted by ops1: go ahead" in granted_text and "mallory" not in asked_text + granted_text

        (reply,) = replies
        assert reply["body"]["thread_ts"] == root["ts"] and reply["body"]["channel"] == "#vision-gpu"
        text = reply["body"]["text"]
        for needle in (f"Appeal {steps[0]['appeal_id']} granted: credit 12.34", "by ops1", "note: lost to the transfer",
                       "filed by ana", f"about: alert {ALERT_ID}"):  # fmt: skip
            assert needle in text, (needle, text)
        assert "mallory" not in text and "99.99" not in text and "changed my mind" not in text
        (escalation,) = ops
        assert "thread_ts" not in escalation["body"] and escalation["body"]["channel"] == "#gpu-ops"
        assert f"Appeal {steps[4]['appeal_id']} escalated" in escalation["body"]["text"]
        assert "job 99 on c1" in escalation["body"]["text"] and "gpuledger appeal decide" in escalation["body"]["text"]

        # Replayed from the start by a fresh group (as after a lost offset): nothing goes out twice.
        chat_run(prefix + "chat-b")
        assert len(receiver.received) == 5
        rows = client.query("SELECT alert_id, status, channel, thread_ts, reply_to FROM chat_deliveries FINAL "
                            "ORDER BY ts_ms").result_rows  # fmt: skip
        delivered = {r[0]: r[1:] for r in rows}
        journalled = {delivered.pop(raise_steps[i]["event_id"]) for i in (0, 2)}  # the ask and the grant, not mallory's
        assert journalled == {("sent", "#vision-gpu", p["ts"], "") for p in raised}
        assert delivered == {
            ALERT_ID: ("sent", "#vision-gpu", root["ts"], ""),
            steps[1]["event_id"]: ("sent", "#vision-gpu", root["ts"], ALERT_ID),
            steps[5]["event_id"]: ("sent", "#gpu-ops", escalation["ts"], ""),
        }
    finally:
        receiver.stop()
        client.close()
