"""Where the team page's time goes, query by query (issue 44 item 6): on a month kept by bench/web_page.py or
bench/history_curve.py (--data-dir / --keep), `--requests` warm requests of the team page through the app's
TestClient, and every query those requests sent, timed as the server timed it (`X-ClickHouse-Summary`'s elapsed; the
embedded server lets no client read `system.query_log`, and its summary's rows are the result's): how many times,
the server's time (median / max ms), the client's wall time, the rows returned, and the query's first characters.
Applies this tree's pending migrations and views first (as bench/web_page.py --data-dir does), then reads only.

    .venv/bin/python bench/page_queries.py --data-dir /tmp/h10k --requests 10
    .venv/bin/python bench/page_queries.py --data-dir /tmp/h10k --requests 10 --url '/teams/vision?period=2026-03'

The page sends its reads at once (web/pages.py), so the server's times overlap: their sum is more than the page's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import machine, migrated_database  # noqa: E402
from web_page import PERIOD, getter  # noqa: E402

SEEN: list[tuple[str, float, float, int]] = []  # (query, server ms, wall ms, rows out)


def recording() -> None:
    """Record every query clickhouse-connect's HTTP client sends from now on (the page's reads run on its threads)."""
    import re

    from clickhouse_connect.driver.httpclient import HttpClient

    plain = HttpClient.query

    def query(self: Any, query: str | None = None, *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        result = plain(self, query, *args, **kwargs)
        wall = (time.perf_counter() - began) * 1000
        summary = getattr(result, "summary", None) or {}
        text = re.sub(r"\s+", " ", query or "")
        SEEN.append((text, int(summary.get("elapsed_ns", 0)) / 1e6, wall, len(result.result_rows)))
        return result

    HttpClient.query = query  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a month kept by bench/web_page.py --data-dir")
    ap.add_argument("--requests", type=int, default=10, help="warm requests of the page (after one warm-up)")
    ap.add_argument("--url", default=f"/teams/vision?period={PERIOD}", help="the page (default the team page)")
    ap.add_argument("--width", type=int, default=150, help="characters of each query shown")
    args = ap.parse_args()

    from fixtures_clickhouse import start_server, stop_server
    from fixtures_web import Published, make_client

    from base.settings import BrokerSettings, Settings, WebSettings

    kept = json.loads((args.data_dir / "seeded.json").read_text())
    print(f"machine: {machine()}; {kept}; {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
    server = start_server(args.data_dir / "data")
    try:
        client, ch = migrated_database(server, kept["database"])  # this tree's views, as web_page.py does
        client.close()
        end_ms = int(dt.datetime(2026, 4, 1, tzinfo=dt.UTC).timestamp() * 1000)
        settings = Settings(state_dir=args.data_dir / "state", cluster="sim", clickhouse=ch,
                            broker=BrokerSettings(enabled=False), web=WebSettings(demo=False))  # fmt: skip
        web = make_client(settings, Published(), now_ms=end_ms)
        get = getter(web, args.url)
        get()  # warm-up, not recorded
        recording()
        samples = []
        for _ in range(args.requests):
            began = time.perf_counter()
            get()
            samples.append((time.perf_counter() - began) * 1000)
        samples.sort()
        p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
        print(f"\n{args.url}: {args.requests} warm requests, median {statistics.median(samples):.0f} ms, "
              f"p95 {p95:.0f} ms")  # fmt: skip
        by_query: dict[str, list[tuple[str, float, float, int]]] = {}
        for seen in SEEN:
            by_query.setdefault(seen[0], []).append(seen)
        print("\n| a request's queries | times | server median ms | max | wall median ms | rows out |")
        print("|---|---:|---:|---:|---:|---:|")
        total = 0.0
        for text, runs in sorted(by_query.items(), key=lambda kv: -statistics.median(r[1] for r in kv[1])):
            server_ms = statistics.median(r[1] for r in runs)
            total += server_ms * len(runs) / args.requests
            print(f"| `{text[: args.width]}` | {len(runs)} | {server_ms:.0f} | {max(r[1] for r in runs):.0f} | "
                  f"{statistics.median(r[2] for r in runs):.0f} | {max(r[3] for r in runs):,} |")  # fmt: skip
        print(f"\nthe server's time summed over a request's queries: {total:.0f} ms (sent at once, they overlap)")
    finally:
        stop_server(server)


if __name__ == "__main__":
    main()
