"""Local schema registry (Apicurio Registry, stack/registry.py) start-up, memory and `schemas register`.

Warm (application cached): start to ready on a fresh H2 file database and a restart on existing data,
RSS idle and after every subject's history is registered, the registration itself (first run and the
idempotent re-run), stop. `--cold` also times the first fetch (an empty cache and Maven repository:
Maven downloads its plugin and the ~105 MB assembly).

    .venv/bin/python bench/registry_startup.py [--runs 3] [--cold] [--json]

Prints figures only; never fails on wall time. Results go into docs/benchmarks.md by hand.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from _common import machine, rss_mib

from base.settings import RegistrySettings
from schemas import DEFAULT_STORE
from schemas.registry_sync import RegistryApi, plan, register_all
from schemas.topics import all_topics
from stack import registry
from stack.broker import free_ports


def timed_start(cfg: registry.RegistryConfig) -> tuple[registry.LocalRegistry, float]:
    r = registry.LocalRegistry(cfg)
    t = time.monotonic()
    r.start()
    return r, time.monotonic() - t


def register_s(url: str) -> tuple[float, int]:
    plans = plan(DEFAULT_STORE, all_topics(), "", RegistrySettings().subject)
    t = time.monotonic()
    with RegistryApi(url) as api:
        done = register_all(api, plans)
    return time.monotonic() - t, len(done)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="starts to take the median of")
    ap.add_argument("--cold", action="store_true", help="also time the first fetch (downloads ~105 MB)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    version = RegistrySettings().version
    results: dict[str, object] = {
        "apicurio_version": version,
        "machine": machine(),
    }
    with tempfile.TemporaryDirectory(prefix="gpuledger-bench-registry-") as tmp:
        root = Path(tmp)
        (port,) = free_ports(1)
        if args.cold:
            t = time.monotonic()
            registry.ensure_app(version, root / "cache", maven_repo=root / "m2")
            results["cold_fetch_and_unpack_s"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        registry.ensure_app(version)  # the user cache: a no-op once fetched
        results["app_cached_check_s"] = round(time.monotonic() - t, 3)

        fresh, restart, first_reg, rereg, stops = [], [], [], [], []
        for i in range(args.runs):
            cfg = registry.RegistryConfig(data_dir=root / f"data{i}", port=port, version=version)
            r, s = timed_start(cfg)
            fresh.append(s)
            if i == 0:
                results["rss_idle_mib"] = round(rss_mib(r.pid or 0), 1)
            took, n = register_s(r.url)
            first_reg.append(took)
            results["schema_versions_registered"] = n
            took, _ = register_s(r.url)
            rereg.append(took)
            if i == 0:
                results["rss_after_register_mib"] = round(rss_mib(r.pid or 0), 1)
            t = time.monotonic()
            r.stop()
            stops.append(time.monotonic() - t)
            r, s = timed_start(cfg)  # restart on existing data: the ids are read back
            restart.append(s)
            r.stop()
        results["start_to_ready_fresh_s"] = round(statistics.median(fresh), 2)
        results["start_to_ready_restart_s"] = round(statistics.median(restart), 2)
        results["register_all_first_s"] = round(statistics.median(first_reg), 2)
        results["register_all_again_s"] = round(statistics.median(rereg), 2)
        results["stop_s"] = round(statistics.median(stops), 2)
        results["runs"] = args.runs
        app = registry.app_cache_dir(version) / "app"
        results["app_cache_mib"] = round(sum(f.stat().st_size for f in app.rglob("*") if f.is_file()) / 2**20, 1)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for k, v in results.items():
            print(f"{k:32} {v}")


if __name__ == "__main__":
    main()
