"""The finance journal (sinks/journal.py, issue 19 "finance posting"): a worked example, by hand.

October 2026, statements of two teams (amounts in cents, as the statements hold them):

    vision  usage       a2 CC-100   1800 s   150
            usage       a3 CC-100   3600 s   200
            adjustment  a1 CC-100   to 2026-09, rate-card card-2          +100
            credit      a1 (no cc)  to 2026-09, appeal ap-1                -150  -> a1's cost centre CC-100
            credit      x9 (no cc)  to 2026-09, appeal ap-2                 -25  -> CC-300 (a frozen month's)
    nlp     usage       b2 CC-200   7200 s   200
            adjustment  b1 p-wrong CC-200, correction corr-1               -200
            adjustment  b1 p-nlp   CC-200, correction corr-1               +200
            reservation r-1 (no job, no cc)                                 +480  -> nlp's only cost centre CC-200

Journal, worked by hand:

    usage        CC-100  debit  3.50  (150 + 200)   1.5 GPU-h (5400 s)  2 jobs
    usage        CC-200  debit  2.00                2.0 GPU-h           1 job
    adjustment   CC-100  debit  1.00  2026-09 rate-card card-2
    credit       CC-100  credit 1.50  2026-09 appeal ap-1
    adjustment   CC-200         0.00  2026-09 correction corr-1 (-2.00 + 2.00: one line, net)
    reservation  CC-200  debit  4.80  reservation r-1
    credit       CC-300  credit 0.25  2026-09 appeal ap-2
    contra   CLUSTER-c1  credit 9.55  = 3.50 + 2.00 + 1.00 - 1.50 + 0.00 + 4.80 - 0.25

    debits 3.50 + 2.00 + 1.00 + 4.80 = 11.30;  credits 1.50 + 0.25 + 9.55 = 11.30;  balance 0.00
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal

from sinks.journal import JournalLine, balance, build_journal
from sinks.statements import Statement, StatementLine

P = "2026-10"


def vision(extra_cents: int = 0) -> Statement:
    return Statement(P, "vision", "card-2", (
        StatementLine("usage", "vision", P, cluster="c1", job_id="a2", cost_centre="CC-100", allocated_s=1800,
                      cents=150 + extra_cents),
        StatementLine("usage", "vision", P, cluster="c1", job_id="a3", cost_centre="CC-100", allocated_s=3600,
                      cents=200),
        StatementLine("adjustment", "vision", "2026-09", cluster="c1", job_id="a1", cost_centre="CC-100", cents=100,
                      cause_kind="rate-card", cause_ref="card-2"),
        StatementLine("credit", "vision", "2026-09", cluster="c1", job_id="a1", cents=-150, cause_kind="appeal",
                      cause_ref="ap-1"),
        StatementLine("credit", "vision", "2026-09", cluster="c1", job_id="x9", cents=-25, cause_kind="appeal",
                      cause_ref="ap-2"),
    ))  # fmt: skip


NLP = Statement(P, "nlp", "card-2", (
    StatementLine("usage", "nlp", P, cluster="c1", job_id="b2", cost_centre="CC-200", allocated_s=7200, cents=200),
    StatementLine("adjustment", "nlp", "2026-09", cluster="c1", job_id="b1", project="p-wrong", cost_centre="CC-200",
                  cents=-200, cause_kind="correction", cause_ref="corr-1"),
    StatementLine("adjustment", "nlp", "2026-09", cluster="c1", job_id="b1", project="p-nlp", cost_centre="CC-200",
                  cents=200, cause_kind="correction", cause_ref="corr-1"),
    StatementLine("reservation", "nlp", P, cents=480, cause_kind="reservation", cause_ref="r-1"),
))  # fmt: skip
FROZEN = {("c1", "x9"): "CC-300"}  # what the store reads from a closed month's usage lines


def journal(*statements: Statement, closed: bool = False, account: str = "GPU-CB") -> list[JournalLine]:
    return build_journal(P, statements, closed=closed, account=account, contra_cost_centre="CLUSTER-c1",
                         job_cost_centres=FROZEN)  # fmt: skip


def test_the_worked_journal_balances_to_the_cent() -> None:
    lines = journal(vision(), NLP)
    got = [(j.line_kind, j.cost_centre, str(j.debit), str(j.credit), j.source_period, j.cause_kind, j.cause_ref)
           for j in lines]  # fmt: skip
    assert got == [
        ("usage", "CC-100", "3.50", "0.00", P, "", ""),
        ("usage", "CC-200", "2.00", "0.00", P, "", ""),
        ("adjustment", "CC-100", "1.00", "0.00", "2026-09", "rate-card", "card-2"),
        ("credit", "CC-100", "0.00", "1.50", "2026-09", "appeal", "ap-1"),
        ("adjustment", "CC-200", "0.00", "0.00", "2026-09", "correction", "corr-1"),
        ("reservation", "CC-200", "4.80", "0.00", P, "reservation", "r-1"),
        ("credit", "CC-300", "0.00", "0.25", "2026-09", "appeal", "ap-2"),
        ("contra", "CLUSTER-c1", "0.00", "9.55", P, "", ""),
    ]
    assert sum(j.debit for j in lines) == Decimal("11.30") == sum(j.credit for j in lines)
    assert balance(lines) == Decimal("0.00")
    assert sum(j.amount for j in lines) == 0
    usage = lines[0]
    assert (usage.allocated_gpu_h, usage.jobs, usage.statement_ids) == (Decimal("1.5"), 2, vision().statement_id)
    assert lines[-1].statement_ids == ";".join(sorted((vision().statement_id, NLP.statement_id)))
    assert lines[-1].jobs == 3 and lines[-1].allocated_gpu_h == Decimal("3.5")
    assert {j.status for j in lines} == {"provisional"}
    assert {j.status for j in journal(vision(), NLP, closed=True)} == {"closed"}
    assert "appeal ap-1" in lines[3].description


def test_line_ids_are_what_the_line_is_not_its_amounts() -> None:
    first = journal(vision(), NLP)
    again = journal(NLP, vision())  # another read order
    moved = journal(vision(extra_cents=7), NLP, closed=True)  # the month closed with one more late cent
    assert [j.line_id for j in first] == [j.line_id for j in again] == [j.line_id for j in moved]
    assert len({j.line_id for j in first}) == len(first)
    assert moved[0].debit == Decimal("3.57") and balance(moved) == 0
    # The id is the hash of (period, kind, cost centre, account, source month, cause), here for the contra:
    ident = [P, "contra", "CLUSTER-c1", "GPU-CB", P, "", ""]
    assert first[-1].line_id == hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]
    assert {j.line_id for j in journal(vision(), NLP, account="OTHER")}.isdisjoint(j.line_id for j in first)


def test_an_unknown_cost_centre_is_unassigned_and_nothing_is_empty() -> None:
    lonely = Statement(P, "", "card-2", (
        StatementLine("usage", "", P, cluster="c1", job_id="z1", allocated_s=60, cents=3),
        StatementLine("credit", "", "2026-09", cluster="c1", job_id="z2", cents=-3, cause_kind="appeal",
                      cause_ref="ap-9"),
    ))  # fmt: skip
    lines = journal(lonely)
    assert [(j.line_kind, j.cost_centre, j.amount) for j in lines] == [
        ("usage", "UNASSIGNED", Decimal("0.03")), ("credit", "UNASSIGNED", Decimal("-0.03")),
        ("contra", "CLUSTER-c1", Decimal("0.00"))]  # fmt: skip
    assert journal() == []


def test_a_month_that_credits_more_than_it_charges_has_a_debit_contra() -> None:
    refund = Statement(P, "vision", "card-2", (
        StatementLine("usage", "vision", P, cluster="c1", job_id="a2", cost_centre="CC-100", cents=100),
        StatementLine("credit", "vision", "2026-09", cluster="c1", job_id="a2", cents=-400, cause_kind="appeal",
                      cause_ref="ap-3"),
    ))  # fmt: skip
    lines = journal(refund)
    contra = lines[-1]
    assert (contra.debit, contra.credit) == (Decimal("3.00"), Decimal("0.00"))  # 4.00 credited - 1.00 charged
    assert balance(lines) == 0
