"""What the pages read from ClickHouse, as the read-only analyst: the views analysts and `report chargeback`
read, so the page and the report cannot disagree. Every value is a bound parameter; identifiers are fixed
text in this module. Rows come back as the view model's types (web/model.py).

This is the one module of web/ that imports the sinks (tests/unit/test_layering.py): where the report code
already reads or shapes a figure (`report chargeback --by cluster`, the statements and their adjustments, the
governance look-ups, identities, quota, the attribution baseline), the page reads it through here and restates
none of it. A module the page needs only now and then is imported at its first use, as before.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sinks.chargeback import LINE_COLUMNS
from sinks.chargeback import quota_lines as quota_lines
from sinks.identities import identity_text as identity_text
from sinks.identities import owner_text as owner_text
from sinks.identities import robots_of as robots_of
from sinks.identities import self_declared_notes as self_declared_notes
from sinks.identities import source_text as source_text
from sinks.ratecard import ONPREM
from web.fleet import FleetDay, FleetUsage, QueueWait
from web.model import AlertRow, Day, JobUsage, ProjectSources, Sums, TeamUsage
from web.params import Period

STATEMENT_COLUMNS = (*LINE_COLUMNS, "allocated_seconds", "dark_seconds")


@dataclass(frozen=True, slots=True)
class PricedViews:
    """Where a month's priced usage and statement lines are read: the views every report reads, or, for a month
    with no reused job id and no contested device-day, views that give the same rows without the machinery for
    those two (migration 031: a read planned in ~20 ms instead of ~75). Fixed names, never request input."""

    usage: str = "v_usage_priced"
    month: str = "v_chargeback_month"


FULL_VIEWS = PricedViews()
SINGLE_LIVES_VIEWS = PricedViews("v_usage_priced_single", "v_chargeback_month_single")
# The single views over the lives of the month's ids only, for a ledger of many months (v_month_single_lives'
# `month_lives`; sinks/views/v_job_lives_month.sql). A view of one month: every read of a PricedViews' usage binds
# `period`, whichever views it reads.
MONTH_LIVES_VIEWS = PricedViews("v_usage_priced_month_lives(period = {period:String})", "v_chargeback_month_lives")


def _job_usage_head(views: PricedViews) -> str:
    """The head of a job-usage query over `views`' priced usage; a scope, `_on` and `_JOB_GROUP` follow."""
    return (
        "SELECT cluster, job_id, any(user), any(team), project, any(original_project), any(correction_id), "
        "generation, pricing_tier, preemptible, sum(allocated_s), sum(active_s), sum(starved_s), sum(idle_s), "
        "sum(dark_s), sum(charge_num), sum(idle_charge_num), sum(unpriced_s), min(day), max(day) "
        f"FROM {views.usage} WHERE day >= {{start:Date}} AND day < {{end:Date}} AND "
    )


# A closed month's frozen usage lines (v_statement_lines), in the same shape; idle cost from the frozen rate.
_FROZEN_USAGE = (
    "SELECT cluster, job_id, any(user), any(team), project, any(original_project), any(correction_id), generation, "
    "pricing_tier, preemptible, sum(allocated_s), sum(active_s), sum(starved_s), sum(idle_s), sum(dark_s), "
    "sum(charge_num), sum(toInt128(idle_s) * rate_micro_per_gpu_hour), sum(unpriced_s), NULL, NULL "
    "FROM v_statement_lines WHERE period = {period:String} AND kind = 'usage' AND "
)
_JOB_GROUP = " GROUP BY cluster, job_id, project, generation, pricing_tier, preemptible"
# The three scopes of the job-usage query: fixed text, values bound.
_BY_TEAM = "team = {team:String}"
_BY_TEAM_PROJECT = "team = {team:String} AND project = {project:String}"
_BY_JOB = "cluster = {cluster:String} AND job_id = {job:String}"
# The team page's optional cluster filter (`?cluster=`): fixed text appended to a WHERE, the name bound.
_ON_CLUSTER = " AND cluster = {cluster:String}"


def _on(cluster: str | None) -> str:
    return "" if cluster is None else _ON_CLUSTER


# The team's jobs of the month, as the rows of usage_daily name them. Their events are picked from job_events by
# job_id first, then by the (cluster, job_id) pair: a set of one column prunes the table's rows at a fraction of a
# pair set's cost (at 10,000 GPUs and a year of history, 2.5 M events: 3-4x faster; issue 44 item 6), the pair
# keeps the pick exact.
_MONTH_IDS = "FROM usage_daily WHERE day >= {start:Date} AND day < {end:Date} AND team = {team:String} AND job_id != ''"


# A team's month grouped in one read (team_usage): the lines per project, user and cluster, the seconds per
# generation and tier (quota use), per day of the open ledger (the chart), per job (only the `limit` with the most
# idle cost are kept, ranked on the server) and the total; `grouping()` says which set a row is (a bit set for each
# column not in it, the SQL standard's). A job's other columns are any of its rows', as `merge_segments` keeps.
_GROUPED = (
    "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY g ORDER BY idle_num DESC, cluster, job_id) AS rank "
    "FROM (SELECT grouping(project, user, cluster, generation, pricing_tier, d, job_id) AS g, project, user, "
    "cluster, generation, pricing_tier, d, job_id, uniqExact(cluster, job_id), sum(allocated_s), sum(active_s), "
    "sum(starved_s), sum(idle_s), sum(dark_s), sum(charge_num), sum({idle}) AS idle_num, sum(unpriced_s), "
    "any(user), any(team), any(project), any(original_project), any(correction_id), any(generation), "
    "any(pricing_tier), any(preemptible), {days} FROM (SELECT *, {day} AS d FROM {source}) "
    "GROUP BY GROUPING SETS ((project), (user), (cluster), (generation, pricing_tier), (d), (cluster, job_id), ()))) "
    "WHERE g != {{jobs:UInt8}} OR (idle_num > 0 AND rank <= {{limit:UInt32}})"
)
_GROUPED_COLUMNS = ("project", "user", "cluster", "generation", "pricing_tier", "d", "job_id")


def _grouping(*in_set: str) -> int:
    return sum(1 << (len(_GROUPED_COLUMNS) - 1 - i) for i, c in enumerate(_GROUPED_COLUMNS) if c not in in_set)


_GROUPING_SETS = {
    _grouping("project"): "project", _grouping("user"): "user", _grouping("cluster"): "cluster",
    _grouping("generation", "pricing_tier"): "generation", _grouping("d"): "day",
    _grouping("cluster", "job_id"): "job", _grouping(): "",
}  # fmt: skip
_JOB_SET = _grouping("cluster", "job_id")
# The team's rows of the month: the ledger now (its source follows the priced usage view's name), or a closed
# month's frozen usage lines (idle at the frozen rate).
_TEAM_OPEN = {"source": " WHERE day >= {start:Date} AND day < {end:Date} AND team = {team:String}",
              "idle": "idle_charge_num", "days": "min(day), max(day)", "day": "day"}  # fmt: skip
_TEAM_CLOSED = {
    "source": "v_statement_lines WHERE period = {period:String} AND kind = 'usage' AND team = {team:String}",
    "idle": "toInt128(idle_s) * rate_micro_per_gpu_hour", "days": "NULL, NULL", "day": "toDate(0)",
}  # fmt: skip


def _sums(row: tuple[Any, ...]) -> Sums:
    jobs, alloc, act, starv, idle, dark, num, idle_num, unpriced = (int(v) for v in row)
    return Sums(alloc, act, starv, idle, dark, num, idle_num, unpriced, counted_jobs=jobs)


def _job_usage(row: tuple[Any, ...]) -> JobUsage:
    (cluster, job_id, user, team, project, original, correction, gen, tier, pre, alloc, act, starv, idle, dark,
     num, idle_num, unpriced, first, last) = row  # fmt: skip
    return JobUsage(
        str(cluster), str(job_id), str(user), str(team), str(project), str(original or project), str(correction or ""),
        str(gen), str(tier), bool(pre), int(alloc), int(act), int(starv), int(idle), int(dark), int(num),
        int(idle_num), int(unpriced), first, last,
    )


@dataclass(frozen=True, slots=True)
class Statement:
    """A team's line of `report chargeback --by team` for the month, as the report prints it."""

    line: str
    figures: dict[str, Any]
    allocated_seconds: int
    dark_seconds: int


class _Reads:
    """A clickhouse-connect client logged in as the analyst, and the one way the pages read through it."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def _rows(self, sql: str, **parameters: Any) -> list[tuple[Any, ...]]:
        return list(self.client.query(sql, parameters=parameters).result_rows)


class _FleetReads(_Reads):
    """The fleet page's reads (operators and finance)."""

    def fleet_days(self, period: Period) -> list[FleetDay]:
        """Per day of the period: the fleet's allocated seconds by class and its unallocated telemetry
        (usage_daily), and the inventory's device-seconds with how many reported (coverage_daily)."""
        usage = {d: (int(a), int(s), int(i), int(k), int(u)) for d, a, s, i, k, u in self._rows(
            "SELECT day, sum(active_s), sum(starved_s), sum(idle_s), sum(dark_s), sum(unallocated_s) FROM usage_daily "
            "WHERE day >= {start:Date} AND day < {end:Date} GROUP BY day",
            start=period.start, end=period.end,
        )}  # fmt: skip
        inventory = {d: (int(e), int(r)) for d, e, r in self._rows(
            "SELECT day, sum(expected_device_s), sum(reporting_device_s) FROM coverage_daily "
            "WHERE day >= {start:Date} AND day < {end:Date} GROUP BY day",
            start=period.start, end=period.end,
        )}  # fmt: skip
        return [FleetDay(d, *usage.get(d, (0, 0, 0, 0, 0)), *inventory.get(d, (0, 0)))
                for d in sorted(set(usage) | set(inventory))]  # fmt: skip

    def policy_drift(self) -> list[tuple[str, str, str, int, list[str]]]:
        """Per cluster and engine, the policy watch's latest word (alerts POLICY_DRIFT / POLICY_DRIFT_CLEARED,
        producers/policy_watch.py): (cluster, engine, alert kind, ts_ms, drift lines). Not bound to a period: a
        drift shows until the watch says it is gone; a drift and its clear in one millisecond read as cleared."""
        return [(str(c), str(e), str(k), int(t), [str(x) for x in lines]) for c, e, k, t, lines in self._rows(
            "SELECT cluster, engine, argMax(kind, (ts_ms, kind = 'POLICY_DRIFT_CLEARED')) AS k, max(ts_ms), "
            "argMax(drift_lines, (ts_ms, kind = 'POLICY_DRIFT_CLEARED')) FROM alerts FINAL "
            "WHERE kind IN ('POLICY_DRIFT', 'POLICY_DRIFT_CLEARED') AND engine IS NOT NULL "
            "GROUP BY cluster, engine ORDER BY cluster, engine",
        )]  # fmt: skip

    def policy_applies(self, limit: int = 20) -> list[tuple[Any, ...]]:
        """The latest `policy apply` records (policy_applies, producers/policy_audit.py), newest first: (ts_ms,
        cluster, engine, actor, actor_source, change objects, settings, before, after, still differs)."""
        return self._rows(
            "SELECT ts_ms, cluster, engine, actor, actor_source, change_objects, change_settings, change_before, "
            "change_after, still_differs FROM policy_applies FINAL ORDER BY ts_ms DESC, apply_id LIMIT {n:UInt32}",
            n=limit,
        )

    def coverage_gaps(self, period: Period, limit: int = 100) -> list[tuple[str, str, int, int]]:
        """Nodes whose inventory's devices did not all report in the period: (cluster, node, expected
        device-seconds, reporting device-seconds), the largest gap first."""
        return [(str(c), str(n), int(e), int(r)) for c, n, e, r in self._rows(
            "SELECT cluster, node, sum(expected_device_s) AS e, sum(reporting_device_s) AS r FROM coverage_daily "
            "WHERE day >= {start:Date} AND day < {end:Date} GROUP BY cluster, node HAVING r < e "
            "ORDER BY e - r DESC, cluster, node LIMIT {limit:UInt32}",
            start=period.start, end=period.end, limit=limit,
        )]  # fmt: skip

    def fleet_usage(self, period: Period, views: PricedViews = FULL_VIEWS) -> list[FleetUsage]:
        """The fleet's priced usage per cluster, generation, tier and preemptibility (v_usage_priced)."""
        rows = self._rows(
            "SELECT cluster, generation, pricing_tier, preemptible, uniqExact(job_id), sum(allocated_s), "
            "sum(active_s), sum(starved_s), sum(idle_s), sum(dark_s), sum(charge_num), sum(idle_charge_num), "
            f"sum(unpriced_s) FROM {views.usage} WHERE day >= {{start:Date}} AND day < {{end:Date}} "
            "GROUP BY cluster, generation, pricing_tier, preemptible "
            "ORDER BY cluster, generation, pricing_tier, preemptible",
            start=period.start, end=period.end, period=period.text,
        )  # fmt: skip
        return [FleetUsage(str(c), str(g), str(t), bool(p), *(int(v) for v in rest)) for c, g, t, p, *rest in rows]

    def idle_leaders(self, period: Period, limit: int = 20, views: PricedViews = FULL_VIEWS) -> list[JobUsage]:
        """The fleet's jobs with the most idle cost in the period (one row per job and price)."""
        rows = self._rows(_job_usage_head(views) + "job_id != ''" + _JOB_GROUP +
                          " ORDER BY sum(idle_charge_num) DESC, cluster, job_id LIMIT {limit:UInt32}",
                          start=period.start, end=period.end, period=period.text, limit=limit)  # fmt: skip
        return [_job_usage(r) for r in rows]

    def queue_waits(self, period: Period) -> list[QueueWait]:
        """Per generation and tier: the jobs that started in the period and how long each waited from
        submission to start (job events with both times; generation and tier from the job's usage)."""
        rows = self._rows(
            "SELECT u.generation, u.pricing_tier, count(), quantileExact(0.5)(q.wait_ms), "
            "quantileExact(0.9)(q.wait_ms), max(q.wait_ms), sum(q.wait_ms) FROM ("
            "  SELECT cluster, job_id, greatest(0, min(start_ts_ms) - min(submit_ts_ms)) AS wait_ms FROM job_events "
            "  WHERE submit_ts_ms IS NOT NULL AND start_ts_ms IS NOT NULL GROUP BY cluster, job_id "
            "  HAVING min(start_ts_ms) >= {start_ms:Int64} AND min(start_ts_ms) < {end_ms:Int64}"
            ") AS q INNER JOIN ("
            "  SELECT cluster, job_id, any(generation) AS generation, any(pricing_tier) AS pricing_tier "
            "  FROM usage_daily WHERE day >= {start:Date} AND day < {end:Date} AND job_id != '' "
            "  GROUP BY cluster, job_id"
            ") AS u ON q.cluster = u.cluster AND q.job_id = u.job_id "
            "GROUP BY u.generation, u.pricing_tier ORDER BY u.generation, u.pricing_tier",
            start=period.start, end=period.end, start_ms=period.start_ms(), end_ms=period.end_ms(),
        )  # fmt: skip
        return [QueueWait(str(g), str(t), int(n), int(p50), int(p90), int(top), int(total))
                for g, t, n, p50, p90, top, total in rows]  # fmt: skip


class _QualityReads(_Reads):
    """What the team page's data-quality section reads beside the month's usage."""

    def dark_by_node(self, period: Period, team: str, cluster: str | None = None) -> list[tuple[str, int]]:
        """Where the team's allocated time had no telemetry, per node (the daily rollup node_daily: one row
        per team, day and node, so a month of 10,000 GPUs is read in thousands of rows, not millions)."""
        return [(str(n), int(s)) for n, s in self._rows(
            "SELECT node, sum(dark_s) FROM node_daily WHERE team = {team:String} AND day >= {start:Date} "
            "AND day < {end:Date}" + _on(cluster) + " GROUP BY node HAVING sum(dark_s) > 0 ORDER BY 2 DESC, 1 LIMIT 50",
            start=period.start, end=period.end, team=team, cluster=cluster or "",
        )]  # fmt: skip

    def project_sources(self, period: Period, team: str, cluster: str | None = None) -> ProjectSources:
        """Of the team's jobs in the month: how many were charged to their user's default project (the last event
        says so), and how many claimed a project their user is not a member of. Counted on the server: a job a
        row would be thousands of rows a page at 10,000 GPUs."""
        rows = self._rows(
            "SELECT countIf(source = 'DEFAULT'), countIf(claimed) FROM (SELECT argMax(project_source, ts_ms) AS "
            "source, max(project_claimed IS NOT NULL) AS claimed FROM job_events WHERE job_id IN (SELECT job_id "
            + _MONTH_IDS + _on(cluster) + ") AND (cluster, job_id) IN (SELECT cluster, job_id " + _MONTH_IDS
            + _on(cluster) + ") GROUP BY cluster, job_id)",
            start=period.start, end=period.end, team=team, cluster=cluster or "",
        )  # fmt: skip
        return ProjectSources(int(rows[0][0]), int(rows[0][1])) if rows else ProjectSources(0, 0)

    def identity_clusters(self, period: Period, team: str, cluster: str | None = None) -> list[Any]:
        """Per cluster, the team's jobs of the month by where their user names came from (sinks/identities.py, as
        `report chargeback` reads it): the clusters whose identities are only self-declared."""
        from sinks.identities import cluster_identities

        return cluster_identities(self.client, period.text, team, cluster)

    def team_identities(self, period: Period, team: str, cluster: str | None = None,
                        views: PricedViews = FULL_VIEWS) -> list[dict[str, Any]]:  # fmt: skip
        """The identities behind the team's month: one row per (name, identifier), never one per name, with its
        source, jobs (lives), allocated seconds and jobs whose self-declared user disagreed (v_job_identities
        joined to each life's priced usage)."""
        cols = ("user", "user_uid", "user_source", "jobs", "allocated_s", "claimed_jobs")
        rows = self._rows(
            "SELECT i.user, i.user_uid, argMax(i.user_source, u.job_start_ms), count(), sum(u.a), "
            "countIf(i.user_claimed IS NOT NULL) FROM ("
            "  SELECT cluster, job_id, job_start_ms, sum(allocated_s) AS a "
            f"  FROM {views.usage} WHERE day >= {{start:Date}} AND day < {{end:Date}} AND team = {{team:String}}"
            + _on(cluster) + " GROUP BY cluster, job_id, job_start_ms"
            ") AS u INNER JOIN ("
            "  SELECT cluster, job_id, job_start_ms, user, user_uid, user_source, user_claimed FROM v_job_identities "
            "  WHERE job_id IN (SELECT job_id " + _MONTH_IDS + _on(cluster) + ") AND (cluster, job_id) IN "
            "  (SELECT cluster, job_id " + _MONTH_IDS + _on(cluster) + ")"
            ") AS i ON u.cluster = i.cluster AND u.job_id = i.job_id AND u.job_start_ms = i.job_start_ms "
            "GROUP BY i.user, i.user_uid ORDER BY i.user, ifNull(i.user_uid, '') LIMIT 1000",
            start=period.start, end=period.end, period=period.text, team=team, cluster=cluster or "",
        )  # fmt: skip
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def latest_minute_ms(self, since: dt.date, cluster: str | None = None) -> int | None:
        """The newest device-minute stored since `since`, any team (node_daily's max per row)."""
        rows = self._rows("SELECT max(last_minute_ms), count() FROM node_daily WHERE day >= {since:Date}" +
                          _on(cluster), since=since, cluster=cluster or "")  # fmt: skip
        return int(rows[0][0]) if rows and rows[0][1] else None


DEVICE_MINUTE_COLUMNS = (
    "minute_start_ms", "node", "device_uuid", "mig_instance_id", "model", "generation", "allocated_s", "active_s",
    "starved_s", "idle_s", "dark_s", "sample_count", "activity_mean_ratio", "activity_max_ratio", "fb_used_mib_max",
    "power_w_mean", "sm_weighted_s", "mapping_version", "classifier_version",
)  # fmt: skip


class _ReportReads(_Reads):
    """What the report code reads (sinks/reconcile.py, sinks/baseline.py), read here so the page shows its figures."""

    def cluster_lines(self, period: Period, team: str, *, closed: bool = False) -> dict[str, dict[str, Any]]:
        """The team's lines of `report chargeback --by cluster` (sinks/reconcile.py, the report's own read):
        cluster -> the line's figures. The report splits its cents over every (team, cluster) line of the month,
        so the whole month is read and the team's lines picked here, not filtered in SQL."""
        from dataclasses import asdict

        from sinks.reconcile import ALL_CLUSTERS, chargeback_by_cluster

        report = chargeback_by_cluster(self.client, period.text, closed=closed)
        return {ln.cluster: {k: v for k, v in asdict(ln.line).items() if k != "line"}
                for ln in report.lines if ln.line.line == team and ln.cluster != ALL_CLUSTERS}  # fmt: skip

    def clusters_report(self, period: Period, *, closed: bool = False) -> tuple[Any, list[tuple[str, Any]], str]:
        """`report chargeback --by cluster` (sinks/reconcile.py): the report; each cluster's lines across teams
        added up as the report adds them (`add_up`), by cluster; and the name the report gives all clusters."""
        from sinks.reconcile import ALL_CLUSTERS, add_up, chargeback_by_cluster

        report = chargeback_by_cluster(self.client, period.text, closed=closed)
        per_cluster: dict[str, list[Any]] = {}
        for ln in report.lines:
            if ln.cluster != ALL_CLUSTERS:
                per_cluster.setdefault(ln.cluster, []).append(ln)
        return report, [(name, add_up("ALL", lines)) for name, lines in sorted(per_cluster.items())], ALL_CLUSTERS

    def baseline_marks(self, period: Period) -> Any:
        """The month against the attribution baseline (issue 38; sinks/baseline.py, as the reports), per team."""
        from sinks.baseline import baseline_now, month_marks

        return month_marks(self.client, period.text, baseline_now(self.client))


class Warehouse(_FleetReads, _QualityReads, _ReportReads):
    """The analyst's queries; `client` is a clickhouse-connect client logged in as the analyst."""

    def closed(self, period: Period) -> bool:
        """Whether the month is closed (issue 19): its statements are frozen, the pages show them."""
        rows = self._rows("SELECT count() FROM v_period_closes WHERE period = {period:String}", period=period.text)
        return bool(rows and rows[0][0])

    def closes(self) -> dict[str, Any]:
        """Every closed month's close (`sinks.statement_store.PeriodClose` by period): the pages that need both
        whether the month is closed and the statement's status read `v_period_closes` once."""
        from sinks.statement_store import StatementStore

        return dict(StatementStore(self.client).closes())

    def priced_views(self, period: Period) -> PricedViews:
        """The views that give the month's priced usage fastest (`v_month_single_lives`: whether the month has a
        usage row of a reused job id or a contested device-day; neither, and the single-lives views are exact; and
        whether the ledger holds so many more lives than the month has usage rows that joining only the month's ids'
        lives is the cheaper read)."""
        rows = self._rows("SELECT single, month_lives FROM v_month_single_lives(period = {period:String})",
                          period=period.text)  # fmt: skip
        if not rows or not rows[0][0]:
            return FULL_VIEWS
        return MONTH_LIVES_VIEWS if rows[0][1] else SINGLE_LIVES_VIEWS

    def statements(self, period: Period, *, closed: bool = False,
                   views: PricedViews = FULL_VIEWS) -> dict[str, Statement]:  # fmt: skip
        """Every team's statement line for the month, as `report chargeback --by team` prints it: the ledger now
        (`v_chargeback_month`), or a closed month's frozen lines (`v_statement_month`)."""
        cols = ", ".join(STATEMENT_COLUMNS)
        view = "v_statement_month" if closed else views.month
        rows = self._rows(
            f"SELECT {cols} FROM {view}(period = {{period:String}}, by = 'team') ORDER BY line",
            period=period.text,
        )
        out = {}
        for row in rows:
            values = dict(zip(STATEMENT_COLUMNS, row, strict=True))
            figures = {k: values[k] for k in LINE_COLUMNS}
            out[str(values["line"])] = Statement(str(values["line"]), figures, int(values["allocated_seconds"]),
                                                 int(values["dark_seconds"]))  # fmt: skip
        return out

    def team_jobs(self, period: Period, team: str, project: str | None = None, *, closed: bool = False,
                  cluster: str | None = None, views: PricedViews = FULL_VIEWS) -> list[JobUsage]:  # fmt: skip
        """The team's jobs in the month (on `cluster` only, when given), one row per job and price (corrections
        applied); of a closed month, its statement's frozen usage lines."""
        scope = _BY_TEAM if project is None else _BY_TEAM_PROJECT
        head = _FROZEN_USAGE if closed else _job_usage_head(views)
        rows = self._rows(head + scope + _on(cluster) + _JOB_GROUP, start=period.start, end=period.end, team=team,
                          project=project or "", period=period.text, cluster=cluster or "")  # fmt: skip
        return [_job_usage(r) for r in rows]

    def team_usage(self, period: Period, team: str, *, closed: bool = False, most_idle: int = 10,
                   cluster: str | None = None, views: PricedViews = FULL_VIEWS) -> TeamUsage:  # fmt: skip
        """The team's month grouped by the warehouse (what the team page shows of it), from the same rows as
        `team_jobs` (on `cluster` only, when given): one read, whatever the number of jobs. The days (`daily`'s
        rows) of the open ledger only: a closed month's frozen lines have none (its one row of days is ignored),
        so its page reads them apart (`days` is None)."""
        parts = _TEAM_CLOSED if closed else {**_TEAM_OPEN, "source": views.usage + _TEAM_OPEN["source"]}
        parts = {**parts, "source": parts["source"] + _on(cluster)}
        values = {"start": period.start, "end": period.end, "team": team, "period": period.text,
                  "cluster": cluster or ""}  # fmt: skip
        by: dict[str, dict[str, Sums]] = {"project": {}, "user": {}, "cluster": {}}
        onprem: dict[str, int] = {}
        days: list[Day] | None = None if closed else []
        total = Sums(counted_jobs=0)
        rows = self._rows(_GROUPED.format(**parts), jobs=_JOB_SET, limit=most_idle, **values)
        top: list[tuple[int, JobUsage]] = []
        for mask, project, user, cluster, generation, tier, day, job_id, *sums in rows:
            kind = _GROUPING_SETS[int(mask)]
            if kind == "generation":
                if tier == ONPREM:
                    onprem[str(generation)] = int(sums[1])
            elif kind == "day":
                if days is not None:
                    days.append(Day(day, int(sums[2]), int(sums[3]), int(sums[4]), int(sums[5])))
            elif kind == "job":
                top.append((int(sums[-1]), _job_usage((cluster, job_id, *sums[9:17], *sums[1:9], *sums[17:19]))))
            elif kind:
                by[kind][str({"project": project, "user": user, "cluster": cluster}[kind])] = _sums(tuple(sums[:9]))
            elif sums[0]:
                total = _sums(tuple(sums[:9]))
        return TeamUsage(by, onprem, total, [job for _, job in sorted(top, key=lambda t: t[0])],
                         sorted(days, key=lambda d: d.day) if days is not None else None)  # fmt: skip

    def job_usage(self, period: Period, cluster: str, job_id: str, views: PricedViews = FULL_VIEWS) -> list[JobUsage]:
        rows = self._rows(_job_usage_head(views) + _BY_JOB + _JOB_GROUP, start=period.start, end=period.end,
                          period=period.text, cluster=cluster, job=job_id)  # fmt: skip
        return [_job_usage(r) for r in rows]

    def daily(self, period: Period, team: str, cluster: str | None = None,
              views: PricedViews = FULL_VIEWS) -> list[Day]:  # fmt: skip
        rows = self._rows(
            f"SELECT day, sum(active_s), sum(starved_s), sum(idle_s), sum(dark_s) FROM {views.usage} "
            "WHERE day >= {start:Date} AND day < {end:Date} AND team = {team:String}" + _on(cluster) +
            " GROUP BY day ORDER BY day",
            start=period.start, end=period.end, period=period.text, team=team, cluster=cluster or "",
        )  # fmt: skip
        return [Day(d, int(a), int(s), int(i), int(k)) for d, a, s, i, k in rows]

    def team_alerts(self, team: str, since_ms: int, cluster: str | None = None) -> list[AlertRow]:
        rows = self._rows(
            "SELECT kind, ts_ms, cluster, ifNull(job_id, ''), ifNull(user, ''), ifNull(project, ''), idle_minutes, "
            "cost_so_far, action, action_at_ms, dry_run FROM alerts FINAL WHERE team = {team:String} "
            "AND ts_ms >= {since:Int64} AND kind IN ('IDLE_WARNING', 'IDLE_RESOLVED', 'RECLAIM_NOTICE')" +
            _on(cluster) + " ORDER BY ts_ms LIMIT 100000",
            team=team, since=since_ms, cluster=cluster or "",
        )  # fmt: skip
        return [AlertRow(str(k), int(ts), str(c), str(j), str(u), str(p), i, cost, a, at, bool(d))
                for k, ts, c, j, u, p, i, cost, a, at, d in rows]  # fmt: skip

    def job_alerts(self, cluster: str, job_id: str) -> list[dict[str, Any]]:
        """A job's idle warnings and reclaim notices (what an appeal may name), newest first."""
        cols = ("alert_id", "kind", "ts_ms", "action")
        rows = self._rows(
            "SELECT alert_id, kind, ts_ms, ifNull(action, '') FROM alerts FINAL WHERE cluster = {cluster:String} "
            "AND job_id = {job:String} AND kind IN ('IDLE_WARNING', 'RECLAIM_NOTICE') ORDER BY ts_ms DESC LIMIT 50",
            cluster=cluster, job=job_id,
        )  # fmt: skip
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def job_states(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
        if not keys:
            return {}
        rows = self._rows(
            "SELECT cluster, job_id, argMax(event_type, (ts_ms, event_id)) FROM job_events "
            "WHERE (cluster, job_id) IN {keys:Array(Tuple(String, String))} GROUP BY cluster, job_id",
            keys=keys,
        )
        return {(str(c), str(j)): str(s) for c, j, s in rows}

    def gangs(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
        """The gangs of these jobs: (cluster, gang id) -> each member (a job whose events named devices) -> its
        latest event. Jobs in no gang are in none."""
        if not keys:
            return {}
        rows = self._rows(
            "SELECT cluster, gang_id, job_id, argMax(event_type, (ts_ms, event_id)) FROM job_events "
            "WHERE (cluster, gang_id) IN (SELECT cluster, assumeNotNull(gang_id) FROM job_events "
            "WHERE (cluster, job_id) IN {keys:Array(Tuple(String, String))} AND gang_id IS NOT NULL) "
            "GROUP BY cluster, gang_id, job_id "
            "HAVING countIf(event_type IN ('STARTED', 'RESUMED', 'UPDATED') AND allocations != '[]') > 0",
            keys=keys,
        )
        out: dict[tuple[str, str], dict[str, str]] = {}
        for cluster, gang, job, state in rows:
            out.setdefault((str(cluster), str(gang)), {})[str(job)] = str(state)
        return out

    def job(self, cluster: str, job_id: str) -> dict[str, Any] | None:
        cols = ("state", "user", "project", "team", "cost_centre", "job_name", "pricing_tier", "preemptible",
                "gang_size", "start_ts_ms", "end_ts_ms")  # fmt: skip
        rows = self._rows(
            "SELECT argMax(event_type, (ts_ms, event_id)), argMax(user, (ts_ms, event_id)), "
            "argMax(project, (ts_ms, event_id)), argMax(team, (ts_ms, event_id)), "
            "argMax(cost_centre, (ts_ms, event_id)), argMax(job_name, (ts_ms, event_id)), "
            "argMax(pricing_tier, (ts_ms, event_id)), argMax(preemptible, (ts_ms, event_id)), "
            "argMax(gang_size, (ts_ms, event_id)), min(start_ts_ms), max(end_ts_ms) "
            "FROM job_events WHERE cluster = {cluster:String} AND job_id = {job:String} HAVING count() > 0",
            cluster=cluster, job=job_id,
        )  # fmt: skip
        return dict(zip(cols, rows[0], strict=True)) if rows else None

    def job_lives_identities(self, cluster: str, job_id: str) -> list[tuple[int, Any]]:
        """Who each life of the job ran as (job_start_ms, sinks.identities.JobIdentity), latest life first."""
        from sinks.identities import job_identities

        found = job_identities(self.client, [(cluster, job_id)])
        return sorted(((start, who) for (_, _, start), who in found.items()), key=lambda x: -x[0])

    def corrections(self, cluster: str, job_id: str) -> list[dict[str, Any]]:
        cols = ("correction_id", "ts_ms", "old_project", "new_project", "reason", "corrected_by")
        rows = self._rows(
            f"SELECT {', '.join(cols)} FROM attribution_corrections FINAL WHERE cluster = {{cluster:String}} "
            "AND job_id = {job:String} ORDER BY ts_ms, correction_id",
            cluster=cluster, job=job_id,
        )  # fmt: skip
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def job_nodes(self, cluster: str, job_id: str) -> list[str]:
        """The nodes the job's events allocated: device_minutes is sorted by (cluster, node, ...), so naming
        them lets a job's drill-down read its nodes' parts only, not the whole month of every device."""
        return [str(n) for (n,) in self._rows(
            "SELECT DISTINCT JSONExtractString(a, 'node') AS n FROM job_events "
            "ARRAY JOIN JSONExtractArrayRaw(allocations) AS a "
            "WHERE cluster = {cluster:String} AND job_id = {job:String} AND n != '' LIMIT 10000",
            cluster=cluster, job=job_id,
        )]  # fmt: skip

    def _on_nodes(self, cluster: str, job_id: str) -> tuple[str, dict[str, Any]]:
        """The job's device_minutes filter: its nodes when its events name them (else every node)."""
        nodes = self.job_nodes(cluster, job_id)
        return ("AND node IN {nodes:Array(String)} ", {"nodes": nodes}) if nodes else ("", {})

    def job_devices(self, period: Period, cluster: str, job_id: str) -> list[dict[str, Any]]:
        cols = ("node", "device_uuid", "mig_instance_id", "model", "minutes", "allocated_s", "active_s",
                "starved_s", "idle_s", "dark_s", "first_minute_ms", "last_minute_ms")  # fmt: skip
        on_nodes, nodes = self._on_nodes(cluster, job_id)
        rows = self._rows(
            "SELECT node, device_uuid, mig_instance_id, any(model), count(), sum(allocated_s), sum(active_s), "
            "sum(starved_s), sum(idle_s), sum(dark_s), min(minute_start_ms), max(minute_start_ms) "
            "FROM device_minutes FINAL WHERE cluster = {cluster:String} AND job_id = {job:String} " + on_nodes +
            "AND day >= {start:Date} AND day < {end:Date} GROUP BY node, device_uuid, mig_instance_id "
            "ORDER BY node, device_uuid, mig_instance_id LIMIT 10000",
            cluster=cluster, job=job_id, start=period.start, end=period.end, **nodes,
        )  # fmt: skip
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def device_minutes(self, cluster: str, job_id: str, start_ms: int, end_ms: int, limit: int) -> list[dict[str, Any]]:
        cols = DEVICE_MINUTE_COLUMNS
        on_nodes, nodes = self._on_nodes(cluster, job_id)
        rows = self._rows(
            f"SELECT {', '.join(cols)} FROM device_minutes FINAL WHERE cluster = {{cluster:String}} "
            "AND job_id = {job:String} " + on_nodes +
            "AND minute_start_ms >= {start:Int64} AND minute_start_ms < {end:Int64} "
            "ORDER BY minute_start_ms, node, device_uuid, mig_instance_id LIMIT {limit:UInt32}",
            cluster=cluster, job=job_id, start=start_ms, end=end_ms, limit=limit, **nodes,
        )  # fmt: skip
        return [dict(zip(cols, r, strict=True)) for r in rows]

    def team_of_project(self, period: Period, project: str) -> list[str]:
        return [str(t) for (t,) in self._rows(
            "SELECT DISTINCT team FROM v_usage_priced WHERE day >= {start:Date} AND day < {end:Date} "
            "AND project = {project:String}", start=period.start, end=period.end, project=project,
        )]  # fmt: skip


def decimal_or_none(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def connect_analyst(clickhouse: Any, timeout_s: float) -> Any:
    """The analyst's ClickHouse client (read-only, never the writer's), as `report` and analysts' tools use it."""
    from sinks.db import connect

    return connect(clickhouse, analyst=True, send_receive_timeout=int(timeout_s))


def statement_store(client: Any) -> Any:
    """The closed statements (`sinks.statement_store.StatementStore`) read through `client`."""
    from sinks.statement_store import StatementStore

    return StatementStore(client)


def pending_lines(store: Any, period: str, charges: Any, team: str) -> list[Any]:
    """The team's lines other than usage a close of `period` would carry now (`sinks.statement_store`)."""
    from sinks.statement_store import pending_lines as pending

    return pending(store, period, charges, team)


def adjustments_since(store: Any, period: str, team: str) -> list[tuple[str, Any]]:
    """The team's adjustments to closed month `period`, by the month that holds each (`sinks.statement_store`)."""
    from sinks.statement_store import adjustments_since as since

    return since(store, period, team)


def governance_charges(client: Any, policy: Any) -> list[Any]:
    """The credits and reservation charges `period close` routes onto statements (`sinks.governance_charges`)."""
    from sinks.governance_charges import charges

    return list(charges(client, policy))


def appeal_events(client: Any) -> list[dict[str, Any]]:
    """Every appeal step the sink has stored (`sinks.governance`)."""
    from sinks.governance import appeal_events as stored

    return stored(client)


def job_escalation_events(client: Any, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The escalation steps of one job the sink has stored (`sinks.governance`)."""
    from sinks.governance import escalation_events

    return escalation_events(client, (cluster, job_id))


def escalation_job(client: Any, cluster: str, job_id: str) -> tuple[Any, bool]:
    """(the job as the escalation rules see it, or None when the ledger has none; whether the ledger saw it end)
    (`sinks.escalations.ledger_job_state`, what `escalate ask` reads)."""
    from sinks.escalations import ledger_job_state

    return ledger_job_state(client, cluster, job_id)


def alert_subject(client: Any, alert_id: str) -> Any:
    """The job behind an idle warning or reclaim notice, or None (`sinks.governance`)."""
    from sinks.governance import alert_subject as subject

    return subject(client, alert_id)


def job_subject(client: Any, cluster: str, job_id: str, period: str) -> Any:
    """A job's charge in `period`, or None when the ledger has no usage of it then (`sinks.governance`)."""
    from sinks.governance import job_subject as subject

    return subject(client, cluster, job_id, period)


# -- what if (issue 43) ---------------------------------------------------------------------------


def whatif_comparison(settings: Any, proposal: Any, period: str, by: str, now_ms: int) -> Any:
    """`policy whatif`'s comparison (`sinks.whatif.whatif` with `processors.whatif.replay_month`, the command's own
    call) for the fleet page, on a client of its own logged in as the read-only analyst (`connect_analyst`): every
    query of it is a read, and the engine refuses the analyst anything else. Closed when done."""
    from processors.whatif import replay_month, run_classes
    from sinks import whatif

    client = connect_analyst(settings.clickhouse, settings.web.query_timeout_s)
    try:
        return whatif.whatif(client, settings, period, proposal, by, replay_month, now_ms, None, run_classes())
    finally:
        client.close()


# -- resume a reclaimed job (issue 41 item 3): the page asks, `reclaim run` carries it out ----------------------


def resume_standing(client: Any, policy: Any, cluster: str, job_id: str, asker: str) -> tuple[Any, Any, str | None]:
    """(the job's owner, gpuledger's latest reclaim of it or None, the one line refusing `asker` or None): the rule
    `reclaim run` applies again when the request arrives (`sinks.reclaim_resume.may_resume`)."""
    from sinks.reclaim_resume import job_owner, latest_reclaim, may_resume

    owner = job_owner(client, cluster, job_id)
    return owner, latest_reclaim(client, cluster, job_id), may_resume(policy, owner, asker, job_id)


def resume_asked(cluster: str, job_id: str, asker: str, owner: Any, now_ms: int) -> dict[str, Any]:
    """The appeals.v1 step that asks the reclaim worker to resume the job (`sinks.reclaim_resume`)."""
    from sinks.reclaim_resume import resume_asked_event

    return resume_asked_event(cluster, job_id, asker, owner, now_ms)


def resume_outcomes(client: Any, cluster: str, job_id: str) -> list[dict[str, Any]]:
    """The job's reclaims and resumes as `action_outcomes` recorded them, newest first (64 steps at most)."""
    rows = client.query(
        "SELECT ts_ms, action, action_id, step, command, status, detail FROM action_outcomes "
        "WHERE cluster = {c:String} AND job_id = {j:String} AND NOT dry_run ORDER BY ts_ms DESC, step DESC LIMIT 64",
        parameters={"c": cluster, "j": job_id},
    ).result_rows
    keys = ("ts_ms", "action", "action_id", "step", "command", "status", "detail")
    return [dict(zip(keys, r, strict=True)) for r in rows]
