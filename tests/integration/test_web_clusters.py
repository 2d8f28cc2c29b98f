"""The simulator's two clusters on the pages (issue 20: "the page shows the simulator's two clusters"): a real
pipeline run of the Slurm-like cluster `sim` and the Kubernetes one `sim-k8s` beside it, stored in the embedded
ClickHouse. The fleet page's cluster table is `report chargeback --by cluster` line for line, with each cluster
across teams and the month's total; the team page splits its statement per cluster (the same hours and jobs as
the report's lines) and ends with the statement line, the total across clusters. `?cluster=` restricts the team
page, its CSV downloads and its drill-downs to one cluster: its statement is the team's line of the report per
cluster.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import PERIOD, make_client, run_cli, simulated_database

from base.settings import BrokerSettings, ClickHouseSettings, Settings, WebSettings
from producers.simulator import SimConfig

pytestmark = pytest.mark.integration
TWO = SimConfig(seed=11, nodes=1, duration_s=1800, kube_nodes=3)
OPS = "ops00"


@pytest.fixture(scope="module")
def two_clusters(clickhouse_server: Any) -> Iterator[ClickHouseSettings]:
    with simulated_database(clickhouse_server, "webk_", TWO) as (ch, _):
        yield ch


def table(client: Any, url: str, user: str) -> list[dict[str, str]]:
    resp = client.get(url, headers={"X-Forwarded-User": user})
    assert resp.status_code == 200, resp.text
    return list(csv.DictReader(io.StringIO(resp.text)))


def report(ch: ClickHouseSettings, by: str) -> list[dict[str, str]]:
    out = run_cli(ch, "report", "chargeback", "--period", PERIOD, "--by", by, "--format", "csv")
    return list(csv.DictReader(io.StringIO(out[out.index("period,") :])))


def test_the_pages_show_both_clusters_and_their_total(two_clusters: ClickHouseSettings, tmp_path: Path) -> None:
    ch = two_clusters
    settings = Settings(state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
                        web=WebSettings(demo=False))  # fmt: skip
    client = make_client(settings, now_ms=TWO.start_ms + TWO.duration_s * 1000)
    by_cluster = report(ch, "cluster")
    assert {r["cluster"] for r in by_cluster} == {"sim", "sim-k8s", "ALL"}

    # The fleet page: the report's lines, then each cluster across teams, then the month's total.
    fleet = table(client, f"/fleet?period={PERIOD}&csv=clusters", OPS)
    keys = ("cluster", "jobs", "allocated_gpu_h", "charge", "consumed_gpu_h", "idle_gpu_h", "dark_gpu_h")
    assert [(r["team"], *(r[k] for k in keys)) for r in fleet if r["team"] != "ALL"] == [
        (r["line"], *(r[k] for k in keys)) for r in by_cluster]  # fmt: skip
    across = {r["cluster"]: r for r in fleet if r["team"] == "ALL"}
    assert set(across) == {"sim", "sim-k8s"}
    total = fleet[-1]
    for k in ("jobs", "allocated_gpu_h", "charge"):
        assert sum(Decimal(r[k]) for r in across.values()) == Decimal(total[k]) > 0
    html = client.get(f"/fleet?period={PERIOD}", headers={"X-Forwarded-User": OPS}).text
    assert "sim-k8s" in html

    # The team page of a team on both clusters: each cluster's hours and jobs are the report's; the charges
    # split the statement to the cent; the last line is the statement (report chargeback --by team's line).
    teams = {r["line"]: r for r in report(ch, "team")}
    mine = {}
    for r in by_cluster:
        mine.setdefault(r["line"], {})[r["cluster"]] = r
    team = next(t for t, lines in sorted(mine.items()) if {"sim", "sim-k8s"} <= set(lines))
    lines = table(client, f"/teams/{team}?period={PERIOD}&csv=clusters", OPS)
    assert [r["cluster"] for r in lines][-1] == "all clusters"
    *split, whole = lines
    assert {r["cluster"] for r in split} == {"sim", "sim-k8s"}
    for r in split:
        theirs = mine[team][r["cluster"]]
        assert (r["jobs"], r["allocated_gpu_h"], r["consumed_gpu_h"]) == (
            theirs["jobs"], theirs["allocated_gpu_h"], theirs["consumed_gpu_h"])  # fmt: skip
        assert abs(Decimal(r["charge"]) - Decimal(theirs["charge"])) <= Decimal("0.01")
    assert (whole["jobs"], whole["allocated_gpu_h"], whole["charge"]) == (
        teams[team]["jobs"], teams[team]["allocated_gpu_h"], teams[team]["charge"])  # fmt: skip
    assert sum(Decimal(r["charge"]) for r in split) == Decimal(whole["charge"])


def figure(html: str, name: str) -> str:
    match = re.search(rf'id="fig-{name}".*?data-raw="([^"]*)"', html, re.S)
    assert match is not None, name
    return match.group(1)


def test_the_team_page_filtered_to_one_cluster(two_clusters: ClickHouseSettings, tmp_path: Path) -> None:
    ch = two_clusters
    settings = Settings(state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
                        web=WebSettings(demo=False))  # fmt: skip
    client = make_client(settings, now_ms=TWO.start_ms + TWO.duration_s * 1000)
    mine: dict[str, dict[str, dict[str, str]]] = {}
    for r in report(ch, "cluster"):
        mine.setdefault(r["line"], {})[r["cluster"]] = r
    team = next(t for t, lines in sorted(mine.items()) if {"sim", "sim-k8s"} <= set(lines))
    base = f"/teams/{team}?period={PERIOD}"
    split = {r["cluster"]: r for r in table(client, f"{base}&csv=clusters", OPS)}
    everything = {name: table(client, f"{base}&csv={name}", OPS) for name in ("projects", "users", "idle_jobs")}
    keys = ("jobs", "allocated_gpu_h", "consumed_gpu_h", "idle_gpu_h", "dark_gpu_h")
    charges = Decimal(0)
    for cluster in ("sim", "sim-k8s"):
        theirs = mine[team][cluster]
        url = f"{base}&cluster={cluster}"
        # The statement: the team's line of `report chargeback --by cluster`, the unfiltered page's split of it
        # in hours and jobs (its charge, the report's own rounding, within a cent of the split).
        html = client.get(url, headers={"X-Forwarded-User": OPS}).text
        assert (figure(html, "charge"), figure(html, "jobs"), figure(html, "allocated")) == (
            theirs["charge"], theirs["jobs"], theirs["allocated_gpu_h"])  # fmt: skip
        (line,) = table(client, f"{url}&csv=clusters", OPS)
        assert line["cluster"] == cluster and line["charge"] == theirs["charge"]
        assert tuple(line[k] for k in keys) == tuple(theirs[k] for k in keys) == tuple(split[cluster][k] for k in keys)
        assert abs(Decimal(line["charge"]) - Decimal(split[cluster]["charge"])) <= Decimal("0.01")
        charges += Decimal(line["charge"])
        # Every table of the page is this cluster's part: projects and users add up to its line.
        for name in ("projects", "users"):
            rows = table(client, f"{url}&csv={name}", OPS)
            assert sum(Decimal(r["charge"]) for r in rows) == Decimal(theirs["charge"]), name
            assert sum(int(r["jobs"]) for r in rows) == int(theirs["jobs"]), name
            assert sum(int(r["jobs"]) for r in rows) < sum(int(r["jobs"]) for r in everything[name]), name
        idle = table(client, f"{url}&csv=idle_jobs", OPS)
        assert {r["cluster"] for r in idle} <= {cluster}
        theirs_idle = [r["job_id"] for r in everything["idle_jobs"] if r["cluster"] == cluster]
        assert [r["job_id"] for r in idle][: len(theirs_idle)] == theirs_idle
        # Drill-downs, CSV links and the month links carry the filter; the project page is filtered too.
        hrefs = re.findall(r'href="([^"]+)"', html)
        drill = [h for h in hrefs if h.startswith((f"/teams/{team}/projects/", "/jobs/")) or "csv=" in h]
        assert drill and all(f"cluster={cluster}" in h for h in drill)
        months = re.findall(r'<a href="([^"]+)" rel="(?:prev|next)"', html)
        assert len(months) == 2 and all(f"cluster={cluster}" in h for h in months)
        project = next(h for h in hrefs if h.startswith(f"/teams/{team}/projects/")).replace("&amp;", "&")
        jobs = table(client, f"{project}&csv=jobs", OPS)
        assert jobs and {r["cluster"] for r in jobs} == {cluster}
    assert charges == sum(Decimal(mine[team][c]["charge"]) for c in ("sim", "sim-k8s"))

    # A well-formed cluster the team has no usage on: an empty statement that says so; a malformed one: 400.
    html = client.get(f"{base}&cluster=nowhere", headers={"X-Forwarded-User": OPS})
    assert html.status_code == 200 and 'id="cluster-unknown"' in html.text
    assert figure(html.text, "charge") == "0.00" and figure(html.text, "jobs") == "0"
    assert table(client, f"{base}&cluster=nowhere&csv=projects", OPS) == []
    for bad in ("sim%27", "-sim", "x" * 65, "sim%20k8s"):
        resp = client.get(f"{base}&cluster={bad}", headers={"X-Forwarded-User": OPS})
        assert resp.status_code == 400 and "cluster name" in resp.text, bad
    # Without the parameter (or empty) the page is the whole statement.
    assert table(client, f"{base}&cluster=&csv=clusters", OPS) == list(split.values())
