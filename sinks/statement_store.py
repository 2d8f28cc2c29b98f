"""Statements in ClickHouse: the reads and writes around the pure `sinks.statements` (issue 19).

`StatementStore` reads the ledger's current figures of a month (`v_usage_priced`), the closed months
(`v_period_closes`), their frozen lines (`v_statement_lines`) and data-quality tallies
(`v_statement_data_quality`), and writes a close (lines and tallies, then statements, then the `period_closes`
row that makes it count; tables in sinks/migrations/012_statements.sql and 024_statement_data_quality.sql).
`prepare` and `close_period` put the pure functions together: which adjustments and charges a month gets,
and the checks before a close. Values are bound parameters; table names are fixed here.

A team's scope (`team=`, the team page's reads): a closed month's frozen lines, posted adjustments and segments
of only the jobs that touch the team (`_TEAM_JOBS`), so the page prices its own jobs, not every team's. It is by
job, not by line: `pending_adjustments` names a job's cause from all of the job's lines (a job frozen under one
team may be charged to another now), so each job is read whole, and only the result is cut to the team.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, fields
from decimal import Decimal
from typing import Any, Literal

from base.errors import ConfigError
from sinks.chargeback import check_period
from sinks.data_quality import TALLY_FIELDS, DataQuality, Tally, frozen_figure, team_tallies
from sinks.journal import JournalLine, StatementLike, build_journal
from sinks.statements import (
    Charge,
    Segment,
    Statement,
    StatementLine,
    build_statements,
    cents_to_decimal,
    check_closable,
    close_id,
    pending_adjustments,
)

_MONTH = "day >= toDate(concat({p:String}, '-01')) AND day < addMonths(toDate(concat({p:String}, '-01')), 1)"
_SEGMENT_KEY = ("team", "cluster", "job_id", "user", "project", "original_project", "correction_id", "cost_centre",
                "generation", "pricing_tier", "preemptible", "rate_micro")  # fmt: skip
# The jobs of closed month {p} that touch team {team}: a usage line frozen for it, an adjustment to the month
# posted for it, or minutes of the month attributed to it. `pending_adjustments` of these jobs alone gives
# exactly the team's lines of all jobs' (a job's lines depend on that job's lines only), and more jobs than
# these would only cost time. The minutes' teams are read from usage_daily, not priced through v_usage_priced
# (~12x the time): v_usage_priced's rows are the same minutes (usage_daily's, or device_minutes' where a day is
# shared by two lives of an id or a device-minute is contested, which feed usage_daily too), so its jobs of a
# team are among usage_daily's.
_TEAM_JOBS = (
    "(cluster, job_id) IN ("
    "SELECT cluster, job_id FROM v_statement_lines "
    "WHERE period = {p:String} AND kind = 'usage' AND team = {team:String}"
    " UNION DISTINCT SELECT cluster, job_id FROM v_statement_lines "
    "WHERE kind = 'adjustment' AND source_period = {p:String} AND period > {p:String} AND team = {team:String}"
    f" UNION DISTINCT SELECT cluster, job_id FROM usage_daily WHERE {_MONTH} AND job_id != '' "
    "AND team = {team:String})"
)
LINE_COLUMNS = (
    "statement_id", "line_id", "period", "team", "kind", "source_period", "cluster", "job_id", "user", "project",
    "original_project", "correction_id", "cost_centre", "generation", "pricing_tier", "preemptible",
    "rate_micro_per_gpu_hour", "allocated_s", "active_s", "starved_s", "idle_s", "dark_s", "unpriced_s",
    "charge_num", "charge", "cause_kind", "cause_ref", "note",
)  # fmt: skip
STATEMENT_COLUMNS = (
    "statement_id", "close_id", "period", "team", "closed_ms", "closed_by", "content_hash", "card_version",
    "line_count", "jobs", "usage_charge", "adjustment_charge", "credit_charge", "reservation_charge", "total_charge",
    "allocated_s", "dark_s", "unpriced_s", "coverage_pct",
)  # fmt: skip
CLOSE_COLUMNS = ("period", "close_id", "closed_ms", "closed_by", "statements", "total_charge")
QUALITY_COLUMNS = ("statement_id", "period", "team", *TALLY_FIELDS)


@dataclass(frozen=True, slots=True)
class PeriodClose:
    period: str
    closed_ms: int
    close_id: str
    closed_by: str
    statements: int
    total_charge: Decimal


@dataclass(frozen=True, slots=True)
class StoredStatement:
    """A closed statement as stored: its header's figures and the lines read back."""

    statement_id: str
    period: str
    team: str
    closed_ms: int
    closed_by: str
    content_hash: str
    card_version: str
    total_charge: Decimal
    lines: tuple[StatementLine, ...]
    quality: Tally | None = None  # the data-quality tally frozen with it (None: closed before migration 024)

    def recomputed(self) -> Statement:
        return Statement(self.period, self.team, self.card_version, self.lines, self.quality)


def _line_row(statement_id: str, period: str, line: StatementLine) -> list[Any]:
    return [
        statement_id, line.line_id, period, line.team, line.kind, line.source_period,
        line.cluster, line.job_id, line.user, line.project, line.original_project, line.correction_id,
        line.cost_centre, line.generation, line.pricing_tier, line.preemptible, line.rate_micro, line.allocated_s,
        line.active_s, line.starved_s, line.idle_s, line.dark_s, line.unpriced_s, line.charge_num, line.charge,
        line.cause_kind, line.cause_ref, line.note,
    ]  # fmt: skip


def _line_from_row(values: dict[str, Any]) -> StatementLine:
    return StatementLine(
        kind=values["kind"], team=values["team"], source_period=values["source_period"], cluster=values["cluster"],
        job_id=values["job_id"], user=values["user"], project=values["project"],
        original_project=values["original_project"], correction_id=values["correction_id"],
        cost_centre=values["cost_centre"], generation=values["generation"], pricing_tier=values["pricing_tier"],
        preemptible=bool(values["preemptible"]), rate_micro=int(values["rate_micro_per_gpu_hour"]),
        allocated_s=int(values["allocated_s"]), active_s=int(values["active_s"]),
        starved_s=int(values["starved_s"]), idle_s=int(values["idle_s"]), dark_s=int(values["dark_s"]),
        unpriced_s=int(values["unpriced_s"]), charge_num=int(values["charge_num"]),
        cents=int(Decimal(values["charge"]) * 100), cause_kind=values["cause_kind"], cause_ref=values["cause_ref"],
        note=values["note"],
    )  # fmt: skip


def _scoped(where: str, team: str | None) -> tuple[str, dict[str, str]]:
    """`where`, and with `team` only the jobs that touch it (`_TEAM_JOBS`), and the parameters that adds."""
    return (where, {}) if team is None else (f"{where} AND {_TEAM_JOBS}", {"team": team})


class StatementStore:
    def __init__(self, client: Any) -> None:
        self._c = client

    @property
    def client(self) -> Any:
        return self._c

    def _rows(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        return list(self._c.query(sql, parameters=params).result_rows)

    # -- reads --

    def closes(self) -> dict[str, PeriodClose]:
        rows = self._rows("SELECT period, closed_ms, close_id, closed_by, statements, total_charge "
                          "FROM v_period_closes")
        return {str(r[0]): PeriodClose(str(r[0]), int(r[1]), str(r[2]), str(r[3]), int(r[4]), Decimal(r[5]))
                for r in rows}  # fmt: skip

    def months_with_usage(self) -> list[str]:
        rows = self._rows("SELECT DISTINCT formatDateTime(day, '%Y-%m') FROM usage_daily WHERE job_id != ''")
        return sorted(str(r[0]) for r in rows)

    def card_version(self) -> str:
        rows = self._rows("SELECT any(card_version) FROM v_rate_card")
        return str(rows[0][0]) if rows and rows[0][0] is not None else ""

    def quality(self, period: str) -> dict[str, Tally]:
        """Each team's data-quality tally of `period` from the ledger as it is now (what a close freezes)."""
        return team_tallies(self._c, check_period(period))

    def segments(self, period: str, team: str | None = None) -> list[Segment]:
        """The ledger's figures of `period` as they are now, per job and rate (corrections applied); with `team`,
        those of the jobs that touch it (`_TEAM_JOBS`: `period` closed), whichever team each segment names."""
        key = ", ".join(_SEGMENT_KEY)
        where, scope = _scoped(_MONTH, team)
        rows = self._rows(
            f"SELECT {key}, sum(allocated_s), sum(active_s), sum(starved_s), sum(idle_s), sum(dark_s), "
            f"sum(unpriced_s), sum(charge_num) FROM v_usage_priced WHERE {where} GROUP BY {key} ORDER BY {key}",
            p=check_period(period), **scope,
        )
        names = [f.name for f in fields(Segment)]
        out = []
        for r in rows:
            values: list[Any] = [*(str(v) for v in r[:10]), bool(r[10]), *(int(v or 0) for v in r[11:])]
            out.append(Segment(**dict(zip(names, values, strict=True))))
        return out

    def _lines_where(self, where: str, **params: Any) -> list[tuple[str, StatementLine]]:
        """(statement period, line) of the closed statements' lines matching `where`, oldest statement first."""
        rows = self._rows(f"SELECT {', '.join(LINE_COLUMNS)} FROM v_statement_lines WHERE {where} "
                          "ORDER BY period, statement_id, line_id", **params)  # fmt: skip
        out = []
        for row in rows:
            values = dict(zip(LINE_COLUMNS, row, strict=True))
            out.append((str(values["period"]), _line_from_row(values)))
        return out

    def frozen_lines(self, period: str, team: str | None = None) -> list[StatementLine]:
        """The lines of closed month `period`'s statements; with `team`, those of the jobs that touch it."""
        where, scope = _scoped("period = {p:String}", team)
        return [line for _, line in self._lines_where(where, p=period, **scope)]

    def posted_adjustments(self, source_period: str, team: str | None = None) -> list[tuple[str, StatementLine]]:
        """(the month whose closed statement holds it, line) of the adjustments of closed month `source_period`
        already posted, oldest first; with `team`, those of the jobs that touch it."""
        where, scope = _scoped("kind = 'adjustment' AND source_period = {p:String} AND period > {p:String}", team)
        return self._lines_where(where, p=source_period, **scope)

    def posted_refs(self) -> set[tuple[str, str]]:
        """(kind, ref) of the credits and reservation charges already in a closed statement."""
        rows = self._rows("SELECT DISTINCT kind, cause_ref FROM v_statement_lines "
                          "WHERE kind IN ('credit', 'reservation')")
        return {(str(k), str(r)) for k, r in rows}

    def job_cost_centres(self, jobs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """The cost centre of each job's usage in the closed statements (its earliest month's, if several)."""
        wanted = set(jobs)
        if not wanted:
            return {}
        rows = self._rows("SELECT cluster, job_id, argMin(cost_centre, period) FROM v_statement_lines "
                          "WHERE kind = 'usage' AND cost_centre != '' AND job_id IN {ids:Array(String)} "
                          "GROUP BY cluster, job_id", ids=sorted({j for _, j in wanted}))  # fmt: skip
        return {(str(c), str(j)): str(cc) for c, j, cc in rows if (str(c), str(j)) in wanted}

    def statements(self, period: str, team: str | None = None, *,
                   lines: Literal["all", "other", "none"] = "all") -> list[StoredStatement]:  # fmt: skip
        """The closed statements of `period` with their lines, as stored; with `team`, its statement alone (a page
        of one team need not read every team's lines). `lines`: "other", only the lines that are not usage (the
        few a page lists, without the thousands of usage lines); "none", only the heads and data-quality tallies.
        A statement read with some lines left out is for showing, not for `verify` (its hash covers them all)."""
        scope = {} if team is None else {"team": team}
        heads = self._rows(
            "SELECT statement_id, period, team, closed_ms, closed_by, content_hash, card_version, total_charge "
            "FROM v_statements WHERE period = {p:String}" + ("" if team is None else " AND team = {team:String}")
            + " ORDER BY team",
            p=period, **scope,
        )  # fmt: skip
        ids = sorted({str(r[0]) for r in heads})
        held: dict[str, list[StatementLine]] = {}
        if lines != "none" and ids:
            kinds = " AND kind != 'usage'" if lines == "other" else ""
            for row in self._rows(f"SELECT {', '.join(LINE_COLUMNS)} FROM v_statement_lines WHERE period = {{p:String}}"
                                  " AND statement_id IN {ids:Array(String)}" + kinds, p=period, ids=ids):  # fmt: skip
                values = dict(zip(LINE_COLUMNS, row, strict=True))
                held.setdefault(str(values["statement_id"]), []).append(_line_from_row(values))
        quality = {str(r[0]): Tally(*(int(v) for v in r[1:]))
                   for r in self._rows(f"SELECT statement_id, {', '.join(TALLY_FIELDS)} FROM v_statement_data_quality "
                                       "WHERE period = {p:String} AND statement_id IN {ids:Array(String)}",
                                       p=period, ids=ids)} if ids else {}  # fmt: skip
        return [
            StoredStatement(str(sid), str(per), str(team), int(ms), str(by), str(h), str(card), Decimal(total),
                            tuple(sorted(held.get(str(sid), []), key=lambda x: x.line_id)), quality.get(str(sid)))
            for sid, per, team, ms, by, h, card, total in heads
        ]  # fmt: skip

    def frozen_quality(self, period: str) -> DataQuality | None:
        """The data-quality figure closed month `period` froze (the sum of its statements' tallies); None when it
        is not closed or was closed before the figure was frozen with its statements."""
        return frozen_figure(period, (s.quality for s in self.statements(check_period(period), lines="none")))

    # -- the write --

    def write_close(self, period: str, statements: Sequence[Statement], closed_ms: int, closed_by: str) -> str:
        cid = close_id(period, statements)
        # A statement's id hashes all its lines: taken once per statement, not once per line (that was quadratic).
        ids = [s.statement_id for s in statements]
        line_rows = [_line_row(sid, s.period, line) for sid, s in zip(ids, statements, strict=True) for line in s.lines]
        if line_rows:
            self._c.insert("statement_lines", line_rows, column_names=list(LINE_COLUMNS))
        quality_rows = [[sid, s.period, s.team, *astuple(s.quality)] for sid, s in zip(ids, statements, strict=True)
                        if s.quality is not None]  # fmt: skip
        if quality_rows:
            self._c.insert("statement_data_quality", quality_rows, column_names=list(QUALITY_COLUMNS))
        heads = [[
            sid, cid, s.period, s.team, closed_ms, closed_by, s.content_hash, s.card_version, len(s.lines),
            s.jobs, s.total("usage"), s.total("adjustment"), s.total("credit"), s.total("reservation"), s.total(),
            s.seconds("allocated_s"), s.seconds("dark_s"), s.seconds("unpriced_s"), s.coverage_pct,
        ] for sid, s in zip(ids, statements, strict=True)]  # fmt: skip
        if heads:
            self._c.insert("statements", heads, column_names=list(STATEMENT_COLUMNS))
        total = cents_to_decimal(sum(s.total_cents() for s in statements))
        self._c.insert("period_closes", [[period, cid, closed_ms, closed_by, len(statements), total]],
                       column_names=list(CLOSE_COLUMNS))  # fmt: skip
        return cid


ChargeSource = Callable[[], Iterable[Charge]]


def _owed(
    store: StatementStore, source: str, card: str, team: str | None = None
) -> tuple[list[tuple[str, StatementLine]], list[StatementLine]]:
    """Closed month `source`'s adjustments already posted ((the month whose statement holds it, line), oldest
    first) and what it owes or is owed now (`pending_adjustments`); with `team`, from the jobs that touch it."""
    # Three reads that do not depend on each other, sent at once (the client has no session: it serves
    # concurrent queries from its pool): the caller waits for the slowest, not the sum.
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="owed-reads") as reads:
        posted_read = reads.submit(store.posted_adjustments, source, team)
        frozen_read = reads.submit(store.frozen_lines, source, team)
        now_read = reads.submit(store.segments, source, team)
        posted, frozen, now = posted_read.result(), frozen_read.result(), now_read.result()
    return posted, pending_adjustments(source, frozen, [line for _, line in posted], now, card)


def _carried(
    store: StatementStore, period: str, charges: Iterable[Charge], team: str | None = None
) -> tuple[list[StatementLine], list[Charge], str]:
    """What a close of `period` would carry besides its usage: the pending adjustments of every closed month
    (when no earlier month is open: months close in order), the credits and reservation charges routed to it that
    no closed statement holds yet, and the rate card's version. With `team`, the adjustments of the jobs that
    touch it only (other teams' lines of those jobs included: the caller keeps the team's)."""
    period = check_period(period)
    closes = store.closes()
    if period in closes:
        raise ConfigError(f"period {period} is closed: `gpuledger statement show --period {period}` shows it")
    open_before = any(p < period and p not in closes for p in store.months_with_usage())
    card = store.card_version()
    adjustments: list[StatementLine] = []
    if not open_before:
        for source in sorted(p for p in closes if p < period):
            adjustments += _owed(store, source, card, team)[1]
    done = store.posted_refs()
    routed = [
        c for c in charges
        if (c.kind, c.ref) not in done
        and (c.source_period == period or (c.source_period < period and c.source_period in closes and not open_before))
    ]  # fmt: skip
    return adjustments, routed, card


def prepare(store: StatementStore, period: str, charges: Iterable[Charge] = ()) -> tuple[Statement, ...]:
    """The statements `period` would close with now: its usage and what it would carry (`_carried`)."""
    adjustments, routed, card = _carried(store, period, charges)
    return build_statements(period, store.segments(period), adjustments, routed, card, store.quality(period))


def pending_lines(
    store: StatementStore, period: str, charges: Iterable[Charge] = (), team: str | None = None
) -> list[StatementLine]:
    """The lines other than usage that a close of `period` would carry now: `prepare`'s statements built without
    the month's usage or its data quality, which the team page does not show and need not price. With `team`,
    its lines only, from its jobs' figures only (the team page): the same lines as without, kept to the team."""
    adjustments, routed, card = _carried(store, period, charges, team)
    return [line for s in build_statements(period, (), adjustments, routed, card) if team in (None, s.team)
            for line in s.lines]  # fmt: skip


def close_period(
    store: StatementStore, period: str, closed_by: str, now_ms: int, charges: Iterable[Charge] = ()
) -> tuple[str, tuple[Statement, ...]]:
    """Close `period` (the checks of `check_closable` first): its statements frozen, the close id returned."""
    period = check_period(period)
    if not closed_by.strip():
        raise ConfigError("--by must name who closes the period")
    closes = store.closes()
    check_closable(period, now_ms, closes, store.months_with_usage())
    statements = prepare(store, period, charges)
    cid = store.write_close(period, statements, now_ms, closed_by.strip())
    return cid, statements


def adjustments_since(store: StatementStore, period: str, team: str | None = None) -> list[tuple[str, StatementLine]]:
    """The adjustments to closed month `period`: (the month whose statement holds it, line) for those posted
    in later closed statements, then ("open", line) for those the next open month would post now. With `team`,
    its lines only, from its jobs' figures only (the team page), as `pending_lines`."""
    posted, pending = _owed(store, period, store.card_version(), team)
    return [(where, line) for where, line in [*posted, *(("open", line) for line in pending)]
            if team in (None, line.team)]  # fmt: skip


def journal(store: StatementStore, period: str, charges: ChargeSource, *, account: str, contra_cost_centre: str,
            contra_account: str | None = None) -> list[JournalLine]:  # fmt: skip
    """The finance journal of `period` (`sinks.journal`): from its frozen statements when it is closed, else
    from the statements it would close with now (`prepare`, with `charges()`), marked provisional."""
    period = check_period(period)
    closed = period in store.closes()
    statements: Sequence[StatementLike] = store.statements(period) if closed else prepare(store, period, charges())
    unnamed = {(line.cluster, line.job_id) for s in statements for line in s.lines
               if line.job_id and not line.cost_centre}  # fmt: skip
    return build_journal(period, statements, closed=closed, account=account, contra_cost_centre=contra_cost_centre,
                         contra_account=contra_account, job_cost_centres=store.job_cost_centres(unnamed))  # fmt: skip


def month_quality(store: StatementStore, period: str, closed: bool) -> DataQuality:
    """The data-quality figure a month's reports carry: a closed month's as frozen at its close, whatever arrived
    since; an open month's from the ledger now. A month closed before the figure was frozen with its statements
    has only the ledger's now, and its scope says so."""
    from dataclasses import replace

    from sinks.data_quality import data_quality

    frozen = store.frozen_quality(period) if closed else None
    if frozen is not None:
        return frozen
    live = data_quality(store.client, period)
    return replace(live, scope=f"{period} now: closed before its figure was frozen") if closed else live


@dataclass(frozen=True, slots=True)
class Verified:
    statement_id: str
    team: str
    stored_hash: str
    recomputed_hash: str

    @property
    def ok(self) -> bool:
        return self.stored_hash == self.recomputed_hash and self.statement_id.endswith(self.stored_hash[:16])


def verify(store: StatementStore, period: str) -> list[Verified]:
    """Each closed statement of `period`: its stored hash beside the hash of the lines read back now."""
    out = []
    for s in store.statements(check_period(period)):
        out.append(Verified(s.statement_id, s.team, s.content_hash, s.recomputed().content_hash))
    return out
