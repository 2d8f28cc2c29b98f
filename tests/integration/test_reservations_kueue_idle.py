"""A reservation left idle past the policy's limit is released early on Kueue (issue 41 item 4, the Kueue part; the
Slurm part: tests/integration/test_reservations_live.py).

The policy gives team serve-<s> 1 hopper GPU; a 2-GPU reservation for an hour raises its ClusterQueue's nominalQuota
to 3 at the first pass of the reservation service (as gpuledger-reservations, with only its shipped ClusterRole).
The team computes in the reservation's first minute, then its GPUs sit idle: the device-minutes go through the real
broker and the sinks into the embedded ClickHouse, and each pass reads them through `idle_minutes`'s own query.
Under warn 3 / release 5 minutes the service does nothing at 2, warns at 4, and at 6 releases early and takes the
bump back (nominalQuota 1 again, 54 minutes before the reservation's end); nothing at 7. The pass's clock is moved
minutes ahead instead of waiting them; Kueue's side is real. `chat run` posts the warning and the release to the
team's route, once each. On the team's statement the reservation's line stops
at the release: 2 GPUs x the time it held them, less the GPU-seconds the team's own job held meanwhile."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_kube import bind_user, make_namespace, rbac_manifests
from test_kube_live_identity import remove_stamp
from test_statements_close import card, run

from base.settings import ClickHouseSettings, KafkaSettings, Settings, SinksSettings
from schemas import topics
from schemas.governance_reservations import fold, request_events
from schemas.policy import parse_policy
from schemas.topics import job_key
from sinks.chat import WebhookReceiver
from sinks.consumer import LedgerSink
from sinks.db import connect
from sinks.ratecard import RATE_CARD_COLUMNS
from sinks.reservations import KueueQuota, reservation_charges
from sinks.reserve_cli import reconcile_once
from sinks.writer import LedgerWriter
from stack.kube.cluster import LocalKube
from streams.eventlog import read_events
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
TOPICS = (topics.DEVICE_MINUTES, topics.RESERVATIONS)


def policy_text(s: str, ns: str) -> str:
    return f"""\
version: 1
generations: {{hopper: {{slurm_gres: h100, kueue_flavor: h100-{s}}}}}
tiers: [{{name: prod-{s}, priority: 1000}}]
kueue: {{cohort: org-{s}}}
governance:
  operators: [ops1]
  reservations: {{max_hours: 24, auto_approve_gpus: 2, auto_approve_hours: 24, idle_warn_minutes: 3,
                 idle_release_minutes: 5}}
teams:
  - {{name: serve-{s}, namespaces: [{ns}], members: [alice], quota: {{hopper: 1}}, borrowing_limit: {{hopper: 1}}}}
"""


def nominal(kube: LocalKube, cq: str) -> str:
    obj = json.loads(kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", cq, "-o", "json").stdout)
    return str(obj["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"])


@pytest.fixture
def stage(local_kube: LocalKube, kafka_bootstrap: str, ledger_database: tuple[Any, ClickHouseSettings],
          tmp_path: Path) -> Iterator[tuple[Settings, str, str]]:  # fmt: skip
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + t.name + suffix for t in TOPICS for suffix in ("", ".dlq")]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    client, ch = ledger_database
    client.insert("rate_card", card("card-1", 2_000_000, 1), column_names=RATE_CARD_COLUMNS)
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix), clickhouse=ch,
                        sinks=SinksSettings(group_id=f"sink-{uuid.uuid4().hex[:6]}", batch_max_records=500,
                                            batch_max_wait_s=0.3), cluster="c1")  # fmt: skip
    s, ns = uuid.uuid4().hex[:6], make_namespace(local_kube, "ri")
    local_kube.apply(rbac_manifests("reservations"))
    bind_user(local_kube, "gpuledger-reservations", "gpuledger-reservations")
    try:
        yield settings, s, ns
    finally:
        remove_stamp(local_kube, ns)


def test_a_reservation_left_idle_past_the_limit_is_released_early_on_kueue(
    local_kube: LocalKube, stage: tuple[Settings, str, str], tmp_path: Path
) -> None:
    from fixtures_cli import run_gpuledger

    settings, s, ns = stage
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(policy_text(s, ns))
    policy = parse_policy(policy_text(s, ns))
    done = run_gpuledger(["policy", "apply", "--engine", "kueue", "--policy", str(policy_file), "--kubeconfig",
                          str(local_kube.cfg.kubeconfig("gpuledger-policy"))],
                         {**os.environ, "GPULEDGER_CONFIG": str(tmp_path / "none.toml")}, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    team = cq = f"serve-{s}"
    assert nominal(local_kube, cq) == "1"

    start = (int(time.time()) // 60) * 60_000
    events = request_events({}, policy, cluster="c1", team=team, generation="hopper", gpus=2, nodes=[],
                            start_ms=start, end_ms=start + 3_600_000, reason="a launch", requester="alice",
                            now_ms=start)  # fmt: skip
    pub = RecordPublisher(settings.kafka)
    for e in events:
        pub.publish(topics.RESERVATIONS, f"c1/{e['reservation_id']}".encode(), e)
    pub.flush()
    rid = events[0]["reservation_id"]
    engines = [KueueQuota(policy, kubeconfig=str(local_kube.cfg.kubeconfig("gpuledger-reservations")))]

    def pass_at(minutes: int) -> list[tuple[str, str]]:
        done = reconcile_once(settings, policy, engines, start + minutes * 60_000 + 5_000)
        return [(e["event_type"], e["text"]) for e in done if e["reservation_id"] == rid]

    rendered = pass_at(0)
    assert [kind for kind, _ in rendered] == ["RENDERED"] and nominal(local_kube, cq) == "3", rendered

    # The team computed in the reservation's first minute, then its GPUs sat idle.
    seeded = [{**m, "team": team, "cluster": "c1"} for m in run("a1", "GPU-a", "2026-09-20T10:00",
                                                                 [("active", 1), ("idle", 9)])]  # fmt: skip
    for i, m in enumerate(seeded):
        m["minute_start_ms"] = start + i * 60_000
        pub.publish(topics.DEVICE_MINUTES, job_key("c1", "a1"), m)
    pub.flush()
    client = connect(settings.clickhouse)
    try:
        LedgerSink(settings.kafka, settings.sinks, LedgerWriter(client), topics=[t.name for t in TOPICS]).run(
            lambda: False, max_idle_s=3.0
        )
    finally:
        client.close()

    assert pass_at(2) == []  # 1 idle minute after the busy one: within the limits
    assert pass_at(4) == [("IDLE_WARNED", "its GPUs idle for 3 min")]
    released = pass_at(6)
    assert released[0] == ("RELEASED", "idle 5 min: released early") and released[1][0] == "REMOVED", released
    assert nominal(local_kube, cq) == "1"  # the bump taken back, 54 minutes before the reservation's end
    assert pass_at(7) == []  # nothing twice

    # In chat: `chat run` posts the service's warning and early release to the team's route, once each.
    receiver = WebhookReceiver(port=0).start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")},
           "GPULEDGER_CONFIG": str(tmp_path / "none.toml"), "GPULEDGER_CLUSTER": "c1",
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
           "GPULEDGER_KAFKA__TOPIC_PREFIX": settings.kafka.topic_prefix,
           "GPULEDGER_CLICKHOUSE__URL": settings.clickhouse.url,
           "GPULEDGER_CLICKHOUSE__DATABASE": settings.clickhouse.database,
           "GPULEDGER_CLICKHOUSE__PASSWORD": settings.clickhouse.password.get_secret_value(),
           "GPULEDGER_SINKS__GROUP_ID": f"chat-{uuid.uuid4().hex[:6]}",
           "GPULEDGER_SINKS__CHAT__TEAMS": json.dumps({team: {
               "url": f"http://127.0.0.1:{receiver.port}/slack/{team}", "channel": f"#{team}", "format": "slack"}}),
           }  # fmt: skip
    logs = []
    try:
        for _ in range(2):  # a second run reads the topic again: nothing is posted twice
            done = run_gpuledger(["chat", "run", "--max-idle-s", "3"], env, timeout=240)
            assert done.returncode == 0, done.stderr[-3000:]
            logs.append(done.stderr)
        posts = [p["body"] for p in receiver.received]
    finally:
        receiver.stop()
    assert [(p["channel"], p["text"].splitlines()[0].strip("*")) for p in posts] == [  # Slack's bold title
        (f"#{team}", f"[gpuledger] Reservation {rid} idle: its GPUs idle for 3 min (team {team}, 2 hopper GPUs)"),
        (
            f"#{team}",
            f"[gpuledger] Reservation {rid} released early: idle 5 min: released early (team {team}, 2 hopper GPUs)",
        ),
    ], (posts, [line for text in logs for line in text.splitlines() if "rsv-" in line or "chat" in line])

    # On the team's statement: the reserved GPUs up to the release, less the team's own minute.
    steps, _ = read_events(settings.kafka, topics.RESERVATIONS)
    reservation = fold(steps, policy)[0][rid]
    assert reservation.ended_how == "RELEASED" and reservation.until_ms() == start + 6 * 60_000 + 5_000
    client = connect(settings.clickhouse)
    try:
        (line,) = reservation_charges(client, [reservation], start + 60 * 60_000)
    finally:
        client.close()
    held_s = 2 * (6 * 60 + 5)  # 2 GPUs from the start to the release, not to the end an hour later
    used_s = 7 * 60  # the team's job held one GPU (busy, then idle) in each of the 7 minutes begun by then
    assert (line.team, line.allocated_s) == (team, held_s - used_s), line
