"""Appeals with decisions (issue 19) on the real broker and the embedded ClickHouse, through the CLI.

Worked example: a1 (vision, alice) held one hopper GPU for an hour in 2026-09 at 2.00 $/GPU-h; September is
closed (vision 2.00). Alice appeals the idle warning on a1; ops1 grants a credit of 1.50. September's
statement keeps its hash; the next open month, 2026-10, carries exactly one line for it: vision, credit,
-1.50, source 2026-09, naming the appeal; once October closes, November owes nothing more.
Refused steps (an unknown alert, someone else's job, a second appeal, a non-decider, a second decision) are
one line each and leave no event; hostile records on the topic are dead-lettered by the sink or ignored by
the fold, never a credit.
"""

from __future__ import annotations

import csv
import io
import json
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from test_statements_close import LEDGER, env, hashes, ledger_settings, lines_of, ms
from test_statements_close import run_cli as cli

from base.settings import Settings
from schemas import topics
from schemas.codec import AvroCodec
from schemas.topics import job_key
from sinks.consumer import LedgerSink
from sinks.db import connect
from sinks.writer import LedgerWriter
from streams.eventlog import read_events
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
TOPICS = (topics.DEVICE_MINUTES, topics.ALERTS, topics.APPEALS)
POLICY = """
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}, ampere: {slurm_gres: a100, kueue_flavor: a100}}
tiers: [{name: research, priority: 100}]
governance:
  operators: [ops1]
  appeals: {deadline_hours: 72, window_days: 3650, max_credit: "100.00"}
teams:
  - {name: vision, members: [alice]}
  - {name: nlp, members: [carol]}
"""
ALERT = {
    "alert_id": "al-1", "kind": "IDLE_WARNING", "ts_ms": ms("2026-09-10T10:40"), "cluster": "c1", "job_id": "a1",
    "node": "n1", "device_uuids": ["GPU-a"], "user": "alice", "team": "vision", "project": "p-v",
    "idle_minutes": 20, "cost_so_far": 0.67, "action": "CHECKPOINT_THEN_REQUEUE",
    "action_at_ms": ms("2026-09-10T10:55"), "dry_run": True, "message": "GPU-a idle", "appeal_route": None,
    "emitted_ts_ms": None,
}  # fmt: skip


@pytest.fixture
def appeals_env(kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str,
                tmp_path: Path) -> tuple[Settings, dict[str, str]]:  # fmt: skip
    settings = ledger_settings(kafka_bootstrap, clickhouse_server, clickhouse_database, TOPICS)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return settings, {**env(settings), "GPULEDGER_POLICY_PATH": str(policy)}


def sink(s: Settings) -> None:
    client = connect(s.clickhouse)
    try:
        LedgerSink(s.kafka, s.sinks, LedgerWriter(client), topics=[t.name for t in TOPICS]).run(
            lambda: False, max_idle_s=3.0
        )
    finally:
        client.close()


def dead_letters(s: Settings, topic: topics.Topic) -> list[dict[str, bytes]]:
    consumer = Consumer({"bootstrap.servers": s.kafka.bootstrap_servers, "group.id": uuid.uuid4().hex,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.subscribe([s.kafka.topic(topic.dlq)])
    out: list[dict[str, bytes]] = []
    for _ in range(12):
        out += [dict(m.headers() or []) for m in consumer.consume(10, timeout=0.5) if m.error() is None]
    consumer.close()
    return out


def journal(environ: dict[str, str], period: str, path: Path) -> list[dict[str, str]]:
    cli(environ, "report", "journal", "--period", period, "--output", str(path))
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def parquet_rows(path: Path) -> list[dict[str, str]]:
    """The Parquet journal read back with pyarrow, each cell as the CSV writes it."""
    import pyarrow.parquet as pq

    return [{k: str(v) for k, v in row.items()} for row in pq.read_table(path).to_pylist()]


def statement_ids(s: Settings, period: str) -> str:
    client = connect(s.clickhouse)
    rows = client.query("SELECT statement_id FROM v_statements WHERE period = {p:String} ORDER BY statement_id",
                        parameters={"p": period}).result_rows  # fmt: skip
    client.close()
    return ";".join(str(r[0]) for r in rows)


def test_a_credit_on_a_closed_month_is_one_line_in_the_next(appeals_env: tuple[Settings, dict[str, str]],
                                                             tmp_path: Path) -> None:  # fmt: skip
    s, environ = appeals_env
    environ = {**environ, "GPULEDGER_CLUSTER_COST_CENTRE": "CC-GPU-OPS"}
    pub = RecordPublisher(s.kafka)
    for rec in LEDGER[:60]:  # a1: one hopper GPU for an hour on 2026-09-10
        pub.publish(topics.DEVICE_MINUTES, job_key("c1", "a1"), rec)
    pub.publish(topics.ALERTS, job_key("c1", "a1"), ALERT)
    pub.flush()
    sink(s)
    cli(environ, "period", "close", "2026-09", "--by", "fin")
    closed = hashes(s, "2026-09")

    # Refused steps: one line each, no event.
    assert "no job alert 'al-404'" in cli(environ, "appeal", "file", "--alert", "al-404", "--reason", "x",
                                          "--by", "alice", code=2)  # fmt: skip
    assert "may not appeal job a1" in cli(environ, "appeal", "file", "--alert", "al-1", "--reason", "x",
                                          "--by", "carol", code=2)  # fmt: skip
    assert read_events(s.kafka, topics.APPEALS)[0] == []
    out = cli(environ, "appeal", "file", "--alert", "al-1", "--reason", "checkpoint lost, 11 hours", "--by", "alice")
    appeal_id = out.split()[1]
    assert "still open" in cli(environ, "appeal", "file", "--alert", "al-1", "--reason", "again", "--by", "alice",
                               code=2)  # fmt: skip
    credit = ("appeal", "decide", appeal_id, "--grant", "credit")
    assert "may not decide appeals" in cli(environ, *credit, "--amount", "1.50", "--note", "self-service", "--by",
                                           "alice", code=2)  # fmt: skip
    assert "above the policy's max_credit" in cli(environ, *credit, "--amount", "100.01", "--note", "n", "--by",
                                                  "ops1", code=2)  # fmt: skip
    out = cli(environ, "appeal", "decide", appeal_id, "--grant", "credit", "--amount", "1.50", "--note",
              "reclaimed while checkpointing", "--by", "ops1")  # fmt: skip
    assert out.strip() == f"appeal {appeal_id} decided: credit 1.50"
    assert "already decided (CREDIT by ops1)" in cli(environ, "appeal", "decide", appeal_id, "--deny", "--note",
                                                     "no", "--by", "ops1", code=2)  # fmt: skip
    events, _ = read_events(s.kafka, topics.APPEALS)
    assert [e["event_type"] for e in events] == ["FILED", "DECIDED"]

    # Hostile records on the topic: bytes that are no record and a step over the contract's bounds are
    # dead-lettered; a well-formed credit "decided" by someone the policy does not empower is never a credit.
    codec = AvroCodec.from_settings(s.kafka)
    forged = {**events[1], "event_id": "forged", "actor": "mallory", "credit_cents": 9_999, "ts_ms": events[1]["ts_ms"]}
    pub.publish_raw(s.kafka.topic(topics.APPEALS.name), job_key("c1", "a1"), b"\x00not avro")
    pub.publish_raw(s.kafka.topic(topics.APPEALS.name), job_key("c1", "a1"),
                    codec.encode("appeals", {**events[0], "event_id": "huge", "text": "x" * 100_000}))  # fmt: skip
    pub.publish(topics.APPEALS, job_key("c1", "a1"), forged)
    pub.flush()
    sink(s)
    letters = dead_letters(s, topics.APPEALS)
    classes = sorted(h["dlq.error.class"] for h in letters)
    assert classes == [b"InvalidRecord", b"UnknownSchema"]  # "\x00...": Confluent framing of no known schema
    assert b"at most 2000" in next(h["dlq.error.message"] for h in letters if h["dlq.error.class"] == b"InvalidRecord")

    # The credit: one line in October, September untouched.
    october = lines_of(json.loads(cli(environ, "statement", "show", "--period", "2026-10", "--format", "json")))
    assert october == {("vision", "credit", "2026-09", "a1", "p-v", "-1.50", "appeal", appeal_id)}
    assert hashes(s, "2026-09") == closed
    assert cli(environ, "statement", "verify", "--period", "2026-09").count(" ok") == 1

    # The journal of open October (provisional): the credit is its one line, to a1's cost centre (September's
    # frozen usage names CC-100), naming the appeal; the contra to the cluster's cost centre balances it.
    provisional = journal(environ, "2026-10", tmp_path / "oct-open.csv")
    assert [(r["line_kind"], r["cost_centre"], r["debit"], r["credit"], r["source_period"], r["cause_kind"],
             r["cause_ref"], r["status"]) for r in provisional] == [
        ("credit", "CC-100", "0.00", "1.50", "2026-09", "appeal", appeal_id, "provisional"),
        ("contra", "CC-GPU-OPS", "1.50", "0.00", "2026-10", "", "", "provisional")]  # fmt: skip
    out = cli(environ, "period", "close", "2026-10", "--by", "fin")
    assert ": -1.50 over 1 lines" in out

    # Closed October's journal: exactly one adjustment line, from October's closed statement; it balances to
    # the cent; two exports give the same ids (the provisional export's too, so a finance system upserts);
    # the Parquet file says what the CSV says.
    october_ids = set(hashes(s, "2026-10"))
    october_sid = statement_ids(s, "2026-10")
    first = journal(environ, "2026-10", tmp_path / "oct-1.csv")
    again = journal(environ, "2026-10", tmp_path / "oct-2.csv")
    assert first == again
    assert october_ids == {"vision"}
    assert [r["line_id"] for r in first] == [r["line_id"] for r in provisional]
    adjustments = [r for r in first if r["line_kind"] != "contra"]
    assert [(r["line_kind"], r["cost_centre"], r["credit"], r["cause_ref"], r["statement_ids"], r["status"])
            for r in adjustments] == [("credit", "CC-100", "1.50", appeal_id, october_sid, "closed")]  # fmt: skip
    assert sum(Decimal(r["debit"]) - Decimal(r["credit"]) for r in first) == Decimal("0.00")
    assert sum(Decimal(r["amount"]) for r in first) == 0 and first[-1]["debit"] == "1.50"
    cli(environ, "report", "journal", "--period", "2026-10", "--format", "parquet", "-o", str(tmp_path / "oct.pq"))
    assert parquet_rows(tmp_path / "oct.pq") == first
    # September's own journal: its frozen usage and the contra, unchanged by the credit posted in October.
    september = journal(environ, "2026-09", tmp_path / "sep.csv")
    assert [(r["line_kind"], r["cost_centre"], r["debit"], r["credit"], r["statement_ids"]) for r in september] == [
        ("usage", "CC-100", "2.00", "0.00", statement_ids(s, "2026-09")),
        ("contra", "CC-GPU-OPS", "0.00", "2.00", statement_ids(s, "2026-09"))]  # fmt: skip
    assert hashes(s, "2026-09") == closed
    november = json.loads(cli(environ, "statement", "show", "--period", "2026-11", "--format", "json"))
    assert november == []
    listed = json.loads(cli(environ, "appeal", "list", "--state", "decided", "--format", "json"))
    assert [(a["appeal_id"], a["decision"], a["credit"], a["decided_by"]) for a in listed] == [
        (appeal_id, "CREDIT", "1.50", "ops1")]


def test_an_overdue_appeal_is_escalated_once(appeals_env: tuple[Settings, dict[str, str]]) -> None:
    s, environ = appeals_env
    now = time.time_ns() // 1_000_000
    filed = {
        "event_id": "e-old", "event_type": "FILED", "appeal_id": "ap-old", "ts_ms": now - 4 * 86_400_000,
        "actor": "alice", "cluster": "c1", "job_id": "a1", "alert_id": "al-1", "user": "alice", "team": "vision",
        "project": "p-v", "period": "2026-09", "text": "please", "decision": None, "credit_cents": None,
        "exemption_until_ms": None, "deadline_ms": now - 86_400_000,
    }  # fmt: skip
    pub = RecordPublisher(s.kafka)
    pub.publish(topics.APPEALS, job_key("c1", "a1"), filed)
    pub.flush()
    assert "appeal ap-old escalated: undecided 96 h after filing" in cli(environ, "appeal", "escalate")
    assert cli(environ, "appeal", "escalate") == ""
    listed = json.loads(cli(environ, "appeal", "list", "--state", "escalated", "--format", "json"))
    assert [a["appeal_id"] for a in listed] == ["ap-old"]
    events, _ = read_events(s.kafka, topics.APPEALS)
    assert [(e["event_type"], e["actor"]) for e in events] == [("FILED", "alice"), ("ESCALATED", "gpuledger-appeals")]
