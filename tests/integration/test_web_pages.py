"""The team page against a real pipeline run (the simulator through the processors, stored by the sinks'
writer in the embedded ClickHouse): its statement equals `report chargeback --format csv` to the cent, its
lines add up to the statement, and the drill-down down to device-minutes agrees with the simulator's
expected ledger (written from the ground truth, no processor code). Scoping and hostile input too.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from decimal import Decimal
from typing import Any

import pytest
from fixtures_web import (
    END_MS,
    PERIOD,
    SIM,
    Published,
    make_client,
    run_cli,
    small_ledger,
    web_app,
    web_ledger,
    web_settings,
)

from producers.simulator import expected_ledger
from web.model import gpu_h

pytestmark = pytest.mark.integration
__all__ = ["small_ledger", "web_app", "web_ledger", "web_settings"]  # fixtures used by name
LEAD, MEMBER, OTHER = "vis00", "vis01", "nlp01"  # the simulator's directory: the first user of a team leads it
FIGURES = {"charge": "charge", "allocated": "allocated_gpu_h", "consumed": "consumed_gpu_h",
           "utilisation": "utilisation_pct", "idle-cost": "idle_cost", "active": "active_gpu_h",
           "starved": "starved_gpu_h", "idle": "idle_gpu_h", "dark": "dark_gpu_h", "coverage": "coverage_pct",
           "jobs": "jobs", "unpriced": "unpriced_gpu_h"}  # fmt: skip


def as_user(user: str, groups: str = "") -> dict[str, str]:
    return {"X-Forwarded-User": user, **({"X-Forwarded-Groups": groups} if groups else {})}


def figures(html: str) -> dict[str, str]:
    found = dict(re.findall(r'id="fig-([a-z-]+)".*?data-raw="([^"]*)"', html, re.S))
    return {FIGURES[k]: v for k, v in found.items() if k in FIGURES}


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def report(web_ledger: Any, by: str = "team") -> dict[str, dict[str, str]]:
    ch, _ = web_ledger
    out = run_cli(ch, "report", "chargeback", "--period", PERIOD, "--by", by, "--format", "csv")
    return {row["line"]: row for row in csv_rows(out)}


def expected_by(key: str) -> dict[str, dict[str, int]]:
    sums: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job in expected_ledger(SIM).values():
        for field in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s"):
            sums[getattr(job, key)][field] += getattr(job, field)
    return sums


def test_every_team_statement_equals_report_chargeback_csv(web_app: Any, web_ledger: Any) -> None:
    lines = report(web_ledger)
    teams = [t for t in lines if t != "TOTAL"]
    assert len(teams) >= 3
    for team in teams:
        resp = web_app.get(f"/teams/{team}?period={PERIOD}", headers=as_user("ops00"))
        assert resp.status_code == 200, resp.text
        shown = figures(resp.text)
        for key, value in shown.items():
            assert value == str(lines[team][key]), (team, key)
        assert PERIOD in resp.text and "01 Mar 2026" in resp.text  # the period's dates beside the figures


def test_statement_agrees_with_the_simulators_ground_truth(web_app: Any) -> None:
    for team, truth in expected_by("team").items():
        shown = figures(web_app.get(f"/teams/{team}?period={PERIOD}", headers=as_user("ops00")).text)
        assert shown["allocated_gpu_h"] == str(gpu_h(truth["allocated_s"])), team
        assert shown["idle_gpu_h"] == str(gpu_h(truth["idle_s"])), team
        assert shown["dark_gpu_h"] == str(gpu_h(truth["dark_s"])), team
        assert shown["consumed_gpu_h"] == str(gpu_h(truth["active_s"] + truth["starved_s"])), team


def test_projects_and_users_add_up_to_the_statement(web_app: Any, web_ledger: Any) -> None:
    lines = report(web_ledger)
    by_project = report(web_ledger, "project")
    truth = expected_by("project")
    for team in (t for t in lines if t != "TOTAL"):
        for table in ("projects", "users"):
            resp = web_app.get(f"/teams/{team}?period={PERIOD}&csv={table}", headers=as_user("ops00"))
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/csv")
            assert "attachment" in resp.headers["content-disposition"]
            rows = csv_rows(resp.text)
            assert sum(Decimal(r["charge"]) for r in rows) == Decimal(lines[team]["charge"]), (team, table)
            assert sum(int(r["jobs"]) for r in rows) == int(lines[team]["jobs"]), (team, table)
        projects = web_app.get(f"/teams/{team}?period={PERIOD}&csv=projects", headers=as_user("ops00")).text
        for row in csv_rows(projects):
            # Every project belongs to one team in the simulator: its line is the report's project line.
            assert row["allocated_gpu_h"] == by_project[row["project"]]["allocated_gpu_h"]
            assert row["allocated_gpu_h"] == str(gpu_h(truth[row["project"]]["allocated_s"]))


def test_the_team_month_grouped_in_sql_equals_the_lines_built_from_its_jobs(web_ledger: Any) -> None:
    """The team page groups the month in ClickHouse (`team_usage`); its lines, total, quota seconds and
    costliest idle jobs are what the same rows give one job at a time (`team_jobs`, the project page's read)."""
    from sinks.db import connect
    from web import model as m
    from web import params
    from web.queries import Warehouse

    ch, _ = web_ledger
    wh = Warehouse(connect(ch, analyst=True))
    period = params.period(PERIOD, END_MS)
    statements = wh.statements(period)
    assert len(statements) > 1
    for team, statement in statements.items():
        jobs = wh.team_jobs(period, team)
        usage = wh.team_usage(period, team)
        charge = statement.figures["charge"]
        for key in ("project", "user", "cluster"):
            assert m.grouped_lines(usage.by[key], key, charge) == m.lines_by(jobs, key, charge), (team, key)
        whole = m.total(jobs)
        assert usage.total.figures() == whole.figures() and usage.total.unpriced_s == whole.unpriced_s, team
        assert usage.total.job_count == len({j.key for j in jobs}) > 0, team
        onprem: dict[str, int] = defaultdict(int)
        for job in jobs:
            if job.pricing_tier == "on-prem":
                onprem[job.generation] += job.allocated_s
        assert usage.onprem_s == onprem, team
        assert m.most_idle_cost(usage.most_idle) == m.most_idle_cost(jobs), team
        assert len(usage.most_idle) == min(10, sum(1 for j in m.merge_segments(jobs) if j.idle_charge_num > 0))
        assert usage.days == wh.daily(period, team) and usage.days, team


def test_drill_down_project_to_job_to_device_minutes_matches_the_expected_ledger(web_app: Any) -> None:
    ledger = expected_ledger(SIM)
    job = max((j for j in ledger.values() if j.team == "vision"), key=lambda j: j.idle_s)
    projects = web_app.get(f"/teams/vision?period={PERIOD}", headers=as_user(LEAD)).text
    assert f"/teams/vision/projects/{job.project}?period={PERIOD}" in projects
    listing = web_app.get(f"/teams/vision/projects/{job.project}?period={PERIOD}&csv=jobs", headers=as_user(LEAD))
    rows = {r["job_id"]: r for r in csv_rows(listing.text)}
    assert set(rows) == {j.job_id for j in ledger.values() if j.project == job.project and j.team == "vision"}
    assert rows[job.job_id]["allocated_gpu_h"] == str(gpu_h(job.allocated_s))
    page = web_app.get(f"/jobs/sim/{job.job_id}?period={PERIOD}", headers=as_user(LEAD))
    assert page.status_code == 200 and "<svg" in page.text and "c-idle" in page.text
    url = f"/jobs/sim/{job.job_id}?period={PERIOD}"
    minutes = csv_rows(web_app.get(f"{url}&csv=minutes", headers=as_user(LEAD)).text)
    for field in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s"):
        assert sum(int(m[field]) for m in minutes) == getattr(job, field), field
    assert {m["classifier_version"] for m in minutes} == {"c1"} and all(m["mapping_version"] for m in minutes)
    assert {m["class"].split(" ")[0] for m in minutes} <= {"active", "starved", "idle", "dark"}
    devices = csv_rows(web_app.get(f"/jobs/sim/{job.job_id}?period={PERIOD}&csv=devices", headers=as_user(LEAD)).text)
    assert len(devices) == job.gpus


def test_a_projects_jobs_come_a_page_at_a_time_and_the_csv_holds_them_all(
    web_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from web import pages

    ledger = expected_ledger(SIM)
    counts: dict[str, int] = defaultdict(int)
    for j in ledger.values():
        if j.team == "vision":
            counts[j.project] += 1
    project = max(counts, key=lambda p: counts[p])
    assert counts[project] >= 3
    monkeypatch.setattr(pages, "PROJECT_JOBS_PAGE", 2)
    url = f"/teams/vision/projects/{project}?period={PERIOD}"
    whole = [r["job_id"] for r in csv_rows(web_app.get(f"{url}&csv=jobs", headers=as_user(LEAD)).text)]
    assert len(whole) == counts[project]  # the CSV: every job, whatever the page
    n_pages = -(-len(whole) // 2)
    seen: list[str] = []
    for n in range(1, n_pages + 2):
        html = web_app.get(f"{url}&page={n}", headers=as_user(LEAD)).text
        shown = re.findall(r'<a href="/jobs/sim/([^"?]+)\?', html)
        assert len(shown) == (2 if n < n_pages else len(whole) - 2 * (n_pages - 1) if n == n_pages else 0), n
        assert figures(html)["allocated_gpu_h"] == figures(web_app.get(url, headers=as_user(LEAD)).text)[
            "allocated_gpu_h"]  # the month's figures on every page
        assert 'id="job-pages"' in html and (f"<strong>{n}</strong>" in html) == (n <= n_pages)
        seen += shown
    assert seen == whole  # most charged first, each job on one page
    assert web_app.get(f"{url}&page=0", headers=as_user(LEAD)).status_code == 400


def test_open_idle_warnings_show_when_the_action_is_due(web_app: Any, web_ledger: Any) -> None:
    ch, _ = web_ledger
    from sinks.db import connect

    analyst = connect(ch, analyst=True)
    alerts = analyst.query(
        "SELECT team, job_id, kind, ts_ms, action_at_ms FROM alerts FINAL WHERE kind IN "
        "('IDLE_WARNING', 'IDLE_RESOLVED', 'RECLAIM_NOTICE') ORDER BY ts_ms"
    ).result_rows
    latest: dict[tuple[str, str], tuple[str, int | None]] = {}
    for team, job, kind, _, at in alerts:
        latest[(team, job)] = (kind, at)
    ledger = expected_ledger(SIM)
    still_held = {j.job_id for j in ledger.values() if j.end_ms > END_MS - 60_000}
    expected = {(t, j): at for (t, j), (kind, at) in latest.items() if kind == "IDLE_WARNING" and j in still_held}
    shown = {}
    for team in {t for t, _ in latest}:
        text = web_app.get(f"/teams/{team}?period={PERIOD}&csv=warnings", headers=as_user("ops00")).text
        shown.update({(team, r["job_id"]): r for r in csv_rows(text)})
    assert set(shown) == set(expected)
    for row in shown.values():
        assert row["due"].startswith(("in ", "overdue by ")) and row["action"]


def test_a_member_sees_only_their_teams(web_app: Any) -> None:
    assert web_app.get(f"/teams/vision?period={PERIOD}", headers=as_user(MEMBER)).status_code == 200
    denied = web_app.get(f"/teams/vision?period={PERIOD}", headers=as_user(OTHER))
    assert denied.status_code == 403 and "nlp" in denied.text
    assert web_app.get(f"/teams/vision/projects/vision-seg?period={PERIOD}", headers=as_user(OTHER)).status_code == 403
    home = web_app.get(f"/?period={PERIOD}", headers=as_user(OTHER)).text
    assert 'id="team-nlp"' in home and 'id="team-vision"' not in home
    assert web_app.get(f"/teams/vision?period={PERIOD}", headers=as_user("fin00")).status_code == 200
    finance = as_user("someone", "gpuledger-finance")
    assert web_app.get(f"/teams/vision?period={PERIOD}", headers=finance).status_code == 200
    assert web_app.get(f"/teams/vision?period={PERIOD}").status_code == 401


def test_a_proxy_header_from_an_untrusted_address_is_ignored(web_settings: Any) -> None:
    from starlette.testclient import TestClient

    from web.app import create_app
    from web.context import build_context

    client = TestClient(create_app(build_context(web_settings)), client=("10.1.2.3", 5000))
    assert client.get(f"/teams/vision?period={PERIOD}", headers=as_user("ops00")).status_code == 401


@pytest.mark.parametrize("path", [
    "/teams/vision?period=2026-3", "/teams/vision?period=2026-13", "/teams/vision?period=2026-03-01",
    "/teams/vision?period=1999-12", "/teams/vision?period=%202026-03", "/teams/vision?period=2026-03%0a",
    "/teams/vis'ion?period=2026-03", "/teams/" + "v" * 65 + "?period=2026-03",
    "/teams/vision?period=2026-03&csv=../../etc", "/teams/vision?period=2026-03&csv=nosuchtable",
    "/teams/vision/projects/a%20b?period=2026-03", "/jobs/sim/" + "9" * 300 + "?period=2026-03",
    "/jobs/sim/1%27%20OR%201=1?period=2026-03", "/jobs/sim/1001?period=2026-03&day=2026-04-01",
    "/jobs/sim/1001?period=2026-03&page=0",
])  # fmt: skip
def test_hostile_input_is_a_400_naming_the_problem(web_app: Any, path: str) -> None:
    resp = web_app.get(path, headers=as_user("ops00"))
    assert resp.status_code == 400, resp.text
    assert "Bad request" in resp.text and "Traceback" not in resp.text


def test_pages_carry_security_headers_and_no_secret(web_app: Any, web_settings: Any) -> None:
    resp = web_app.get(f"/teams/vision?period={PERIOD}", headers=as_user("ops00"))
    assert "default-src 'self'" in resp.headers["content-security-policy"]
    assert resp.headers["x-content-type-options"] == "nosniff"
    for secret in (web_settings.clickhouse.password, web_settings.clickhouse.analyst_password):
        assert secret.get_secret_value() not in resp.text
    assert "http://" not in resp.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # no other host named


def test_a_correction_is_published_only_when_allowed(web_settings: Any) -> None:
    published = Published()
    client = make_client(web_settings, published)
    ledger = expected_ledger(SIM)
    job = next(j for j in ledger.values() if j.team == "vision" and j.project == "vision-detect")
    page = client.get(f"/jobs/sim/{job.job_id}?period={PERIOD}", headers=as_user(LEAD)).text
    token = re.search(r'name="token" value="([0-9a-f]+)"', page).group(1)
    form = {"cluster": "sim", "job_id": job.job_id, "project": "vision-seg", "reason": "mislabelled sweep",
            "token": token, "period": PERIOD}  # fmt: skip
    assert client.post("/corrections", data={**form, "token": "0" * 64}, headers=as_user(LEAD)).status_code == 403
    assert client.post("/corrections", data={**form, "reason": "  "}, headers=as_user(LEAD)).status_code == 400
    assert client.post("/corrections", data={**form, "project": "no-such"}, headers=as_user(LEAD)).status_code == 403
    # A member of another team may not, even with its own token.
    other = client.get(f"/teams/nlp?period={PERIOD}", headers=as_user(OTHER))
    assert other.status_code == 200
    assert not published.records
    resp = client.post("/corrections", data=form, headers=as_user(LEAD))
    assert resp.status_code == 303, resp.text
    (topic, key, record), = published.records
    assert topic.name == "attribution.corrections.v1" and key == f"sim/{job.job_id}".encode()
    assert (record["old_project"], record["new_project"], record["corrected_by"]) == (
        "vision-detect", "vision-seg", LEAD)
    assert record["reason"] == "mislabelled sweep" and resp.headers["location"].endswith(record["correction_id"])


def test_a_warehouse_that_does_not_answer_is_a_503_without_secrets(web_settings: Any) -> None:
    dead = web_settings.model_copy(update={"clickhouse": web_settings.clickhouse.model_copy(
        update={"url": "http://127.0.0.1:9"})})  # fmt: skip
    resp = make_client(dead).get(f"/teams/vision?period={PERIOD}", headers=as_user("ops00"))
    assert resp.status_code == 503 and "cannot be read" in resp.text
    assert dead.clickhouse.analyst_password.get_secret_value() not in resp.text and "Traceback" not in resp.text


def test_demo_mode_picks_only_directory_users_and_ignores_a_forged_cookie(web_settings: Any) -> None:
    demo = make_client(web_settings.model_copy(update={"web": web_settings.web.model_copy(update={"demo": True})}))
    assert "Demo mode" in demo.get("/").text
    assert demo.get("/demo?user=nobody").status_code == 400
    assert demo.get(f"/teams/vision?period={PERIOD}", cookies={"gpuledger_demo_user": "x'<y"}).status_code == 401
    picked = demo.get("/demo?user=vis01")
    assert picked.status_code == 303 and "samesite=strict" in picked.headers["set-cookie"].lower()
    assert demo.get(f"/teams/vision?period={PERIOD}").status_code == 200  # the cookie, as vis01
    assert demo.get(f"/teams/nlp?period={PERIOD}").status_code == 403
    plain = make_client(web_settings)  # demo off: no picker, the cookie means nothing
    assert plain.get("/demo?user=vis01").status_code == 404
    assert plain.get(f"/teams/vision?period={PERIOD}", cookies={"gpuledger_demo_user": "vis01"}).status_code == 401


def test_a_jobs_drill_down_reads_only_its_nodes_and_loses_no_row(web_ledger: Any) -> None:
    """device_minutes is sorted by node first, so the job page names the nodes the job's events allocated (a
    month of every device is otherwise read per request). For every simulated job those nodes hold exactly the
    devices and seconds of the job's device-minutes."""
    from sinks.db import connect
    from web.params import period as parse_period
    from web.queries import Warehouse

    ch, _ = web_ledger
    client = connect(ch)
    try:
        wh = Warehouse(client)
        by_job = {
            str(j): ({str(n) for n in nodes}, int(s))
            for j, nodes, s in client.query(
                "SELECT job_id, groupUniqArray(node), sum(allocated_s) FROM device_minutes FINAL "
                "WHERE cluster = 'sim' AND job_id != '' GROUP BY job_id"
            ).result_rows
        }
        assert by_job
        period = parse_period(PERIOD, END_MS)
        for job_id, (nodes, allocated) in by_job.items():
            assert set(wh.job_nodes("sim", job_id)) == nodes, job_id
            assert sum(d["allocated_s"] for d in wh.job_devices(period, "sim", job_id)) == allocated, job_id
    finally:
        client.close()


def test_the_data_quality_rollup_equals_the_raw_device_minutes(web_ledger: Any) -> None:
    """The team page's dark-by-node and freshest-minute figures read node_daily (migration 015), not the month's
    raw device-minutes: per team and node they are exactly what device_minutes holds."""
    from sinks.db import connect
    from web.params import period as parse_period
    from web.queries import Warehouse

    ch, _ = web_ledger
    client, analyst = connect(ch), connect(ch, analyst=True)
    try:
        wh = Warehouse(analyst)  # the page's reader: the analyst may read the rollup
        period = parse_period(PERIOD, END_MS)
        raw = client.query(
            "SELECT team, node, sum(dark_s) FROM device_minutes FINAL WHERE job_id != '' GROUP BY team, node "
            "HAVING sum(dark_s) > 0"
        ).result_rows
        expected: dict[str, set[tuple[str, int]]] = defaultdict(set)
        for team, node, dark in raw:
            expected[str(team)].add((str(node), int(dark)))
        assert expected, "the simulated ledger has dark minutes"
        for team in {t for t in expected} | {"vision", "nlp"}:
            assert set(wh.dark_by_node(period, team)) == expected.get(team, set()), team
        newest = client.query("SELECT max(minute_start_ms) FROM device_minutes").result_rows[0][0]
        assert wh.latest_minute_ms(period.start) == newest
        assert wh.latest_minute_ms(period.next().start) is None
    finally:
        client.close()
        analyst.close()


def test_migration_015_rolls_up_the_device_minutes_stored_before_it(small_ledger: Any) -> None:
    """Applied to a ledger that already holds device-minutes, the migration fills node_daily from them once;
    later inserts arrive through its materialized view, and nothing is counted twice."""
    from sinks.db import connect, migrate

    client = connect(small_ledger)
    try:
        totals = "SELECT count(), sum(allocated_s), sum(dark_s), max(minute_start_ms) FROM device_minutes"
        rolled = "SELECT sum(device_minutes), sum(allocated_s), sum(dark_s), max(last_minute_ms) FROM node_daily"
        before = client.query(totals).result_rows[0]
        assert before[0] > 0 and client.query(rolled).result_rows[0] == before
        client.command("DROP VIEW node_daily_mv")
        client.command("DROP TABLE node_daily")
        client.command("ALTER TABLE schema_migrations DELETE WHERE version = 15 SETTINGS mutations_sync = 1")
        assert [r.status for r in migrate(client, small_ledger) if r.version == 15] == ["applied"]
        assert client.query(rolled).result_rows[0] == before
        client.command(
            "INSERT INTO device_minutes (cluster, node, device_uuid, minute_start_ms, job_id, team, allocated_s, "
            "dark_s) VALUES ('sim', 'node-x', 'GPU-x', {ms:Int64}, 'j-x', 'vision', 60, 60)",
            parameters={"ms": int(before[3]) + 60_000},
        )
        after = client.query(rolled).result_rows[0]
        assert after == (before[0] + 1, before[1] + 60, before[2] + 60, before[3] + 60_000)
    finally:
        client.close()


def test_the_data_quality_counts_the_jobs_on_default_projects_as_the_simulator_made_them(web_app: Any) -> None:
    """The page counts, on the server, the team's jobs whose last event says DEFAULT; the simulator's plan says
    which jobs it gave no project (ground truth, no pipeline code). Its users are members of their projects, so
    none claimed another's."""
    from producers.simulator.kube import cluster_plan
    from producers.simulator.model import clusters

    used = {job_id for job_id, ledger in expected_ledger(SIM).items() if ledger.allocated_s > 0}
    defaults: dict[str, int] = defaultdict(int)
    for cfg in clusters(SIM):
        for job in cluster_plan(cfg).jobs:
            if job.job_id in used:
                defaults[job.person.team] += job.project_source == "DEFAULT"
    assert sum(defaults.values()) > 0 and len(defaults) >= 3
    for team, count in defaults.items():
        html = web_app.get(f"/teams/{team}?period={PERIOD}", headers=as_user("ops00")).text
        shown = re.search(r"default project \(none given\): (\d+) of (\d+)", html)
        assert shown is not None and int(shown.group(1)) == count, team
        assert "charged elsewhere): 0." in html, team


def test_the_simulators_month_is_read_from_the_single_lives_views(web_ledger: Any) -> None:
    """No job id of the simulator's month has two lives and no device two clusters' claims, so the pages above,
    equal to the report (which reads the full views), were read from the single-lives views (migration 031)."""
    from sinks.db import connect
    from web import params
    from web.queries import SINGLE_LIVES_VIEWS, Warehouse

    ch, _ = web_ledger
    assert Warehouse(connect(ch, analyst=True)).priced_views(params.period(PERIOD, END_MS)) == SINGLE_LIVES_VIEWS
