"""The attribution baseline is a recorded fact (issue 38 item 4), on the real broker and the real ClickHouse engine.

The policy is applied through the function `policy apply` calls once its engine step has succeeded
(`producers.baseline_cli.record_baseline`; the engine step is independent of it and is covered by the live Slurm
and Kueue tests), with the clock injected: a strict policy sets the day it is first applied; the same policy
applied again writes nothing; a later policy stating its own date moves it, and that latest event is in force.
The real sink stores the events; `report chargeback` for a month before, a month partly before and a month after
the baseline, a team's statement and the team page all show the baseline and the mark, with the share of the
GPU-hours before it charged to defaults, checked against SQL written here over the stored rows.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from fixtures_web import SMALL, make_client, run_cli, simulated_database

from base.settings import BrokerSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.baseline_cli import record_baseline
from schemas.governance_baseline import day_start_ms
from schemas.policy import parse_policy
from schemas.topics import ATTRIBUTION_BASELINE
from sinks.consumer import LedgerSink
from sinks.db import connect
from sinks.writer import LedgerWriter
from streams.eventlog import read_events

pytestmark = pytest.mark.integration
EXAMPLE = (Path(__file__).resolve().parents[2] / "deploy" / "policy.example.yaml").read_text(encoding="utf-8")
STRICT = parse_policy(EXAMPLE + "attribution: {mode: strict}\n")
DATED = parse_policy(EXAMPLE + "attribution: {mode: strict, baseline: 2026-03-03}\n")
APR_10_NOON = day_start_ms(dt.date(2026, 4, 10)) + 12 * 3600 * 1000
DAY_MS = 86_400_000


@pytest.fixture
def env(kafka_bootstrap: str, clickhouse_server: Any, tmp_path: Path) -> Iterator[Settings]:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [prefix + ATTRIBUTION_BASELINE.name + suffix for suffix in ("", ".dlq")]
    for fut in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        fut.result(timeout=30)
    with simulated_database(clickhouse_server, "bl_", SMALL) as (ch, _):
        yield Settings(
            state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
            kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
            sinks=SinksSettings(group_id=f"sink-{uuid.uuid4().hex[:6]}", batch_max_records=100, batch_max_wait_s=0.3),
            web=WebSettings(demo=False),
        )  # fmt: skip


def sink(s: Settings) -> None:
    client = connect(s.clickhouse)
    try:
        LedgerSink(s.kafka, s.sinks, LedgerWriter(client), topics=[ATTRIBUTION_BASELINE.name]).run(
            lambda: False, max_idle_s=3.0
        )
    finally:
        client.close()


def defaulted_share(client: Any, until: str, team: str | None = None) -> tuple[Decimal, float]:
    """Allocated GPU-hours of March before `until` and the share of jobs whose latest event named no project
    (DEFAULT or MISSING, or no event at all), by SQL written here over the stored device-minutes."""
    rows = client.query(
        "SELECT sum(a), sumIf(a, src IN ('DEFAULT', 'MISSING', '')) FROM ("
        " SELECT m.cluster, m.job_id, sum(m.allocated_s) AS a, any(e.src) AS src FROM device_minutes AS m FINAL"
        " LEFT JOIN (SELECT cluster, job_id, argMax(project_source, ts_ms) AS src FROM job_events FINAL"
        "            GROUP BY cluster, job_id) AS e ON m.cluster = e.cluster AND m.job_id = e.job_id"
        " WHERE m.job_id != '' AND m.minute_start_ms >= {lo:Int64} AND m.minute_start_ms < {hi:Int64}"
        "   AND ({team:String} = '' OR m.team = {team:String})"
        " GROUP BY m.cluster, m.job_id)",
        parameters={"lo": day_start_ms(dt.date(2026, 3, 1)), "hi": day_start_ms(dt.date.fromisoformat(until)),
                    "team": team or ""},
    ).result_rows  # fmt: skip
    total, defaulted = (int(v or 0) for v in rows[0])
    return (Decimal(total) / 3600).quantize(Decimal("0.001")), round(100 * defaulted / total, 1)


def report(s: Settings, period: str, *args: str) -> str:
    return " ".join(run_cli(s.clickhouse, "report", "chargeback", "--period", period, *args).split())


def test_the_baseline_is_recorded_once_moved_by_a_later_policy_and_shown_on_every_report(env: Settings) -> None:
    s = env
    # No baseline yet: every report says so.
    assert "attribution baseline: none recorded" in report(s, "2026-03")

    first = record_baseline(s, STRICT, engine="slurm", now_ms=APR_10_NOON, actor="ops1")
    assert first.written is not None and first.after is not None and first.after.day == dt.date(2026, 4, 10)
    again = record_baseline(s, STRICT, engine="slurm", now_ms=APR_10_NOON + DAY_MS, actor="ops1")
    assert again.written is None and again.after == first.after  # the same policy again: nothing written
    moved = record_baseline(s, DATED, engine="kueue", now_ms=APR_10_NOON + 2 * DAY_MS, actor="ops2")
    assert moved.written is not None and moved.before == first.after
    assert moved.after is not None and (moved.after.day, moved.after.source) == (dt.date(2026, 3, 3), "POLICY_DATE")
    assert record_baseline(s, DATED, engine="kueue", now_ms=APR_10_NOON + 3 * DAY_MS, actor="ops2").written is None
    events, bad = read_events(s.kafka, ATTRIBUTION_BASELINE)
    assert not bad and [(e["event_type"], e["source"], e["actor"]) for e in events] == [
        ("SET", "STRICT_MODE", "ops1"), ("SET", "POLICY_DATE", "ops2")]  # fmt: skip

    sink(s)
    client = connect(s.clickhouse)
    try:
        # One job of the largest team named no project after all: a later event of it says DEFAULT.
        team = client.query("SELECT team FROM device_minutes FINAL WHERE team != '' AND job_id != '' GROUP BY team "
                            "ORDER BY uniqExact(job_id) DESC, team LIMIT 1").result_rows[0][0]  # fmt: skip
        job = client.query("SELECT job_id FROM device_minutes FINAL WHERE team = {t:String} AND job_id != '' "
                           "GROUP BY job_id ORDER BY sum(allocated_s) DESC LIMIT 1", parameters={"t": team},
                           ).result_rows[0][0]  # fmt: skip
        client.command("INSERT INTO job_events SELECT * REPLACE (concat(event_id, '-d') AS event_id, ts_ms + 1 AS "
                       "ts_ms, 'DEFAULT' AS project_source) FROM job_events FINAL WHERE job_id = {j:String} "
                       "ORDER BY ts_ms DESC LIMIT 1", parameters={"j": job})  # fmt: skip
        stored = client.query("SELECT count() FROM attribution_baseline_events FINAL").result_rows[0][0]
        gpu_h, share = defaulted_share(client, "2026-03-03")
        team_gpu_h, team_share = defaulted_share(client, "2026-03-03", team)
    finally:
        client.close()
    assert stored == 2 and gpu_h > 0 and 0 < share < 100 and 0 < team_share < 100  # real shares, not 0 or all

    recorded = "attribution baseline 2026-03-03 (the policy's date; recorded 2026-04-12 12:00 UTC by ops2)"
    before, partly, after = report(s, "2026-02"), report(s, "2026-03"), report(s, "2026-04")
    assert f"{recorded}: 2026-02 is before the baseline; 0.0% of its 0.000 allocated GPU-h" in before
    assert (f"{recorded}: 2026-03 is partly before the baseline (2026-03-01 to 2026-03-02); {share}% of its "
            f"{gpu_h} allocated GPU-h before the baseline charged to defaults") in partly  # fmt: skip
    assert f"{recorded}: 2026-04 is after the baseline" in after
    rows = json.loads(run_cli(s.clickhouse, "report", "chargeback", "--period", "2026-03", "--format", "json"))
    assert rows and {(r["baseline"], r["baseline_mark"], r["before_baseline_until"],
                      r["before_baseline_defaulted_pct"]) for r in rows} == {
        ("2026-03-03", "partly before the baseline", "2026-03-03", share)}  # fmt: skip

    # A team's statement: its own hours before the baseline.
    lines = json.loads(run_cli(s.clickhouse, "statement", "show", "--period", "2026-03", "--team", team,
                               "--format", "json"))  # fmt: skip
    assert lines and {(r["baseline"], r["baseline_mark"], r["before_baseline_defaulted_pct"],
                       r["before_baseline_gpu_h"]) for r in lines} == {
        ("2026-03-03", "partly before the baseline", team_share, str(team_gpu_h))}  # fmt: skip
    text = " ".join(run_cli(s.clickhouse, "statement", "show", "--period", "2026-03", "--team", team).split())
    assert f"{recorded}: 2026-03 is partly before the baseline (2026-03-01 to 2026-03-02); {team_share}%" in text

    # The team page: the baseline and the mark, for a month partly before it and a month after.
    web = make_client(s)
    page = web.get(f"/teams/{team}?period=2026-03", headers={"X-Forwarded-User": "ops00"})
    assert page.status_code == 200, page.text
    mark = re.search(r'<p class="notice" id="baseline" data-mark="([^"]+)" data-baseline="([^"]+)">(.*?)</p>',
                     page.text, re.S)  # fmt: skip
    assert mark and mark.group(1, 2) == ("partly before the baseline", "2026-03-03"), page.text[:2000]
    assert f'data-raw="{team_share}"' in mark.group(3) and "charged to defaults" in mark.group(3)
    later = web.get(f"/teams/{team}?period=2026-04", headers={"X-Forwarded-User": "ops00"}).text
    assert 'data-mark="after the baseline" data-baseline="2026-03-03"' in later


def test_no_baseline_is_said_on_the_statement_and_the_page(env: Settings) -> None:
    s = env
    text = " ".join(run_cli(s.clickhouse, "statement", "show", "--period", "2026-03").split())
    assert "attribution baseline: none recorded" in text
    page = make_client(s).get("/teams/vision?period=2026-03", headers={"X-Forwarded-User": "ops00"}).text
    assert 'data-mark="no baseline"' in page and "No attribution baseline recorded" in page
