"""Statements that close (issue 19), on the real broker and the embedded ClickHouse, driven by the CLI.

A worked ledger over three months, every figure worked by hand below (rates are plain numbers so the
arithmetic can be checked on paper). Device-minutes and the correction travel through Kafka and the sink;
the rate-card reloads are new `rate_card` loads, as `gpuledger ratecard load` writes them.

    rates    card-1: hopper on-prem 2.00 $/GPU-h, ampere on-prem 1.00 $/GPU-h (from 2026-01-01)
             card-2: hopper 3.00;  card-3: hopper 2.50  (ampere stays 1.00)
    a1  vision/alice/p-v   hopper  60 min on 2026-09-10          3600 s
    b1  nlp/bob/p-wrong    ampere 120 min on 2026-09-12          7200 s  (later corrected to p-nlp)
    a2  vision/alice/p-v   hopper  30 min on 2026-10-05          1800 s  (10 of them dark)

    close 2026-09 (card-1):  vision a1 1 h x 2.00 = 2.00;  nlp b1 2 h x 1.00 = 2.00
    correct b1 -> p-nlp, load card-2; 2026-10 as it closes:
        vision  usage a2 0.5 h x 3.00 = 1.50;  adjustment a1 1 h x (3.00 - 2.00) = +1.00 (rate-card card-2)
        nlp     adjustment b1 p-wrong -2.00 and b1 p-nlp +2.00, both naming the correction
    close 2026-10; load card-3; 3 more minutes of b1 arrive late for 2026-09; 2026-11 as it closes:
        vision  a1: now 2.50 - frozen 2.00 - posted 1.00 = -0.50;  a2: now 1.25 - frozen 1.50 = -0.25
        nlp     b1: 180 s x 1.00 = +0.05 (late-data)
2026-09's statements keep their hash through all of it; `report chargeback --period 2026-09` shows them.
The finance journals of October and November: each adjustment a line with its cause, per cost centre (b1's
correction nets to 0.00 within CC-200), and the contra to the cluster's cost centre (-2.50, then +0.70).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_cli import run_gpuledger

from base.settings import ClickHouseSettings, KafkaSettings, Settings, SinksSettings
from schemas import topics
from schemas.topics import job_key
from sinks import chargeback as cb
from sinks.consumer import LedgerSink
from sinks.db import connect, migrate
from sinks.ratecard import RATE_CARD_COLUMNS
from sinks.writer import LedgerWriter
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SINK_TOPICS = (topics.DEVICE_MINUTES, topics.CORRECTIONS)

JOBS = {  # job: user, team, project, cost centre, generation
    "a1": ("alice", "vision", "p-v", "CC-100", "hopper"),
    "b1": ("bob", "nlp", "p-wrong", "CC-200", "ampere"),
    "a2": ("alice", "vision", "p-v", "CC-100", "hopper"),
}


def ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp() * 1000)


def minute(job: str, uuid_: str, start_ms: int, cls: str) -> dict[str, Any]:
    user, team, project, cc, gen = JOBS[job]
    counts = dict.fromkeys(("active_s", "starved_s", "idle_s", "dark_s"), 0)
    counts[f"{cls}_s"] = 60
    return {
        "cluster": "c1", "node": "n1", "device_uuid": uuid_, "mig_instance_id": None, "minute_start_ms": start_ms,
        "model": "H100" if gen == "hopper" else "A100", "generation": gen, "job_id": job, "user": user,
        "project": project, "team": team, "cost_centre": cc, "preemptible": False, "pricing_tier": "on-prem",
        "unallocated_s": 0, "allocated_s": 60, **counts, "sm_weighted_s": 30.0 if cls == "active" else 0.0,
        "sample_count": 0 if cls == "dark" else 60, "activity_mean_ratio": None, "activity_max_ratio": None,
        "fb_used_mib_max": None, "power_w_mean": None, "mapping_version": "m1", "classifier_version": "c1",
    }  # fmt: skip


def run(job: str, uuid_: str, start: str, pattern: list[tuple[str, int]]) -> list[dict[str, Any]]:
    out, t = [], ms(start)
    for cls, count in pattern:
        for _ in range(count):
            out.append(minute(job, uuid_, t, cls))
            t += 60_000
    return out


LEDGER = [
    *run("a1", "GPU-a", "2026-09-10T10:00", [("active", 60)]),
    *run("b1", "GPU-d", "2026-09-12T08:00", [("active", 60), ("idle", 60)]),
    *run("a2", "GPU-a", "2026-10-05T09:00", [("active", 20), ("dark", 10)]),
]
LATE = run("b1", "GPU-d", "2026-09-12T10:00", [("idle", 3)])


def card(version: str, hopper_micro: int, loaded_ms: int) -> list[list[Any]]:
    return [
        ["hopper", "on-prem", False, dt.date(2026, 1, 1), hopper_micro, "test", version, loaded_ms],
        ["ampere", "on-prem", False, dt.date(2026, 1, 1), 1_000_000, "test", version, loaded_ms],
    ]


def ledger_settings(kafka_bootstrap: str, server: Any, database: str, catalogue: tuple[Any, ...]) -> Settings:
    """A fresh topic prefix with `catalogue`'s topics and their dead letters, the database migrated with the first
    rate card (hopper 2.00 per GPU-hour), and the settings that reach both (test_appeals_credit.py and
    test_reservations_live.py start from it too)."""
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + t.name + suffix for t in catalogue for suffix in ("", ".dlq")]
    for fut in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        fut.result(timeout=30)
    ch = ClickHouseSettings(url=server.url, database=database, password=server.password,
                            analyst_password=server.analyst_password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    client.insert("rate_card", card("card-1", 2_000_000, 1), column_names=RATE_CARD_COLUMNS)
    client.close()
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
        clickhouse=ch,
        sinks=SinksSettings(group_id=f"sink-{uuid.uuid4().hex[:6]}", batch_max_records=500, batch_max_wait_s=0.3),
    )


def run_cli(environ: dict[str, str], *args: str, code: int = 0) -> str:
    """`gpuledger ARGS` under `environ`: its stdout, or with a non-zero `code` its one line of stderr."""
    done = run_gpuledger(list(args), environ)
    assert done.returncode == code, done.stdout + done.stderr
    if code:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line
        return done.stderr
    return done.stdout


@pytest.fixture
def governed(kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str) -> Settings:
    return ledger_settings(kafka_bootstrap, clickhouse_server, clickhouse_database, SINK_TOPICS)


def env(s: Settings) -> dict[str, str]:
    ch = s.clickhouse
    return {
        "GPULEDGER_CONFIG": str(REPO / "tests" / "no-such-gpuledger.toml"),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers,
        "GPULEDGER_KAFKA__TOPIC_PREFIX": s.kafka.topic_prefix,
        "GPULEDGER_CLICKHOUSE__URL": ch.url,
        "GPULEDGER_CLICKHOUSE__DATABASE": ch.database,
        "GPULEDGER_CLICKHOUSE__PASSWORD": ch.password.get_secret_value(),
        "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": ch.analyst_password.get_secret_value(),
        "GPULEDGER_CLUSTER": "c1",
        "PATH": "/usr/bin:/bin",
    }


def cli(s: Settings, *args: str, code: int = 0) -> str:
    done = run_gpuledger(list(args), env(s))
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout if code == 0 else done.stderr


def publish(s: Settings, minutes: list[dict[str, Any]]) -> None:
    pub = RecordPublisher(s.kafka)
    for rec in minutes:
        pub.publish(topics.DEVICE_MINUTES, job_key(rec["cluster"], rec["job_id"]), rec)
    pub.flush()


def sink(s: Settings) -> None:
    client = connect(s.clickhouse)
    try:
        LedgerSink(s.kafka, s.sinks, LedgerWriter(client), topics=[t.name for t in SINK_TOPICS]).run(
            lambda: False, max_idle_s=3.0
        )
    finally:
        client.close()


def reload_card(s: Settings, version: str, hopper_micro: int, loaded_ms: int) -> None:
    client = connect(s.clickhouse)
    client.insert("rate_card", card(version, hopper_micro, loaded_ms), column_names=RATE_CARD_COLUMNS)
    client.close()


def statement(s: Settings, period: str) -> list[dict[str, Any]]:
    return json.loads(cli(s, "statement", "show", "--period", period, "--format", "json"))


def lines_of(rows: list[dict[str, Any]]) -> set[tuple[str, ...]]:
    return {(r["team"], r["kind"], r["source_period"], r["job_id"], r["project"], r["charge"], r["cause_kind"],
             r["cause_ref"]) for r in rows}  # fmt: skip


def hashes(s: Settings, period: str) -> dict[str, str]:
    client = connect(s.clickhouse)
    rows = client.query("SELECT team, content_hash FROM v_statements WHERE period = {p:String}",
                        parameters={"p": period}).result_rows  # fmt: skip
    client.close()
    return dict(rows)


def test_a_closed_month_never_changes_later_changes_are_adjustments(governed: Settings) -> None:
    s = governed
    publish(s, LEDGER)
    sink(s)

    # Months close in order, only once ended, and only once.
    assert "close 2026-09 first" in cli(s, "period", "close", "2026-10", "--by", "fin", code=2)
    out = cli(s, "period", "close", "2026-09", "--by", "fin")
    assert "2026-09 closed: 2 statements" in out
    assert "already closed" in cli(s, "period", "close", "2026-09", "--by", "fin", code=2)
    closed = hashes(s, "2026-09")
    assert set(closed) == {"vision", "nlp"}
    frozen = statement(s, "2026-09")
    assert {(r["team"], r["job_id"], r["project"], r["charge"], r["statement"]) for r in frozen} == {
        ("vision", "a1", "p-v", "2.00", "closed"), ("nlp", "b1", "p-wrong", "2.00", "closed")}

    # A correction through the CLI and the broker, then a rate-card reload.
    out = cli(s, "attribution", "correct", "b1", "--project", "p-nlp", "--reason", "NLP grant", "--by", "nlp-lead",
              "--old-project", "p-wrong")  # fmt: skip
    correction_id = out.split()[1]
    sink(s)
    reload_card(s, "card-2", 3_000_000, 2)

    # The live ledger moved; the closed month did not.
    analyst = connect(s.clickhouse, analyst=True)
    live = {line.line: str(line.charge) for line in cb.chargeback(analyst, "2026-09", "project").lines}
    assert live == {"p-v": "3.00", "p-nlp": "2.00"}
    report = json.loads(cli(s, "report", "chargeback", "--period", "2026-09", "--by", "project", "--format", "json"))
    assert {r["line"]: r["charge"] for r in report} == {"p-v": "2.00", "p-wrong": "2.00", "TOTAL": "4.00"}
    table = cli(s, "report", "chargeback", "--period", "2026-09", "--by", "team")
    assert "closed" in table and "adjustments to 2026-09 since it closed" in table and correction_id[:8] in table
    assert hashes(s, "2026-09") == closed

    # 2026-10 as it would close now: its usage, and 2026-09's adjustments with their causes.
    october = {
        ("vision", "usage", "2026-10", "a2", "p-v", "1.50", "", ""),
        ("vision", "adjustment", "2026-09", "a1", "p-v", "1.00", "rate-card", "card-2"),
        ("nlp", "adjustment", "2026-09", "b1", "p-wrong", "-2.00", "correction", correction_id),
        ("nlp", "adjustment", "2026-09", "b1", "p-nlp", "2.00", "correction", correction_id),
    }
    assert lines_of(statement(s, "2026-10")) == october
    out = cli(s, "period", "close", "2026-10", "--by", "fin")
    assert "2026-10/vision/" in out and ": 2.50 over 2 lines" in out and ": 0.00 over 2 lines" in out
    assert lines_of(statement(s, "2026-10")) == october

    # Card-3 and late data for 2026-09: what was posted in 2026-10 is not posted again.
    reload_card(s, "card-3", 2_500_000, 3)
    publish(s, LATE)
    sink(s)
    november = {
        ("vision", "adjustment", "2026-09", "a1", "p-v", "-0.50", "rate-card", "card-3"),
        ("vision", "adjustment", "2026-10", "a2", "p-v", "-0.25", "rate-card", "card-3"),
        ("nlp", "adjustment", "2026-09", "b1", "p-nlp", "0.05", "late-data", ""),
    }
    assert lines_of(statement(s, "2026-11")) == november
    cli(s, "period", "close", "2026-11", "--by", "fin")
    assert lines_of(statement(s, "2026-11")) == november
    assert "has not ended yet" in cli(s, "period", "close", "2099-01", "--by", "fin", code=2)

    # Closed September + every adjustment posted since = September as the ledger has it now, to the cent.
    assert hashes(s, "2026-09") == closed
    posted = analyst.query("SELECT sum(charge) FROM v_statement_lines WHERE source_period = '2026-09'").result_rows
    assert posted[0][0] == Decimal("4.00") + Decimal("1.00") + Decimal("-0.50") + Decimal("0.05")
    assert cb.chargeback(analyst, "2026-09", "team").total.charge == Decimal("4.55")  # 1 h x 2.50 + 2.05 h x 1.00
    analyst.close()
    for period in ("2026-09", "2026-10", "2026-11"):
        verified = cli(s, "statement", "verify", "--period", period)
        assert verified.count(" ok") == len(hashes(s, period)), verified
    periods = json.loads(cli(s, "period", "list", "--format", "json"))
    assert [(p["period"], p["closed_by"], p["total_charge"]) for p in periods] == [
        ("2026-09", "fin", "4.00"), ("2026-10", "fin", "2.50"), ("2026-11", "fin", "-0.70")]

    # The finance journals: each adjustment its own line with its cause (the correction's reversal and new
    # charge, both CC-200, net to one 0.00 line), the contra to the cluster's cost centre balancing each month.
    def journal(period: str) -> list[tuple[str, ...]]:
        rows = list(csv.DictReader(io.StringIO(cli(s, "report", "journal", "--period", period))))
        assert sum(Decimal(r["debit"]) - Decimal(r["credit"]) for r in rows) == 0
        return [(r["line_kind"], r["cost_centre"], r["debit"], r["credit"], r["source_period"], r["cause_kind"],
                 r["cause_ref"]) for r in rows if r["status"] == "closed"]  # fmt: skip

    assert journal("2026-10") == [
        ("usage", "CC-100", "1.50", "0.00", "2026-10", "", ""),
        ("adjustment", "CC-100", "1.00", "0.00", "2026-09", "rate-card", "card-2"),
        ("adjustment", "CC-200", "0.00", "0.00", "2026-09", "correction", correction_id),
        ("contra", "CLUSTER-c1", "0.00", "2.50", "2026-10", "", ""),
    ]
    assert journal("2026-11") == [
        ("adjustment", "CC-100", "0.00", "0.50", "2026-09", "rate-card", "card-3"),
        ("adjustment", "CC-100", "0.00", "0.25", "2026-10", "rate-card", "card-3"),
        ("adjustment", "CC-200", "0.05", "0.00", "2026-09", "late-data", ""),
        ("contra", "CLUSTER-c1", "0.70", "0.00", "2026-11", "", ""),
    ]


def test_a_tampered_statement_fails_verification(governed: Settings) -> None:
    s = governed
    publish(s, LEDGER[:60])
    sink(s)
    cli(s, "period", "close", "2026-09", "--by", "fin")
    assert cli(s, "statement", "verify", "--period", "2026-09").count(" ok") == 1
    client = connect(s.clickhouse)
    client.command("ALTER TABLE statement_lines UPDATE charge = 1.99 WHERE job_id = 'a1' SETTINGS mutations_sync = 1")
    client.close()
    out = run_gpuledger(["statement", "verify", "--period", "2026-09"], env(s))
    assert out.returncode == 1 and "MISMATCH" in out.stdout, out.stdout + out.stderr
