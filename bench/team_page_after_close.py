"""The team pages once a month has closed (docs/benchmarks.md, "Closing that month, and the pages after it"):
their statement status prices the closed month's changes for the page's team only (`pending_lines(..., team=)`,
`adjustments_since(..., team)`), not for every team.

Reuses a month generated and kept by bench/web_page.py (--data-dir), closes March in it if it is not closed yet
(`close_period`, as `gpuledger period close 2026-03` does; the close stays in the kept month), then times, warm:
the team pages of April (no usage in April: what it costs is March's adjustments) and of March (closed: its
changes since the close), each as it is and as it was before the scope (`pending_lines` and `adjustments_since`
called without `team`, the team's lines kept after), their calls interleaved so that other work on the machine
weighs on both alike; and `pending_lines` and the closed month's reads alone, unscoped
and scoped. It checks on the way that each team's scoped lines are exactly the unscoped ones of that team.

    .venv/bin/python bench/web_page.py --gpus 1000 --requests 3 --data-dir /tmp/web1k   # generates it once
    .venv/bin/python bench/team_page_after_close.py --data-dir /tmp/web1k --requests 10
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _common import kept_month, machine  # noqa: E402
from web_page import PERIOD, TEAMS, timed  # noqa: E402

NEXT = "2026-04"


def interleaved(fns: list[Callable[[], Any]], runs: int) -> list[tuple[float, float]]:
    """Median and p95 (ms) of each of `fns`, called in turn `runs` times after one warm-up call of each."""
    samples: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(runs):
        for fn, out in zip(fns, samples, strict=True):
            began = time.perf_counter()
            fn()
            out.append((time.perf_counter() - began) * 1000)
    for out in samples:
        out.sort()
    return [(statistics.median(out), out[min(len(out) - 1, round(0.95 * (len(out) - 1)))]) for out in samples]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", type=Path, required=True, help="a month kept by bench/web_page.py --data-dir")
    ap.add_argument("--requests", type=int, default=10, help="timed warm calls of each")
    ap.add_argument("--team", default="vision", help="the page's team")
    args = ap.parse_args()

    from fixtures_web import Published, make_client

    from base.settings import BrokerSettings, Settings, WebSettings
    from sinks.db import connect, migrate
    from sinks.statement_store import StatementStore, adjustments_since, close_period, pending_lines

    with kept_month(args.data_dir) as (ch, kept):
        print(f"machine: {machine()}; {kept['gpus']} GPUs, {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC")
        client = connect(ch, send_receive_timeout=600)
        migrate(client, ch)
        end_ms = int(dt.datetime(2026, 4, 2, tzinfo=dt.UTC).timestamp() * 1000)
        writer = StatementStore(client)
        if PERIOD not in writer.closes():
            began = dt.datetime.now(dt.UTC)
            cid, statements = close_period(writer, PERIOD, "bench", end_ms)
            took = (dt.datetime.now(dt.UTC) - began).total_seconds()
            print(f"closed {PERIOD} ({cid}, {len(statements)} statements) in {took:.1f} s")
        store = StatementStore(connect(ch, analyst=True, send_receive_timeout=600))
        everyone = pending_lines(store, NEXT)
        for team, _ in TEAMS:
            assert pending_lines(store, NEXT, team=team) == [x for x in everyone if x.team == team], team
        print(f"pending lines of {NEXT}: {len(everyone)}; each team's scoped lines equal the unscoped ones of it")

        settings = Settings(state_dir=args.data_dir / "state", cluster="sim", clickhouse=ch,
                            broker=BrokerSettings(enabled=False), web=WebSettings(demo=False))  # fmt: skip
        web = make_client(settings, Published(), now_ms=end_ms)
        def get(url: str) -> Callable[[], Any]:
            def call() -> Any:
                resp = web.get(url, headers={"X-Forwarded-User": "ops00"})
                assert resp.status_code == 200, (resp.status_code, resp.text[:300])
                return resp

            return call

        import sinks.statement_store as statement_store

        def pending_unscoped(store: Any, period: str, charges: Any = (), team: str | None = None) -> Any:
            return [x for x in pending_lines(store, period, charges) if team in (None, x.team)]

        def since_unscoped(store: Any, period: str, team: str | None = None) -> Any:
            return [(w, x) for w, x in adjustments_since(store, period) if team in (None, x.team)]

        def before(fn: Callable[[], Any]) -> Callable[[], Any]:
            """`fn` with the statement status reading every team's jobs, as before the scope (what
            web.statements.status imports and calls; the team's lines kept after)."""

            def call() -> Any:
                statement_store.pending_lines = pending_unscoped
                statement_store.adjustments_since = since_unscoped
                try:
                    return fn()
                finally:
                    statement_store.pending_lines = pending_lines
                    statement_store.adjustments_since = adjustments_since

            return call

        print(f"\n| the team page, {PERIOD} closed, {kept['gpus']} GPUs, {args.requests} warm calls of each, "
              "interleaved | unscoped (before): median / p95 ms | scoped to its team: median / p95 ms |")
        print("|---|---:|---:|")
        for url in (f"/teams/{args.team}?period={NEXT}", f"/teams/{args.team}?period={PERIOD}"):
            (med0, p950), (med1, p951) = interleaved([before(get(url)), get(url)], args.requests)
            print(f"| `{url}` | {med0:,.0f} / {p950:,.0f} | {med1:,.0f} / {p951:,.0f} |")
        cases = [
            ("pending_lines, unscoped (every team)", lambda: pending_lines(store, NEXT)),
            (f"pending_lines, team={args.team}", lambda: pending_lines(store, NEXT, team=args.team)),
            (f"segments({PERIOD}), unscoped", lambda: store.segments(PERIOD)),
            (f"segments({PERIOD}, team={args.team})", lambda: store.segments(PERIOD, args.team)),
            (f"frozen_lines({PERIOD}), unscoped", lambda: store.frozen_lines(PERIOD)),
            (f"frozen_lines({PERIOD}, team={args.team})", lambda: store.frozen_lines(PERIOD, args.team)),
        ]
        print(f"\n| alone, {PERIOD} closed, {kept['gpus']} GPUs, {args.requests} warm calls | median ms | p95 ms |")
        print("|---|---:|---:|")
        for name, fn in cases:
            med, p95, _ = timed(fn, args.requests)
            print(f"| {name} | {med:.0f} | {p95:.0f} |")
        client.close()


if __name__ == "__main__":
    main()
