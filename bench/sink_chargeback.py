"""Bench: sink insert rows/s into the embedded ClickHouse, and the monthly chargeback query time
for 10,000 GPUs.

What is measured (printed again at the end):
1. decode: Avro decode + model validation + row mapping of DeviceMinute records, in-process
   (the CPU the sink spends per record before ClickHouse).
2. sink insert: `LedgerWriter.write` of device-minute batches (stored-key look-up for dedupe,
   Native insert over HTTP through clickhouse-connect, the daily-rollup materialized view) into
   the embedded chDB server (`python -m stack.clickhouse clickhouse serve`), then the same batches
   again (a replay: look-up only, nothing inserted).
3. chargeback: a month of usage for 10,000 GPUs, written straight into the daily rollup
   (`usage_daily`) with INSERT ... SELECT: a month of device-minutes (10,000 x 43,200 = 432 M rows)
   is too much for this machine's time budget, and the report reads only the rollup, which is what
   the materialized view would hold for those minutes. Then `gpuledger report chargeback` (the same
   query, `sinks.chargeback.chargeback`) per grouping, and `report explain` for one project, timed
   over HTTP with the read-only analyst user.

Usage: python bench/sink_chargeback.py [--rows 300000] [--batch 50000] [--gpus 10000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from base.settings import ClickHouseSettings  # noqa: E402
from schemas.codec import AvroCodec  # noqa: E402
from sinks import chargeback as cb  # noqa: E402
from sinks.db import connect, migrate  # noqa: E402
from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows  # noqa: E402
from sinks.rows import DEVICE_MINUTES  # noqa: E402
from sinks.writer import LedgerWriter, Origin, Pending  # noqa: E402
from streams.consume import decode_or_dead_letter  # noqa: E402

MINUTE0 = 1_793_491_200_000  # 2026-11-01T00:00Z
PASSWORD = "bench-writer"
ANALYST = "bench-analyst"


def start_server(path: Path) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(
        {
            "GPULEDGER_CONFIG": str(path / "none.toml"),
            "GPULEDGER_CLICKHOUSE__PASSWORD": PASSWORD,
            "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": ANALYST,
            "GPULEDGER_STATE_DIR": str(path / "state"),
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "stack.clickhouse", "clickhouse", "serve", "--path", str(path / "data"),
         "--host", "127.0.0.1", "--port", "0"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    reader.start()
    reader.join(60)
    match = re.search(r"listening on (http://\S+)", line[0] if line else "")
    if not match:
        proc.kill()
        raise SystemExit("embedded ClickHouse did not start")
    return proc, match.group(1)


def device_minute(gpu: int, minute: int) -> dict[str, Any]:
    idle = 60 if (gpu + minute) % 7 == 0 else 0
    return {
        "cluster": "bench", "node": f"n{gpu // 8:05d}", "device_uuid": f"GPU-{gpu:06d}", "mig_instance_id": None,
        "minute_start_ms": MINUTE0 + minute * 60_000, "model": "H100", "generation": "hopper",
        "job_id": f"job-{gpu // 8}-{minute // 240}", "user": f"user{gpu % 3000}", "project": f"proj{gpu % 1000}",
        "team": f"team{gpu % 200}", "cost_centre": f"CC-{gpu % 50}", "preemptible": gpu % 5 == 0,
        "pricing_tier": "on-prem", "unallocated_s": 0, "allocated_s": 60, "active_s": 60 - idle, "starved_s": 0,
        "idle_s": idle, "dark_s": 0, "sm_weighted_s": 0.0 if idle else 39.0, "sample_count": 60,
        "activity_mean_ratio": 0.65, "activity_max_ratio": 0.9, "fb_used_mib_max": 40_000.0, "power_w_mean": 550.0,
        "mapping_version": "dcgm-3.3/m1", "classifier_version": "c1",
    }  # fmt: skip


def bench_decode(n: int) -> float:
    codec = AvroCodec()
    encoded = [codec.encode("usage.device-minutes", device_minute(i % 10_000, i // 10_000)) for i in range(n)]

    class NoPublisher:  # every record is valid here; a dead letter would be a bench bug
        codec = None

        def publish_raw(self, *a: Any, **k: Any) -> None:
            raise AssertionError("unexpected dead letter")

    from streams.consume import SourceRecord

    t0 = time.perf_counter()
    for i, value in enumerate(encoded):
        record = decode_or_dead_letter(
            SourceRecord("usage.device-minutes.v1", 0, i, None, value),
            codec,
            NoPublisher(),  # type: ignore[arg-type]
            subject="usage.device-minutes",
        )
        DEVICE_MINUTES.rows(record)  # type: ignore[arg-type]
    return n / (time.perf_counter() - t0)


def bench_insert(ch: ClickHouseSettings, rows: int, batch: int, gpus: int) -> tuple[float, float]:
    client = connect(ch)
    writer = LedgerWriter(client)
    batches = []
    for start in range(0, rows, batch):
        batches.append([
            Pending(DEVICE_MINUTES, DEVICE_MINUTES.rows(device_minute(i % gpus, i // gpus))[0], Origin("b", 0, i))
            for i in range(start, min(rows, start + batch))
        ])  # fmt: skip
    t0 = time.perf_counter()
    inserted = sum(writer.write(b).inserted.get("device_minutes", 0) for b in batches)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    skipped = sum(writer.write(b).skipped_duplicates for b in batches)
    replay = time.perf_counter() - t0
    assert inserted == rows and skipped == rows, (inserted, skipped)
    daily = client.query("SELECT sum(device_minutes) FROM usage_daily").result_rows[0][0]
    assert daily == rows, daily
    client.close()
    return rows / first, rows / replay


MONTH_SQL = """
INSERT INTO usage_daily
SELECT day, 'bench' AS cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
       'dcgm-3.3/m1', 'c1', devices * minutes AS device_minutes, 0, allocated, active, starved, idle, dark,
       active * 0.7, allocated
FROM
(
    SELECT toDate('2026-11-01') + intDiv(number, {jobs_per_day:UInt64}) AS day,
           number % {jobs_per_day:UInt64} AS slot,
           if(slot < {gang_slots:UInt64}, 8, 1) AS devices,
           360 + (cityHash64(number) % 720) AS minutes,
           devices * minutes * 60 AS allocated,
           intDiv(allocated * (cityHash64(number, 1) % 20), 100) AS idle,
           intDiv(allocated * (cityHash64(number, 2) % 10), 100) AS starved,
           intDiv(allocated * (cityHash64(number, 3) % 5), 100) AS dark,
           allocated - idle - starved - dark AS active,
           concat('job-', toString(number)) AS job_id,
           ['hopper', 'ampere'][1 + (slot % 2)] AS generation,
           ['on-prem', 'on-prem', 'on-prem', 'cloud-on-demand', 'cloud-spot'][1 + (cityHash64(number, 4) % 5)]
               AS pricing_tier,
           cityHash64(number, 5) % 4 = 0 AS preemptible,
           concat('user', toString(cityHash64(number, 6) % 3000)) AS user,
           concat('team', toString(cityHash64(number, 6) % 3000 % 200)) AS team,
           concat('proj', toString(cityHash64(number, 7) % 1000)) AS project,
           concat('CC-', toString(cityHash64(number, 6) % 3000 % 200 % 50)) AS cost_centre
    FROM numbers({days:UInt64} * {jobs_per_day:UInt64})
)
"""


def bench_month(ch: ClickHouseSettings, gpus: int, runs: int) -> dict[str, Any]:
    client = connect(ch)
    client.command("TRUNCATE TABLE usage_daily")
    # 10,000 GPUs a day: half in 8-GPU gangs (one job a day each), half single-GPU (three jobs a day).
    gang_slots = gpus // 2 // 8
    jobs_per_day = gang_slots + (gpus - gang_slots * 8) * 3
    t0 = time.perf_counter()
    client.command(MONTH_SQL, parameters={"jobs_per_day": jobs_per_day, "gang_slots": gang_slots, "days": 30})
    load_s = time.perf_counter() - t0
    client.command("OPTIMIZE TABLE usage_daily FINAL")
    rows = client.query("SELECT count(), sum(allocated_s) FROM usage_daily").result_rows[0]
    corrections = [[f"corr-{i}", MINUTE0 + i, "bench", f"job-{i * 97}", None, "proj-corrected", "bench", "bench"]
                   for i in range(rows[0] // 100)]  # fmt: skip
    client.insert("attribution_corrections", corrections,
                  column_names=["correction_id", "ts_ms", "cluster", "job_id", "old_project", "new_project",
                                "reason", "corrected_by"])  # fmt: skip
    client.close()
    analyst = connect(ch, analyst=True)
    timings: dict[str, list[float]] = {}
    total = None
    for by in cb.BY_CHOICES:
        for _ in range(runs):
            t0 = time.perf_counter()
            report = cb.chargeback(analyst, "2026-11", by)
            timings.setdefault(f"chargeback --by {by}", []).append(time.perf_counter() - t0)
        total = total or report.total.charge
        assert report.total.charge == total, "every grouping must total the same"
    for _ in range(runs):
        t0 = time.perf_counter()
        jobs = cb.explain(analyst, "2026-11", "proj7")
        timings["explain --project proj7"] = [*timings.get("explain --project proj7", []), time.perf_counter() - t0]
    analyst.close()
    return {"rows": rows[0], "gpu_hours": rows[1] / 3600, "load_s": load_s, "timings": timings, "total": total,
            "lines": len(report.lines), "explain_rows": len(jobs), "corrections": len(corrections)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000, help="device-minutes for the insert bench")
    parser.add_argument("--batch", type=int, default=50_000, help="rows per sink batch")
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--decode", type=int, default=50_000, help="records for the decode bench")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    proc, url = start_server(tmp)
    try:
        ch = ClickHouseSettings(url=url, database="bench", password=PASSWORD, analyst_password=ANALYST)
        client = connect(ch)
        migrate(client, ch)
        client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
        client.close()
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"nproc={os.cpu_count()} loadavg={load} server={url} (embedded chDB, clickhouse-connect over HTTP)")
        decode_rps = bench_decode(args.decode)
        print(f"decode+validate+map: {decode_rps:,.0f} records/s ({args.decode:,} DeviceMinute records, in-process)")
        first, replay = bench_insert(ch, args.rows, args.batch, args.gpus)
        print(f"sink insert: {first:,.0f} rows/s ({args.rows:,} device-minutes, batches of {args.batch:,}, "
              f"key look-up + insert + daily-rollup MV)")  # fmt: skip
        print(f"sink replay of the same batches: {replay:,.0f} rows/s (look-up only, 0 rows inserted)")
        month = bench_month(ch, args.gpus, args.runs)
        print(f"month: {month['rows']:,} usage_daily rows = {month['gpu_hours']:,.0f} GPU-h for {args.gpus:,} GPUs "
              f"x 30 days, loaded in {month['load_s']:.1f}s; {month['corrections']:,} corrections; "
              f"total charge ${month['total']:,}")  # fmt: skip
        for name, values in month["timings"].items():
            print(f"  {name}: median {statistics.median(values) * 1000:.0f} ms, "
                  f"min {min(values) * 1000:.0f} ms over {len(values)} runs")  # fmt: skip
        print(f"loadavg at end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
