"""An alert on Kafka reaches the local webhook receiver through apprise, routed to the team's
channel, with its evidence and appeal route; a redelivered alert is not posted twice."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger
from fixtures_clickhouse import wait_for

from base.settings import ChatRoute, ChatSettings, KafkaSettings, Settings, SinksSettings
from schemas.topics import ALERTS, job_key
from sinks.chat import ChatNotifier, WebhookReceiver
from sinks.worker_agent import consume_records
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration


def test_alert_arrives_on_the_local_webhook_routed_with_evidence(kafka_bootstrap: str) -> None:
    receiver = WebhookReceiver(port=0).start()
    try:
        prefix = f"c{uuid.uuid4().hex[:8]}."
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.create_topics([NewTopic(prefix + ALERTS.name, 1, 1)])[prefix + ALERTS.name].result(timeout=30)
        base = f"json://127.0.0.1:{receiver.port}"
        chat = ChatSettings(
            users={"alice": ChatRoute(url=f"{base}/dm/alice", channel="@alice")},
            teams={"vision": ChatRoute(url=f"{base}/vision-gpu", channel="#vision-gpu")},
            default=ChatRoute(url=f"{base}/gpu-alerts"),
        )
        settings = Settings(
            kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
            sinks=SinksSettings(chat=chat),
        )
        alert: dict[str, Any] = {
            "alert_id": "idle-c1-88-1", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "c1",
            "job_id": "88", "node": "gpu-n07", "device_uuids": ["GPU-aa11", "GPU-bb22"], "user": "bob",
            "team": "vision", "project": "p-vision", "idle_minutes": 40, "cost_so_far": 2.17,
            "action": "CHECKPOINT_THEN_REQUEUE", "action_at_ms": 1_795_000_900_000, "dry_run": False,
            "message": "Job 88 has held 2 GPUs idle for 40 minutes.",
            "appeal_route": "reply here or open PLAT ticket", "emitted_ts_ms": None,
        }  # fmt: skip
        pub = RecordPublisher(settings.kafka)
        pub.publish(ALERTS, job_key("c1", "88"), alert)
        pub.publish(ALERTS, job_key("c1", "88"), alert)  # redelivered
        pub.publish(ALERTS, job_key("c1", "7"), {**alert, "alert_id": "idle-c1-7-1", "user": "alice", "job_id": "7"})
        pub.flush()

        notifier = ChatNotifier(settings.sinks.chat, clock_ms=lambda: 0)
        statuses: list[str] = []
        handled = consume_records(
            settings, ALERTS, "chat-test", lambda r: statuses.append(notifier.handle(r).status), lambda: False, 3.0
        )
        assert handled == 3 and statuses == ["sent", "duplicate", "sent"]
        assert wait_for(lambda: len(receiver.received) == 2, timeout_s=10)
    finally:
        receiver.stop()

    by_path = {item["path"]: item["body"] for item in receiver.received}
    team_post = by_path["/vision-gpu"]
    assert "job 88 on c1" in team_post["title"]
    body = team_post["message"]
    for needle in ("channel: #vision-gpu", "GPU-aa11, GPU-bb22", "idle for 40 min", "$2.17",
                   "next: CHECKPOINT_THEN_REQUEUE", "appeal: reply here or open PLAT ticket",
                   "owner: user bob, team vision, project p-vision"):  # fmt: skip
        assert needle in body, needle
    assert "channel: @alice" in by_path["/dm/alice"]["message"]


def test_chat_run_command_posts_once_across_restarts(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Any
) -> None:
    import json
    import os
    from pathlib import Path

    from base.settings import ClickHouseSettings
    from sinks.db import connect, migrate

    repo = Path(__file__).resolve().parents[2]
    ch = ClickHouseSettings(
        url=clickhouse_server.url, database=clickhouse_database, password=clickhouse_server.password
    )
    client = connect(ch)
    migrate(client, ch)
    receiver = WebhookReceiver(port=0).start()
    prefix = f"cr{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(prefix + ALERTS.name, 1, 1)])[prefix + ALERTS.name].result(timeout=30)
    secret_url = f"json://127.0.0.1:{receiver.port}/vision-gpu?token=TOPSECRET"
    env = {
        **os.environ,
        "GPULEDGER_CONFIG": str(repo / "tests" / "no-such-gpuledger.toml"),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix,
        "GPULEDGER_CLICKHOUSE__URL": ch.url,
        "GPULEDGER_CLICKHOUSE__DATABASE": ch.database,
        "GPULEDGER_CLICKHOUSE__PASSWORD": ch.password.get_secret_value(),
        "GPULEDGER_SINKS__CHAT__TEAMS": json.dumps({"vision": {"url": secret_url, "channel": "#vision-gpu"}}),
    }
    alert = {
        "alert_id": "cov-n7-1", "kind": "COVERAGE_GAP", "ts_ms": 1_795_000_000_000, "cluster": "c1", "job_id": None,
        "node": "gpu-n07", "device_uuids": ["GPU-cc33"], "user": None, "team": "vision", "project": None,
        "idle_minutes": None, "cost_so_far": None, "action": None, "action_at_ms": None, "dry_run": True,
        "message": "gpu-n07 stopped reporting 1 of 8 GPUs", "appeal_route": None, "emitted_ts_ms": None,
    }  # fmt: skip
    pub = RecordPublisher(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix))
    pub.publish(ALERTS, b"c1/gpu-n07", alert)
    pub.flush()
    try:
        # The groups are this test's own (the session's broker is shared); the second replays the topic.
        for group in (f"{prefix}chat-a", f"{prefix}chat-b"):
            proc = run_gpuledger(["chat", "run", "--max-idle-s", "3"], {**env, "GPULEDGER_SINKS__GROUP_ID": group},
                                 timeout=180, cwd=repo)  # fmt: skip
            assert proc.returncode == 0, proc.stderr
            assert "TOPSECRET" not in proc.stderr + proc.stdout
        assert len(receiver.received) == 1
        assert "gpu-n07 stopped reporting" in receiver.received[0]["body"]["message"]
        assert "channel: #vision-gpu" in receiver.received[0]["body"]["message"]
        rows = client.query("SELECT alert_id, status, channel, destination FROM chat_deliveries FINAL").result_rows
        assert [(a, s, c) for a, s, c, _ in rows] == [("cov-n7-1", "sent", "#vision-gpu")]
        assert "TOPSECRET" not in rows[0][3]
    finally:
        receiver.stop()
        client.close()


def test_the_receiver_records_a_key_once_and_answers_its_repeat_as_the_first(tmp_path: Any) -> None:
    """Through apprise (a JSON route) and httpx: a repeated Idempotency-Key is answered 200 and not recorded
    again, a Slack-format repeat gets its first post's `ts`; posts without a key are each recorded; a bad key is
    refused with 400; only the last `max_keys` keys are remembered."""
    import httpx

    from sinks.chat import ChatRoute, Destination, apprise_send, post, slack_post

    out = tmp_path / "posts.jsonl"
    receiver = WebhookReceiver(port=0, out=out, max_keys=2).start()
    try:
        base = f"http://127.0.0.1:{receiver.port}"
        hook = Destination("default", "default", "#x", ChatRoute(url=f"json://127.0.0.1:{receiver.port}/hook"))
        for _ in range(3):
            assert post(hook, "t", "alert k1", "", apprise_send, slack_post, key="k1") == (True, "")
        assert post(hook, "t", "no key", "", apprise_send, slack_post) == (True, "")
        assert post(hook, "t", "no key", "", apprise_send, slack_post) == (True, "")
        assert [r.get("idempotency_key") for r in receiver.received] == ["k1", None, None]
        assert receiver.repeats == {"k1": 2}
        assert len(out.read_text().splitlines()) == 3

        slack = {"text": "*t*\nalert s1", "channel": "#x"}
        first = httpx.post(f"{base}/api", json=slack, headers={"Idempotency-Key": '"s1"'}).json()
        again = httpx.post(f"{base}/api", json=slack, headers={"Idempotency-Key": '"s1"'}).json()
        assert first["ok"] and first["ts"] and again == first and receiver.repeats["s1"] == 1
        assert httpx.post(f"{base}/api", json=slack, headers={"Idempotency-Key": "x" * 300}).status_code == 400
        # two more keys: k1 (the oldest) is forgotten, a post with it is recorded as new
        httpx.post(f"{base}/hook", json={"m": 1}, headers={"Idempotency-Key": '"k2"'})
        assert post(hook, "t", "alert k1", "", apprise_send, slack_post, key="k1") == (True, "")
        assert [r.get("idempotency_key") for r in receiver.received] == ["k1", None, None, "s1", "k2", "k1"]
    finally:
        receiver.stop()
