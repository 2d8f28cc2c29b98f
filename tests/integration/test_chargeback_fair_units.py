"""Fair units on the real ClickHouse engine, from samples to `report chargeback`: MIG slices charged at their
share of the GPU, the on-prem / cloud split and `--by tier`, and the data-quality figure on chargeback,
explain and journal.

The device-minutes come from the processors' own pipeline (`run_in_memory`: inventory, job events and
scrapes in, rollup rows out), so the share is derived where production derives it; the sinks' writer stores
them and the CLI reads the analyst views.

Node n1 has one H100 in MIG mode (instances 1: 1g.10gb and 3: 9g.99gb named by the inventory, 2: 3g.40gb named
only by the samples) and a whole H100; node cn1 is a cloud H100. Each of five jobs holds one device for
30 minutes (1800 s), every second sampled. Rates (micro-dollars per GPU-hour, shipped card): hopper on-prem
1,631,018, so 1g = 233,003 and 3g = 699,008 (tests/unit/test_mig.py); hopper cloud on-demand 6,980,000.

    job  team project  device                 rate       numerator = 1800 x rate
    M1   ml   p-ml     MIG 1 (1g.10gb, 1/7)    233,003      419,405,400
    M3   ml   p-ml     MIG 2 (3g.40gb, 3/7)    699,008    1,258,214,400
    U    ml   p-ml     MIG 3 (9g.99gb, ?)            0    (unpriced: 0.5 GPU-h)
    C    ml   p-burst  cloud H100 (default project) 6,980,000 12,564,000,000
    W    web  p-web    whole H100 (claimed p-ml)  1,631,018 2,935,832,400

One cent is 36,000,000. ml: 14,241,619,800 = 395.6005 cents; web: 81.5509 cents; total 477.1514 -> 477 cents.
Floors 395 + 81 = 476: the leftover cent goes to the larger remainder (ml .6005): ml 3.96, web 0.81.
By tier: on-prem 4,613,452,200 = 128.15 cents, cloud 349 cents: 1.28 and 3.49 (total 4.77).
ml's columns: cloud 3.49 (half-up of its cloud numerator), on-prem the rest, 0.47; web is all on-prem, 0.81.
Data quality: 5 jobs x 1800 s = 9000 s allocated, none dark (coverage 100.0); C's 1800 s on a default project
and W's 1800 s claimed are 20.0% each; U's 0.5 GPU-h unpriced, all of it a MIG slice of unknown profile.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from base.processor_settings import IdlePolicy, ProcessorSettings
from base.settings import ClickHouseSettings
from processors.pipeline import run_in_memory
from processors.testing import T0, device, inventory, job_event, scrape
from schemas import topics
from schemas.topics import DEVICE_SAMPLES, INVENTORY, JOB_EVENTS, job_key, node_key
from sinks.db import connect, migrate
from sinks.ratecard import RATE_CARD_COLUMNS, load_card, rate_card_rows
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
PERIOD = "2026-03"  # T0 is 2026-03-02T11:20Z
SECONDS = 1800
H100 = "NVIDIA H100 80GB HBM3"


def _held(uuid: str, mig: int | None = None) -> dict[str, Any]:
    return {"index": None, "uuid": uuid, "mig_instance_id": mig, "mig_profile": None}


def _start(job: str, node: str, dev: dict[str, Any], *, team: str, project: str, **extra: Any) -> dict[str, Any]:
    ev = job_event("STARTED", job, T0, {node: []}, team=team, project=project, user=f"u-{job}")
    ev["allocations"] = [{"node": node, "devices": [dev]}]
    ev["gang_size"] = ev["requested_devices"] = 1
    ev.update(extra)
    return ev


def _inventory() -> dict[str, Any]:
    inv = inventory("n1", ["GPU-M", "GPU-W"])
    mig = {"uuid": "GPU-M", "index": 0, "model": H100, "generation": "hopper"}
    inv["devices"] = [
        {**mig, "mig_instance_id": 1, "mig_profile": "1g.10gb"},
        {**mig, "mig_instance_id": 2, "mig_profile": None},  # the samples name this one
        {**mig, "mig_instance_id": 3, "mig_profile": "9g.99gb"},  # no such H100 profile
        {"uuid": "GPU-W", "index": 1, "model": H100, "generation": "hopper", "mig_profile": None,
         "mig_instance_id": None},
    ]  # fmt: skip
    return inv


def records() -> list[tuple[Any, bytes, dict[str, Any]]]:
    starts = [
        _start("M1", "n1", _held("GPU-M", 1), team="ml", project="p-ml"),
        _start("M3", "n1", _held("GPU-M", 2), team="ml", project="p-ml"),
        _start("U", "n1", _held("GPU-M", 3), team="ml", project="p-ml"),
        _start("C", "cn1", _held("GPU-C"), team="ml", project="p-burst", pricing_tier="cloud-on-demand",
               project_source="DEFAULT"),
        _start("W", "n1", _held("GPU-W"), team="web", project="p-web", project_claimed="p-ml"),
    ]  # fmt: skip
    out: list[tuple[Any, bytes, dict[str, Any]]] = [
        (INVENTORY, node_key("c1", "n1"), _inventory()),
        (INVENTORY, node_key("c1", "cn1"), inventory("cn1", ["GPU-C"])),
    ]
    out += [(JOB_EVENTS, job_key("c1", ev["job_id"]), ev) for ev in starts]
    for second in range(SECONDS):
        ts = T0 + second * 1000
        slice_3g = {**device("GPU-M", 0, sm=0.8, fb_mib=9000, model=H100, mig=2), "mig_profile": "3g.40gb"}
        n1 = [
            device("GPU-M", 0, sm=0.8, fb_mib=9000, model=H100, mig=1),
            slice_3g,
            device("GPU-M", 0, sm=0.8, fb_mib=9000, model=H100, mig=3),
            device("GPU-W", 1, sm=0.8, fb_mib=9000, model=H100),
        ]
        out.append((DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", ts, n1)))
        cloud = [device("GPU-C", 0, sm=0.8, fb_mib=9000)]
        out.append((DEVICE_SAMPLES, node_key("c1", "cn1"), scrape("cn1", ts, cloud)))
    end_ms = T0 + SECONDS * 1000
    for ev in starts:  # the same job ending: no allocations listed closes what it holds
        end = {**ev, "event_id": f"{ev['event_id']}/end", "event_type": "ENDED", "ts_ms": end_ms, "start_ts_ms": None,
               "end_ts_ms": end_ms, "allocations": []}  # fmt: skip
        out.append((JOB_EVENTS, job_key("c1", ev["job_id"]), end))
    out.append((DEVICE_SAMPLES, node_key("c1", "n1"), scrape("n1", T0 + (SECONDS + 130) * 1000, [])))  # time passes
    return out


@pytest.fixture
def ledger(clickhouse_server: Any, clickhouse_database: str) -> ClickHouseSettings:
    server = clickhouse_server
    ch = ClickHouseSettings(url=server.url, database=clickhouse_database, password=server.password,
                            analyst_password=server.analyst_password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    client.insert("rate_card", rate_card_rows(load_card(), 1), column_names=RATE_CARD_COLUMNS)
    recs = records()
    settings = ProcessorSettings(idle=IdlePolicy(idle_after_min_interactive=60, idle_after_min_batch=60))
    result = run_in_memory(recs, settings)
    pending = []
    for subject, rows in ((topics.DEVICE_MINUTES.name, result.device_minutes),
                          (JOB_EVENTS.name, [r for t, _, r in recs if t is JOB_EVENTS])):  # fmt: skip
        for spec in SINKS[subject]:
            pending += [Pending(spec, row, Origin(subject, 0, i)) for i, r in enumerate(rows) for row in spec.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected
    client.close()
    return ch


def cli(ch: ClickHouseSettings, *args: str) -> str:
    from gpuledger.cli import _register_all, app

    if not any(g.name == "report" for g in app.registered_groups):
        _register_all()
    env = {
        "GPULEDGER_CONFIG": str(REPO / "tests" / "no-such-gpuledger.toml"),
        "GPULEDGER_CLICKHOUSE__URL": ch.url,
        "GPULEDGER_CLICKHOUSE__DATABASE": ch.database,
        "GPULEDGER_CLICKHOUSE__PASSWORD": ch.password.get_secret_value(),
        "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": ch.analyst_password.get_secret_value(),
    }
    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_mig_slices_are_charged_at_their_share(ledger: ClickHouseSettings) -> None:
    analyst = connect(ledger, analyst=True)
    stored = analyst.query(
        "SELECT mig_instance_id, mig_profile, gpu_share_slices, gpu_share_of, sum(allocated_s) FROM device_minutes "
        "WHERE device_uuid = 'GPU-M' AND job_id != '' GROUP BY 1, 2, 3, 4 ORDER BY 1"
    ).result_rows
    assert stored == [(1, "1g.10gb", 1, 7, SECONDS), (2, "3g.40gb", 3, 7, SECONDS), (3, "9g.99gb", 0, 1, SECONDS)]
    rates = dict(analyst.query("SELECT job_id, any(rate_micro) FROM v_usage_priced GROUP BY job_id").result_rows)
    assert rates == {"M1": 233_003, "M3": 699_008, "U": 0, "C": 6_980_000, "W": 1_631_018}

    lines = {r["line"]: r for r in json.loads(cli(ledger, "report", "chargeback", "--period", PERIOD, "--format",
                                                  "json"))}  # fmt: skip
    assert {k: v["charge"] for k, v in lines.items()} == {"ml": "3.96", "web": "0.81", "TOTAL": "4.77"}
    ml, web = lines["ml"], lines["web"]
    assert (ml["onprem_charge"], ml["cloud_charge"]) == ("0.47", "3.49")
    assert (web["onprem_charge"], web["cloud_charge"]) == ("0.81", "0.00")
    assert (ml["onprem_gpu_h"], ml["cloud_gpu_h"], ml["unpriced_gpu_h"]) == ("1.5000", "0.5000", "0.5000")
    assert ml["allocated_gpu_h"] == "2.0000"  # device-hours: a slice-hour is one hour of that device


def test_by_tier_keeps_cloud_burst_apart(ledger: ClickHouseSettings) -> None:
    rows = json.loads(cli(ledger, "report", "chargeback", "--period", PERIOD, "--by", "tier", "--format", "json"))
    assert {r["line"]: r["charge"] for r in rows} == {"cloud-on-demand": "3.49", "on-prem": "1.28", "TOTAL": "4.77"}
    table = cli(ledger, "report", "chargeback", "--period", PERIOD, "--by", "tier")
    assert "cloud-on-demand" in table and "on-prem" in table


def test_every_output_carries_the_data_quality_figure(ledger: ClickHouseSettings) -> None:
    expected = {"dq_jobs": 5, "dq_coverage_pct": 100.0, "dq_unidentified_gpu_h": "0.000", "dq_unidentified_jobs": 0,
                "dq_default_project_pct": 20.0, "dq_claimed_project_pct": 20.0, "dq_unpriced_gpu_h": "0.500",
                "dq_unknown_mig_gpu_h": "0.500"}  # fmt: skip
    report = json.loads(cli(ledger, "report", "chargeback", "--period", PERIOD, "--format", "json"))
    assert all({k: row[k] for k in expected} == expected for row in report)

    text = cli(ledger, "report", "chargeback", "--period", PERIOD)
    assert (f"data quality ({PERIOD}, 5 jobs): coverage 100.0%, unidentified devices 0.000 GPU-h (0 jobs), "
            "default project 20.0%, claimed project 20.0% of allocated GPU-h, unpriced 0.500 GPU-h "
            "(0.500 on MIG slices of unknown profile)") in " ".join(text.split())  # fmt: skip

    # explain: the figure of the project's own jobs (M1, M3, U: no default, no claim, U unpriced)
    jobs = json.loads(cli(ledger, "report", "explain", "--project", "p-ml", "--period", PERIOD, "--format", "json"))
    assert sorted((j["job_id"], j["gpu_share_slices"], j["gpu_share_of"], j["charge"]) for j in jobs) == [
        ("M1", 1, 7, "0.12"), ("M3", 3, 7, "0.35"), ("U", 0, 1, "0.00")]  # 0.1165015 and 0.349504 half-up
    assert {(j["dq_jobs"], j["dq_default_project_pct"], j["dq_claimed_project_pct"], j["dq_unknown_mig_gpu_h"])
            for j in jobs} == {(3, 0.0, 0.0, "0.500")}  # fmt: skip
    assert "data quality (2026-03 project p-ml, 3 jobs)" in cli(ledger, "report", "explain", "--project", "p-ml",
                                                                "--period", PERIOD)  # fmt: skip

    journal = list(csv.DictReader(io.StringIO(cli(ledger, "report", "journal", "--period", PERIOD))))
    assert journal and all(row["dq_coverage_pct"] == "100.0" and row["dq_default_project_pct"] == "20.0"
                           and row["dq_claimed_project_pct"] == "20.0" for row in journal)  # fmt: skip
