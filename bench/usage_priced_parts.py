"""Where a read of `v_usage_priced` spends its time (docs/benchmarks.md, "Where a `v_usage_priced` read's time
goes"): the team's month through the view, and each part of the view alone, as the analyst, warm.

Reuses a month generated and kept by bench/web_page.py (--data-dir); reads only.

    .venv/bin/python bench/web_page.py --gpus 10000 --requests 3 --data-dir /tmp/web10k   # generates it once
    .venv/bin/python bench/usage_priced_parts.py --data-dir /tmp/web10k --runs 5
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import kept_month, machine  # noqa: E402
from web_page import PERIOD, timed  # noqa: E402

MONTH = "day >= toDate(concat({p:String}, '-01')) AND day < addMonths(toDate(concat({p:String}, '-01')), 1)"
TEAM_ROWS = (
    "SELECT day, cluster, job_id, team, toInt64(allocated_s) AS allocated_s, "
    "(toInt64(toUnixTimestamp(toDateTime(day, 'UTC'))) + 86400) * 1000 AS end_ms "
    f"FROM usage_daily WHERE job_id != '' AND {MONTH} AND team = {{team:String}}"
)
LIVES_MERGED = (
    "SELECT cluster, job_id, submit_ms, min(job_start_ms) AS job_start_ms FROM job_lives "
    "GROUP BY cluster, job_id, submit_ms HAVING sum(starts) > 0"
)
# The team's rows joined to LIVES as v_usage_lives' first branch joins them (LATER: its filter of shared days).
ASOF = ("SELECT count(), sum(u.allocated_s), sum(l.job_start_ms) FROM (" + TEAM_ROWS + ") AS u "
        "ASOF LEFT JOIN (LIVES) AS l ON u.cluster = l.cluster AND u.job_id = l.job_id AND u.end_ms > l.job_start_ms")
LATER = " WHERE NOT (l.later AND toDate(fromUnixTimestamp64Milli(l.job_start_ms, 'UTC')) = u.day)"


def joined(lives: str, later: bool = True) -> str:
    return ASOF.replace("LIVES", lives) + (LATER if later else "")
NO_LIVES = (
    "SELECT count(), sum(toInt128(u.allocated_s) * r.rate_micro_per_gpu_hour) FROM (SELECT * FROM usage_daily "
    f"WHERE job_id != '' AND {MONTH} AND team = {{team:String}}) AS u "
    "LEFT JOIN v_project_corrections AS c ON u.cluster = c.cluster AND u.job_id = c.job_id "
    "ASOF LEFT JOIN v_rate_card AS r ON u.generation = r.generation AND u.pricing_tier = r.pricing_tier "
    "AND u.preemptible = r.preemptible AND u.day >= r.effective_from"
)

PARTS = (
    ("`usage_daily`, the team's month, count and sum (no join)",
     f"SELECT count(), sum(allocated_s) FROM usage_daily WHERE {MONTH} AND team = {{team:String}}"),
    ("`v_job_lives` (merge, then a window per id)", "SELECT count() FROM v_job_lives"),
    ("`v_job_days_shared` count (the shared-days guard)", "SELECT count() FROM v_job_days_shared"),
    ("`v_device_days_contested` count", "SELECT count() FROM v_device_days_contested"),
    ("ceded claims count", "SELECT count() FROM v_device_claims_resolved WHERE ceded_s > 0"),
    ("corrections", "SELECT count() FROM v_project_corrections"),
    ("the team's rows ASOF-joined to `v_job_lives`", joined("SELECT * FROM v_job_lives")),
    ("the same join against lives merged without the window", joined(LIVES_MERGED, later=False)),
    ("the same join with the lives restricted to the team's month's ids (`IN`)", joined(
        "SELECT * FROM v_job_lives WHERE (cluster, job_id) IN (SELECT cluster, job_id FROM usage_daily "
        f"WHERE {MONTH} AND team = {{team:String}})")),
    ("`v_usage_lives`, the team's month",
     f"SELECT count(), sum(allocated_s) FROM v_usage_lives WHERE {MONTH} AND team = {{team:String}}"),
    ("`v_usage_priced`, the team's month",
     f"SELECT count(), sum(charge_num) FROM v_usage_priced WHERE {MONTH} AND team = {{team:String}}"),
    ("`v_usage_priced`, every team's month", f"SELECT count(), sum(charge_num) FROM v_usage_priced WHERE {MONTH}"),
    ("`v_chargeback_month(by='team')` (the statement lines)",
     "SELECT * FROM v_chargeback_month(period = {p:String}, by = 'team')"),
    ("`usage_daily` + corrections + the rate card, no lives", NO_LIVES),
    ("the same, + the contested guard", NO_LIVES + " WHERE (SELECT count() FROM v_device_days_contested) >= 0"),
)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a month kept by bench/web_page.py --data-dir")
    ap.add_argument("--runs", type=int, default=5, help="timed warm runs of each read")
    ap.add_argument("--team", default="vision")
    args = ap.parse_args()

    from sinks.db import connect

    with kept_month(args.data_dir) as (ch, kept):
        print(f"machine: {machine()}; {kept['gpus']} GPUs, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
        client = connect(ch, analyst=True, send_receive_timeout=600)
        values = {"p": PERIOD, "team": args.team}
        print(f"\n| read (team `{args.team}`, {PERIOD}, {args.runs} warm runs) | median ms | p95 ms |\n|---|---:|---:|")
        for name, sql in PARTS:
            median, p95, _ = timed(lambda sql=sql: client.query(sql, parameters=values).result_rows, args.runs)
            print(f"| {name} | {median:.0f} | {p95:.0f} |", flush=True)


if __name__ == "__main__":
    main()
