"""A claimed project in the ledger: the job is charged to its user's default and the explain report
flags the claim (v_job_claims), on the embedded ClickHouse with the worked ledger of
test_chargeback_ledger."""

from __future__ import annotations

from contract_records import IDENTITY, job_event
from test_chargeback_ledger import ledger_settings, write_ledger  # noqa: F401  (fixture)

from base.settings import ClickHouseSettings
from schemas import topics
from sinks import chargeback as cb
from sinks.db import connect
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending


def test_explain_flags_a_claimed_project_charged_to_the_default(ledger_settings: ClickHouseSettings) -> None:  # noqa: F811
    ch = ledger_settings
    write_ledger(ch)
    # j1 (alice, charged p-vision, her default) named p-secret, a project she is not a member of.
    claimed = job_event("STARTED", 1_000, job_id="j1", project="p-vision", project_source="DEFAULT",
                        project_claimed="p-secret", identity=IDENTITY)  # fmt: skip
    events, identities = SINKS[topics.JOB_EVENTS.name]
    client = connect(ch)
    try:
        pending = [Pending(spec, row, Origin("e", 0, 0)) for spec in (events, identities) for row in spec.rows(claimed)]
        pending.append(Pending(events, events.rows(job_event("STARTED", 1_000, job_id="j6"))[0], Origin("e", 0, 1)))
        assert not LedgerWriter(client).write(pending).rejected
        stored = client.query("SELECT project, project_claimed FROM job_events FINAL WHERE job_id = 'j1'").result_rows
        assert stored == [("p-vision", "p-secret")]
    finally:
        client.close()

    analyst = connect(ch, analyst=True)
    try:
        rows = cb.explain(analyst, "2026-11", "p-vision")
        claims = analyst.query("SELECT cluster, job_id, charged_project, claimed_project FROM v_job_claims").result_rows
        assert cb.explain(analyst, "2026-11", "p-secret") == []  # the claim is never a charge line
    finally:
        analyst.close()
    assert claims == [("c1", "j1", "p-vision", "p-secret")]
    flagged = {(r["job_id"], r["claimed_project"]) for r in rows}
    assert flagged == {("j1", "p-secret"), ("j4", None), ("j6", None)}
    assert list(rows[0]) == list(cb.EXPLAIN_COLUMNS)
