"""The chat worker killed -9 mid-batch, four times, on the fault suite's broker and ClickHouse server.

400 idle warnings (each its own job, spread over alerts.v1's partitions) are published 25 a second while `chat
run` posts them: the odd ones to a loopback webhook (the default route, an apprise JSON URL; the receiver writes
each post it records as a JSON line), the even ones, team vision's, to a route of format "slack" at a loopback
stand-in for Slack's Web API (tests/fixtures_slack.py: chat.postMessage, conversations.history/replies/list as
Slack documents them; like Slack it stores every post it gets, keys or not). The worker is killed -9 each time 40
more posts arrived while more are to come: a batch is half done, and the next life starts from what the group
committed, behind what was posted. Kills 2 and 4 land while Slack holds the answer to a post it has stored: the
post in doubt on the Slack route, every time. After the fourth kill a last `chat run --max-idle-s` finishes.

Exactly once at both ends. An alert a kill cut between its post and its `sent` row (its `posting` row written,
sinks/chat.py `ChatJournal`) is in doubt: its record was not acked, so the next life handles it again. On the
webhook route every post carries an `Idempotency-Key`, its alert id, and the receiver honours it
(`WebhookReceiver`: a key seen before is answered and not recorded again), so the repeats (requests answered
without recording) are at most one per kill. On the Slack route every post carries its alert id in Slack's message
metadata, and the next life reads the channel's history for the alerts in doubt before posting them
(sinks/chat_slack.py): the held posts are found there, with the `ts` Slack gave them, and not posted again. So
every alert is stored exactly once, the journal ends with every alert `sent`, none left `posting`, and the group's
committed offsets reach the topic's end. Anything missing (a record faust dropped and nobody read again, a batch
acked before it was handled) or stored twice fails the test.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fault_harness import PipelineRun, Stack, committed_total, log, wait_until
from fixtures_slack import SlackStandIn

from schemas.topics import ALERTS, job_key
from sinks.chat import WebhookReceiver
from streams.publish import RecordPublisher

pytestmark = [pytest.mark.fault, pytest.mark.timeout(900)]

ALERTS_N = 400
WAVE, WAVE_EVERY_S = 25, 1.0  # published 25 at a time, a second apart
POSTS_PER_LIFE = 40  # a kill once this many more posts arrived
KILLS = 4
HELD_KILLS = (2, 4)  # these kills land while Slack holds its answer to a post it stored
SLACK_CHANNEL = "C0GPUSLACK"
ALERT_ID = re.compile(r"alert: (chatkill-\d+) \(")


def _alert(i: int, now_ms: int) -> dict[str, Any]:
    return {
        "alert_id": f"chatkill-{i}", "kind": "IDLE_WARNING", "ts_ms": now_ms - 3_600_000, "cluster": "c1",
        "job_id": str(i), "node": f"gpu-n{i % 16:02d}", "device_uuids": [f"GPU-{i:04d}"], "user": None,
        "team": "vision" if i % 2 == 0 else None, "project": None, "idle_minutes": 45, "cost_so_far": 1.25,
        "action": None, "action_at_ms": None, "dry_run": True,
        "message": f"Job {i} has held a GPU idle for 45 minutes.", "appeal_route": None, "emitted_ts_ms": None,
    }  # fmt: skip


class ChatRun(PipelineRun):
    """A pipeline run's topics, database and environment, with chat routed to `receiver` and team vision's alerts
    to `slack` (no rate limit)."""

    def __init__(self, stack: Stack, root: Path, receiver: WebhookReceiver, slack: SlackStandIn) -> None:
        super().__init__(stack, "kill-chat", root)
        self.receiver, self.slack = receiver, slack

    def env(self, **extra: str) -> dict[str, str]:
        route = {"url": f"json://127.0.0.1:{self.receiver.port}/hook", "channel": "#gpu-idle"}
        vision = {"url": self.slack.url(), "channel": "#gpu-slack", "format": "slack", "token": self.slack.token}
        return super().env(
            GPULEDGER_SINKS__CHAT__DEFAULT=json.dumps(route),
            GPULEDGER_SINKS__CHAT__TEAMS=json.dumps({"vision": vision}),
            GPULEDGER_SINKS__CHAT__RATE_LIMIT_PER_MINUTE="1000000",
            **extra,
        )

    def chat_committed(self) -> int:
        """Records of alerts.v1 the chat group has committed, over all partitions."""
        return committed_total(self.stack.bootstrap, f"{self.sink_group}-chat", self.topic(ALERTS))


def _posted(receiver: WebhookReceiver) -> Counter[str]:
    ids: Counter[str] = Counter()
    for item in list(receiver.received):
        found = ALERT_ID.search(json.dumps(item["body"]))
        assert found is not None, item
        ids[found.group(1)] += 1
    return ids


def _slack_posted(slack: SlackStandIn) -> Counter[str]:
    """The alert of each message stored in the Slack channel, read from its text (what people see), checked
    against its metadata key (what the next life looks up)."""
    ids: Counter[str] = Counter()
    for message in list(slack.messages[SLACK_CHANNEL]):
        found = ALERT_ID.search(message["text"])
        assert found is not None and message["metadata"]["event_payload"]["key"] == found.group(1), message
        ids[found.group(1)] += 1
    return ids


def test_chat_killed_9_mid_batch_records_every_alert_exactly_once(stack: Stack, tmp_path: Any) -> None:
    posts = tmp_path / "webhook.jsonl"
    receiver = WebhookReceiver(port=0, out=posts).start()
    slack = SlackStandIn({SLACK_CHANNEL: "gpu-slack", "C0OTHERCH1": "random"}).start()
    try:
        run = ChatRun(stack, tmp_path, receiver, slack)
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

            def got() -> int:
                return len(receiver.received) + slack.posts

            publish_wave()
            kills, last, next_wave = 0, 0, time.monotonic() + WAVE_EVERY_S

            def tick() -> None:  # the next wave when it is due
                nonlocal next_wave
                if published < ALERTS_N and time.monotonic() >= next_wave:
                    publish_wave()
                    next_wave = time.monotonic() + WAVE_EVERY_S

            held: list[str] = []  # the alerts whose Slack answer was held when the worker was killed
            deadline = time.monotonic() + 420
            chat = run.spawn("chat", "chat", "run")
            run.more.append(chat)
            while kills < KILLS and time.monotonic() < deadline:
                tick()
                if got() >= ALERTS_N:
                    break
                if got() >= last + POSTS_PER_LIFE:  # posts since the last kill, more to come: a batch half done
                    if kills + 1 in HELD_KILLS:  # Slack stores the next post and holds its answer: kill then
                        slack.hold_post(slack.posts + 1)
                        while not slack.held.wait(0.05) and time.monotonic() < deadline:
                            tick()
                        assert slack.held.is_set(), "no post to Slack came to hold"
                        held.append(ALERT_ID.search(slack.messages[SLACK_CHANNEL][-1]["text"]).group(1))  # type: ignore[union-attr]
                    run.kill(chat)
                    slack.release()
                    kills += 1
                    last = got()
                    how = ", a Slack post held" if kills in HELD_KILLS else ""
                    log(f"kill-chat: kill -9 #{kills} after {last} posts of {published} published, "
                        f"{run.chat_committed()} records committed{how}")  # fmt: skip
                    if kills < KILLS:
                        chat = run.spawn("chat", "chat", "run")
                        run.more.append(chat)
                time.sleep(0.02)
            while published < ALERTS_N:
                publish_wave()
            assert kills == KILLS, f"{got()} posts: the kills came too late to land mid-batch"
            out = run.cli("chat", "run", "--max-idle-s", "3", timeout_s=300)

            posted, on_slack = _posted(receiver), _slack_posted(slack)
            everywhere = posted + on_slack
            missing = sorted(f"chatkill-{i}" for i in range(ALERTS_N) if f"chatkill-{i}" not in everywhere)
            assert not missing, (
                f"{len(missing)} alerts never posted, e.g. {missing[:5]}; the last run's log: {out[-3000:]}"
            )
            twice = {a: n for a, n in everywhere.items() if n > 1}
            assert not twice, f"stored more than once: {twice}"
            assert set(on_slack) == {f"chatkill-{i}" for i in range(0, ALERTS_N, 2)}, "team vision's went to Slack"
            assert all(ALERT_ID.search(json.dumps(r["body"])).group(1) == r["idempotency_key"]  # type: ignore[union-attr]
                       for r in receiver.received)  # fmt: skip
            repeats = dict(receiver.repeats)
            assert set(repeats) <= set(posted) and sum(repeats.values()) <= kills, repeats
            assert len(posts.read_text().splitlines()) == len(receiver.received) == ALERTS_N // 2
            # each held post was in doubt and found in the channel's history by the next life, not posted again
            chat_log = (run.logs / "chat.log").read_text(errors="replace") + out
            found = [a for a in held if f"post {a} in doubt: found in #gpu-slack" in chat_log]
            assert found == held and len(held) == len(HELD_KILLS), (held, found)
            assert slack.calls["conversations.history"] >= len(held) and slack.calls["conversations.list"] >= 1

            client = stack.client(run.database)
            rows = client.query("SELECT alert_id, status, thread_ts FROM chat_deliveries FINAL").result_rows
            assert {a for a, status, _ in rows if status == "sent"} == set(everywhere)
            assert not [a for a, status, _ in rows if status == "posting"], "alerts left in doubt"
            slack_ts = {m["metadata"]["event_payload"]["key"]: m["ts"] for m in slack.messages[SLACK_CHANNEL]}
            assert {a: ts for a, _, ts in rows if a in slack_ts} == slack_ts, "each Slack post journalled with its ts"
            wait_until(lambda: run.chat_committed() == ALERTS_N, 30, "the chat group committed every alert")
            log(f"kill-chat: {len(everywhere)} alerts stored once each of {ALERTS_N} after {kills} kills; webhook "
                f"repeats (same key, answered, not recorded): {sum(repeats.values())} {repeats}; Slack posts held "
                f"at a kill and found in the history: {held}; history reads "
                f"{slack.calls['conversations.history']}")  # fmt: skip
    finally:
        receiver.stop()
        slack.stop()
