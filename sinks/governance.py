"""The governance workflows in ClickHouse (issue 19): what the appeal and reservation commands look up, and
the credits and reservation charges `period close` puts on the statements.

The steps themselves are stored by the sink (`appeal_events`, `reservation_events`, migration 013); what they
mean is the pure fold of `schemas/governance_appeals.py` (and `schemas/governance_reservations.py`) under the
policy, the same code the commands run, so a step the rules refuse never becomes a credit here either.
Values are bound parameters; table names are fixed here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from schemas.governance_appeals import Subject, fold
from schemas.policy import Policy
from sinks.rows import APPEAL_COLUMNS, ESCALATION_COLUMNS, RESERVATION_COLUMNS
from sinks.statements import Charge


def _month(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m")


def appeal_events(client: Any) -> list[dict[str, Any]]:
    rows = client.query(f"SELECT {', '.join(APPEAL_COLUMNS)} FROM appeal_events FINAL").result_rows
    return [dict(zip(APPEAL_COLUMNS, row, strict=True)) for row in rows]


def credits(client: Any, policy: Policy) -> Iterator[Charge]:
    """A credit line per appeal whose decision (the first valid one) is CREDIT, in the month of its charge."""
    appeals, _ = fold(appeal_events(client), policy)
    for a in sorted(appeals.values(), key=lambda a: a.appeal_id):
        if a.decision != "CREDIT" or not a.credit_cents:
            continue
        s = a.subject
        yield Charge(kind="credit", ref=a.appeal_id, team=s.team or "", source_period=s.period or _month(a.filed_ms),
                     cents=-a.credit_cents, cluster=s.cluster, job_id=s.job_id, project=s.project or "",
                     note=f"appeal {a.appeal_id} granted by {a.decided_by}: {a.note}"[:500])  # fmt: skip


def reservation_events(client: Any) -> list[dict[str, Any]]:
    rows = client.query(f"SELECT {', '.join(RESERVATION_COLUMNS)} FROM reservation_events FINAL").result_rows
    return [dict(zip(RESERVATION_COLUMNS, row, strict=True)) for row in rows]


def escalation_events(client: Any, job: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """Every escalation step the sink stored, or those of one (cluster, job_id): each step names its job."""
    where, parameters = "", {}
    if job is not None:
        where, parameters = " WHERE cluster = {c:String} AND job_id = {j:String}", {"c": job[0], "j": job[1]}
    rows = client.query(f"SELECT {', '.join(ESCALATION_COLUMNS)} FROM escalation_events FINAL{where}",
                        parameters=parameters).result_rows  # fmt: skip
    return [dict(zip(ESCALATION_COLUMNS, row, strict=True)) for row in rows]


def charges(client: Any, policy: Policy | None, now_ms: int) -> list[Charge]:
    """Every credit, reservation charge and priced escalation the governance events give up to `now_ms` (none
    without a policy to judge them)."""
    from schemas.governance_escalations import fold as fold_escalations
    from schemas.governance_reservations import fold as fold_reservations
    from sinks.escalations import escalation_charges
    from sinks.reservations import reservation_charges

    if policy is None:
        return []
    reservations, _ = fold_reservations(reservation_events(client), policy)
    escalations, _ = fold_escalations(escalation_events(client), policy)
    return [*credits(client, policy), *reservation_charges(client, reservations.values(), now_ms),
            *escalation_charges(policy, escalations.values(), now_ms)]  # fmt: skip


def has_decisions(client: Any) -> bool:
    """Whether any appeal was decided or any reservation approved: steps only a policy can judge."""
    appeals = client.query("SELECT count() FROM appeal_events WHERE event_type = 'DECIDED'").result_rows[0][0]
    approved = client.query("SELECT count() FROM reservation_events WHERE event_type = 'APPROVED'").result_rows[0][0]
    return bool(appeals or approved)


# -- what an appeal is about ----------------------------------------------------------------------------


def alert_subject(client: Any, alert_id: str) -> Subject | None:
    """The job behind an idle warning or reclaim notice, or None when the ledger has no such job alert."""
    rows = client.query(
        "SELECT cluster, job_id, user, team, project, ts_ms FROM alerts FINAL "
        "WHERE alert_id = {a:String} AND job_id IS NOT NULL AND job_id != '' LIMIT 1",
        parameters={"a": alert_id},
    ).result_rows
    if not rows:
        return None
    cluster, job_id, user, team, project, ts_ms = rows[0]
    return Subject(str(cluster), str(job_id), alert_id, user, team, project, _month(int(ts_ms)), int(ts_ms))


def job_subject(client: Any, cluster: str, job_id: str, period: str | None = None) -> Subject | None:
    """A job's charge (in `period`, default the last month it was charged in), or None when the ledger has no
    usage of that job (in that month)."""
    rows = client.query(
        "SELECT period, any(user), any(team), any(project), max(last_day) FROM v_chargeback_jobs "
        "WHERE cluster = {c:String} AND job_id = {j:String} AND ({p:String} = '' OR period = {p:String}) "
        "GROUP BY period ORDER BY period DESC LIMIT 1",
        parameters={"c": cluster, "j": job_id, "p": period or ""},
    ).result_rows
    if not rows:
        return None
    month, user, team, project, last_day = rows[0]
    seen = dt.datetime.combine(last_day, dt.time(23, 59, 59), dt.UTC)
    return Subject(cluster, job_id, None, user or None, team or None, project or None, str(month),
                   int(seen.timestamp() * 1000))  # fmt: skip
