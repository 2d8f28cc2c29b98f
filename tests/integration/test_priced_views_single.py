"""The single-lives views (migration 031) on the embedded ClickHouse: a month with no reused job id and no contested
device-day gives v_usage_priced's rows and v_chargeback_month's lines through `v_usage_priced_single` and
`v_chargeback_month_single`, and `v_month_single_lives` says so; a month with either is read from the full views by
the pages (`Warehouse.priced_views`), whose statements then still equal the hand-worked figures. Each month with a
reused id or a contested day is also shown to differ between the two, so the check is what keeps the pages right.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
import test_chargeback_clusters as overlap
import test_chargeback_job_lives as lives
from test_chargeback_ledger import ledger_settings  # noqa: F401  (fixture)

from base.settings import ClickHouseSettings
from schemas import topics
from sinks import chargeback as cb
from sinks.db import connect
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending
from web.params import Period
from web.queries import FULL_VIEWS, MONTH_LIVES_VIEWS, SINGLE_LIVES_VIEWS, Warehouse

pytestmark = pytest.mark.integration
NOVEMBER = Period(2026, 11)
BYS = ("team", "project", "user", "tier", "cost_centre")


def check(client: Any, period: str = "2026-11") -> tuple[int, int, int]:
    sql = "SELECT reused_rows, contested_days, single FROM v_month_single_lives(period = {p:String})"
    ((reused, contested, single),) = client.query(sql, parameters={"p": period}).result_rows
    return int(reused), int(contested), int(single)


def month_lines(client: Any, view: str, by: str, period: str = "2026-11") -> list[tuple[Any, ...]]:
    return list(client.query(f"SELECT * FROM {view}(period = {{p:String}}, by = {{by:String}}) ORDER BY line",
                             parameters={"p": period, "by": by}).result_rows)  # fmt: skip


MONTH_LIVES_NOVEMBER = "v_usage_priced_month_lives(period = '2026-11')"  # a view of one month: its ids' lives only


def priced_rows(client: Any, view: str) -> list[tuple[Any, ...]]:
    rows = client.query(f"SELECT * FROM {view} WHERE day >= '2026-11-01' AND day < '2026-12-01'").result_rows
    return sorted(rows, key=repr)


def warehouse(ch: ClickHouseSettings) -> Warehouse:
    return Warehouse(connect(ch, analyst=True))


def test_a_month_of_one_life_per_id_and_no_contested_day_reads_the_same_from_the_single_views(
    ledger_settings: ClickHouseSettings,  # noqa: F811
) -> None:
    """The overlap test's claims without the pod that contests GPU-m: every id one life, no device two clusters'."""
    (dm,) = SINKS[topics.DEVICE_MINUTES.name]
    rows = [r for r in overlap.ledger() if r["job_id"] != "nlp/ft-1"]
    pending = [Pending(dm, row, Origin("m", 0, i)) for i, r in enumerate(rows) for row in dm.rows(r)]
    client = connect(ledger_settings)
    try:
        assert not LedgerWriter(client).write(pending).rejected
        assert check(client) == (0, 0, 1)
        full = priced_rows(client, "v_usage_priced")
        assert len(full) >= 4 and full == priced_rows(client, "v_usage_priced_single")
        assert full == priced_rows(client, MONTH_LIVES_NOVEMBER)
        for by in BYS:
            lines = month_lines(client, "v_chargeback_month", by)
            assert lines and lines == month_lines(client, "v_chargeback_month_single", by), by
            assert lines == month_lines(client, "v_chargeback_month_lives", by), by
    finally:
        client.close()
    wh = warehouse(ledger_settings)
    assert wh.priced_views(NOVEMBER) == SINGLE_LIVES_VIEWS
    assert wh.statements(NOVEMBER, views=SINGLE_LIVES_VIEWS) == wh.statements(NOVEMBER)
    # A long history: more than four lives stored per usage row of the month (other months' jobs, here another
    # cluster's). The page then joins only November's ids' lives, and shows the same statements and rows.
    client = connect(ledger_settings)
    try:
        client.command("INSERT INTO job_lives SELECT 'earlier', concat('j-', toString(number)), 0, 1000, 2000, 1 "
                       "FROM numbers(4 * {n:UInt64} + 1)", parameters={"n": len(full)})  # fmt: skip
        assert full == priced_rows(client, MONTH_LIVES_NOVEMBER) == priced_rows(client, "v_usage_priced")
    finally:
        client.close()
    assert wh.priced_views(NOVEMBER) == MONTH_LIVES_VIEWS
    assert wh.statements(NOVEMBER, views=MONTH_LIVES_VIEWS) == wh.statements(NOVEMBER)


def test_a_contested_day_sends_the_month_to_the_full_views(ledger_settings: ClickHouseSettings) -> None:  # noqa: F811
    overlap.write(ledger_settings)
    client = connect(ledger_settings)
    try:
        reused, contested, single = check(client)
        assert (reused, single) == (0, 0) and contested >= 1
        # Without the ceded seconds, nlp would be charged j2's 1,770 s twice: the single view is wrong here.
        assert month_lines(client, "v_chargeback_month_single", "team") != month_lines(client, "v_chargeback_month",
                                                                                        "team")  # fmt: skip
        assert check(client, "2026-10") == (0, 0, 1)  # a month without usage has nothing to get wrong
    finally:
        client.close()
    wh = warehouse(ledger_settings)
    views = wh.priced_views(NOVEMBER)
    assert views == FULL_VIEWS
    statements = wh.statements(NOVEMBER, views=views)
    assert {team: str(s.figures["charge"]) for team, s in statements.items()} == {"nlp": "4.01", "vision": "2.45"}


def test_a_reused_job_id_sends_the_month_to_the_full_views(ledger_settings: ClickHouseSettings) -> None:  # noqa: F811
    lives.write(ledger_settings)
    client = connect(ledger_settings)
    try:
        reused, contested, single = check(client)
        assert reused >= 3 and (contested, single) == (0, 0)
        # The single views hold no row of id 7 (three lives): only id 8's.
        assert {r[3] for r in priced_rows(client, "v_usage_priced_single")} == {"8"}
        assert {r[3] for r in priced_rows(client, "v_usage_priced")} == {"7", "8"}
    finally:
        client.close()
    wh = warehouse(ledger_settings)
    views = wh.priced_views(NOVEMBER)
    assert views == FULL_VIEWS
    report = cb.chargeback(connect(ledger_settings, analyst=True), "2026-11", by="team")
    shown = {team: s.figures for team, s in wh.statements(NOVEMBER, views=views).items()}
    assert shown == {line.line: asdict(line) for line in report.lines} and len(shown) == 2
