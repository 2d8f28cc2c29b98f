"""March 2026's chargeback and team page against the months of history behind them (issue 21, item 5: 1, 6 and 12
months): how query time grows as the ledger ages.

One database grows: bench/web_page.py's generator fills March 2026 alone, then the months before it until the
history is each length of --curve (1, 6, 12: March; then October 2025 .. February 2026; then April .. September
2025), the server's merges are waited for and the rollups merged (web_page.merged), and at each length, on March:
`gpuledger report chargeback --period 2026-03` through the CLI in its own process (its start included, one
warm-up run first; web_page.cli_seconds) and the team page `/teams/vision?period=2026-03` through the app's
TestClient (warm; web_page.timed). Median and p95 of each, a markdown table, JSON lines, and a plot (--png).

    .venv/bin/python bench/history_curve.py --gpus 1000 --curve 1,6,12 --requests 10 --report-runs 5 --json h.jsonl
    .venv/bin/python bench/history_curve.py --gpus 10000 --history-stride 30 --requests 20 --json h10k.jsonl
    .venv/bin/python bench/history_curve.py --replot h.jsonl     # the plot again, from a run's JSON lines

--history-stride K generates the months before March with every Kth minute of each GPU's day (March itself always
has every minute). What March's reads scan of the history keeps its size: every job, its events and its life, and
every row of the rollups kept per day (usage_daily, device_cluster_days, node_daily, device_clusters); only the
history's device_minutes hold 1/K of the rows. The timed reads read that table only for a day two lives of a job
id share or a device two clusters claim, and the generator makes neither. A month of 10,000 GPUs takes ~15 minutes
to generate here at every minute.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine, migrated_database  # noqa: E402
from web_page import (  # noqa: E402
    PERIOD,
    START,
    cli_seconds,
    getter,
    keep_marker,
    merged,
    month_starts,
    seed_month,
    timed,
)

CHARGEBACK = ("report", "chargeback", "--period", PERIOD)
TEAM_PAGE = f"/teams/vision?period={PERIOD}"


def quantiles(samples_ms: list[float]) -> tuple[float, float]:
    """Median and p95 (nearest rank, as web_page.timed) of `samples_ms`."""
    ordered = sorted(samples_ms)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return median, ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def plot(rows: list[dict[str, Any]], gpus: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [r["months"] for r in rows]
    for key, label, marker in (
        ("chargeback", "gpuledger report chargeback --period 2026-03 (CLI, its start included)", "o"),
        ("team_page", "team page /teams/vision?period=2026-03", "s"),
    ):
        medians = [r[f"{key}_median_ms"] / 1000 for r in rows]
        p95s = [r[f"{key}_p95_ms"] / 1000 for r in rows]
        (line,) = ax.plot(xs, medians, marker=marker, label=f"{label}, median")
        ax.plot(xs, p95s, marker=marker, linestyle="--", color=line.get_color(), alpha=0.6, label="p95")
    ax.set_xlabel("months of history in the database (March 2026 and the months before it)")
    ax.set_ylabel("seconds")
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)
    stride = rows[0].get("history_stride", 1)
    sparse = f"\n(the months before March generated with every {stride}th minute)" if stride > 1 else ""
    ax.set_title(f"March 2026's queries against history, {gpus:,} GPUs{sparse}", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=1000, help="GPUs in the fleet (default 1000)")
    ap.add_argument("--curve", default="1,6,12", help="the history lengths, in months, ending with March 2026")
    ap.add_argument("--requests", type=int, default=10, help="timed warm team-page requests at each length")
    ap.add_argument("--report-runs", type=int, default=5, help="timed chargeback runs (after one warm-up)")
    ap.add_argument("--history-stride", type=int, default=1,
                    help="the months before March: every Kth minute of each GPU's day (default 1)")  # fmt: skip
    ap.add_argument("--march-stride", type=int, default=1,
                    help="March 2026 too: every Kth minute (default 1). The team page reads no device-minute (the "
                         "rollups, job events and lives only, which keep their size), so a sparse March times it as a "
                         "whole one would, generated in 1/K of the time")  # fmt: skip
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "images" / "history-curve.png")
    ap.add_argument("--json", type=Path, help="also write one JSON line per length here")
    ap.add_argument("--keep", type=Path, help="generate into this (new) directory and keep it: `bench/web_page.py "
                    "--data-dir DIR --months N --gpus G` then times every page on the longest history")  # fmt: skip
    ap.add_argument("--replot", type=Path, help="only draw --png from the JSON lines of an earlier run")
    args = ap.parse_args()
    if args.replot:
        rows = [json.loads(line) for line in args.replot.read_text().splitlines() if line.strip()]
        plot(rows, rows[0]["gpus"], args.png)
        return
    lengths = sorted({int(n) for n in args.curve.split(",")})

    from fixtures_clickhouse import start_server, stop_server
    from fixtures_web import Published, make_client

    from base.settings import BrokerSettings, Settings, WebSettings
    from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows

    print(f"machine: {machine()}; {args.gpus} GPUs; history every {args.history_stride} minute(s), March every "
          f"{args.march_stride}; "
          f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")  # fmt: skip
    rows: list[dict[str, Any]] = []
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        sys.exit(f"--keep {args.keep}: not empty; give a new directory")
    with (tempfile.TemporaryDirectory(prefix="bench-history-") if args.keep is None
          else contextlib.nullcontext(str(args.keep))) as tmp:  # fmt: skip
        Path(tmp).mkdir(parents=True, exist_ok=True)
        server = start_server(Path(tmp) / "data")
        try:
            client, ch = migrated_database(server)
            database = ch.database
            client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
            end_ms = int(dt.datetime(2026, 4, 1, tzinfo=dt.UTC).timestamp() * 1000)
            settings = Settings(state_dir=Path(tmp) / "state", cluster="sim", clickhouse=ch,
                                broker=BrokerSettings(enabled=False), web=WebSettings(demo=False))  # fmt: skip
            seeded: set[dt.date] = set()
            print("\n| months | generated (s per month) | merges waited s | chargeback median / p95 s | team page "
                  "median / p95 ms | load average (1 min) |")  # fmt: skip
            print("|---:|---:|---:|---:|---:|---:|")
            for months in lengths:
                fresh = [m for m in reversed(month_starts(months)) if m not in seeded]  # newest first
                began = time.perf_counter()
                for first in fresh:
                    seed_month(client, args.gpus, first, args.march_stride if first == START else args.history_stride)
                    seeded.add(first)
                per_month_s = (time.perf_counter() - began) / max(1, len(fresh))
                waited_s = merged(client, database)
                web = make_client(settings, Published(), now_ms=end_ms)
                page_med, page_p95, _ = timed(getter(web, TEAM_PAGE), args.requests)
                cli_seconds(ch, CHARGEBACK, 1)  # warm-up: the first run after new months reads them cold
                report_med, report_p95 = quantiles([s * 1000 for s in cli_seconds(ch, CHARGEBACK, args.report_runs)])
                minutes = client.query("SELECT count() FROM device_minutes").result_rows[0][0]
                events, ids, jobs = client.query(
                    "SELECT count(), uniqExact(event_id), uniqExact(job_id) FROM job_events"
                ).result_rows[0]
                assert events == ids == 3 * jobs, ("job ids of two months met", events, ids, jobs)
                row = {"gpus": args.gpus, "months": months, "device_minutes": minutes, "jobs": jobs,
                       "generated_s_per_month": per_month_s, "merges_waited_s": waited_s,
                       "chargeback_median_ms": report_med, "chargeback_p95_ms": report_p95,
                       "team_page_median_ms": page_med, "team_page_p95_ms": page_p95,
                       "load_1m": os.getloadavg()[0], "requests": args.requests, "history_stride": args.history_stride,
                       "march_stride": args.march_stride,
                       "report_runs": args.report_runs}  # fmt: skip
                rows.append(row)
                print(f"| {months} | {per_month_s:.0f} | {waited_s:.0f} | {report_med / 1000:.2f} / "
                      f"{report_p95 / 1000:.2f} | {page_med:,.0f} / {page_p95:,.0f} | {row['load_1m']:.1f} |",
                      flush=True)  # fmt: skip
                if args.json:
                    with args.json.open("a") as out:
                        out.write(json.dumps(row) + "\n")
                if args.keep is not None:
                    keep_marker(args.keep, args.gpus, database, months, args.history_stride)
            client.close()
        finally:
            stop_server(server)
    plot(rows, args.gpus, args.png)
    print(f"\nplot: {args.png}")


if __name__ == "__main__":
    main()
