"""Each page's content: the warehouse's rows through the view model into tables, figures and charts.

One function per page; each returns a `Page` whose tables the HTML template and the `?csv=<table>`
download both render, so a download is exactly the table on the screen (all of its rows).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from web import charts, statements
from web import model as m
from web.model import Column, Table
from web.params import Period
from web.queries import (
    PricedViews,
    Statement,
    Warehouse,
    identity_text,
    owner_text,
    quota_lines,
    self_declared_notes,
    source_text,
)

WARNINGS_LOOKBACK_MS = 14 * 24 * 3600 * 1000
DEVICE_MINUTES_PAGE = 1000
PROJECT_JOBS_PAGE = 200  # a project's jobs a page (a month of a big project is thousands: megabytes of HTML)
DEVICE_MINUTES_CSV_MAX = 200_000
# The team page's reads, sent together (a clickhouse-connect client without a session serves concurrent queries
# from its connection pool). Shared by every request: a busy server queues reads here rather than opening more.
_READS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="page-reads")


@dataclass
class Page:
    title: str
    tables: dict[str, Table] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)

    def add(self, table: Table) -> Table:
        self.tables[table.name] = table
        return table


def _query(period: Period, only: str | None = None, **extra: str) -> str:
    """`period=...` and, for a page filtered to one cluster (`only`), `cluster=...`: absent when not filtered."""
    return urlencode({"period": period.text, **({"cluster": only} if only is not None else {}), **extra})


def team_url(team: str, period: Period, only: str | None = None) -> str:
    return f"/teams/{quote(team, safe='')}?{_query(period, only)}"


def page_count(rows: int, size: int) -> int:
    """Pages of `size` rows that `rows` fill (one, however few)."""
    return max(1, -(-rows // size))


def one_page(rows: list[Any], page_no: int, size: int) -> list[Any]:
    """Page `page_no` (from 1) of `rows`, `size` a page; past the last, none."""
    return rows[(page_no - 1) * size: page_no * size]


def project_url(team: str, project: str, period: Period, only: str | None = None) -> str:
    return f"/teams/{quote(team, safe='')}/projects/{quote(project, safe='')}?{_query(period, only)}"


def job_url(cluster: str, job_id: str, period: Period, only: str | None = None, **extra: str) -> str:
    return f"/jobs/{quote(cluster, safe='')}/{quote(job_id, safe='/')}?{_query(period, only, **extra)}"


def _with_links(rows: list[dict[str, Any]], period: Period, team: str, only: str | None = None) -> list[dict[str, Any]]:
    """Drill-down links; a page filtered to cluster `only` passes the filter on (the job's own page carries it back
    to its team and project pages)."""
    for row in rows:
        if "job_id" in row:
            row["_job_url"] = job_url(row["cluster"], row["job_id"], period, only)
        if "project" in row:
            row["_project_url"] = project_url(team, row["project"], period, only)
    return rows


PROJECT_COLUMNS = (Column("project", "project"), Column("share_pct", "share of team %", "pct"), *m.USAGE_COLUMNS)
USER_COLUMNS = (Column("user", "user"), Column("share_pct", "share of team %", "pct"), *m.USAGE_COLUMNS)
CLUSTER_COLUMNS = (Column("cluster", "cluster"), Column("share_pct", "share of team %", "pct"), *m.USAGE_COLUMNS)
ALL_CLUSTERS = "all clusters"
JOB_COLUMNS = (
    Column("cluster", "cluster"), Column("job_id", "job"), Column("user", "user"), Column("project", "project"),
    Column("original_project", "corrected from"), Column("generation", "generation"),
    Column("pricing_tier", "tier"), *m.USAGE_COLUMNS[1:], Column("first_day", "first day"),
    Column("last_day", "last day"),
)  # fmt: skip
WARNING_COLUMNS = (
    Column("cluster", "cluster"), Column("job_id", "job"), Column("user", "user"), Column("project", "project"),
    Column("idle_minutes", "idle min", "int"), Column("cost_so_far", "idle cost so far", "money"),
    Column("warned_at", "warned"), Column("action", "action"), Column("due_at", "action due"),
    Column("due", "due"), Column("dry_run", "dry-run"),
)  # fmt: skip


def statement_figures(statement: Statement | None) -> dict[str, Any]:
    if statement is None:
        zero = Decimal("0.0000")
        return {"jobs": 0, "allocated_gpu_h": zero, "charge": Decimal("0.00"), "consumed_gpu_h": zero,
                "utilisation_pct": None, "active_gpu_h": zero, "starved_gpu_h": zero, "idle_gpu_h": zero,
                "dark_gpu_h": zero, "idle_cost": Decimal("0.00"), "coverage_pct": None,
                "unpriced_gpu_h": zero}  # fmt: skip
    return dict(statement.figures)


def _statement_line(wh: Warehouse, period: Period, team: str, closed: bool, only: str | None,
                    views: PricedViews) -> tuple[Statement | None, dict[str, Any], list[str] | None]:  # fmt: skip
    """The team's statement line and its figures; filtered to one cluster (`only`), the team's line of `report
    chargeback --by cluster` (none: zeros, and the page says so, when the team has no usage on the cluster this
    month, as the month links carry the filter into such months) and the clusters the team has lines on."""
    if only is None:
        statement = wh.statements(period, closed=closed, views=views).get(team)
        return statement, statement_figures(statement), None
    lines = wh.cluster_lines(period, team, closed=closed)
    return None, (dict(lines[only]) if only in lines else statement_figures(None)), sorted(lines)


def team_page(wh: Warehouse, team: str, period: Period, now_ms: int, quota: Mapping[str, Mapping[str, int]] | None,
              credits: Callable[[Any], list[Any]] = lambda _client: [], only: str | None = None,
              robots: Mapping[str, Any] | None = None) -> Page:  # fmt: skip
    """The team's month; `only`: one cluster's part of it (`?cluster=`), every figure and table restricted to it.
    `robots`: the policy's robot accounts by name (sinks.identities.robots_of), who owns each."""
    # The page's reads do not depend on each other, but for the month's two priced reads, which wait for whether it
    # is closed and which views price it: sent at once, the page waits for the slowest, not the sum.
    views_read = _READS.submit(wh.priced_views, period)
    alerts_read = _READS.submit(wh.team_alerts, team, now_ms - WARNINGS_LOOKBACK_MS, only)
    dark_read = _READS.submit(wh.dark_by_node, period, team, only)
    sources_read = _READS.submit(wh.project_sources, period, team, only)
    latest_read = _READS.submit(wh.latest_minute_ms, period.start - dt.timedelta(days=31), only)
    baseline_read = _READS.submit(baseline_mark, wh, period, team)
    identity_read = _READS.submit(wh.identity_clusters, period, team, only)
    closes = wh.closes()
    closed = period.text in closes
    views = views_read.result()
    usage_read = _READS.submit(wh.team_usage, period, team, closed=closed, cluster=only, views=views)
    line_read = _READS.submit(_statement_line, wh, period, team, closed, only, views)
    usage = usage_read.result()
    days_read = _READS.submit(wh.daily, period, team, only, views) if usage.days is None else None
    statement, figures, clusters = line_read.result()
    known = sorted(usage.by["cluster"]) if clusters is None else clusters
    page = Page(f"{team}: {period.text}" + (f" on {only}" if only is not None else ""))
    status = statements.status(wh.client, period.text, team, figures["charge"], credits, closes=closes, cluster=only)
    for table in status.tables:
        page.add(table)
    links = {"project": "_project_url", "job_id": "_job_url"}
    page.add(Table("projects", "Projects behind the line", PROJECT_COLUMNS,
                   _with_links(m.grouped_lines(usage.by["project"], "project", figures["charge"]), period, team, only),
                   links=links))  # fmt: skip
    page.add(Table("users", "Users behind the line", USER_COLUMNS,
                   m.grouped_lines(usage.by["user"], "user", figures["charge"])))  # fmt: skip
    page.add(Table("identities", "Identities behind the line", IDENTITY_COLUMNS,
                   identity_rows(wh.team_identities(period, team, only, views), robots or {}),
                   note="A name and its identifier: an account recreated under the same name is a second identity. "
                        "Robots show the team and project policy.yaml names as their owner."))  # fmt: skip
    page.add(Table("clusters", "Clusters behind the line", CLUSTER_COLUMNS, _cluster_lines(usage, figures, only),
                   note="Each cluster's share of the statement (the charge split to the cent, as for projects), "
                        "then the statement line itself: the total across clusters." if only is None else
                        f"Only {only}: its line of report chargeback --by cluster."))  # fmt: skip
    page.add(Table("idle_jobs", "Jobs with the most idle cost", JOB_COLUMNS,
                   _with_links(m.most_idle_cost(usage.most_idle), period, team, only), links=links,
                   note="Idle: held, with telemetry, and neither active nor starved."))  # fmt: skip
    alerts = alerts_read.result()
    keys = sorted({(a.cluster, a.job_id) for a in alerts})
    states, gangs = wh.job_states(keys), wh.gangs(keys)
    warnings = _with_links(m.open_warnings(alerts, states, now_ms, gangs), period, team, only)
    for row in warnings:
        if row.pop("_gang", False):
            row.pop("_job_url", None)  # a gang is no job of its own: its pods' pages are the evidence
    page.add(Table("warnings", "Open idle warnings", WARNING_COLUMNS, warnings, links=links,
                   note="Warnings of the last 14 days whose job still holds its devices and was neither resolved "
                        "nor reclaimed. A Kubernetes gang is one line, open once all its pods are idle."))  # fmt: skip
    days = m.daily_series(days_read.result() if days_read is not None else usage.days or [], period.start,
                          period.days)  # fmt: skip
    sums = usage.total
    quality = m.quality(sums, dark_read.result(), sources_read.result(), latest_read.result(), now_ms,
                        sums.unpriced_s)  # fmt: skip
    page.add(Table("dark_nodes", "Where telemetry was missing", (
        Column("node", "node"), Column("dark_gpu_h", "dark GPU-h", "gpu_h"), Column("share_pct", "share %", "pct"),
    ), quality.dark_nodes))  # fmt: skip
    quota_rows = _quota(quota, team, period, usage.onprem_s)
    if quota_rows:
        page.add(Table("quota", "Quota and its use (owned hardware)", QUOTA_COLUMNS, quota_rows))
    page.context.update(
        identity_notes=self_declared_notes(identity_read.result()),
        claimed_user_jobs=sum(c.claimed_user_jobs for c in identity_read.result()),
        team=team, period=period, figures=figures, statement=statement, quality=quality,
        baseline=baseline_read.result(),
        chart=charts.daily_chart(days), quota_rows=quota_rows, has_policy=quota is not None, stmt=status,
        prev_url=team_url(team, period.previous(), only), next_url=team_url(team, period.next(), only),
        only=only, only_known=only is None or only in known, here_url=team_url(team, period, only),
        cluster_choices=[(name, team_url(team, period, name)) for name in known], all_url=team_url(team, period),
    )  # fmt: skip
    return page


IDENTITY_COLUMNS = (
    Column("identity", "identity"), Column("source", "where the name comes from"), Column("owner", "owner (robots)"),
    Column("jobs", "jobs", "int"), Column("allocated_gpu_h", "allocated GPU-h", "gpu_h"),
    Column("claimed_jobs", "jobs naming another user", "int"),
)  # fmt: skip


def identity_rows(found: list[dict[str, Any]], robots: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The identities table: one row per (name, identifier), the robot's owner beside it."""
    return [{
        "identity": identity_text(str(r["user"]), r["user_uid"]), "source": source_text(r["user_source"]),
        "owner": owner_text(str(r["user"]), robots), "jobs": int(r["jobs"]),
        "allocated_gpu_h": m.gpu_h(int(r["allocated_s"])), "claimed_jobs": int(r["claimed_jobs"]),
    } for r in found]  # fmt: skip


def baseline_mark(wh: Warehouse, period: Period, team: str) -> Any:
    """The team's month against the attribution baseline (issue 38; sinks/baseline.py, as the reports): over the
    team's jobs on every cluster, the share of GPU-hours before the baseline charged to defaults."""
    return wh.baseline_marks(period).team(team)


def _cluster_lines(usage: m.TeamUsage, figures: Mapping[str, Any], only: str | None = None) -> list[dict[str, Any]]:
    """Each cluster's split of the statement, then the statement (`all clusters`); filtered to `only`, its one line."""
    lines = m.grouped_lines(usage.by["cluster"], "cluster", figures["charge"])
    if not lines or only is not None:
        return lines
    share = Decimal(100) if figures["allocated_gpu_h"] else None
    return [*lines, {**figures, "cluster": ALL_CLUSTERS, "share_pct": share}]


QUOTA_COLUMNS = (
    Column("generation", "generation"), Column("allocated_gpu_h", "allocated GPU-h", "gpu_h"),
    Column("quota_gpu_h", "quota GPU-h", "gpu_h"), Column("quota_used_pct", "quota used %", "pct"),
)  # fmt: skip


def _quota(quota: Mapping[str, Mapping[str, int]] | None, team: str, period: Period,
           onprem_s: Mapping[str, int]) -> list[dict[str, Any]]:  # fmt: skip
    """`onprem_s`: the team's on-prem allocated seconds per generation (what quota counts)."""
    if quota is None:
        return []
    allocated = {(team, generation): seconds for generation, seconds in onprem_s.items()}
    lines = quota_lines({team: quota.get(team, {})}, period.text, allocated)
    return [{"generation": q.generation, "allocated_gpu_h": q.allocated_gpu_h, "quota_gpu_h": q.quota_gpu_h,
             "quota_used_pct": q.quota_used_pct} for q in lines]  # fmt: skip


def project_page(wh: Warehouse, team: str, project: str, period: Period, only: str | None = None, page_no: int = 1,
                 whole: bool = False) -> Page:  # fmt: skip
    """The project's jobs in the month, most charged first, PROJECT_JOBS_PAGE a page (`page_no`; `whole`: all of
    them, for the CSV); `only`: those on that cluster (the filtered team page's drill-down). The figures are the
    whole month's whatever the page."""
    closed = wh.closed(period)
    jobs = wh.team_jobs(period, team, project, closed=closed, cluster=only, views=wh.priced_views(period))
    page = Page(f"{team} / {project}: {period.text}" + (f" on {only}" if only is not None else ""))
    rows = m.job_lines(jobs)
    rows.sort(key=lambda r: (-r["charge"], r["cluster"], r["job_id"]))
    first = (page_no - 1) * PROJECT_JOBS_PAGE
    shown = rows if whole else one_page(rows, page_no, PROJECT_JOBS_PAGE)
    span = f"jobs {first + 1}-{first + len(shown)} of {len(rows)}" if shown else f"none of {len(rows)} on this page"
    page.add(Table("jobs", f"Jobs charged to {project}", JOB_COLUMNS, _with_links(shown, period, team, only),
                   links={"job_id": "_job_url"},
                   note=f"Most charged first: {span} ({PROJECT_JOBS_PAGE} a page; the CSV has them all). Each "
                        "job's charge is rounded to the cent on its own line; the project's line in the team page "
                        "splits the team's statement to the cent."))  # fmt: skip
    sums = m.total(jobs)
    page.context.update(team=team, project=project, period=period, figures=sums.figures(), closed=closed,
                        charge=m.money(sums.charge_num), team_url=team_url(team, period, only), only=only,
                        here_url=project_url(team, project, period, only), page_no=page_no,
                        pages=page_count(len(rows), PROJECT_JOBS_PAGE))  # fmt: skip
    return page


DEVICE_COLUMNS = (
    Column("node", "node"), Column("device_uuid", "device"), Column("mig_instance_id", "MIG"), Column("model", "model"),
    Column("minutes", "minutes", "int"), Column("allocated_gpu_h", "allocated GPU-h", "gpu_h"),
    Column("active_gpu_h", "active", "gpu_h"), Column("starved_gpu_h", "starved", "gpu_h"),
    Column("idle_gpu_h", "idle", "gpu_h"), Column("dark_gpu_h", "dark", "gpu_h"),
    Column("first_minute", "first minute"), Column("last_minute", "last minute"),
)  # fmt: skip
MINUTE_COLUMNS = (
    Column("minute", "minute (UTC)"), Column("node", "node"), Column("device_uuid", "device"),
    Column("mig_instance_id", "MIG"), Column("class", "class", "class"), Column("allocated_s", "allocated s", "int"),
    Column("active_s", "active s", "int"), Column("starved_s", "starved s", "int"), Column("idle_s", "idle s", "int"),
    Column("dark_s", "dark s", "int"), Column("sample_count", "samples", "int"),
    Column("activity_mean_ratio", "activity mean", "ratio"), Column("activity_max_ratio", "activity max", "ratio"),
    Column("fb_used_mib_max", "memory MiB max", "int"), Column("power_w_mean", "power W", "int"),
    Column("mapping_version", "mapping"), Column("classifier_version", "classifier"),
)  # fmt: skip
CORRECTION_COLUMNS = (
    Column("when", "when (UTC)"), Column("old_project", "from"), Column("new_project", "to"),
    Column("reason", "reason"), Column("corrected_by", "by"), Column("correction_id", "event id"),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobView:
    """Which slice of a job's evidence a request asks for: the period, a day of it, a page of its minutes."""

    period: Period
    day: dt.date | None = None
    page: int = 1
    csv: bool = False
    only: str | None = None  # the team page's cluster filter, carried back to the team and project pages


def job_page(wh: Warehouse, cluster: str, job_id: str, view: JobView,
             robots: Mapping[str, Any] | None = None) -> Page | None:  # fmt: skip
    """None when the warehouse knows no such job (no event, no usage in the period). `robots`: the policy's robot
    accounts by name, who owns each."""
    period = view.period
    info = wh.job(cluster, job_id)
    usage = m.merge_segments(wh.job_usage(period, cluster, job_id, wh.priced_views(period)))
    if info is None and not usage:
        return None
    job = usage[0] if usage else None
    page = Page(f"job {job_id} on {cluster}")
    devices = wh.job_devices(period, cluster, job_id)
    page.add(Table("devices", "Devices held in the period", DEVICE_COLUMNS, [_device_row(d) for d in devices]))
    days = sorted({_day(d["first_minute_ms"]) for d in devices} | {_day(d["last_minute_ms"]) for d in devices})
    day = view.day or (days[0] if days else None)
    minutes: list[dict[str, Any]] = []
    timeline = ""
    if day is not None:
        start = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)
        end = start + 24 * 3600 * 1000
        raw = wh.device_minutes(cluster, job_id, start, end, DEVICE_MINUTES_CSV_MAX)
        minutes = [_minute_row(r) for r in raw]
        timeline = _timeline(minutes, start, end)
    shown = minutes if view.csv else one_page(minutes, view.page, DEVICE_MINUTES_PAGE)
    page.add(Table("minutes", f"Device-minutes on {day.isoformat() if day else '-'}", MINUTE_COLUMNS, shown,
                   note=f"{len(minutes)} device-minutes that day; {DEVICE_MINUTES_PAGE} a page, the CSV has them all. "
                        f"A minute's seconds: gpuledger report seconds --cluster {cluster} --node NODE --start "
                        "YYYY-MM-DDTHH:MM:00Z (as the warehouse keeps them; every second: --from-kafka)."))  # fmt: skip
    corrections = [{**c, "when": m.utc_minute(int(c["ts_ms"]))} for c in wh.corrections(cluster, job_id)]
    page.add(Table("corrections", "Corrections (audited events)", CORRECTION_COLUMNS, corrections))
    sums = m.total(usage)
    team = (job.team if job else None) or str((info or {}).get("team") or "")
    # who each life of the id ran as, latest first: a name, its identifier, its source, a robot's owner
    ran_as = [{"start": _when(start) if start else "-", "identity": who.text, "source": source_text(who.source),
               "claimed": who.claimed, "groups": ", ".join(who.groups[:20]),
               "owner": owner_text(who.user, robots or {})}
              for start, who in wh.job_lives_identities(cluster, job_id)]  # fmt: skip
    page.context.update(
        ran_as=ran_as,
        cluster=cluster, job_id=job_id, period=period, info=info or {}, job=job, team=team,
        project=job.project if job else str((info or {}).get("project") or ""),
        figures=sums.figures(), charge=m.money(sums.charge_num), timeline=timeline, day=day,
        days=[(d, job_url(cluster, job_id, period, view.only, day=d.isoformat())) for d in days if period.contains(d)],
        pages=page_count(len(minutes), DEVICE_MINUTES_PAGE), page_no=view.page, only=view.only,
        team_url=team_url(team, period, view.only) if team else "",
        project_url=project_url(team, job.project, period, view.only) if job and team else "",
        start=_when((info or {}).get("start_ts_ms")), end=_when((info or {}).get("end_ts_ms")),
    )  # fmt: skip
    return page


def _day(ms: int) -> dt.date:
    return dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).date()


def _when(ms: Any) -> str:
    return m.utc_minute(int(ms)) + " UTC" if ms is not None else "-"


def _device_row(d: dict[str, Any]) -> dict[str, Any]:
    return {
        "node": d["node"], "device_uuid": d["device_uuid"],
        "mig_instance_id": "" if d["mig_instance_id"] in (None, -1) else d["mig_instance_id"], "model": d["model"],
        "minutes": int(d["minutes"]), **{f"{k}_gpu_h": m.gpu_h(int(d[f"{k}_s"])) for k in ("allocated", *m.CLASSES)},
        "first_minute": m.utc_minute(int(d["first_minute_ms"])), "last_minute": m.utc_minute(int(d["last_minute_ms"])),
    }  # fmt: skip


def _minute_row(r: dict[str, Any]) -> dict[str, Any]:
    counts = [int(r[k]) for k in ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s")]
    return {
        **r, "minute": m.utc_minute(int(r["minute_start_ms"])), "class": m.minute_class(*counts),
        "mig_instance_id": "" if r["mig_instance_id"] in (None, -1) else r["mig_instance_id"],
        "activity_mean_ratio": _ratio(r["activity_mean_ratio"]), "activity_max_ratio": _ratio(r["activity_max_ratio"]),
        "fb_used_mib_max": None if r["fb_used_mib_max"] is None else round(float(r["fb_used_mib_max"])),
        "power_w_mean": None if r["power_w_mean"] is None else round(float(r["power_w_mean"])),
    }  # fmt: skip


def _ratio(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(round(float(value), 3)))


def _timeline(minutes: list[dict[str, Any]], start: int, end: int) -> str:
    strips: dict[str, list[tuple[int, str]]] = {}
    for r in minutes:
        mig = f" mig {r['mig_instance_id']}" if r["mig_instance_id"] != "" else ""
        label = f"{r['node']} {str(r['device_uuid'])[:12]}{mig}"
        strips.setdefault(label, []).append((int(r["minute_start_ms"]), r["class"]))
    if not strips:
        return ""
    held = [int(r["minute_start_ms"]) for r in minutes]
    first = max(start, min(held) - min(held) % 3_600_000)
    last = min(end, max(held) + 3_600_000 - max(held) % 3_600_000)
    return charts.device_timeline([charts.Strip(k, v) for k, v in sorted(strips.items())], first, last)


# -- the fleet page (operators and finance) -------------------------------------------------------

FLEET_TEAM_COLUMNS = (Column("team", "team"), *m.USAGE_COLUMNS, Column("unpriced_gpu_h", "unpriced GPU-h", "gpu_h"))
FLEET_JOB_COLUMNS = (Column("team", "team"), *JOB_COLUMNS)
FLEET_IDLE_LEADERS = 20
FLEET_CLUSTER_COLUMNS = (Column("team", "team"), Column("cluster", "cluster"), *m.USAGE_COLUMNS,
                         Column("unpriced_gpu_h", "unpriced GPU-h", "gpu_h"))  # fmt: skip


def fleet_url(period: Period) -> str:
    return f"/fleet?{urlencode({'period': period.text})}"


def fleet_page(wh: Warehouse, period: Period) -> Page:
    """Every team side by side (their statement lines), the fleet's daily trend and capacity evidence, where
    telemetry or prices are missing, and who left the most idle time."""
    from web import fleet

    closed = wh.closed(period)
    views = wh.priced_views(period)
    statements = wh.statements(period, closed=closed, views=views)
    page = Page(f"Fleet: {period.text}")
    teams = [{"team": line, **s.figures, "_team_url": team_url(line, period)} for line, s in statements.items()]
    teams.sort(key=lambda r: (-r["charge"], r["team"]))
    page.add(Table("teams", "Teams side by side", FLEET_TEAM_COLUMNS, teams, links={"team": "_team_url"},
                   note="Each team's line of report chargeback --by team for the month."))  # fmt: skip
    page.add(Table("clusters", "Clusters: each team on each cluster, and across them", FLEET_CLUSTER_COLUMNS,
                   _fleet_clusters(wh, period, closed), links={"team": "_team_url"},
                   note="report chargeback --by cluster: each team's line per cluster, its total across clusters "
                        "(cluster ALL), each cluster across teams, and the month's total."))  # fmt: skip
    days = fleet.days_filled(wh.fleet_days(period), period.start, period.days)
    page.add(Table("trend", "Share of the fleet allocated, and how much of it computed, per day", fleet.TREND_COLUMNS,
                   fleet.trend(days), note="Fleet GPU-h: what the node inventory says is installed (every device "
                   "seen, where no inventory reported). Consumed = active + starved."))  # fmt: skip
    usage = wh.fleet_usage(period, views)
    page.add(Table("generations", "Allocated vs consumed, and what idle time cost, per generation",
                   fleet.CAPACITY_COLUMNS, fleet.by_generation(usage)))  # fmt: skip
    page.add(Table("queue", "Queue wait from submit to start", fleet.QUEUE_COLUMNS, fleet.queue(wh.queue_waits(period)),
                   note="Jobs that started in the month, from their scheduler's submit and start times."))  # fmt: skip
    page.add(Table("coverage_gaps", "Coverage gaps: devices present but not reporting", fleet.COVERAGE_COLUMNS,
                   fleet.coverage_gaps(wh.coverage_gaps(period)),
                   note="Per node: device-seconds the inventory expected and telemetry did not cover "
                        "(a held device with no telemetry is dark, never idle)."))  # fmt: skip
    page.add(Table("unpriced", "Unpriced hours: no rate on the card", fleet.UNPRICED_COLUMNS, fleet.unpriced(usage)))
    page.add(Table("policy_drift", "Policy drift: where a scheduler differs from the policy now", fleet.DRIFT_COLUMNS,
                   fleet.policy_drift(wh.policy_drift()),
                   note="The policy watch's latest word per engine (gpuledger policy watch): shown until it finds the "
                        "engine matches the policy again, whatever the month."))  # fmt: skip
    page.add(Table("policy_applies", "Policy applies: who changed the schedulers, each setting before and after",
                   fleet.APPLY_COLUMNS, fleet.policy_applies(wh.policy_applies()),
                   note="The latest 20 `gpuledger policy apply` runs, whatever the month; who is the engine's own "
                        "answer (Slurm: the OS user; Kubernetes: the authenticated user)."))  # fmt: skip
    jobs = m.merge_segments(wh.idle_leaders(period, FLEET_IDLE_LEADERS * 2, views))
    team_of = {j.key: j.team for j in jobs}
    leaders = m.most_idle_cost(jobs, FLEET_IDLE_LEADERS)
    for row in leaders:
        row["team"] = team_of[(row["cluster"], row["job_id"])]
        row["_job_url"] = job_url(row["cluster"], row["job_id"], period)
        row["_team_url"] = team_url(row["team"], period)
    page.add(Table("idle_leaders", "Idle leaders: the jobs whose idle time cost the most", FLEET_JOB_COLUMNS, leaders,
                   links={"job_id": "_job_url", "team": "_team_url"},
                   note="Idle: held, with telemetry, neither active nor starved; at the job's own rate."))  # fmt: skip
    page.context.update(period=period, headline=fleet.headline(days), chart=charts.daily_chart(fleet.chart_days(days)),
                        totals=_fleet_totals(statements),
                        prev_url=fleet_url(period.previous()), next_url=fleet_url(period.next()))  # fmt: skip
    return page


def _fleet_clusters(wh: Warehouse, period: Period, closed: bool) -> list[dict[str, Any]]:
    """`report chargeback --by cluster`'s lines (sinks/reconcile.py), then each cluster across teams (summed as the
    report sums, `add_up`); the last line is the month's total over every cluster."""
    from dataclasses import asdict

    report, across, everywhere = wh.clusters_report(period, closed=closed)
    rows = [{**asdict(ln.line), "team": ln.line.line, "cluster": ln.cluster,
             "_team_url": team_url(ln.line.line, period)} for ln in report.lines]  # fmt: skip
    rows += [{**asdict(ln.line), "team": "ALL", "cluster": name} for name, ln in across]
    rows.append({**asdict(report.total.line), "team": "TOTAL", "cluster": everywhere})
    return rows


def _fleet_totals(statements: Mapping[str, Statement]) -> dict[str, Any]:
    """The teams' lines added up, as `report chargeback` adds its TOTAL line."""
    keys = ("jobs", "allocated_gpu_h", "charge", "consumed_gpu_h", "idle_gpu_h", "dark_gpu_h", "idle_cost",
            "unpriced_gpu_h")  # fmt: skip
    totals: dict[str, Any] = {k: sum((s.figures[k] for s in statements.values()), Decimal(0)) for k in keys}
    totals["jobs"] = int(totals["jobs"])
    return totals
