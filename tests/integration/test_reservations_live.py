"""Reservations with expiry (issue 19): on the live Slurm (fixture `slurm`) and the real broker through the CLI,
and charged on the statement in the embedded ClickHouse.

- A reservation within policy is approved at once, rendered by one pass of the service (`scontrol show
  reservation` shows it: the team's account, the node holding its GPUs) and gone from Slurm after its end with
  nobody acting; the next pass records it EXPIRED and REMOVED. A future one is rendered ahead (INACTIVE), its
  extension reaches Slurm's EndTime, its release deletes it. Requests over policy, for an unknown team or
  overlapping one of the team's are one line each and leave no event.
- Charged on allocation: vision reserved 2 hopper GPUs for 4 h on 2026-09-20 and its job used 1 GPU-h inside;
  at 2.00 $/GPU-h the statement has a reservation line of (8 - 1) GPU-h = 14.00 beside the job's 2.00, and once
  September is closed nothing of it is owed again.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_statements_close import env, ledger_settings, lines_of, ms, run
from test_statements_close import run_cli as cli

from base.settings import Settings
from schemas import topics
from schemas.governance_reservations import request_events
from schemas.policy import parse_policy
from schemas.topics import job_key
from sinks.consumer import LedgerSink
from sinks.db import connect
from sinks.writer import LedgerWriter
from stack.slurm.cluster import SlurmClient
from streams.eventlog import read_events
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
TOPICS = (topics.DEVICE_MINUTES, topics.RESERVATIONS)


def policy_text(account: str) -> str:
    return f"""
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 2}}
  ampere: {{slurm_gres: a100, kueue_flavor: a100}}
tiers: [{{name: research, priority: 100}}]
governance:
  operators: [ops1]
  reservations: {{max_hours: 24, max_lead_days: 7, auto_approve_gpus: 2, auto_approve_hours: 24}}
teams:
  - {{name: vision, slurm_account: {account}, members: [alice], quota: {{hopper: 2}}}}
  - {{name: nlp, members: [carol], quota: {{ampere: 1}}}}
"""


@pytest.fixture
def governed(kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str,
             tmp_path: Path) -> tuple[Settings, dict[str, str], str]:  # fmt: skip
    settings = ledger_settings(kafka_bootstrap, clickhouse_server, clickhouse_database, TOPICS)
    account = f"resv{uuid.uuid4().hex[:6]}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(account))
    return settings, {**env(settings), "GPULEDGER_POLICY_PATH": str(policy)}, account


def shown(slurm: SlurmClient, name: str) -> str | None:
    done = slurm.run("scontrol", "-o", "show", "reservation", name, check=False)
    return done.stdout.strip() if done.returncode == 0 and name in done.stdout else None


def test_a_reservation_on_the_live_slurm_appears_and_is_gone_after_its_end(
    slurm: SlurmClient, governed: tuple[Settings, dict[str, str], str]
) -> None:
    s, environ, account = governed
    environ = {**environ, **slurm.cfg.env, "PATH": slurm.env["PATH"]}
    slurm.run("sacctmgr", "-i", "add", "account", account)

    # Refused: over policy, unknown team, someone else's team; nothing published.
    base = ("reserve", "create", "--generation", "hopper", "--reason", "paper deadline")
    assert "may reserve 1..2 hopper GPUs" in cli(environ, *base, "--team", "vision", "--gpus", "3", "--hours", "1",
                                                 "--by", "alice", code=2)  # fmt: skip
    assert "unknown team 'ghost'" in cli(environ, *base, "--team", "ghost", "--gpus", "1", "--hours", "1", "--by",
                                         "alice", code=2)  # fmt: skip
    assert "may not reserve for vision" in cli(environ, *base, "--team", "vision", "--gpus", "1", "--hours", "1",
                                               "--by", "carol", code=2)  # fmt: skip
    assert read_events(s.kafka, topics.RESERVATIONS)[0] == []

    # 2 hopper GPUs for 40 s from now: approved at once, rendered by one pass of the service.
    out = cli(environ, *base, "--team", "vision", "--gpus", "2", "--hours", str(40 / 3600), "--by", "alice")
    rid = out.split()[1].rstrip(":")
    assert "approved" in out
    assert "overlapping reservation" in cli(environ, *base, "--team", "vision", "--gpus", "1", "--hours", "1",
                                            "--by", "alice", code=2)  # fmt: skip
    out = cli(environ, "reserve", "reconcile", "--engine", "slurm")
    assert f"{rid} rendered SLURM" in out
    line = shown(slurm, f"gpuledger-{rid}")
    assert line is not None and f"Accounts={account}" in line and "Nodes=gpu-node-1" in line, line

    # Nobody acts: Slurm ends it at its EndTime.
    deadline = time.monotonic() + 120
    while shown(slurm, f"gpuledger-{rid}") is not None and time.monotonic() < deadline:
        time.sleep(2)
    assert shown(slurm, f"gpuledger-{rid}") is None, "still in Slurm after its end"
    out = cli(environ, "reserve", "reconcile", "--engine", "slurm")
    assert f"{rid} expired: reached its end" in out and f"{rid} removed SLURM: already gone from Slurm" in out
    listed = json.loads(cli(environ, "reserve", "list", "--state", "all", "--format", "json"))
    assert [(r["reservation_id"], r["state"], r["on"]) for r in listed] == [(rid, "EXPIRED", "")]

    # A future one: rendered ahead (INACTIVE), extended on Slurm, released and deleted.
    start = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    out = cli(environ, *base, "--team", "vision", "--gpus", "1", "--start", start, "--hours", "1", "--by", "alice")
    later = out.split()[1].rstrip(":")
    cli(environ, "reserve", "reconcile", "--engine", "slurm")
    assert "State=INACTIVE" in (shown(slurm, f"gpuledger-{later}") or "")
    out = cli(environ, "reserve", "extend", later, "--hours", "2", "--by", "alice")
    cli(environ, "reserve", "reconcile", "--engine", "slurm")
    line = shown(slurm, f"gpuledger-{later}") or ""
    assert "Duration=03:00:00" in line, line
    cli(environ, "reserve", "release", later, "--by", "alice", "--reason", "plans changed")
    assert f"{later} removed SLURM: deleted" in cli(environ, "reserve", "reconcile", "--engine", "slurm")
    assert shown(slurm, f"gpuledger-{later}") is None
    steps = [e["event_type"] for e in read_events(s.kafka, topics.RESERVATIONS)[0] if e["reservation_id"] == later]
    assert sorted(steps) == sorted(["REQUESTED", "APPROVED", "RENDERED", "EXTENDED", "RELEASED", "REMOVED"])


def test_reserved_capacity_is_a_statement_line(governed: tuple[Settings, dict[str, str], str]) -> None:
    s, environ, account = governed
    policy = parse_policy(policy_text(account))
    asked = ms("2026-09-19T12:00")
    events = request_events({}, policy, cluster="c1", team="vision", generation="hopper", gpus=2, nodes=[],
                            start_ms=ms("2026-09-20T10:00"), end_ms=ms("2026-09-20T14:00"), reason="paper",
                            requester="alice", now_ms=asked)  # fmt: skip
    pub = RecordPublisher(s.kafka)
    for e in events:
        pub.publish(topics.RESERVATIONS, f"c1/{e['reservation_id']}".encode(), e)
    for rec in run("a1", "GPU-a", "2026-09-20T11:00", [("active", 60)]):  # vision's job inside the reservation
        pub.publish(topics.DEVICE_MINUTES, job_key("c1", "a1"), {**rec, "team": "vision"})
    pub.flush()
    client = connect(s.clickhouse)
    try:
        sink = LedgerSink(s.kafka, s.sinks, LedgerWriter(client), topics=[t.name for t in TOPICS])
        sink.run(lambda: False, max_idle_s=3.0)
    finally:
        client.close()
    rid = events[0]["reservation_id"]
    september = json.loads(cli(environ, "statement", "show", "--period", "2026-09", "--format", "json"))
    assert lines_of(september) == {
        ("vision", "usage", "2026-09", "a1", "p-v", "2.00", "", ""),
        ("vision", "reservation", "2026-09", "", "", "14.00", "reservation", f"{rid}/2026-09"),
    }
    reserved = next(r for r in september if r["kind"] == "reservation")
    assert reserved["allocated_gpu_h"] == "7.0000" and reserved["rate_per_gpu_hour"] == "2.000000"
    assert ": 16.00 over 2 lines" in cli(environ, "period", "close", "2026-09", "--by", "fin")
    assert json.loads(cli(environ, "statement", "show", "--period", "2026-10", "--format", "json")) == []


def test_a_reservation_left_idle_past_the_limit_is_released_early_on_the_live_slurm(
    slurm: SlurmClient, governed: tuple[Settings, dict[str, str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41 item 4: the service's pass reads the team's device-minutes through `idle_minutes`'s query in the
    embedded ClickHouse (seeded: a busy minute at the start, idle ones after) and, with the policy's limits (warn 3,
    release 5 minutes), first does nothing, then warns, then releases early and deletes the reservation on Slurm.
    The pass's clock is injected (minutes ahead) instead of waiting real minutes; Slurm's side is real."""
    from sinks.reservations import SlurmReservations
    from sinks.reserve_cli import reconcile_once

    s, _, account = governed
    for key, value in {**slurm.cfg.env, "PATH": slurm.env["PATH"]}.items():
        monkeypatch.setenv(key, value)
    slurm.run("sacctmgr", "-i", "add", "account", account)
    policy = parse_policy(policy_text(account).replace(
        "auto_approve_hours: 24}", "auto_approve_hours: 24, idle_warn_minutes: 3, idle_release_minutes: 5}"))
    start = (int(time.time()) // 60 + 1) * 60_000  # the next whole minute: Slurm takes a start ahead
    events = request_events({}, policy, cluster="c1", team="vision", generation="hopper", gpus=2, nodes=[],
                            start_ms=start, end_ms=start + 3_600_000, reason="paper deadline",
                            requester="alice", now_ms=start - 30_000)  # fmt: skip
    pub = RecordPublisher(s.kafka)
    for e in events:
        pub.publish(topics.RESERVATIONS, f"c1/{e['reservation_id']}".encode(), e)
    pub.flush()
    rid = events[0]["reservation_id"]
    engines = [SlurmReservations(policy)]
    kinds = [(e["event_type"], e.get("engine")) for e in reconcile_once(s, policy, engines, start - 20_000)]
    assert kinds == [("RENDERED", "SLURM")]
    assert f"Accounts={account}" in (shown(slurm, f"gpuledger-{rid}") or "")

    # vision computed in the reservation's first minute on its node, then its GPUs sat idle.
    seeded = [{**m, "node": "gpu-node-1", "team": "vision"} for m in run("a1", "GPU-a", "2026-09-20T10:00",
                                                                          [("active", 1), ("idle", 9)])]
    for i, m in enumerate(seeded):
        m["minute_start_ms"] = start + i * 60_000
        pub.publish(topics.DEVICE_MINUTES, job_key("c1", "a1"), m)
    pub.flush()
    client = connect(s.clickhouse)
    try:
        LedgerSink(s.kafka, s.sinks, LedgerWriter(client), topics=[t.name for t in TOPICS]).run(
            lambda: False, max_idle_s=3.0)
    finally:
        client.close()

    def pass_at(minutes: int) -> list[tuple[str, str]]:
        done = reconcile_once(s, policy, engines, start + minutes * 60_000 + 5_000)
        return [(e["event_type"], e["text"]) for e in done if e["reservation_id"] == rid]

    assert pass_at(2) == []  # 1 idle minute after the busy one: within the limits
    assert pass_at(4) == [("IDLE_WARNED", "its GPUs idle for 3 min")]
    released = pass_at(6)
    assert released[0] == ("RELEASED", "idle 5 min: released early") and released[1][0] == "REMOVED", released
    assert shown(slurm, f"gpuledger-{rid}") is None  # deleted on Slurm, 54 minutes before its end
    assert pass_at(7) == []  # nothing twice
