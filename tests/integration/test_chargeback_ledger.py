"""Worked ledger: jobs across two generations, preemptible and not, cloud burst (on-demand and
spot), a rate change mid-month, a job crossing the month boundary and a project correction.

Charges are asserted exactly to the cent, from the CLI report and from the analyst SQL views,
and re-writing the whole ledger (a replay) changes nothing. Runs against the embedded ClickHouse
server through clickhouse-connect, like production.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from fixtures_web import cli_env, run_cli

from base.settings import ClickHouseSettings
from schemas import topics
from sinks import chargeback as cb
from sinks.db import connect, load_migrations, migrate
from sinks.ratecard import RATE_CARD_COLUMNS, allocate_cents, charge_for_seconds, load_card, rate_card_rows
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
UTC = dt.UTC


def ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


JOBS = {
    # job: user, team, project, cost centre, generation, tier, preemptible
    "j1": ("alice", "vision", "p-vision", "CC-100", "hopper", "on-prem", False),
    "j2": ("bob", "nlp", "p-nlp", "CC-200", "hopper", "on-prem", True),
    "j3": ("carol", "nlp", "p-wrong", "CC-200", "ampere", "on-prem", False),
    "j4": ("alice", "vision", "p-vision", "CC-100", "hopper", "cloud-on-demand", False),
    "j5": ("dave", "vision", "p-burst", "CC-100", "hopper", "cloud-spot", True),
    "j6": ("erin", "vision", "p-vision", "CC-100", "hopper", "on-prem", False),
}


def device_minute(job: str | None, node: str, uuid: str, minute: int, cls: str, *, allocated: int = 60,
                  generation: str = "hopper") -> dict[str, Any]:  # fmt: skip
    user, team, project, cc, gen, tier, pre = (
        JOBS[job] if job else (None, None, None, None, generation, "on-prem", False)
    )
    counts = dict.fromkeys(("active_s", "starved_s", "idle_s", "dark_s"), 0)
    if job:
        counts[f"{cls}_s"] = allocated
    sampled = 0 if cls == "dark" else allocated
    return {
        "cluster": "c1", "node": node, "device_uuid": uuid, "mig_instance_id": None, "minute_start_ms": minute,
        "model": "H100" if gen == "hopper" else "A100", "generation": gen, "job_id": job, "user": user,
        "project": project, "team": team, "cost_centre": cc, "preemptible": pre, "pricing_tier": tier,
        "unallocated_s": 60 - allocated if job else 60, "allocated_s": allocated if job else 0,
        **counts, "sm_weighted_s": 0.0 if not job else 0.7 * sampled if cls == "active" else 0.1 * sampled,
        "sample_count": sampled if job else 60, "activity_mean_ratio": None, "activity_max_ratio": None,
        "fb_used_mib_max": None, "power_w_mean": None, "mapping_version": "dcgm-3.3/m1", "classifier_version": "c1",
    }  # fmt: skip


def minutes(job: str, node: str, uuid: str, start: str, pattern: list[tuple[str, int]]) -> list[dict[str, Any]]:
    out, t = [], ms(start)
    for cls, count in pattern:
        for _ in range(count):
            out.append(device_minute(job, node, uuid, t, cls))
            t += 60_000
    return out


def worked_ledger() -> list[dict[str, Any]]:
    rows = []
    rows += minutes("j1", "n1", "GPU-a", "2026-11-10T10:00", [("active", 90)])
    rows += minutes("j1", "n1", "GPU-b", "2026-11-10T10:00", [("active", 60), ("idle", 20), ("dark", 10)])
    rows += minutes("j2", "n2", "GPU-c", "2026-11-15T23:30", [("active", 60)])  # crosses the rate change
    j3 = minutes("j3", "n3", "GPU-d", "2026-11-20T08:00", [("starved", 45)])
    j3[0] = device_minute("j3", "n3", "GPU-d", j3[0]["minute_start_ms"], "starved", allocated=30)  # started mid-minute
    rows += j3
    for uuid in ("GPU-e", "GPU-f", "GPU-g", "GPU-h"):
        rows += minutes("j4", "cn1", uuid, "2026-11-21T12:00", [("active", 30)])
    rows += minutes("j5", "cn2", "GPU-i", "2026-11-22T00:00", [("active", 70), ("dark", 50)])
    rows += minutes("j6", "n1", "GPU-a", "2026-10-31T23:50", [("active", 20)])  # half in October
    rows.append(device_minute(None, "n1", "GPU-z", ms("2026-11-10T10:00"), "idle"))  # unallocated telemetry
    return rows


CORRECTIONS = [
    {"correction_id": "corr-1", "ts_ms": ms("2026-11-25T09:00"), "cluster": "c1", "job_id": "j3",
     "old_project": "p-wrong", "new_project": "p-x", "reason": "typo", "corrected_by": "carol"},
    {"correction_id": "corr-2", "ts_ms": ms("2026-11-26T09:00"), "cluster": "c1", "job_id": "j3",
     "old_project": "p-x", "new_project": "p-nlp", "reason": "belongs to the NLP grant", "corrected_by": "nlp-lead"},
]  # fmt: skip

# Expected, by hand (rates from sinks/ratecard.toml, micro-dollars per GPU-hour):
#   hopper on-prem 1.631018 (1.667768 from 2026-11-16), preemptible 0.978611 (1.000661 from 11-16),
#   ampere on-prem 0.752878, hopper cloud on-demand 6.98, spot 2.45.
# j1 2 GPU x 90 min = 3 GPU-h x 1.631018 = 4.893054 (idle 20 min: 0.543673)
# j2 30 min x 0.978611 + 30 min x 1.000661 = 0.989636
# j3 (30 s + 44 min) = 2670 s x 0.752878 / 3600 = 0.558384, corrected to p-nlp (latest correction)
# j4 4 GPU x 30 min = 2 GPU-h x 6.98 = 13.96;  j5 2 GPU-h x 2.45 = 4.90 (50 min dark)
# j6 10 min in November x 1.631018 = 0.271836 (the 10 October minutes are October's)
EXPECTED = {
    "team": {"nlp": "1.55", "vision": "24.02"},
    "project": {"p-burst": "4.90", "p-nlp": "1.55", "p-vision": "19.12"},
    "user": {"alice": "18.85", "bob": "0.99", "carol": "0.56", "dave": "4.90", "erin": "0.27"},
    "cost-centre": {"CC-100": "24.02", "CC-200": "1.55"},
}
EXPECTED_TOTAL = "25.57"


@pytest.fixture
def ledger_settings(clickhouse_server: Any, clickhouse_database: str) -> ClickHouseSettings:
    ch = ClickHouseSettings(
        url=clickhouse_server.url,
        database=clickhouse_database,
        password=clickhouse_server.password,
        analyst_password=clickhouse_server.analyst_password,
    )
    client = connect(ch)
    migrate(client, ch)
    client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
    client.close()
    return ch


def write_ledger(ch: ClickHouseSettings) -> Any:
    client = connect(ch)
    writer = LedgerWriter(client)
    (dm_spec,) = SINKS[topics.DEVICE_MINUTES.name]
    (corr_spec,) = SINKS[topics.CORRECTIONS.name]
    pending = [
        Pending(dm_spec, row, Origin("t", 0, i)) for i, r in enumerate(worked_ledger()) for row in dm_spec.rows(r)
    ]
    pending += [
        Pending(corr_spec, row, Origin("c", 0, i)) for i, r in enumerate(CORRECTIONS) for row in corr_spec.rows(r)
    ]
    result = writer.write(pending)
    assert not result.rejected
    return result



def test_worked_ledger_exact_to_the_cent_in_cli_and_views(ledger_settings: ClickHouseSettings, tmp_path: Path) -> None:
    ch = ledger_settings
    first = write_ledger(ch)
    assert first.inserted["device_minutes"] == len(worked_ledger())
    analyst = connect(ch, analyst=True)

    for by, expected in EXPECTED.items():
        out = run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", by, "--format", "json")
        lines = {row["line"]: row for row in json.loads(out)}
        assert {k: v["charge"] for k, v in lines.items() if k != "TOTAL"} == expected
        assert lines["TOTAL"]["charge"] == EXPECTED_TOTAL
        # The same numbers straight from the analyst view.
        view = analyst.query(
            "SELECT line, charge FROM v_chargeback WHERE period = {p:String} AND by = {b:String}",
            parameters={"p": "2026-11", "b": by},
        ).result_rows
        assert {line: str(charge) for line, charge in view} == expected

    vision = json.loads(run_cli(ch, "report", "chargeback", "--period", "2026-11", "--format", "json"))[1]
    assert vision["line"] == "vision"
    assert vision["allocated_gpu_h"] == "7.1667"  # 3 + 2 + 2 + 1/6
    assert vision["idle_gpu_h"] == "0.3333" and vision["idle_cost"] == "0.54"
    assert vision["dark_gpu_h"] == "1.0000"  # j1 10 min + j5 50 min
    assert vision["coverage_pct"] == 86.0  # (25800 - 3600) / 25800
    assert vision["consumed_gpu_h"] == "5.8333" and vision["utilisation_pct"] == 81.4  # 21000 / 25800
    assert vision["jobs"] == 4

    # Independent recomputation from the per-day priced rows with the pure rate card.
    card = load_card()
    priced = analyst.query(
        "SELECT job_id, day, generation, pricing_tier, preemptible, allocated_s, rate_micro FROM v_usage_priced "
        "WHERE period = '2026-11'"
    ).result_rows
    for job_id, day, gen, tier, pre, _alloc, micro in priced:
        rate = card.rate_for(gen, tier, bool(pre), day)
        assert rate is not None and rate.micro_per_gpu_hour == micro, (job_id, day)
    vision_pairs = [(int(a), int(m)) for j, _d, _g, _t, _p, a, m in priced if JOBS[j][1] == "vision"]
    assert charge_for_seconds(vision_pairs) == Decimal("24.02")
    # The cent allocation, recomputed in Python from the exact numerators, matches the view per user.
    numerators: dict[str, int] = {}
    for j, _d, _g, _t, _p, a, m in priced:
        numerators[JOBS[j][0]] = numerators.get(JOBS[j][0], 0) + int(a) * int(m)
    assert {k: str(v) for k, v in allocate_cents(numerators).items()} == EXPECTED["user"]

    # October holds j6's first ten minutes only.
    october = cb.chargeback(analyst, "2026-10", "project")
    assert [(line.line, str(line.charge)) for line in october.lines] == [("p-vision", "0.27")]

    # Replay the whole ledger: nothing is charged twice.
    again = write_ledger(ch)
    assert again.skipped_duplicates == len(worked_ledger())
    assert str(cb.chargeback(analyst, "2026-11", "team").total.charge) == EXPECTED_TOTAL

    # Explain: the jobs behind p-nlp, with the correction visible and history untouched.
    explained = json.loads(run_cli(ch, "report", "explain", "--project", "p-nlp", "--period", "2026-11",
                                   "--format", "json"))  # fmt: skip
    by_job: dict[str, list[dict[str, Any]]] = {}
    for row in explained:
        by_job.setdefault(row["job_id"], []).append(row)
    assert set(by_job) == {"j2", "j3"}
    assert by_job["j3"][0]["original_project"] == "p-wrong" and by_job["j3"][0]["correction_id"] == "corr-2"
    assert by_job["j3"][0]["charge"] == "0.56"
    stored = analyst.query("SELECT DISTINCT project FROM device_minutes WHERE job_id = 'j3'").result_rows
    assert stored == [("p-wrong",)]  # corrections never rewrite history

    # Finance journal: one debit per cost centre, and the contra (an open month: provisional) balancing them.
    journal_csv = tmp_path / "journal.csv"
    run_cli(ch, "report", "journal", "--period", "2026-11", "--output", str(journal_csv))
    journal = list(csv.DictReader(io.StringIO(journal_csv.read_text())))
    assert [(r["line_kind"], r["cost_centre"], r["debit"], r["credit"], r["status"]) for r in journal] == [
        ("usage", "CC-100", "24.02", "0.00", "provisional"), ("usage", "CC-200", "1.55", "0.00", "provisional"),
        ("contra", "CLUSTER-sim", "0.00", "25.57", "provisional")]  # fmt: skip
    journal_view = analyst.query("SELECT cost_centre, charge FROM v_finance_journal WHERE period = '2026-11' "
                                 "ORDER BY cost_centre").result_rows  # fmt: skip
    assert [(c, str(v)) for c, v in journal_view] == [("CC-100", "24.02"), ("CC-200", "1.55")]

    # CSV and parquet carry the same exact figures.
    rows = list(csv.DictReader(io.StringIO(run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by",
                                                   "cost-centre", "--format", "csv"))))  # fmt: skip
    assert [(r["line"], r["charge"]) for r in rows] == [("CC-100", "24.02"), ("CC-200", "1.55"), ("TOTAL", "25.57")]
    parquet = tmp_path / "cb.parquet"
    run_cli(
        ch, "report", "chargeback", "--period", "2026-11", "--by", "user", "--format", "parquet", "-o", str(parquet)
    )
    table = pq.read_table(parquet).to_pylist()
    assert table[-1]["line"] == "TOTAL" and table[-1]["charge"] == Decimal("25.57")
    table_out = run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", "team")
    assert "vision" in table_out and "24.02" in table_out and "25.57" in table_out
    analyst.close()


def test_analyst_user_is_read_only(ledger_settings: ClickHouseSettings) -> None:
    analyst = connect(ledger_settings, analyst=True)
    assert analyst.query("SELECT count() FROM v_chargeback").result_rows[0][0] == 0
    with pytest.raises(Exception, match=r"(?i)readonly|read-only|not enough privileges"):
        analyst.command("INSERT INTO rate_card (generation) VALUES ('x')")
    analyst.close()


def test_migrations_are_recorded_and_idempotent(ledger_settings: ClickHouseSettings) -> None:
    client = connect(ledger_settings)
    again = migrate(client, ledger_settings)
    assert [r.status for r in again if r.name != "analyst_role"] == ["already-applied"] * (len(again) - 1)
    versions = client.query("SELECT version, status FROM schema_migrations FINAL ORDER BY version").result_rows
    assert [v for v, _ in versions] == [m.version for m in load_migrations()]
    ttl = client.command("SELECT engine_full FROM system.tables WHERE database = currentDatabase() "
                         "AND name = 'raw_samples'")  # fmt: skip
    assert "toIntervalDay(14)" in str(ttl)
    client.close()


def test_bad_report_arguments_fail_in_one_line(ledger_settings: ClickHouseSettings) -> None:
    env = {**cli_env(ledger_settings), "PATH": "/usr/bin:/bin"}
    for args, needle in (
        (["--period", "2026-13"], "--period must be a month"),
        (["--period", "2026-11", "--by", "galaxy"], "--by must be one of"),
        (["--period", "2026-11", "--format", "xml"], "--format must be one of"),
    ):
        proc = subprocess.run(
            [sys.executable, "-c", "from gpuledger.cli import main; main()", "report", "chargeback", *args],
            capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
