"""The team page's pure parts: view model, request values, who may do what, charts. No server, no warehouse."""

from __future__ import annotations

import ast
import datetime as dt
import xml.etree.ElementTree as ET
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from producers.identity import DirectoryEntry
from producers.projects import Project, Registry
from web import access, charts, params
from web import model as m

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"
HOUR = 3600
RATE = 2_000_000  # $2.00 per GPU-hour in micro-dollars
T0 = int(dt.datetime(2026, 11, 10, 12, tzinfo=dt.UTC).timestamp() * 1000)


def job(job_id: str, project: str, user: str, allocated: int, *, idle: int = 0, dark: int = 0, starved: int = 0,
        rate: int = RATE, original: str | None = None, gen: str = "hopper") -> m.JobUsage:  # fmt: skip
    active = allocated - idle - dark - starved
    return m.JobUsage("c1", job_id, user, "vision", project, original or project, "", gen, "on-prem", False,
                      allocated, active, starved, idle, dark, allocated * rate, idle * rate, 0)  # fmt: skip


# -- money and hours --------------------------------------------------------------------------------


def test_split_cents_adds_up_to_the_statement_and_gives_leftovers_to_the_largest_remainders() -> None:
    # 1/3 h each at $1/h: 33.33.. cents each, exact total 100 cents; the report rounds the total half-up.
    third = {"a": 1200 * 1_000_000, "b": 1200 * 1_000_000, "c": 1200 * 1_000_000}
    assert m.split_cents(Decimal("1.00"), third) == {"a": Decimal("0.34"), "b": Decimal("0.33"), "c": Decimal("0.33")}
    uneven = {"x": 7 * m.CENT_UNITS + 10, "y": 3 * m.CENT_UNITS + 20_000_000}
    assert m.split_cents(Decimal("0.11"), uneven) == {"x": Decimal("0.07"), "y": Decimal("0.04")}
    # A statement one cent below the floors (the team lost the cross-team leftover): taken from the smallest.
    short = m.split_cents(Decimal("0.09"), {"p": 5 * m.CENT_UNITS, "q": 5 * m.CENT_UNITS})
    assert sum(short.values()) == Decimal("0.09")


def test_gpu_hours_and_money_round_half_up_like_the_report() -> None:
    assert m.gpu_h(18) == Decimal("0.0050") and m.gpu_h(17) == Decimal("0.0047")
    assert m.money(m.CENT_UNITS // 2) == Decimal("0.01") and m.money(m.CENT_UNITS // 2 - 1) == Decimal("0.00")
    assert m.pct(1, 3) == 33.3 and m.pct(1, 0) is None


def test_lines_by_project_worked_example() -> None:
    jobs = [
        job("1", "p-a", "alice", 2 * HOUR, idle=HOUR // 2),
        job("2", "p-a", "bob", HOUR, dark=HOUR // 4),
        job("3", "p-b", "alice", HOUR // 3, starved=HOUR // 3),
    ]
    exact = sum(j.charge_num for j in jobs)
    statement = m.money(exact)
    lines = {r["project"]: r for r in m.lines_by(jobs, "project", statement)}
    assert lines["p-a"]["allocated_gpu_h"] == Decimal("3.0000") and lines["p-a"]["jobs"] == 2
    assert lines["p-a"]["charge"] == Decimal("6.00") and lines["p-b"]["charge"] == Decimal("0.67")
    assert lines["p-a"]["idle_cost"] == Decimal("1.00") and lines["p-a"]["dark_gpu_h"] == Decimal("0.2500")
    assert lines["p-a"]["coverage_pct"] == 91.7 and lines["p-b"]["utilisation_pct"] == 100.0
    assert sum(r["charge"] for r in lines.values()) == statement
    assert lines["p-a"]["share_pct"] == 90.0
    users = m.lines_by(jobs, "user", statement)
    assert [u["user"] for u in users] == ["alice", "bob"] and sum(u["charge"] for u in users) == statement


def test_a_job_priced_at_two_rates_is_one_line() -> None:
    before = job("9", "p", "u", HOUR, rate=RATE)
    after = job("9", "p", "u", HOUR, rate=RATE * 2, idle=HOUR)
    (merged,) = m.merge_segments([before, after])
    assert merged.allocated_s == 2 * HOUR and merged.charge_num == 3 * HOUR * RATE
    (line,) = m.job_lines([before, after])
    assert line["charge"] == Decimal("6.00") and line["idle_cost"] == Decimal("4.00")
    top = m.most_idle_cost([job("1", "p", "u", HOUR), job("2", "p", "u", HOUR, idle=60), after], limit=5)
    assert [r["job_id"] for r in top] == ["9", "2"]


def test_a_corrected_job_says_where_it_came_from() -> None:
    (line,) = m.job_lines([job("1", "p-new", "u", HOUR, original="p-old")])
    assert line["project"] == "p-new" and line["original_project"] == "p-old"


def test_daily_series_has_every_day_of_the_month() -> None:
    start = dt.date(2026, 2, 1)
    series = m.daily_series([m.Day(dt.date(2026, 2, 3), 10, 0, 5, 1)], start, 28)
    assert len(series) == 28 and series[2].allocated_s == 16 and series[2].consumed_s == 10
    assert series[0].allocated_s == 0 and series[-1].day == dt.date(2026, 2, 28)


# -- open warnings ----------------------------------------------------------------------------------


def alert(kind: str, minute: int, job_id: str = "7", due: int | None = None) -> m.AlertRow:
    return m.AlertRow(kind, T0 + minute * 60_000, "c1", job_id, "alice", "p", 30, 1.5, "CANCEL",
                      None if due is None else T0 + due * 60_000, True)  # fmt: skip


def test_a_warning_is_open_until_resolved_reclaimed_or_the_job_ends() -> None:
    now = T0 + 40 * 60_000
    warned = [alert("IDLE_WARNING", 30, due=45)]
    (row,) = m.open_warnings(warned, {}, now)
    assert row["due"] == "in 5 min" and row["action"] == "CANCEL" and row["cost_so_far"] == Decimal("1.50")
    assert row["due_at"] == "2026-11-10 12:45 UTC" and row["dry_run"] is True
    assert m.open_warnings(warned, {}, T0 + 50 * 60_000)[0]["due"] == "overdue by 5 min"
    assert not m.open_warnings([*warned, alert("IDLE_RESOLVED", 35)], {}, now)
    assert not m.open_warnings([*warned, alert("RECLAIM_NOTICE", 45)], {}, now)
    assert not m.open_warnings(warned, {("c1", "7"): "ENDED"}, now)
    assert m.open_warnings(warned, {("c1", "7"): "RUNNING"}, now)
    # Resolved, then idle again: the new warning is open. At the same minute, the resolution wins.
    again = [*warned, alert("IDLE_RESOLVED", 35), alert("IDLE_WARNING", 38, due=60)]
    assert m.open_warnings(again, {}, now)[0]["due"] == "in 20 min"
    assert not m.open_warnings([alert("IDLE_WARNING", 35), alert("IDLE_RESOLVED", 35)], {}, now)


def test_open_warnings_soonest_first_and_other_kinds_ignored() -> None:
    rows = [alert("IDLE_WARNING", 1, "a", due=90), alert("IDLE_WARNING", 2, "b", due=20), alert("COVERAGE_GAP", 3, "c")]
    assert [r["job_id"] for r in m.open_warnings(rows, {}, T0)] == ["b", "a"]


def test_a_gang_is_one_warning_once_all_its_pods_are_idle_due_at_its_latest_pods_action() -> None:
    gang = {("c1", "kueue:ml/wl"): {"ml/p0": "STARTED", "ml/p1": "STARTED"}}
    p0 = alert("IDLE_WARNING", 30, "ml/p0", due=45)
    assert m.open_warnings([p0], {}, T0, gang) == []  # p1 is not idle: the gang is not warned, nor is p0 alone
    p1 = alert("IDLE_WARNING", 40, "ml/p1", due=55)
    solo = alert("IDLE_WARNING", 41, "9", due=50)
    rows = m.open_warnings([p0, alert("RECLAIM_NOTICE", 45, "ml/p0"), p1, solo], {}, T0 + 46 * 60_000, gang)
    assert [(r["job_id"], r["due_at"], r.get("_gang", False)) for r in rows] == [
        ("9", "2026-11-10 12:50 UTC", False), ("kueue:ml/wl", "2026-11-10 12:55 UTC", True)]
    line = rows[1]
    assert line["warned_at"] == "2026-11-10 12:40 UTC" and line["cost_so_far"] == Decimal("3.00")
    assert line["due"] == "in 9 min" and line["idle_minutes"] == 30
    # every pod reclaimed, or one awake: no open warning; a pod that ended does not hold the gang's
    done = [p0, alert("RECLAIM_NOTICE", 45, "ml/p0"), p1, alert("RECLAIM_NOTICE", 55, "ml/p1")]
    assert m.open_warnings(done, {}, T0, gang) == []
    assert m.open_warnings([p0, p1, alert("IDLE_RESOLVED", 42, "ml/p1")], {}, T0, gang) == []
    ended = {("c1", "kueue:ml/wl"): {"ml/p0": "STARTED", "ml/p1": "ENDED"}}
    assert [r["job_id"] for r in m.open_warnings([p0], {}, T0, ended)] == ["kueue:ml/wl"]


def test_durations_in_words() -> None:
    assert m.due_text(None, T0) == "no action set"
    assert m.due_text(T0 + 3 * 3_600_000 + 60_000, T0) == "in 3 h 1 min"
    assert m.due_text(T0 - 3 * 86_400_000, T0) == "overdue by 3 d 0 h"
    assert m.age_text(T0 - 120_000, T0) == "2 min ago" and m.age_text(None, T0) == "no data"


def test_device_minute_class() -> None:
    assert m.minute_class(60, 60, 0, 0, 0) == "active"
    assert m.minute_class(60, 0, 40, 0, 20) == "starved + dark 20s"
    assert m.minute_class(60, 0, 0, 0, 60) == "dark"
    assert m.minute_class(30, 0, 0, 30, 0) == "idle"
    assert m.minute_class(0, 0, 0, 0, 0) == "unallocated"


def test_quality_says_what_lowers_it() -> None:
    sums = m.total([job("1", "p", "u", HOUR, dark=HOUR // 2), job("2", "p", "u", HOUR)])
    q = m.quality(sums, [("n2", 600), ("n1", 1200), ("n3", 0)], m.ProjectSources(1, 1),
                  T0 - 600_000, T0, 0)  # fmt: skip
    assert q.coverage_pct == 75.0 and q.dark_gpu_h == Decimal("0.5000")
    assert [d["node"] for d in q.dark_nodes] == ["n1", "n2"] and q.dark_nodes[0]["share_pct"] == 66.7
    assert (q.default_project_jobs, q.claimed_project_jobs, q.jobs) == (1, 1, 2) and q.age_text == "10 min ago"


def test_a_table_downloads_plain_values() -> None:
    table = m.Table("t", "T", (m.Column("a", "a"), m.Column("b", "b", "money"), m.Column("d", "d")),
                    [{"a": "x", "b": Decimal("1.50"), "d": dt.date(2026, 1, 2)}, {"a": None}])  # fmt: skip
    assert table.csv_rows() == (["a", "b", "d"], [["x", "1.50", "2026-01-02"], ["", "", ""]])


# -- request values ---------------------------------------------------------------------------------


def test_period_is_parsed_strictly() -> None:
    now = T0
    assert params.period(None, now) == params.Period(2026, 11)
    p = params.period("2026-12", now)
    assert (p.start, p.end, p.days, p.next().text, p.previous().text) == (
        dt.date(2026, 12, 1), dt.date(2027, 1, 1), 31, "2027-01", "2026-11")
    assert p.end_ms() - p.start_ms() == 31 * 86_400_000
    fullwidth = "\uff12\uff10\uff12\uff16-11"  # digits of another script: `\d` would take them
    for bad in ("2026-1", "2026-13", "2026-00", "26-11", "2026-11-01", " 2026-11", "2026-11\n", fullwidth,
                "1999-12", "2200-01", "+2026-11", "2026/11"):
        with pytest.raises(params.BadRequest):
            params.period(bad, now)


def test_day_and_page_are_bounded() -> None:
    nov = params.Period(2026, 11)
    assert params.day("2026-11-30", nov) == dt.date(2026, 11, 30) and params.day("", nov) is None
    for bad in ("2026-11-31", "2026-12-01", "2026-11-1", "20261130"):
        with pytest.raises(params.BadRequest):
            params.day(bad, nov)
    assert params.page(None) == 1 and params.page("7") == 7
    for bad in ("0", "-1", "10001", "1e3", "٣", "999999"):
        with pytest.raises(params.BadRequest):
            params.page(bad)


@pytest.mark.parametrize("value,ok", [
    ("1234", True), ("1234_7", True), ("1234+1", True), ("team-a/train-xyz", True), ("a" * 128, True),
    ("a" * 129, False), ("/etc/passwd", False), ("1 OR 1=1", False), ("1'", False), ("a/b/c", False),
    ("", False), ("..", False), ("1;DROP", False),
])  # fmt: skip
def test_job_ids(value: str, ok: bool) -> None:
    if ok:
        assert params.job_id(value) == value
    else:
        with pytest.raises(params.BadRequest):
            params.job_id(value)


def test_names_and_reason() -> None:
    assert params.team("vision") == "vision" and params.project("llm-pretrain") == "llm-pretrain"
    for bad in ("", "a b", "a'b", "x" * 65, "../x", "ü"):
        with pytest.raises(params.BadRequest):
            params.team(bad)
    assert params.reason("  mislabelled \n sweep ") == "mislabelled sweep"
    for bad in ("", "   ", "x" * 501, "bell\x07"):
        with pytest.raises(params.BadRequest):
            params.reason(bad)


@pytest.mark.parametrize("value,ok", [
    ("sim", True), ("sim-k8s", True), ("eu_west.2", True), ("c" * 64, True), ("c" * 65, False),
    ("-sim", False), ("sim k8s", False), ("sim'", False), ("sim/x", False), ("x%27", False), ("ü", False),
    ("sim\n", False), ("1 OR 1=1", False),
])  # fmt: skip
def test_cluster_filter(value: str, ok: bool) -> None:
    """`?cluster=`: absent or empty is every cluster (None); else a name matched whole, or a 400."""
    assert params.cluster_filter(None) is None and params.cluster_filter("") is None
    if ok:
        assert params.cluster_filter(value) == value
    else:
        with pytest.raises(params.BadRequest, match="cluster name"):
            params.cluster_filter(value)


def test_drill_down_links_carry_the_cluster_filter_and_only_it() -> None:
    from web import pages

    nov = params.Period(2026, 11)
    assert pages.team_url("vision", nov) == "/teams/vision?period=2026-11"
    assert pages.team_url("vision", nov, "sim-k8s") == "/teams/vision?period=2026-11&cluster=sim-k8s"
    rows = pages._with_links([{"cluster": "sim", "job_id": "7", "project": "p-a"}], nov, "vision", "sim")
    assert rows[0]["_job_url"] == "/jobs/sim/7?period=2026-11&cluster=sim"
    assert rows[0]["_project_url"] == "/teams/vision/projects/p-a?period=2026-11&cluster=sim"
    plain = pages._with_links([{"cluster": "sim", "job_id": "7", "project": "p-a"}], nov, "vision")
    assert "cluster=" not in plain[0]["_job_url"] + plain[0]["_project_url"]


# -- who may do what ---------------------------------------------------------------------------------

REGISTRY = Registry({
    "p-a": Project("p-a", members=frozenset({"alice", "bob"})),
    "p-b": Project("p-b", teams=frozenset({"vision"})),
    "p-c": Project("p-c", members=frozenset({"carol"})),
    "p-old": Project("p-old", active=False),
})  # fmt: skip


def viewer(user: str, teams: tuple[str, ...] = ("vision",), leads: tuple[str, ...] = (),
           groups: tuple[str, ...] = ()) -> access.Viewer:  # fmt: skip
    return access.viewer_for(user, DirectoryEntry(user, teams=teams, leads=leads), proxy_groups=groups,
                             operator_groups=("ops",), finance_groups=("fin",))  # fmt: skip


def test_who_may_move_a_job_between_projects() -> None:
    alice, carol = viewer("alice"), viewer("carol")
    assert access.correction_refusal(alice, "vision", "p-a", "p-b", REGISTRY) is None  # member of both
    assert "both" in access.correction_refusal(carol, "vision", "p-a", "p-b", REGISTRY)
    assert "both" in access.correction_refusal(alice, "vision", "p-a", "p-c", REGISTRY)
    assert access.correction_refusal(viewer("lead", leads=("vision",)), "vision", "p-a", "p-c", REGISTRY) is None
    assert "lead" in access.correction_refusal(viewer("lead", leads=("nlp",)), "vision", "p-a", "p-c", REGISTRY)
    assert access.correction_refusal(viewer("op", teams=(), groups=("ops",)), "nlp", "p-a", "p-c", REGISTRY) is None
    assert "not an active project" in access.correction_refusal(alice, "vision", "p-a", "p-old", REGISTRY)
    assert "not an active project" in access.correction_refusal(alice, "vision", "p-a", "nope", REGISTRY)
    assert "already" in access.correction_refusal(alice, "vision", "p-b", "p-b", REGISTRY)
    assert "lead" in access.correction_refusal(alice, "vision", None, "p-a", REGISTRY)


def test_scope() -> None:
    member = viewer("alice", teams=("vision", "nlp"), leads=("vision",))
    assert member.sees_team("nlp") and not member.sees_team("speech")
    assert member.scope == "lead of vision; member of nlp"
    finance = viewer("f", teams=(), groups=("fin",))
    assert finance.sees_team("anything") and finance.finance and not finance.operator
    assert finance.scope == "finance: every team"
    assert access.viewer_for("ghost", None).scope == "no team"


def test_only_configured_proxies_are_believed() -> None:
    trusted = ("127.0.0.1", "::1", "10.0.0.0/24")
    assert access.proxy_trusted("127.0.0.1", trusted) and access.proxy_trusted("10.0.0.9", trusted)
    assert not access.proxy_trusted("10.0.1.9", trusted) and not access.proxy_trusted("testclient", trusted)
    assert not access.proxy_trusted(None, trusted) and not access.proxy_trusted("127.0.0.2", ("127.0.0.1", "bad"))
    assert access.parse_groups(" a, b ,,c ") == frozenset({"a", "b", "c"}) and access.parse_groups(None) == frozenset()


def test_form_tokens_are_per_user() -> None:
    secret = b"s" * 32
    token = access.csrf_token(secret, "alice")
    assert access.csrf_ok(secret, "alice", token)
    assert not access.csrf_ok(secret, "bob", token) and not access.csrf_ok(b"t" * 32, "alice", token)
    assert not access.csrf_ok(secret, "alice", None)


# -- charts -------------------------------------------------------------------------------------------


def test_daily_chart_is_valid_svg_with_a_bar_per_class() -> None:
    days = m.daily_series([m.Day(dt.date(2026, 11, 2), 7200, 3600, 1800, 0)], dt.date(2026, 11, 1), 30)
    svg = charts.daily_chart(days)
    root = ET.fromstring(svg)
    rects = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert {r.get("class") for r in rects} == {"c-active", "c-starved", "c-idle"}
    heights = {r.get("class"): float(r.get("height")) for r in rects}
    assert heights["c-active"] == pytest.approx(2 * heights["c-starved"]) == pytest.approx(4 * heights["c-idle"])
    assert "style=" not in svg  # the page's CSP allows no inline style


def test_timeline_merges_runs_and_escapes_labels() -> None:
    minutes = [(T0 + i * 60_000, "idle") for i in range(5)] + [(T0 + 7 * 60_000, "active")]
    svg = charts.device_timeline([charts.Strip("n1 <GPU>&", minutes)], T0, T0 + 3_600_000)
    root = ET.fromstring(svg)
    runs = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert [r.get("class") for r in runs] == ["c-idle", "c-active"]
    assert "&lt;GPU&gt;&amp;" in svg


def test_the_pure_modules_import_no_framework_or_client() -> None:
    forbidden = ("starlette", "jinja2", "uvicorn", "clickhouse_connect", "confluent_kafka", "faust", "httpx")
    for name in ("model", "params", "access", "charts", "format"):
        tree = ast.parse((ROOT / "web" / f"{name}.py").read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {i for i in imported if i.split(".")[0] in forbidden}, name


def test_the_simulated_organisation_agrees_with_itself() -> None:
    from producers.simulator.org import OPERATOR, sim_directory, sim_policy_text, sim_registry
    from schemas.policy import parse_policy

    assert (ROOT / "deploy" / "policy.sim.yaml").read_text() == sim_policy_text()  # regenerate it from org.py
    policy = parse_policy(sim_policy_text())
    directory, registry = sim_directory(), sim_registry()
    for team in policy.teams:
        # The policy's members are people; the CI robot's service account belongs to its team in the directory only.
        members = {u for u, e in directory.items() if team.name in e.teams and not u.startswith("system:")}
        assert set(team.members) == members and len([u for u in members if team.name in directory[u].leads]) == 1
        assert all(registry.get(registry.default_for(u) or "") is not None for u in members)
    assert policy.governance.deciders == (OPERATOR,) and "gpuledger-operators" in directory[OPERATOR].groups


def test_figures_read_as_people_write_them() -> None:
    from web.format import cell

    assert cell(Decimal("-7.5"), "money") == "-$7.50" and cell(Decimal("1234.5"), "money") == "$1,234.50"
    assert cell(Decimal("0.12345"), "gpu_h") == "0.1235" and cell(None, "pct") == "-" and cell(True) == "yes"


def test_every_request_thread_reads_through_one_analyst_client() -> None:
    """`shared_warehouse` connects once, on first use, whichever threads ask: a client per thread cost each request
    that landed on a new server thread a connection's handshake queries."""
    import threading

    from web.app import shared_warehouse

    made: list[object] = []
    get = shared_warehouse(lambda: made.append(object()) or made[-1])
    seen: list[Any] = []
    threads = [threading.Thread(target=lambda: seen.append(get())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(w) for w in seen}) == 1 and seen[0].client is made[0]
