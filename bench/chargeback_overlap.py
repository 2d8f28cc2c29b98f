"""Bench: the monthly chargeback (`report chargeback --by team`) with each device-second charged once across
clusters (migrations 016-017), against the same report priced without the reconciliation (014's
`v_usage_priced`, recreated in the bench database afterwards).

A one-cluster ledger of GPUS x MINUTES device-minutes (INSERT ... SELECT into device_minutes, so every
materialized view runs), optionally MOVED GPUs also claimed by a second cluster for 600 minutes (the
contested device-minutes the reconciliation settles). Embedded chDB server, clickhouse-connect over HTTP.

Usage: python bench/chargeback_overlap.py [--gpus 500] [--minutes 2880] [--moved 0] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sink_chargeback import ANALYST, PASSWORD, start_server  # noqa: E402

from base.settings import ClickHouseSettings  # noqa: E402
from sinks import chargeback as cb  # noqa: E402
from sinks.db import connect, migrate  # noqa: E402
from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows  # noqa: E402

NOV_2 = 1_793_577_600_000  # 2026-11-02T00:00Z
COLUMNS = (
    "cluster, node, device_uuid, mig_instance_id, minute_start_ms, model, generation, job_id, user, project, team, "
    "cost_centre, preemptible, pricing_tier, unallocated_s, allocated_s, active_s, starved_s, idle_s, dark_s, "
    "sm_weighted_s, sample_count, mapping_version, classifier_version"
)


def _load(client: object, gpus: int, minutes: int, moved: int) -> None:
    client.command(  # type: ignore[attr-defined]
        f"INSERT INTO device_minutes ({COLUMNS}) SELECT 'c1', concat('n', toString(intDiv(g, 8))), "
        f"concat('GPU-', toString(g)), -1, {NOV_2} + m * 60000, 'H100', 'hopper', concat('j', toString(g)), 'u', 'p', "
        "concat('t', toString(g % 50)), 'cc', false, 'on-prem', 0, 60, 60, 0, 0, 0, 40., 60, 'm1', 'c1' "
        f"FROM (SELECT number % {gpus} AS g, intDiv(number, {gpus}) AS m FROM numbers({gpus * minutes}))"
    )
    if moved:
        client.command(  # type: ignore[attr-defined]
            f"INSERT INTO device_minutes ({COLUMNS}) SELECT 'k8s', concat('kn', toString(g)), concat('GPU-', "
            f"toString(g)), -1, {NOV_2} + m * 60000, 'H100', 'hopper', concat('pod', toString(g)), 'u', 'p', 't0', "
            "'cc', false, 'on-prem', 0, 60, 60, 0, 0, 0, 40., 60, 'm1', 'c1' "
            f"FROM (SELECT number % {moved} AS g, 1000 + intDiv(number, {moved}) AS m FROM numbers({moved * 600}))"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=500)
    parser.add_argument("--minutes", type=int, default=2880)
    parser.add_argument("--moved", type=int, default=0, help="GPUs also claimed by a second cluster (600 min each)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    proc, url = start_server(Path(tempfile.mkdtemp(prefix="bench-overlap-")))
    try:
        ch = ClickHouseSettings(url=url, database="bench", password=PASSWORD, analyst_password=ANALYST)
        client = connect(ch)
        migrate(client, ch)
        client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
        t0 = time.perf_counter()
        _load(client, args.gpus, args.minutes, args.moved)
        print(f"{args.gpus * args.minutes:,} device-minutes, {args.moved * 600:,} more from a second cluster on "
              f"{args.moved} of the GPUs, loaded in {time.perf_counter() - t0:.1f}s")  # fmt: skip
        analyst = connect(ch, analyst=True)

        def timed(label: str) -> None:
            runs = []
            for _ in range(args.runs):
                t = time.perf_counter()
                report = cb.chargeback(analyst, "2026-11", "team")
                runs.append(time.perf_counter() - t)
            print(f"{label}: median {statistics.median(runs) * 1000:.0f} ms over {args.runs} runs, "
                  f"total ${report.total.charge}")  # fmt: skip

        timed("reconciled (016-017)")
        old = _before_views_moved("sinks/migrations/014_fair_units.sql")
        start = old.index("CREATE OR REPLACE VIEW v_usage_priced")
        view = old[start : old.index("CREATE OR REPLACE VIEW v_chargeback AS")]
        client.command(view.strip().rstrip(";"))
        timed("without reconciliation (014's v_usage_priced)")
    finally:
        proc.terminate()
        proc.wait(60)


def _before_views_moved(path: str) -> str:
    """A migration's text before the views moved to sinks/views (014's v_usage_priced is in git history only)."""
    git = ("git", "-C", str(REPO))
    added = subprocess.run([*git, "log", "--diff-filter=A", "--format=%H", "--", "sinks/views"], check=True,
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    rev = f"{added[-1]}^" if added else "HEAD"
    return subprocess.run([*git, "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout


if __name__ == "__main__":
    main()
