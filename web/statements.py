"""The statement around the team page's figures (issue 19's closed statements, sinks/statement_store.py):

- a closed month shows what was frozen: the figures of `v_statement_month` (what `report chargeback` prints
  for a closed month), the statement's id and content hash, the adjustment, credit and reservation lines it
  holds, and the adjustments to it since it closed (posted in a later statement, or pending);
- an open month shows the ledger as it is now, and the lines its statement would carry beside its usage if
  it closed now: adjustments of closed months and credits routed to it.

Credits (appeals granted as credit) and reservation charges come from `credits`, the same source `period
close` reads (wired in web/context.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from web.model import Column, Table, utc_minute

LINE_COLUMNS_SHOWN = (
    Column("kind", "kind"), Column("source_period", "for month"), Column("cluster", "cluster"),
    Column("job_id", "job"), Column("user", "user"), Column("project", "project"),
    Column("cause_kind", "cause"), Column("cause_ref", "reference"), Column("charge", "charge", "money"),
    Column("note", "note"),
)  # fmt: skip
SINCE_COLUMNS = (Column("posted_in", "posted in"), *LINE_COLUMNS_SHOWN)


@dataclass
class StatementStatus:
    closed: bool
    closed_at: str = ""
    closed_by: str = ""
    close_id: str = ""
    statement_id: str = ""
    content_hash: str = ""
    usage: Decimal = Decimal("0.00")
    other: Decimal = Decimal("0.00")  # adjustments, credits and reservations in (or pending into) this statement
    tables: list[Table] = field(default_factory=list)

    @property
    def total(self) -> Decimal:
        return self.usage + self.other


def line_row(line: Any, **extra: Any) -> dict[str, Any]:
    return {
        "kind": line.kind, "source_period": line.source_period, "cluster": line.cluster, "job_id": line.job_id,
        "user": line.user, "project": line.project, "cause_kind": line.cause_kind, "cause_ref": line.cause_ref,
        "charge": line.charge, "note": line.note, **extra,
    }  # fmt: skip


def _rows(lines: Iterable[Any], team: str, cluster: str | None = None) -> list[dict[str, Any]]:
    return [line_row(line) for line in lines
            if line.team == team and line.kind != "usage" and cluster in (None, line.cluster)]  # fmt: skip


def status(client: Any, period: str, team: str, usage_charge: Decimal,
           credits: Callable[[Any], list[Any]] = lambda _client: [], *,
           closes: Mapping[str, Any] | None = None, cluster: str | None = None) -> StatementStatus:  # fmt: skip
    """The statement status of `team` in `period`, read through the analyst's `client`; `credits(client)` lists
    the credits and reservation charges (`sinks.statements.Charge`) a close would route; `closes`, the months'
    closes when the caller has read them already (`StatementStore.closes`); `cluster`: only its lines (the team
    page filtered to one cluster)."""
    from web.queries import adjustments_since, pending_lines, statement_store

    store = statement_store(client)
    closes = store.closes() if closes is None else closes
    close = closes.get(period)
    if close is None:
        charges = credits(client)
        # Only a closed earlier month or a charge can add lines; without either, nothing to prepare. The team's
        # lines only, priced from its jobs alone (not every team's jobs of every closed month).
        carried = pending_lines(store, period, charges, team) if charges or any(p < period for p in closes) else []
        pending = _rows(carried, team, cluster)
        other = sum((r["charge"] for r in pending), Decimal(0))
        out = StatementStatus(closed=False, usage=usage_charge, other=other)
        title = "Credits and adjustments this month's statement carries if it closes now"
        note = "Changes to months already closed, and credits, land in the next open month."
        out.tables.append(Table("pending", title, LINE_COLUMNS_SHOWN, pending, note=note))
        return out
    stored = next(iter(store.statements(period, team, lines="other")), None)
    held = _rows(stored.lines, team, cluster) if stored is not None else []
    since = [line_row(line, posted_in=where) for where, line in adjustments_since(store, period, team)
             if cluster in (None, line.cluster)]  # fmt: skip
    out = StatementStatus(
        closed=True, closed_at=utc_minute(close.closed_ms) + " UTC", closed_by=close.closed_by, close_id=close.close_id,
        statement_id=stored.statement_id if stored else "", content_hash=stored.content_hash if stored else "",
        usage=usage_charge, other=sum((r["charge"] for r in held), Decimal(0)),
    )  # fmt: skip
    out.tables.append(Table("statement_lines", "Credits and adjustments in the closed statement", LINE_COLUMNS_SHOWN,
                            held))  # fmt: skip
    out.tables.append(Table("since_close", "Changes to this month since it closed", SINCE_COLUMNS, since,
                            note="Never a rewrite: each is an adjustment line of a later month's statement "
                                 "(posted, or pending in the next open month)."))  # fmt: skip
    return out
