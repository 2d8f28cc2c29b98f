"""The finance journal of a month (issue 19, "finance posting"): pure. No IO, no clock.

Built from a month's team statements (`sinks.statements`): the frozen ones of a closed month, or, for an
open month, the statements as they would close now (marked `provisional`). One journal line per

- **usage**: cost centre, the month's usage lines of every team charged to it (one debit per cost centre);
- **adjustment / credit / reservation**: cost centre, kind, source month and cause (`cause_kind`,
  `cause_ref`): an adjustment to a closed month, an appeal's credit or a reservation charge is its own line,
  naming what caused it, never folded into the usage debit;
- **contra**: one line to the cluster's cost centre for minus the sum of all the others, so the journal
  balances to zero (a credit when the month charged more than it credited, as it normally does).

Amounts are the statement lines' cents added up, so the journal, the statements and their totals agree to
the cent. `debit` and `credit` are never negative (one of them is zero); `amount` is debit minus credit.

A line's id is a hash of what the line is (month, kind, cost centre, account, source month, cause), not of
its amounts or of the statements' content hashes: re-exporting a month gives the same ids, and a line of a
provisional export keeps its id once the month closes, so a finance system that upserts by id replaces the
provisional amounts with the final ones. The statements a line derives from are listed in `statement_ids`.

A credit or reservation line names no cost centre of its own: it takes its job's (from the statements' or
the frozen months' usage lines, `job_cost_centres`), else its team's when the team has exactly one, else
UNASSIGNED, as a usage line without one does.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from decimal import Decimal
from typing import Protocol

from sinks.ratecard import gpu_hours
from sinks.statements import StatementLine, cents_to_decimal

UNASSIGNED = "UNASSIGNED"
CONTRA = "contra"
LINE_KINDS = ("usage", "adjustment", "credit", "reservation", CONTRA)
STATUSES = ("closed", "provisional")


class StatementLike(Protocol):
    """A closed statement as stored or an open one as it would close: what the journal reads of either."""

    @property
    def statement_id(self) -> str: ...

    @property
    def team(self) -> str: ...

    @property
    def lines(self) -> tuple[StatementLine, ...]: ...


@dataclass(frozen=True, slots=True)
class JournalLine:
    period: str
    status: str
    line_id: str
    line_kind: str
    cost_centre: str
    account: str
    debit: Decimal
    credit: Decimal
    amount: Decimal
    source_period: str
    cause_kind: str
    cause_ref: str
    statement_ids: str  # ';'-separated, sorted
    description: str
    allocated_gpu_h: Decimal
    jobs: int


JOURNAL_COLUMNS = tuple(f.name for f in fields(JournalLine))


def journal_line_id(period: str, line_kind: str, cost_centre: str, account: str, source_period: str,
                    cause_kind: str, cause_ref: str) -> str:  # fmt: skip
    ident = [period, line_kind, cost_centre, account, source_period, cause_kind, cause_ref]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


@dataclass
class _Group:
    cents: int = 0
    allocated_s: int = 0
    jobs: set[tuple[str, str]] = field(default_factory=set)
    statements: set[str] = field(default_factory=set)

    def add(self, line: StatementLine, statement_id: str) -> None:
        self.cents += line.cents
        self.allocated_s += line.allocated_s
        if line.job_id:
            self.jobs.add((line.cluster, line.job_id))
        self.statements.add(statement_id)


def _cost_centre(line: StatementLine, jobs: Mapping[tuple[str, str], str], teams: Mapping[str, set[str]]) -> str:
    if line.cost_centre:
        return line.cost_centre
    if line.kind == "usage":
        return UNASSIGNED
    by_job = jobs.get((line.cluster, line.job_id), "") if line.job_id else ""
    if by_job:
        return by_job
    team = teams.get(line.team, set())
    return next(iter(team)) if len(team) == 1 else UNASSIGNED


def _description(period: str, kind: str, source: str, cause_kind: str, cause_ref: str, hours: Decimal,
                 jobs: int, lines: int) -> str:  # fmt: skip
    if kind == "usage":
        return f"GPU allocation {period}: {hours} GPU-h over {jobs} jobs"
    if kind == CONTRA:
        return f"GPU chargeback {period}: contra of {lines} lines"
    cause = f"{cause_kind} {cause_ref}".strip()
    return f"{kind.capitalize()} to {source} posted in {period}: {cause}"


def _line(period: str, status: str, kind: str, cc: str, account: str, source: str, cause: tuple[str, str],
          cents: int, allocated_s: int, jobs: int, statements: Iterable[str],
          lines: int = 0) -> JournalLine:  # fmt: skip
    amount = cents_to_decimal(cents)
    hours = gpu_hours(allocated_s)
    return JournalLine(
        period=period, status=status, line_id=journal_line_id(period, kind, cc, account, source, *cause),
        line_kind=kind, cost_centre=cc, account=account, debit=cents_to_decimal(max(cents, 0)),
        credit=cents_to_decimal(max(-cents, 0)), amount=amount, source_period=source, cause_kind=cause[0],
        cause_ref=cause[1], statement_ids=";".join(sorted(statements)),
        description=_description(period, kind, source, *cause, hours, jobs, lines), allocated_gpu_h=hours, jobs=jobs,
    )  # fmt: skip


def build_journal(
    period: str,
    statements: Sequence[StatementLike],
    *,
    closed: bool,
    account: str,
    contra_cost_centre: str,
    contra_account: str | None = None,
    job_cost_centres: Mapping[tuple[str, str], str] | None = None,
) -> list[JournalLine]:
    """The journal of `period` from its statements: the lines in the module's docstring, usage first (by cost
    centre), then the other lines (by cost centre, kind, source month, cause), then the contra. Empty when
    there are no statement lines. Raises ValueError if two lines would share an id."""
    status = STATUSES[0] if closed else STATUSES[1]
    jobs = dict(job_cost_centres or {})
    teams: dict[str, set[str]] = {}
    for s in statements:
        for line in s.lines:
            if line.cost_centre:
                teams.setdefault(line.team, set()).add(line.cost_centre)
                if line.job_id:
                    jobs.setdefault((line.cluster, line.job_id), line.cost_centre)
    groups: dict[tuple[str, str, str, str, str], _Group] = {}
    for s in statements:
        for line in s.lines:
            cc = _cost_centre(line, jobs, teams)
            key = (line.kind, cc, line.source_period, line.cause_kind, line.cause_ref)
            groups.setdefault(key, _Group()).add(line, s.statement_id)
    order = sorted(groups, key=lambda k: (k[0] != "usage", k[1], LINE_KINDS.index(k[0]), k[2], k[3], k[4]))
    out = []
    for kind, cc, source, cause_kind, cause_ref in order:
        g = groups[(kind, cc, source, cause_kind, cause_ref)]
        out.append(_line(period, status, kind, cc, account, source, (cause_kind, cause_ref), g.cents,
                         g.allocated_s, len(g.jobs), g.statements))  # fmt: skip
    if not out:
        return []
    usage = [groups[k] for k in order if k[0] == "usage"]
    all_jobs = set().union(*(g.jobs for g in usage))
    out.append(_line(period, status, CONTRA, contra_cost_centre, contra_account or account, period, ("", ""),
                     -sum(g.cents for g in groups.values()), sum(g.allocated_s for g in usage), len(all_jobs),
                     {s.statement_id for s in statements}, lines=len(out)))  # fmt: skip
    if len({line.line_id for line in out}) != len(out):
        raise ValueError(f"journal {period}: two lines with the same identity")
    return out


def balance(lines: Iterable[JournalLine]) -> Decimal:
    """Debits minus credits: zero for a journal `build_journal` made."""
    return sum((line.debit - line.credit for line in lines), Decimal(0))
