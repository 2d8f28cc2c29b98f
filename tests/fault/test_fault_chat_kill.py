"""The chat worker killed -9 mid-batch, four times, on the fault suite's broker and ClickHouse server.

400 idle warnings (each its own job, spread over alerts.v1's partitions) are published 25 a second while `chat
run` posts them to a loopback webhook (the receiver writes each post it records as a JSON line); it is killed -9
each time 40 more posts arrived while more are to come: a batch is half done, and the next life starts from what
the group committed, behind what was posted. After the fourth kill a last `chat run --max-idle-s` finishes.

Exactly once at the receiver: every post carries an `Idempotency-Key`, its alert id, and the receiver honours it
(`WebhookReceiver`: a key seen before is answered and not recorded again). An alert a kill cut between its post
and its `sent` row (its `posting` row written, sinks/chat.py `ChatJournal`) is in doubt: its record was not
acked, so the next life posts it again with the same key. So every alert is recorded exactly once, each under
its own key; the repeats (requests the receiver answered without recording) are at most one per kill, since
the handler posts one alert at a time; the journal ends with every alert `sent`, none left `posting`; and the
group's committed offsets reach the topic's end. Anything missing (a record faust dropped and nobody read
again, a batch acked before it was handled) or recorded twice fails the test.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from fault_harness import PipelineRun, Stack, log, wait_until

from schemas.topics import ALERTS, job_key
from sinks.chat import WebhookReceiver
from streams.publish import RecordPublisher

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

ALERTS_N = 400
WAVE, WAVE_EVERY_S = 25, 1.0  # published 25 at a time, a second apart
POSTS_PER_LIFE = 40  # a kill once this many more posts arrived
KILLS = 4
ALERT_ID = re.compile(r"alert: (chatkill-\d+) \(")


def _alert(i: int, now_ms: int) -> dict[str, Any]:
    return {
        "alert_id": f"chatkill-{i}", "kind": "IDLE_WARNING", "ts_ms": now_ms - 3_600_000, "cluster": "c1",
        "job_id": str(i), "node": f"gpu-n{i % 16:02d}", "device_uuids": [f"GPU-{i:04d}"], "user": None,
        "team": None, "project": None, "idle_minutes": 45, "cost_so_far": 1.25, "action": None,
        "action_at_ms": None, "dry_run": True, "message": f"Job {i} has held a GPU idle for 45 minutes.",
        "appeal_route": None, "emitted_ts_ms": None,
    }  # fmt: skip


class ChatRun(PipelineRun):
    """A pipeline run's topics, database and environment, with chat routed to `receiver` (no rate limit)."""

    def __init__(self, stack: Stack, root: Path, receiver: WebhookReceiver) -> None:
        super().__init__(stack, "kill-chat", root)
        self.receiver = receiver

    def env(self, **extra: str) -> dict[str, str]:
        route = {"url": f"json://127.0.0.1:{self.receiver.port}/hook", "channel": "#gpu-idle"}
        return super().env(
            GPULEDGER_SINKS__CHAT__DEFAULT=json.dumps(route),
            GPULEDGER_SINKS__CHAT__RATE_LIMIT_PER_MINUTE="1000000",
            **extra,
        )

    def chat_committed(self) -> int:
        """Records of alerts.v1 the chat group has committed, over all partitions."""
        topic = self.topic(ALERTS)
        consumer = Consumer({"bootstrap.servers": self.stack.bootstrap, "group.id": f"{self.sink_group}-chat"})
        try:
            meta = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            tps = consumer.committed([TopicPartition(topic, p) for p in meta], timeout=10)
            return sum(max(tp.offset, 0) for tp in tps)
        finally:
            consumer.close()


def _posted(receiver: WebhookReceiver) -> Counter[str]:
    ids: Counter[str] = Counter()
    for item in list(receiver.received):
        found = ALERT_ID.search(json.dumps(item["body"]))
        assert found is not None, item
        ids[found.group(1)] += 1
    return ids


def test_chat_killed_9_mid_batch_records_every_alert_exactly_once(stack: Stack, tmp_path: Any) -> None:
    posts = tmp_path / "webhook.jsonl"
    receiver = WebhookReceiver(port=0, out=posts).start()
    try:
        run = ChatRun(stack, tmp_path, receiver)
        with run:
            now_ms = int(time.time() * 1000)
            pub = RecordPublisher(run.kafka())
            published = 0

            def publish_wave() -> None:  # alerts keep coming while chat runs: batches of a few, commits between
                nonlocal published
                for i in range(published, min(published + WAVE, ALERTS_N)):
                    pub.publish(ALERTS, job_key("c1", str(i)), _alert(i, now_ms))
                pub.flush()
                published = min(published + WAVE, ALERTS_N)

            publish_wave()
            kills, last, next_wave = 0, 0, time.monotonic() + WAVE_EVERY_S
            deadline = time.monotonic() + 420
            chat = run.spawn("chat", "chat", "run")
            run.more.append(chat)
            while kills < KILLS and time.monotonic() < deadline:
                if published < ALERTS_N and time.monotonic() >= next_wave:
                    publish_wave()
                    next_wave = time.monotonic() + WAVE_EVERY_S
                got = len(receiver.received)
                if got >= ALERTS_N:
                    break
                if got >= last + POSTS_PER_LIFE:  # posts since the last kill, more to come: a batch half done
                    run.kill(chat)
                    kills += 1
                    last = len(receiver.received)
                    log(f"kill-chat: kill -9 #{kills} after {last} posts of {published} published, "
                        f"{run.chat_committed()} records committed")  # fmt: skip
                    if kills < KILLS:
                        chat = run.spawn("chat", "chat", "run")
                        run.more.append(chat)
                time.sleep(0.02)
            while published < ALERTS_N:
                publish_wave()
            assert kills == KILLS, f"{len(receiver.received)} posts: the kills came too late to land mid-batch"
            out = run.cli("chat", "run", "--max-idle-s", "3", timeout_s=300)

            posted = _posted(receiver)
            missing = sorted(f"chatkill-{i}" for i in range(ALERTS_N) if f"chatkill-{i}" not in posted)
            assert not missing, (
                f"{len(missing)} alerts never posted, e.g. {missing[:5]}; the last run's log: {out[-3000:]}"
            )
            twice = {a: n for a, n in posted.items() if n > 1}
            assert not twice, f"recorded more than once: {twice}"
            assert all(ALERT_ID.search(json.dumps(r["body"])).group(1) == r["idempotency_key"]  # type: ignore[union-attr]
                       for r in receiver.received)  # fmt: skip
            repeats = dict(receiver.repeats)
            assert set(repeats) <= set(posted) and sum(repeats.values()) <= kills, repeats
            assert len(posts.read_text().splitlines()) == len(receiver.received) == ALERTS_N

            client = stack.client(run.database)
            rows = client.query("SELECT alert_id, status FROM chat_deliveries FINAL").result_rows
            assert {a for a, status in rows if status == "sent"} == set(posted)
            assert not [a for a, status in rows if status == "posting"], "alerts left in doubt"
            wait_until(lambda: run.chat_committed() == ALERTS_N, 30, "the chat group committed every alert")
            log(f"kill-chat: {len(receiver.received)} alerts recorded once each of {ALERTS_N} after {kills} kills; "
                f"repeated requests (same key, answered, not recorded): {sum(repeats.values())} {repeats}")  # fmt: skip
    finally:
        receiver.stop()
