"""The team page on a month of N GPUs (issue 20, item 6: <= 300 ms p95 over a month of 10,000 GPUs); the month's
reports through the CLI and the bytes per GPU-month of each table (issue 21, item 5).

Starts the embedded ClickHouse as the tests do (tests/fixtures_clickhouse.start_server), migrates a database,
loads the rate card, and generates a synthetic month inside the server (INSERT ... SELECT FROM numbers(),
one day per statement, sent with clickhouse-connect; nothing is held in Python's memory): every GPU has a
device-minute for every minute of the month; 8 GPUs a node, 2 jobs a node a day (one node each, 12 h),
~10% of node-halves unallocated; teams, projects and users from the simulator's organisation; minutes
active/starved/idle/dark by a hash. job_events get SUBMITTED/STARTED/ENDED per job (the job page and project
sources read them). No alerts are seeded (the open-warnings table is empty). job_minutes are not read by
the pages, so none are written. Then it times, warm, the team, project, job and fleet pages through a
Starlette TestClient of the app (as an operator, from 127.0.0.1), and each of the team page's queries alone,
once the server has no merge of the fresh month's parts running (a month on a real server was merged long ago).

    .venv/bin/python bench/web_page.py --gpus 1000 --requests 10
    .venv/bin/python bench/web_page.py --gpus 10000 --requests 20 --data-dir /tmp/web10k   # generated once, kept
    .venv/bin/python bench/web_page.py --gpus 1000 --months 12   # April 2025 .. March 2026, the pages on March

With --months N the history is N consecutive months ending with March 2026, each generated as March is (its days
numbered from 2026-03-01, so job ids and event times of two months never meet); the pages still show March.
bench/history_curve.py grows one database from 1 to 6 to 12 months and times March's chargeback and team page.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine, migrated_database  # noqa: E402

PERIOD = "2026-03"
START = dt.date(2026, 3, 1)  # the latest month generated, the one the pages and reports show
TEAMS = (("vision", ("vision-detect", "vision-seg")), ("nlp", ("llm-pretrain", "llm-eval")), ("speech", ("asr",)),
         ("research", ("rl-agents", "diffusion")), ("platform", ("infra-bench",)))  # fmt: skip
GPUS_PER_NODE = 8

# One day of device-minutes for {gpus} GPUs, every {stride}th minute of it (1: every minute): row n is GPU
# intDiv(n, per_gpu) at minute (n % per_gpu) * stride of the day, per_gpu = 1440 / stride. {day} is the day's number
# from START (negative before March 2026): jobs are named by it, so no two days share a job id.
_DAY_SQL = """
INSERT INTO device_minutes (cluster, node, device_uuid, mig_instance_id, minute_start_ms, model, generation, job_id,
    user, project, team, cost_centre, preemptible, pricing_tier, unallocated_s, allocated_s, active_s, starved_s,
    idle_s, dark_s, sm_weighted_s, sample_count, activity_mean_ratio, activity_max_ratio, fb_used_mib_max,
    power_w_mean, mapping_version, classifier_version)
SELECT 'sim', concat('node-', toString(node)), concat('GPU-', toString(gpu)), -1, {day_ms:Int64} + m * 60000,
    if(node % 4 = 0, 'NVIDIA A100-SXM4-80GB', 'NVIDIA H100 80GB HBM3'), if(node % 4 = 0, 'ampere', 'hopper'),
    if(alloc, job, ''), if(alloc, concat(team, '-u', toString(node % 4)), ''), if(alloc, project, ''),
    if(alloc, team, ''), if(alloc, 'cc-1000', ''), false, 'on-prem', if(alloc, 0, 60), if(alloc, 60, 0),
    if(alloc AND cls < 65, 60, 0), if(alloc AND cls >= 65 AND cls < 75, 60, 0),
    if(alloc AND cls >= 75 AND cls < 95, 60, 0), if(alloc AND cls >= 95, 60, 0),
    if(alloc AND cls < 65, 45.0, 0.0), if(cls >= 95, 0, 6), if(cls >= 95, NULL, cls / 100), if(cls >= 95, NULL, 0.99),
    if(cls >= 95, NULL, 40000.0), if(cls >= 95, NULL, 350.0), 'bench-1', 'bench-1'
FROM (
    SELECT intDiv(number, {per_gpu:UInt32}) AS gpu, (number % {per_gpu:UInt32}) * {stride:UInt32} AS m,
        intDiv(gpu, 8) AS node, intDiv(m, 720) AS half,
        cityHash64(node, {day:Int32}, half) % 10 != 0 AS alloc,
        concat('j', toString(node), '-', toString({day:Int32}), '-', toString(half)) AS job,
        {teams:Array(String)}[1 + node % length({teams:Array(String)})] AS team,
        {projects:Array(String)}[1 + node % length({projects:Array(String)})] AS project,
        cityHash64(gpu, {day:Int32}, intDiv(m, 30)) % 100 AS cls
    FROM numbers({rows:UInt64})
)
"""

# SUBMITTED, STARTED and ENDED per job of the month (the producers' event types: v_job_lives reads STARTED), from
# the month's device-minutes just written (one row per job; a job is half a day, so never in two months).
_EVENTS_SQL = """
INSERT INTO job_events (event_id, event_type, ts_ms, scheduler, cluster, job_id, job_name, user, project,
    project_source, project_validation, team, cost_centre, preemptible, interactive, checkpointable, gang_size,
    allocations, requested_devices, pricing_tier, submit_ts_ms, start_ts_ms, end_ts_ms)
SELECT concat(job_id, '-', ev), ev, multiIf(ev = 'SUBMITTED', s - 60000, ev = 'STARTED', s, e), 'slurm', 'sim', job_id,
    'train', user, project, 'account', 'valid', team, 'cc-1000', false, false, true, 1,
    concat('[{"node": "', node, '", "devices": []}]'), 8, 'on-prem',
    s - 60000, s, if(ev = 'ENDED', e, NULL)
FROM (SELECT job_id, any(node) AS node, any(user) AS user, any(project) AS project, any(team) AS team,
             min(minute_start_ms) AS s,
             max(minute_start_ms) + 60000 AS e
      FROM device_minutes WHERE job_id != '' AND day >= {first:Date} AND day < {end:Date} GROUP BY job_id)
ARRAY JOIN ['SUBMITTED', 'STARTED', 'ENDED'] AS ev
"""


def month_starts(months: int, last: dt.date = START) -> list[dt.date]:
    """The first days of `months` consecutive months ending with `last`'s, oldest first."""
    index = last.year * 12 + last.month - 1
    return [dt.date(i // 12, i % 12 + 1, 1) for i in range(index - months + 1, index + 1)]


def next_month(first: dt.date) -> dt.date:
    return dt.date(first.year + first.month // 12, first.month % 12 + 1, 1)


def seed_month(client: Any, gpus: int, first: dt.date, stride: int = 1) -> dict[str, float]:
    """Generate the month that begins on `first`: its device-minutes day by day (every `stride`th minute of each
    GPU's day; 1, every minute), then its jobs' events. A sparse month keeps every job, device-day and the rows
    of every rollup kept per day (usage_daily, device_cluster_days, node_daily), with 1/stride of the minutes."""
    if stride < 1 or 1440 % stride:
        raise ValueError(f"stride {stride}: it must divide the 1440 minutes of a day")
    teams = [t for t, ps in TEAMS for _ in ps]
    projects = [p for _, ps in TEAMS for p in ps]
    end = next_month(first)
    began = time.perf_counter()
    for d in range((end - first).days):
        day = first + dt.timedelta(days=d)
        day_ms = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)
        client.command(_DAY_SQL, parameters={"day_ms": day_ms, "day": (day - START).days, "stride": stride,
                                             "per_gpu": 1440 // stride, "rows": gpus * (1440 // stride),
                                             "teams": teams, "projects": projects})  # fmt: skip
    minutes_s = time.perf_counter() - began
    began = time.perf_counter()
    client.command(_EVENTS_SQL, parameters={"first": first, "end": end})
    events_s = time.perf_counter() - began
    return {"device_minutes_s": minutes_s, "job_events_s": events_s}


def keep_marker(directory: Path, gpus: int, database: str, months: int, history_stride: int = 1) -> None:
    """What a kept --data-dir holds (seeded.json), read back by `main` on a later run."""
    (directory / "seeded.json").write_text(json.dumps(
        {"gpus": gpus, "database": database, "months": months, "history_stride": history_stride}))  # fmt: skip


def seed(client: Any, gpus: int, months: list[dt.date] | None = None) -> dict[str, float]:
    """Generate `months` (their first days; default March 2026 alone); the seconds spent, summed over them."""
    total = {"device_minutes_s": 0.0, "job_events_s": 0.0}
    for first in months or [START]:
        for key, seconds in seed_month(client, gpus, first).items():
            total[key] += seconds
    return total


def settle(client: Any, database: str, limit_s: float = 600) -> float:
    """Wait (up to `limit_s`) until the server merges none of the database's parts: a month on a real
    server was merged long ago, and merges of the freshly generated one would be timed with the pages."""
    began = time.perf_counter()
    while time.perf_counter() - began < limit_s:
        merging = client.query("SELECT count() FROM system.merges WHERE database = {db:String}",
                               parameters={"db": database}).result_rows[0][0]  # fmt: skip
        if not merging:
            break
        time.sleep(2)
    return time.perf_counter() - began


def merged(client: Any, database: str) -> float:
    """settle, then merge the small rollups whose fresh parts a server merges over time (timed merged); the
    seconds waited for the background merges."""
    waited = settle(client, database)
    for table in ROLLUPS:
        client.command(f"OPTIMIZE TABLE {table} FINAL")
    return waited


def getter(web: Any, url: str) -> Callable[[], Any]:
    """A GET of `url` through the app's TestClient `web`, as an operator, that must answer 200."""

    def call() -> Any:
        resp = web.get(url, headers={"X-Forwarded-User": "ops00"})
        assert resp.status_code == 200, (url, resp.status_code, resp.text[:300])
        return resp

    return call


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float, Any]:
    """Median and p95 (ms) of `runs` warm calls, after one warm-up call; the last result."""
    result = fn()
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return statistics.median(samples), p95, result


def first_day(wh: Any, period: Any, job: tuple[str, str]) -> tuple[int, int, int]:
    """The job page's minute-by-minute window: the first day the job held a device, and its row cap."""
    from web.pages import DEVICE_MINUTES_CSV_MAX

    first = min(d["first_minute_ms"] for d in wh.job_devices(period, *job))
    start = first - first % 86_400_000
    return start, start + 86_400_000, DEVICE_MINUTES_CSV_MAX


def per_query(
    wh: Any, period: Any, team: str, job: tuple[str, str], now_ms: int, runs: int
) -> list[tuple[str, float, float]]:
    """Each query the team page and the job page make, alone (median, p95 ms); the priced reads from the views the
    pages pick (`priced_views`), then from the full views."""
    from web.queries import FULL_VIEWS

    since = now_ms - 14 * 86_400_000
    views = wh.priced_views(period)
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("closes (v_period_closes)", lambda: wh.closes()),
        ("priced_views (v_month_single_lives)", lambda: wh.priced_views(period)),
        (f"statements ({views.month})", lambda: wh.statements(period, views=views)),
        (f"team_usage ({views.usage} grouped, top idle jobs)", lambda: wh.team_usage(period, team, views=views)),
        (f"team_jobs ({views.usage}, the project page's)", lambda: wh.team_jobs(period, team, views=views)),
        (f"daily ({views.usage})", lambda: wh.daily(period, team, views=views)),
        ("dark_by_node (node_daily)", lambda: wh.dark_by_node(period, team)),
        ("project_sources (job_events IN usage_daily)", lambda: wh.project_sources(period, team)),
        ("latest_minute_ms (node_daily)", lambda: wh.latest_minute_ms(period.start - dt.timedelta(days=31))),
        ("team_alerts", lambda: wh.team_alerts(team, since)),
        ("job (job_events)", lambda: wh.job(*job)),
        (f"job_usage ({views.usage})", lambda: wh.job_usage(period, *job, views)),
        ("job_devices (device_minutes FINAL)", lambda: wh.job_devices(period, *job)),
        ("device_minutes, the job's first day (FINAL)", lambda: wh.device_minutes(*job, *first_day(wh, period, job))),
    ]
    if views != FULL_VIEWS:
        cases += [
            ("statements (v_chargeback_month, the full views)", lambda: wh.statements(period)),
            ("team_usage (v_usage_priced, the full views)", lambda: wh.team_usage(period, team)),
        ]
    out = []
    for name, fn in cases:
        med, p95, _ = timed(fn, runs)
        out.append((name, med, p95))
    return out


# The rollups fed on insert from device_minutes and job_events (thousands to hundreds of thousands of rows).
ROLLUPS = ("usage_daily", "node_daily", "device_cluster_days", "device_clusters", "job_lives", "unidentified_daily")
REPORTS = (
    ("report", "chargeback", "--period", PERIOD),
    ("report", "chargeback", "--period", PERIOD, "--by", "cluster"),
    ("report", "explain", "--period", PERIOD, "--project", "vision-detect", "--format", "csv"),
)


def cli_seconds(ch: Any, argv: tuple[str, ...], runs: int) -> list[float]:
    """`gpuledger *argv` as a user runs it, `runs` times: the CLI in its own process (its start included), as the
    analyst; the seconds of each run."""
    from fixtures_web import cli_env

    env = {**os.environ, **cli_env(ch)}
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([str(ROOT / ".venv" / "bin" / "gpuledger"), *argv], env=env, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        samples.append(time.perf_counter() - began)
    return samples


def reports(ch: Any, gpus: int, runs: int = 3) -> None:
    """The month's reports as a user runs them (cli_seconds)."""
    print(f"\n| command ({gpus} GPUs, {runs} runs, the CLI's start included) | median s | max s |")
    print("|---|---:|---:|")
    for argv in REPORTS:
        samples = cli_seconds(ch, argv, runs)
        print(f"| `gpuledger {' '.join(argv)}` | {statistics.median(samples):.2f} | {max(samples):.2f} |")


def storage(client: Any, database: str, gpus: int, months: int = 1) -> None:
    """Bytes on disk per GPU-month, per table (active parts; `months` months of `gpus` GPUs)."""
    rows = client.query(
        "SELECT table, sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) FROM system.parts "
        "WHERE active AND database = {db:String} GROUP BY table ORDER BY 3 DESC",
        parameters={"db": database},
    ).result_rows
    print(
        f"\n| table ({gpus} GPUs, {months} month(s)) | rows | compressed bytes | per GPU-month | uncompressed "
        "per GPU-month |"
    )
    print("|---|---:|---:|---:|---:|")
    for table, n, packed, raw in rows:
        print(f"| {table} | {n:,} | {packed:,} | {packed / gpus / months:,.0f} | {raw / gpus / months:,.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=10000, help="GPUs in the fleet (default 10000)")
    ap.add_argument("--requests", type=int, default=10, help="timed warm requests per page")
    ap.add_argument("--months", type=int, default=1, help="months of history, ending with March 2026 (default 1)")
    ap.add_argument("--data-dir", type=Path, help="keep the generated month in this directory and reuse it on a "
                    "later run with the same --gpus (10,000 GPUs take ~15 min to generate); pending migrations are "
                    "applied to it, with their backfills")  # fmt: skip
    args = ap.parse_args()

    from fixtures_clickhouse import start_server, stop_server
    from fixtures_web import Published, make_client

    from base.settings import BrokerSettings, Settings, WebSettings
    from sinks.db import connect
    from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows
    from web import params
    from web.queries import Warehouse

    print(f"machine: {machine()}")
    with (tempfile.TemporaryDirectory(prefix="bench-web-") if args.data_dir is None
          else contextlib.nullcontext(str(args.data_dir))) as tmp:  # fmt: skip
        Path(tmp).mkdir(parents=True, exist_ok=True)
        marker = Path(tmp) / "seeded.json"
        kept = json.loads(marker.read_text()) if marker.exists() else None
        if kept is not None and (kept["gpus"], kept.get("months", 1)) != (args.gpus, args.months):
            sys.exit(f"{tmp} holds {kept.get('months', 1)} month(s) of {kept['gpus']} GPUs, not {args.months} of "
                     f"{args.gpus}: use another --data-dir")  # fmt: skip
        server = start_server(Path(tmp) / "data")
        try:
            client, ch = migrated_database(server, kept["database"] if kept else None)
            database = ch.database
            if kept is None:
                client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
                seeded = seed(client, args.gpus, month_starts(args.months))
                print(f"generated: device-minutes {seeded['device_minutes_s']:.1f} s, job_events "
                      f"{seeded['job_events_s']:.1f} s")  # fmt: skip
            rows = client.query("SELECT count(), uniqExact(job_id) FROM device_minutes").result_rows[0]
            daily = client.query("SELECT count() FROM usage_daily").result_rows[0][0]
            print(f"gpus {args.gpus}: {rows[0]:,} device-minutes, {rows[1] - 1:,} jobs, {daily:,} usage_daily rows"
                  + (f" (kept in {tmp})" if kept else "")
                  + (f"; the months before March hold every {kept['history_stride']}th minute"
                     if kept and kept.get("history_stride", 1) > 1 else ""))  # fmt: skip
            print(f"waited {merged(client, database):.0f} s for the server's background merges of the fresh month")
            if args.data_dir is not None and kept is None:
                keep_marker(Path(tmp), args.gpus, database, args.months)
            end_ms = int(dt.datetime(2026, 4, 1, tzinfo=dt.UTC).timestamp() * 1000)
            settings = Settings(state_dir=Path(tmp) / "state", cluster="sim", clickhouse=ch,
                                broker=BrokerSettings(enabled=False), web=WebSettings(demo=False))  # fmt: skip
            web = make_client(settings, Published(), now_ms=end_ms)
            team = "vision"
            job_id = client.query("SELECT job_id FROM device_minutes WHERE team = 'vision' AND day = '2026-03-15' "
                                  "LIMIT 1").result_rows[0][0]  # fmt: skip

            pages = [
                ("team page", f"/teams/{team}?period={PERIOD}"),
                ("project page", f"/teams/{team}/projects/vision-detect?period={PERIOD}"),
                ("job page (drill-down)", f"/jobs/sim/{job_id}?period={PERIOD}"),
                ("fleet page", f"/fleet?period={PERIOD}"),
            ]
            print(f"\n| page ({args.gpus} GPUs, {args.requests} warm requests) | median ms | p95 ms | bytes |")
            print("|---|---:|---:|---:|")
            for name, url in pages:
                med, p95, resp = timed(getter(web, url), args.requests)
                print(f"| {name} `{url}` | {med:.0f} | {p95:.0f} | {len(resp.content):,} |")
            wh = Warehouse(connect(ch, analyst=True))
            print("\n| query alone | median ms | p95 ms |")
            print("|---|---:|---:|")
            for name, med, p95 in per_query(
                wh, params.period(PERIOD, end_ms), team, ("sim", job_id), end_ms, args.requests
            ):
                print(f"| {name} | {med:.0f} | {p95:.0f} |")
            reports(ch, args.gpus)
            storage(client, database, args.gpus, args.months)
            client.close()
        finally:
            stop_server(server)


if __name__ == "__main__":
    main()
