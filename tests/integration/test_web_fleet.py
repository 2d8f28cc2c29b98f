"""The fleet page (/fleet) against a real pipeline run stored in the embedded ClickHouse: the simulator through
the processors, the sinks' writer storing job events, device-minutes and the coverage minutes (its dead exporter
and its silent device are coverage gaps), plus one job on a generation the rate card does not price. The teams
side by side equal `report chargeback --by team`, the other tables equal what the raw tables hold, and only
operators and finance see it.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from collections.abc import Iterator
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest
from fixtures_web import END_MS, PERIOD, POLICY, SIM, make_client, run_cli, simulated_database

from base.processor_settings import ProcessorSettings
from base.settings import BrokerSettings, ClickHouseSettings, Settings, WebSettings
from producers.simulator import simulate
from web.model import gpu_h

pytestmark = pytest.mark.integration
OPS = {"X-Forwarded-User": "ops00"}
TABLES = ("teams", "trend", "generations", "queue", "idle_leaders", "coverage_gaps", "unpriced")
UNPRICED_JOB = ("sim", "kepler-1")


def write_coverage(client: Any) -> int:
    from processors.pipeline import run_in_memory
    from schemas import topics
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending

    result = run_in_memory(list(simulate(SIM)), ProcessorSettings(idle=POLICY))
    name = topics.COVERAGE_MINUTES.name
    pending = [Pending(spec, row, Origin(name, 0, i)) for spec in SINKS[name]
               for i, r in enumerate(result.coverage_minutes) for row in spec.rows(r)]  # fmt: skip
    written = LedgerWriter(client).write(pending)
    assert not written.rejected
    return len(pending)


@pytest.fixture(scope="module")
def fleet_ledger(clickhouse_server: Any) -> Iterator[ClickHouseSettings]:
    with simulated_database(clickhouse_server, "fleet_") as (ch, client):
        assert write_coverage(client) > 0
        # Two hours of one GPU on a generation the rate card has no rate for: unpriced hours of team vision.
        client.command(
            "INSERT INTO device_minutes (cluster, node, device_uuid, minute_start_ms, model, generation, job_id, user, "
            "project, team, pricing_tier, allocated_s, active_s, mapping_version, classifier_version) "
            "SELECT 'sim', 'old-node', 'GPU-old', {start:Int64} + number * 60000, 'Tesla K80', 'kepler', {job:String}, "
            "'vis01', 'vision-detect', 'vision', 'on-prem', 60, 60, 'm', 'c1' FROM numbers(120)",
            parameters={"start": SIM.start_ms - SIM.start_ms % 60_000, "job": UNPRICED_JOB[1]},
        )
        yield ch


@pytest.fixture(scope="module")
def fleet_app(fleet_ledger: ClickHouseSettings, tmp_path_factory: Any) -> Any:
    settings = Settings(state_dir=tmp_path_factory.mktemp("fleet"), cluster="sim", clickhouse=fleet_ledger,
                        broker=BrokerSettings(enabled=False), web=WebSettings(demo=False))  # fmt: skip
    return make_client(settings, now_ms=END_MS)


def csv_of(app: Any, table: str) -> list[dict[str, str]]:
    resp = app.get(f"/fleet?period={PERIOD}&csv={table}", headers=OPS)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/csv"), (table, resp.text[:300])
    assert "attachment" in resp.headers["content-disposition"]
    return list(csv.DictReader(io.StringIO(resp.text)))


def raw(ch: ClickHouseSettings, sql: str) -> list[tuple[Any, ...]]:
    from sinks.db import connect

    client = connect(ch)
    try:
        return list(client.query(sql).result_rows)
    finally:
        client.close()


def test_only_operators_and_finance_see_the_fleet(fleet_app: Any) -> None:
    page = fleet_app.get(f"/fleet?period={PERIOD}", headers=OPS)
    assert page.status_code == 200 and 'id="fleet-title"' in page.text and "<svg" in page.text
    for table in TABLES:
        assert f'id="csv-{table}"' in page.text, table
    assert fleet_app.get(f"/fleet?period={PERIOD}", headers={"X-Forwarded-User": "fin00"}).status_code == 200
    finance = {"X-Forwarded-User": "someone", "X-Forwarded-Groups": "gpuledger-finance"}
    assert fleet_app.get(f"/fleet?period={PERIOD}", headers=finance).status_code == 200
    for user in ("vis01", "vis00"):  # a member, a team's lead
        denied = fleet_app.get(f"/fleet?period={PERIOD}", headers={"X-Forwarded-User": user})
        assert denied.status_code == 403 and "operators and finance" in denied.text, user
        assert fleet_app.get(f"/fleet?period={PERIOD}&csv=teams", headers={"X-Forwarded-User": user}).status_code == 403
        assert 'id="nav-fleet"' not in fleet_app.get(f"/?period={PERIOD}", headers={"X-Forwarded-User": user}).text
    assert 'id="nav-fleet"' in fleet_app.get(f"/?period={PERIOD}", headers=OPS).text
    assert fleet_app.get(f"/fleet?period={PERIOD}").status_code == 401


def test_teams_side_by_side_and_the_totals_equal_report_chargeback(fleet_app: Any, fleet_ledger: Any) -> None:
    out = run_cli(fleet_ledger, "report", "chargeback", "--period", PERIOD, "--by", "team", "--format", "csv")
    report = {r["line"]: r for r in csv.DictReader(io.StringIO(out))}
    total = report.pop("TOTAL")
    shown = {r["team"]: r for r in csv_of(fleet_app, "teams")}
    assert set(shown) == set(report) and len(shown) >= 3
    for team, row in shown.items():
        for key, value in row.items():
            if key != "team":
                assert value == str(report[team][key]), (team, key)
    html = fleet_app.get(f"/fleet?period={PERIOD}", headers=OPS).text
    figures = dict(re.findall(r'id="fig-([a-z-]+)".*?data-raw="([^"]*)"', html, re.S))
    for fig, key in (("charge", "charge"), ("idle-cost", "idle_cost"), ("allocated", "allocated_gpu_h"),
                     ("consumed", "consumed_gpu_h"), ("unpriced", "unpriced_gpu_h"), ("jobs", "jobs")):  # fmt: skip
        assert Decimal(figures[fig]) == Decimal(total[key]), fig
    assert Decimal(total["unpriced_gpu_h"]) == Decimal("2.0000")  # the kepler job, and nothing else


def test_trend_and_generations_equal_the_device_minutes(fleet_app: Any, fleet_ledger: Any) -> None:
    per_day = {d.isoformat(): (int(a), int(c)) for d, a, c in raw(fleet_ledger,
               "SELECT toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS d, sum(allocated_s), "
               "sum(active_s + starved_s) FROM device_minutes FINAL GROUP BY d")}  # fmt: skip
    trend = csv_of(fleet_app, "trend")
    assert len(trend) == 31  # every day of March
    for row in trend:
        alloc, consumed = per_day.get(row["day"], (0, 0))
        assert (row["allocated_gpu_h"], row["consumed_gpu_h"]) == (str(gpu_h(alloc)), str(gpu_h(consumed))), row
    per_gen = {str(g): (int(a), int(c)) for g, a, c in raw(fleet_ledger,
               "SELECT generation, sum(allocated_s), sum(active_s + starved_s) FROM device_minutes FINAL "
               "WHERE job_id != '' GROUP BY generation")}  # fmt: skip
    generations = {r["generation"]: r for r in csv_of(fleet_app, "generations")}
    assert set(generations) == set(per_gen)
    for gen, (alloc, consumed) in per_gen.items():
        assert generations[gen]["allocated_gpu_h"] == str(gpu_h(alloc)), gen
        assert generations[gen]["consumed_gpu_h"] == str(gpu_h(consumed)), gen
    assert generations["kepler"]["unpriced_gpu_h"] == "2.0000" and generations["kepler"]["charge"] == "0.00"
    (unpriced,) = csv_of(fleet_app, "unpriced")
    assert (unpriced["generation"], unpriced["unpriced_gpu_h"]) == ("kepler", "2.0000")


def test_coverage_gaps_are_the_devices_present_but_not_reporting(fleet_app: Any, fleet_ledger: Any) -> None:
    missing = {(str(c), str(n)): int(m) for c, n, m in raw(fleet_ledger,
               "SELECT cluster, node, sum(expected_device_s) - sum(reporting_device_s) AS m FROM coverage_minutes "
               "FINAL GROUP BY cluster, node HAVING m > 0")}  # fmt: skip
    assert missing, "the simulator's dead exporter and silent device leave gaps"
    rows = csv_of(fleet_app, "coverage_gaps")
    assert {(r["cluster"], r["node"]): r["missing_gpu_h"] for r in rows} == {
        k: str(gpu_h(v)) for k, v in missing.items()}
    assert [r["node"] for r in rows] == [n for (_, n), _ in sorted(missing.items(), key=lambda kv: (-kv[1], kv[0]))]


def test_queue_wait_per_generation_from_the_job_events(fleet_app: Any, fleet_ledger: Any) -> None:
    events = raw(fleet_ledger, "SELECT cluster, job_id, min(submit_ts_ms), min(start_ts_ms) FROM job_events "
                               "WHERE submit_ts_ms IS NOT NULL AND start_ts_ms IS NOT NULL GROUP BY cluster, job_id")
    generation = {(str(c), str(j)): str(g) for c, j, g in raw(fleet_ledger,
                  "SELECT cluster, job_id, any(generation) FROM device_minutes WHERE job_id != '' "
                  "GROUP BY cluster, job_id")}  # fmt: skip
    waits: dict[str, list[int]] = defaultdict(list)
    for c, j, submit, start in events:
        if (str(c), str(j)) in generation:
            waits[generation[(str(c), str(j))]].append(max(0, int(start) - int(submit)))
    assert waits
    shown = {r["generation"]: r for r in csv_of(fleet_app, "queue")}
    assert set(shown) == set(waits)
    for gen, ms in waits.items():
        assert int(shown[gen]["jobs"]) == len(ms), gen
        longest = (Decimal(max(ms)) / 60_000).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
        assert Decimal(shown[gen]["wait_max_min"]) == longest, gen


def test_idle_leaders_are_the_teams_costliest_idle_jobs(fleet_app: Any) -> None:
    leaders = csv_of(fleet_app, "idle_leaders")
    assert leaders and all(Decimal(r["idle_cost"]) > 0 for r in leaders)
    assert [Decimal(r["idle_cost"]) for r in leaders] == sorted((Decimal(r["idle_cost"]) for r in leaders),
                                                                 reverse=True)  # fmt: skip
    top = leaders[0]
    team_top = fleet_app.get(f"/teams/{top['team']}?period={PERIOD}&csv=idle_jobs", headers=OPS).text
    first = next(csv.DictReader(io.StringIO(team_top)))
    assert (first["job_id"], first["idle_cost"]) == (top["job_id"], top["idle_cost"])


def test_policy_drift_shows_until_the_watch_says_it_is_gone(fleet_app: Any, fleet_ledger: Any) -> None:
    """The policy watch's alerts stored by the sinks' own writer (issue 41 item 1): the fleet page lists an engine
    whose latest word is a drift, with each differing line, whatever the month, and drops it once cleared."""
    from producers.policy_engine import EngineDiff
    from producers.policy_watch import step
    from schemas import topics
    from schemas.records import Alert
    from sinks.db import connect
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending
    from web.model import utc_minute

    def store(alerts: list[dict[str, Any]]) -> None:
        client = connect(fleet_ledger)
        try:
            pending = [Pending(spec, row, Origin(topics.ALERTS.name, 0, i)) for spec in SINKS[topics.ALERTS.name]
                       for i, a in enumerate(alerts) for row in spec.rows(Alert.from_avro(a))]  # fmt: skip
            assert not LedgerWriter(client).write(pending).rejected
        finally:
            client.close()

    lines = ("qos prod: Priority is 5, policy says 1000", "association serve: GrpTRES is gres/gpu:h100=2, policy says "
             "gres/gpu:h100=1")  # fmt: skip
    state, drift = step({}, "sim", EngineDiff("slurm", lines), END_MS - 60_000)
    clean = step({}, "sim", EngineDiff("kueue", ()), END_MS - 60_000)[1]
    store([*drift, *clean])
    shown = csv_of(fleet_app, "policy_drift")
    assert shown == [{"cluster": "sim", "engine": "slurm", "since": utc_minute(END_MS - 60_000),
                      "differences": "; ".join(lines)}]  # kueue's clean: not listed
    assert "Policy drift" in fleet_app.get(f"/fleet?period={PERIOD}", headers=OPS).text
    store(step(state, "sim", EngineDiff("slurm", ()), END_MS)[1])
    assert csv_of(fleet_app, "policy_drift") == []
    assert "Policy drift" not in fleet_app.get(f"/fleet?period={PERIOD}", headers=OPS).text



def test_each_policy_apply_is_listed_with_who_and_each_setting_before_and_after(fleet_app: Any,
                                                                                fleet_ledger: Any) -> None:  # fmt: skip
    """policy.applied.v1 records (producers/policy_audit.py) stored by the sinks' writer, listed newest first."""
    from producers.policy_audit import applied_event
    from producers.policy_slurm import Drift
    from schemas import topics
    from schemas.records import PolicyApplied
    from sinks.db import connect
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending
    from web.model import utc_minute

    first = applied_event(cluster="sim", engine="slurm", actor="ops1", actor_source="os-user", policy_hash="a",
                          before=[Drift("qos", "prod", "Priority", "1000", "5")], still_differs=[], now_ms=END_MS)
    second = applied_event(cluster="sim", engine="kueue", actor="ops2", actor_source="kubernetes", policy_hash="a",
                           before=[], still_differs=["x: y"], now_ms=END_MS + 60_000)  # fmt: skip
    client = connect(fleet_ledger)
    try:
        name = topics.POLICY_APPLIED.name
        pending = [Pending(spec, row, Origin(name, 0, i)) for spec in SINKS[name]
                   for i, e in enumerate([first, second]) for row in spec.rows(PolicyApplied.from_avro(e))]  # fmt: skip
        assert not LedgerWriter(client).write(pending).rejected
    finally:
        client.close()
    assert csv_of(fleet_app, "policy_applies") == [
        {"when": utc_minute(END_MS + 60_000), "cluster": "sim", "engine": "kueue", "who": "ops2 (kubernetes)",
         "changes": "nothing differed", "still_differs": "x: y"},
        {"when": utc_minute(END_MS), "cluster": "sim", "engine": "slurm", "who": "ops1 (os-user)",
         "changes": "qos prod Priority: 5 -> 1000", "still_differs": ""},
    ]
