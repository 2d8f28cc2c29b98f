"""`v_finance_journal_balanced` (migration 021) against `report journal`, line for line, on the embedded ClickHouse.

The simulated ledger of March 2026 (sinks written by the processors' own stages), then everything a journal
has to get right, each month compared with the CLI's CSV row by row (ids, cost centres, amounts, causes,
descriptions, order) and summed to zero:

    2026-03 open        usage per cost centre, cents allocated as the statements allocate them
    2026-03 closed      with two credits and a reservation charge routed onto the close: one credit naming
                        a job (its cost centre), one a team alone (the team's only cost centre), the
                        reservation a team with no usage (UNASSIGNED)
    late data, a correction and a rate-card reload that touch closed March; April's own jobs, one charged to a
    cost centre whose name needs JSON escaping (quote, backslash, non-ASCII, past the BMP), one to none
    2026-04 open        usage + March's adjustments (correction, late-data, rate-card)
    2026-04 closed      the same frozen; March unchanged
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fixtures_web import PERIOD, SMALL, run_cli, simulated_database

from base.settings import ClickHouseSettings
from producers.corrections import correction_record
from sinks.db import connect
from sinks.ratecard import CENT_UNITS, RATE_CARD_COLUMNS, load_card, rate_card_rows
from sinks.rows import SINKS
from sinks.statement_store import StatementStore, close_period
from sinks.statements import Charge
from sinks.writer import LedgerWriter, Origin, Pending

pytestmark = pytest.mark.integration
NEXT = "2026-04"
CONTRA = "CLUSTER-sim"
ODD_CC = 'CC-Zürich "R&D" \\ 🚀'
COMPARED = ("period", "status", "line_id", "line_kind", "cost_centre", "account", "debit", "credit", "amount",
            "source_period", "cause_kind", "cause_ref", "description", "allocated_gpu_h", "jobs")  # fmt: skip
DECIMALS = ("debit", "credit", "amount", "allocated_gpu_h")


@pytest.fixture
def ledger(clickhouse_server: Any) -> Iterator[tuple[ClickHouseSettings, Any]]:
    with simulated_database(clickhouse_server, "fjv_", SMALL) as found:
        yield found


def ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp() * 1000)


def minutes(job: str, team: str, cc: str, start: str, count: int, device: str) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        out.append({
            "cluster": "sim", "node": "late-node", "device_uuid": device, "mig_instance_id": None,
            "minute_start_ms": ms(start) + i * 60_000, "model": "H100", "generation": "hopper", "job_id": job,
            "user": "u-" + job, "project": "p-" + job, "team": team, "cost_centre": cc, "preemptible": False,
            "pricing_tier": "on-prem", "unallocated_s": 0, "allocated_s": 60, "active_s": 60, "starved_s": 0,
            "idle_s": 0, "dark_s": 0, "sm_weighted_s": 30.0, "sample_count": 60, "activity_mean_ratio": None,
            "activity_max_ratio": None, "fb_used_mib_max": None, "power_w_mean": None, "mapping_version": "m1",
            "classifier_version": "c1",
        })  # fmt: skip
    return out


def write(client: Any, topic: str, records: list[dict[str, Any]]) -> None:
    (spec,) = SINKS[topic]
    pending = [Pending(spec, row, Origin(topic, 0, i)) for i, r in enumerate(records) for row in spec.rows(r)]
    result = LedgerWriter(client).write(pending)
    assert not result.rejected, result.rejected[:3]


def cli_journal(ch: ClickHouseSettings, period: str) -> list[dict[str, str]]:
    out = run_cli(ch, "report", "journal", "--period", period, "--contra-cost-centre", CONTRA)
    return list(csv.DictReader(io.StringIO(out)))


def view_journal(ch: ClickHouseSettings, period: str) -> list[dict[str, Any]]:
    analyst = connect(ch, analyst=True)
    try:
        result = analyst.query(
            "SELECT * FROM v_finance_journal_balanced(period = {p:String}, account = 'GPU-CHARGEBACK', "
            "contra_account = 'GPU-CHARGEBACK', contra_cost_centre = {c:String}) ORDER BY line_no",
            parameters={"p": period, "c": CONTRA},
        )
        return [dict(zip(result.column_names, row, strict=True)) for row in result.result_rows]
    finally:
        analyst.close()


def assert_view_is_the_journal(ch: ClickHouseSettings, period: str, status: str) -> list[dict[str, Any]]:
    expected = cli_journal(ch, period)
    got = view_journal(ch, period)
    assert expected and {r["status"] for r in expected} == {status}
    assert [r["line_no"] for r in got] == list(range(1, len(got) + 1))
    for want, row in zip(expected, got, strict=True):
        for col in COMPARED:
            value = Decimal(want[col]) if col in DECIMALS else int(want[col]) if col == "jobs" else want[col]
            assert row[col] == value, (period, col, want, row)
        # A statement's id hashes its content, known once it is frozen: the view names them on a closed month.
        assert row["statement_ids"] == (want["statement_ids"] if status == "closed" else "")
    assert len(got) == len(expected)
    assert sum(r["amount"] for r in got) == 0 and sum(r["debit"] - r["credit"] for r in got) == 0
    assert [r["line_kind"] for r in got].count("contra") == 1 and got[-1]["line_kind"] == "contra"
    return got


def test_the_journal_view_balances_and_agrees_with_report_journal(ledger: tuple[ClickHouseSettings, Any]) -> None:
    ch, client = ledger
    store = StatementStore(client)
    charged: dict[str, Any] = {}
    for seg in store.segments(PERIOD):
        charged.setdefault(seg.job_id, seg)
    credited, corrected, late = sorted(charged.values(), key=lambda s: (-s.allocated_s, s.job_id))[:3]

    march_open = assert_view_is_the_journal(ch, PERIOD, "provisional")
    assert len({r["cost_centre"] for r in march_open if r["line_kind"] == "usage"}) > 1

    # Close March with credits and a reservation charge on it (what the appeals and reservations would route).
    team_ccs: dict[str, set[str]] = {}
    for seg in store.segments(PERIOD):
        team_ccs.setdefault(seg.team, set()).add(seg.cost_centre)
    single = sorted(t for t, ccs in team_ccs.items() if len(ccs) == 1 and t != credited.team)[0]
    charges = [
        Charge("credit", "apl-job", credited.team, PERIOD, cents=-1234, cluster="sim", job_id=credited.job_id),
        Charge("credit", "apl-team", single, PERIOD, cents=-250),
        Charge("reservation", "rsv-ghost", "ghost-team", PERIOD, charge_num=3600 * 2_000_000, allocated_s=3600),
    ]
    close_period(store, PERIOD, "fin", ms("2026-04-02T00:00"), charges)
    march = assert_view_is_the_journal(ch, PERIOD, "closed")
    by_ref = {r["cause_ref"]: r for r in march}
    usage_ccs = {r["cost_centre"] for r in march if r["line_kind"] == "usage"}
    assert by_ref["apl-job"]["credit"] == Decimal("12.34") and by_ref["apl-job"]["cost_centre"] in usage_ccs
    assert by_ref["apl-team"]["cost_centre"] == next(iter(team_ccs[single]))
    assert by_ref["rsv-ghost"]["cost_centre"] == "UNASSIGNED" and by_ref["rsv-ghost"]["debit"] == Decimal("2.00")

    # After the close: late data and a correction for March, a new rate card, and April's own jobs.
    target = "infra-bench" if corrected.project != "infra-bench" else "asr"
    fix = correction_record("sim", corrected.job_id, target, "relabel", "tester", corrected.project,
                            ms("2026-04-05T00:00"))  # fmt: skip
    write(client, "attribution.corrections.v1", [fix])
    rows = rate_card_rows(load_card(), 2)
    for row in rows:
        row[RATE_CARD_COLUMNS.index("rate_micro_per_gpu_hour")] += 250_000
        row[RATE_CARD_COLUMNS.index("card_version")] = "card-later"
    client.insert("rate_card", rows, column_names=RATE_CARD_COLUMNS)
    # April's jobs are sized so that rounding each line on its own would be wrong: labs' three lines are each
    # 0.35-0.45 of a cent over a whole cent (the team's leftover cent goes to one of them); labs2's two are the
    # same size (a tie, broken by the line's id).
    rate = int(client.query("SELECT argMax(rate_micro_per_gpu_hour, effective_from) FROM v_rate_card WHERE "
                            "generation = 'hopper' AND pricing_tier = 'on-prem' AND NOT preemptible AND "
                            "effective_from <= '2026-04-03'").result_rows[0][0])  # fmt: skip
    over = [m for m in range(1, 400) if 0.35 <= (60 * m * rate) % CENT_UNITS / CENT_UNITS < 0.45]
    x1, x2, x3, y = over[:4]
    write(client, "usage.device-minutes.v1", [
        *minutes(late.job_id, late.team, "CC-late", "2026-03-20T10:00", 7, "GPU-late"),
        *minutes("x1", "labs", ODD_CC, "2026-04-03T09:00", x1, "GPU-x1"),
        *minutes("x2", "labs", "", "2026-04-03T09:00", x2, "GPU-x2"),
        *minutes("x3", "labs", "CC-x3", "2026-04-03T09:00", x3, "GPU-x3"),
        *minutes("y1", "labs2", "CC-y1", "2026-04-04T09:00", y, "GPU-y1"),
        *minutes("y2", "labs2", "CC-y2", "2026-04-04T09:00", y, "GPU-y2"),
    ])  # fmt: skip

    april = assert_view_is_the_journal(ch, NEXT, "provisional")
    causes = {r["cause_kind"] for r in april if r["line_kind"] == "adjustment"}
    assert causes == {"correction", "late-data", "rate-card"}, april
    usage = {r["cost_centre"]: int(r["amount"] * 100) for r in april if r["line_kind"] == "usage"}
    floors = {cc: 60 * m * rate // CENT_UNITS for cc, m in ((ODD_CC, x1), ("UNASSIGNED", x2), ("CC-x3", x3),
                                                            ("CC-y1", y), ("CC-y2", y))}  # fmt: skip
    assert sum(usage[cc] - floors[cc] for cc in (ODD_CC, "UNASSIGNED", "CC-x3")) == 1
    assert sorted(usage[cc] - floors[cc] for cc in ("CC-y1", "CC-y2")) == [0, 1]
    assert assert_view_is_the_journal(ch, PERIOD, "closed") == march

    run_cli(ch, "period", "close", NEXT, "--by", "fin")
    closed_april = assert_view_is_the_journal(ch, NEXT, "closed")
    # Provisional and closed ids are the same ids: a finance system upserting by line_id replaces the amounts.
    assert [r["line_id"] for r in closed_april] == [r["line_id"] for r in april]
    assert assert_view_is_the_journal(ch, PERIOD, "closed") == march
    assert view_journal(ch, "2026-05") == []
