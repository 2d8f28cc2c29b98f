"""The sinks' commands end to end through the `gpuledger` entry point: db migrate, ratecard
load/show, alerts, reclaim exec (dry-run and live with fake Slurm tools), chat receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from contract_records import IDENTITY, job_event
from fixtures_cli import fake_slurm_tools, run_gpuledger
from test_chargeback_ledger import cli_env

from base.settings import ClickHouseSettings
from schemas import topics
from sinks.chat import apprise_send
from sinks.db import connect
from sinks.rows import SINKS
from sinks.view_files import load_views
from sinks.writer import LedgerWriter, Origin, Pending
from stack.broker import free_ports

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def gpuledger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_gpuledger(list(args), env, timeout=180, cwd=REPO)


@pytest.fixture
def env(clickhouse_server: Any, clickhouse_database: str) -> dict[str, str]:
    ch = ClickHouseSettings(
        url=clickhouse_server.url, database=clickhouse_database, password=clickhouse_server.password,
        analyst_password=clickhouse_server.analyst_password,
    )  # fmt: skip
    return {**os.environ, **cli_env(ch)}


def test_migrate_ratecard_alerts_jobs_and_reclaim(env: dict[str, str], tmp_path: Path) -> None:
    out = gpuledger(env, "db", "migrate")
    assert out.returncode == 0, out.stderr
    assert "001_ledger_tables: applied" in out.stdout and "004_analyst_role: skipped" in out.stdout
    views = len(load_views())  # a file's view and its variants
    assert "view v_usage_priced: created" in out.stdout and f"views: {views} changed, 0 unchanged" in out.stdout
    again = gpuledger(env, "db", "migrate").stdout
    assert "already-applied" in again and f"views: 0 changed, {views} unchanged" in again and "view v_" not in again

    loaded = gpuledger(env, "ratecard", "load")
    assert loaded.returncode == 0 and "rates loaded" in loaded.stdout, loaded.stderr
    shown = gpuledger(env, "ratecard", "show")
    assert "1.631018" in shown.stdout and "capex/h" in shown.stdout and "cloud-spot" in shown.stdout

    ch = ClickHouseSettings(url=env["GPULEDGER_CLICKHOUSE__URL"], database=env["GPULEDGER_CLICKHOUSE__DATABASE"],
                            password=env["GPULEDGER_CLICKHOUSE__PASSWORD"])  # fmt: skip
    client = connect(ch)
    events, identities = SINKS[topics.JOB_EVENTS.name]
    (alerts,) = SINKS[topics.ALERTS.name]
    alert = {"alert_id": "a-9", "kind": "IDLE_WARNING", "ts_ms": 5_000, "cluster": "c1", "job_id": "4242",
             "node": "n1", "device_uuids": ["GPU-a"], "user": "alice", "team": "vision", "project": "p-vision",
             "idle_minutes": 31, "cost_so_far": 1.2, "action": "SUSPEND", "action_at_ms": 9_000, "dry_run": True,
             "message": "idle", "appeal_route": None, "emitted_ts_ms": None}  # fmt: skip
    pending = []
    for i, rec in enumerate([job_event("STARTED", 1_000, identity=IDENTITY), job_event("ENDED", 2_000)]):
        pending += [Pending(spec, row, Origin("e", 0, i)) for spec in (events, identities) for row in spec.rows(rec)]
    pending += [Pending(alerts, row, Origin("a", 0, 0)) for row in alerts.rows(alert)]
    (coverage,) = SINKS[topics.COVERAGE_MINUTES.name]
    (raw,) = SINKS[topics.DEVICE_SAMPLES.name]
    for i, (reporting, unexpected) in enumerate(((8, 0), (6, 1))):
        cov = {"cluster": "c1", "node": "n1", "minute_start_ms": 1_793_491_200_000 + i * 60_000,
               "expected_devices": 8, "reporting_devices": reporting, "expected_device_s": 480,
               "reporting_device_s": reporting * 60, "unexpected_devices": unexpected}  # fmt: skip
        pending += [Pending(coverage, row, Origin("cov", 0, i)) for row in coverage.rows(cov)]
    now_ms = int(time.time() * 1000)
    scrape = {"cluster": "c1", "node": "n1", "ts_ms": now_ms, "source": "dcgm-exporter",
              "exporter_version": "3.3.9", "mapping_version": "m1",
              "devices": [{"uuid": "GPU-a", "index": 0, "mig_instance_id": None, "mig_profile": None, "model": "H100",
                           "pci_bus_id": None, "sm_active_ratio": 0.5, "sm_occupancy_ratio": None,
                           "gr_engine_active_ratio": None, "tensor_active_ratio": None, "dram_active_ratio": None,
                           "gpu_util_pct": 80.0, "mem_copy_util_pct": None, "fb_used_mib": 2048.0,
                           "fb_free_mib": None, "power_w": 350.0, "pcie_tx_bytes_per_s": None,
                           "pcie_rx_bytes_per_s": None, "temperature_c": 55.0, "xid_last": None, "pod": None,
                           "namespace": None, "container": None, "hpc_job": "4242"}]}  # fmt: skip
    old_scrape = {**scrape, "ts_ms": now_ms - 30 * 86_400_000}  # past the 14-day TTL
    pending += [Pending(raw, row, Origin("raw", 0, 0)) for rec in (scrape, old_scrape) for row in raw.rows(rec)]
    writer = LedgerWriter(client)
    assert not writer.write(pending).rejected
    assert writer.write(pending).skipped_duplicates == 2  # the coverage minutes, replayed
    assert client.query("SELECT coverage_pct, unexpected_device_minutes FROM v_coverage_daily").result_rows == [
        (87.5, 1)  # (480 + 360) / 960
    ]
    client.command("OPTIMIZE TABLE raw_samples FINAL")  # applies the TTL now instead of at a later merge
    assert client.query("SELECT ts_ms, hpc_job, sm_active_ratio FROM raw_samples").result_rows == [
        (now_ms, "4242", 0.5)
    ]
    state = client.query("SELECT state, team, start_ts_ms FROM v_jobs_current WHERE job_id = '4242'").result_rows
    assert state == [("ENDED", "vision", 1_000)]
    assert client.query("SELECT count() FROM identity_snapshots FINAL").result_rows[0][0] == 1

    listed = gpuledger(env, "alerts", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    assert [a["job_id"] for a in json.loads(listed.stdout)] == ["4242"]
    assert gpuledger(env, "alerts", "--limit", "0").stderr.count("\n") == 1

    # Reclaim: dry-run by default, every step recorded.
    dry = gpuledger(env, "reclaim", "exec", "--scheduler", "slurm", "--job", "4242", "--action",
                    "checkpoint_then_cancel", "--cluster", "c1")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "1. scancel --signal=USR1 --full 4242: planned" in dry.stdout
    bad = gpuledger(env, "reclaim", "exec", "--scheduler", "slurm", "--job", "42;reboot", "--action", "cancel")
    assert bad.returncode == 2 and "not a Slurm job id" in bad.stderr and len(bad.stderr.splitlines()) == 1

    # Live, with fake Slurm tools on PATH.
    bindir, calls = fake_slurm_tools(tmp_path)
    live_env = {**env, "PATH": f"{bindir}{os.pathsep}{env['PATH']}", "GPULEDGER_SINKS__RECLAIM_CHECKPOINT_GRACE_S": "0"}
    live = gpuledger(live_env, "reclaim", "exec", "--scheduler", "SLURM", "--job", "4242", "--action",
                     "CHECKPOINT_THEN_REQUEUE", "--execute")  # fmt: skip
    assert live.returncode == 0, live.stderr
    assert calls.read_text().splitlines() == [  # the restart count first: what a requeue in doubt is judged by
        "scontrol show job -o 4242", "scancel --signal=USR1 --full 4242", "scontrol requeuehold 4242"]
    outcomes = client.query("SELECT dry_run, status, count() FROM action_outcomes FINAL GROUP BY dry_run, status "
                            "ORDER BY dry_run, status").result_rows  # fmt: skip
    assert outcomes == [(False, "ok", 3), (False, "started", 1), (True, "planned", 3)]
    rerun = gpuledger(live_env, "reclaim", "exec", "--scheduler", "SLURM", "--job", "4242", "--action",
                      "CHECKPOINT_THEN_REQUEUE", "--execute")  # fmt: skip
    assert rerun.returncode == 0 and len(calls.read_text().splitlines()) == 6  # a new action id: runs

    # An action from the topic, executed (dry-run) by the executor: v_actions shows how it ended.
    from sinks.reclaim import ClickHouseRecorder, ReclaimExecutor

    (actions,) = SINKS[topics.RECLAIM_ACTIONS.name]
    act = {"action_id": "act-1", "ts_ms": 3_000, "cluster": "c1", "job_id": "4242", "scheduler": "SLURM",
           "action": "CANCEL", "dry_run": True, "reason": "idle 60 min", "device_uuids": ["GPU-a"],
           "user": "alice", "project": "p-vision"}  # fmt: skip
    # Slurm's suspend keeps the GPUs, so a SUSPEND for a Slurm job is refused and ends as failed.
    suspend = {**act, "action_id": "act-2", "action": "SUSPEND"}
    LedgerWriter(client).write([Pending(actions, row, Origin("act", i, 0))
                                for i, a in enumerate((act, suspend)) for row in actions.rows(a)])  # fmt: skip
    for a in (act, suspend):
        ReclaimExecutor(ClickHouseRecorder(client)).execute(a)
    assert client.query("SELECT action_id, outcome, steps_recorded FROM v_actions ORDER BY action_id").result_rows == [
        ("act-1", "planned", 1), ("act-2", "failed", 1)
    ]  # fmt: skip
    client.close()


def test_chat_receiver_command_stores_what_it_gets(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    out = tmp_path / "received.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", "chat", "receiver", "--port", str(port),
         "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and "webhook receiver on http://127.0.0.1:" in proc.stdout.readline()
        assert apprise_send(f"json://127.0.0.1:{port}/team-vision", "hello", "channel: #vision\nevidence: GPU-a")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not out.exists():
            time.sleep(0.05)
        got = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/received", timeout=5).read())
        assert got[0]["path"] == "/team-vision" and "GPU-a" in got[0]["body"]["message"]
        assert json.loads(out.read_text().splitlines()[0])["body"]["title"] == "hello"
    finally:
        proc.terminate()
        proc.wait(30)


def test_warehouse_errors_are_one_line(env: dict[str, str]) -> None:
    # The test database exists but nothing is migrated: the report says what to do, in one line.
    out = gpuledger(env, "report", "chargeback", "--period", "2026-11")
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "gpuledger db migrate" in out.stderr
    down = gpuledger({**env, "GPULEDGER_CLICKHOUSE__URL": "http://127.0.0.1:9"}, "alerts")
    assert down.returncode == 2 and len(down.stderr.strip().splitlines()) == 1, down.stderr
    assert "cannot reach ClickHouse" in down.stderr
