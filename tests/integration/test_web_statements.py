"""The team page over issue 19's closed statements: a closed month shows its frozen statement (the figures
`report chargeback` prints for it, its id and hash); a correction after the close changes nothing there, is
listed as a change since the close, and shows in the next open month as the adjustment lines its statement
would carry.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import PERIOD, SMALL, make_client, run_cli, small_ledger

from base.settings import BrokerSettings, ClickHouseSettings, Settings, WebSettings
from producers.corrections import correction_record
from producers.simulator import expected_ledger

pytestmark = pytest.mark.integration
__all__ = ["small_ledger"]
NEXT = "2026-04"
OPS = {"X-Forwarded-User": "ops00"}


def raw_figures(html: str) -> dict[str, str]:
    return dict(re.findall(r'id="fig-([a-z-]+)".*?data-raw="([^"]*)"', html, re.S))


def report(ch: ClickHouseSettings, period: str) -> dict[str, dict[str, str]]:
    out = run_cli(ch, "report", "chargeback", "--period", period, "--by", "team", "--format", "csv")
    return {r["line"]: r for r in csv.DictReader(io.StringIO(out))}


def csv_of(client: Any, url: str) -> list[dict[str, str]]:
    resp = client.get(url, headers=OPS)
    assert resp.status_code == 200, resp.text
    return list(csv.DictReader(io.StringIO(resp.text)))


def test_a_closed_month_shows_its_frozen_statement_and_what_changed_since(
    small_ledger: ClickHouseSettings, tmp_path: Path
) -> None:
    from sinks.db import connect
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending

    ch = small_ledger
    settings = Settings(state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
                        web=WebSettings(demo=False))  # fmt: skip
    client = make_client(settings)
    job = max(expected_ledger(SMALL).values(), key=lambda j: j.allocated_s)
    team = job.team
    open_page = client.get(f"/teams/{team}?period={PERIOD}", headers=OPS).text
    assert 'id="statement-status"' in open_page and "<strong>Open</strong>" in open_page

    closed_out = run_cli(ch, "period", "close", PERIOD, "--by", "finance-tester")
    frozen = report(ch, PERIOD)
    page = client.get(f"/teams/{team}?period={PERIOD}", headers=OPS).text
    assert "<strong>Closed</strong>" in page and "finance-tester" in page
    statement_id = re.search(r'id="statement-id">([^<]+)<', page).group(1)  # type: ignore[union-attr]
    assert statement_id in closed_out
    assert raw_figures(page)["charge"] == frozen[team]["charge"]

    # A correction after the close: moved to another team's project (as `attribution correct` would publish it).
    target = "infra-bench" if job.project != "infra-bench" else "asr"
    record = correction_record("sim", job.job_id, target, "late relabel", "tester", job.project, 1_900_000_000_000)
    (spec,) = SINKS["attribution.corrections.v1"]
    LedgerWriter(connect(ch)).write([Pending(spec, row, Origin("c", 0, 0)) for row in spec.rows(record)])

    after = client.get(f"/teams/{team}?period={PERIOD}", headers=OPS).text
    assert raw_figures(after)["charge"] == report(ch, PERIOD)[team]["charge"] == frozen[team]["charge"]
    projects = csv_of(client, f"/teams/{team}/projects/{job.project}?period={PERIOD}&csv=jobs")
    assert job.job_id in {r["job_id"] for r in projects}  # the frozen lines still charge the old project
    since = csv_of(client, f"/teams/{team}?period={PERIOD}&csv=since_close")
    mine = [r for r in since if r["job_id"] == job.job_id]
    assert mine and {r["cause_kind"] for r in mine} == {"correction"}
    assert {r["cause_ref"] for r in mine} == {record["correction_id"]} and {r["posted_in"] for r in mine} == {"open"}

    # The next open month: its statement would carry the move as two adjustment lines of the job's team (a
    # correction changes the project, never the team): the old project reversed, the new one charged.
    pending = csv_of(client, f"/teams/{team}?period={NEXT}&csv=pending")
    moved = {r["project"]: float(r["charge"]) for r in pending if r["job_id"] == job.job_id}
    assert set(moved) == {job.project, target} and moved[job.project] < 0 and moved[target] == -moved[job.project]
    assert all(r["kind"] == "adjustment" and r["source_period"] == PERIOD for r in pending)
    nxt = client.get(f"/teams/{team}?period={NEXT}", headers=OPS).text
    total = re.search(r'id="statement-total" data-raw="([^"]+)"', nxt).group(1)  # type: ignore[union-attr]
    assert float(total) == pytest.approx(sum(float(r["charge"]) for r in pending))
