"""`policy whatif` under the policy in force gives the month back exactly (issue 43, Done when): a simulated month
with idle warnings and reclaims, appeals decided while it ran, and its statements closed.

The month is the simulator's (2 hours, 3 nodes) through the in-memory pipeline (the stage objects the Kafka runtime
drives). As it runs, the first warned jobs are appealed by their users and decided by the operator a minute and a
half after the warning, before the reclaim is due: an exemption of one hour (the job stage gets the grant as the
live agent gives it, `JobPartition.grant` with `granted_exemptions` of the job's folded steps, at the decision's
event time), a denial, and a credit. Everything is stored by the sinks' writer (job events, device- and
job-minutes, alerts, actions, appeal steps), then `period close` freezes the month's statements.

Replayed under the policy in force (the same policy.yaml, idle thresholds and card): every warning and reclaim
notice comes back (job, minute, action, idle minutes), the exempted job is warned and not reclaimed either way,
and every team's charge equals the closed statement's usage lines to the cent, with nothing changed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fixtures_web import PERIOD, POLICY, SIM, priced_database

from base.processor_settings import ProcessorSettings
from base.settings import Settings
from producers.simulator import simulate
from producers.simulator.org import FINANCE, OPERATOR, sim_policy_text
from schemas.policy import parse_policy

pytestmark = pytest.mark.integration

DECISIONS = ("EXEMPTION", "DENIED", "CREDIT")  # of the first three warned jobs, in the order they were warned
DECIDED_AFTER_MS = 90_000  # after the warning; the reclaim is due grace_min (5) minutes after it


def _seed(client: Any, policy_text: str) -> dict[str, str]:
    """The simulated month with appeals decided as it runs, stored; returns each appealed job's decision."""
    from processors.idle import granted_exemptions
    from processors.pipeline import InMemoryPipeline
    from schemas import topics
    from schemas.governance_appeals import Subject, decide_event, file_event, fold
    from schemas.topics import qualified_job
    from sinks.rows import SINKS
    from sinks.writer import LedgerWriter, Origin, Pending

    policy = parse_policy(policy_text)
    records = list(simulate(SIM))
    pipe = InMemoryPipeline(ProcessorSettings(idle=POLICY), 1)
    steps: list[dict[str, Any]] = []
    due: list[tuple[int, str]] = []  # (decision time, "cluster/job_id"): the grant reaches the job stage then
    decided: dict[str, str] = {}
    seen, last_second = 0, None

    def appeal(alert: dict[str, Any], decision: str) -> None:
        warned = int(alert["ts_ms"])
        subject = Subject(alert["cluster"], alert["job_id"], alert["alert_id"], alert["user"], alert["team"],
                          alert["project"], PERIOD, warned)  # fmt: skip
        filed = file_event(fold(steps, policy)[0], policy, subject, alert["user"], "still needed", warned + 30_000)
        steps.append(filed)
        extra: dict[str, Any] = {"exemption_hours": 1} if decision == "EXEMPTION" else {}
        if decision == "CREDIT":
            extra = {"credit_cents": 125}
        steps.append(decide_event(fold(steps, policy)[0], policy, filed["appeal_id"], OPERATOR, decision, "ok",
                                  warned + DECIDED_AFTER_MS, **extra))  # fmt: skip
        jid = qualified_job(alert["cluster"], alert["job_id"])
        due.append((warned + DECIDED_AFTER_MS, jid))
        decided[alert["job_id"]] = decision

    for topic, key, record in records:
        ts = int(record["ts_ms"])
        if last_second is not None and ts // 1000 != last_second:
            pipe.advance()
            for alert in pipe.result.alerts[seen:]:
                if alert["kind"] == "IDLE_WARNING" and alert["job_id"] not in decided and len(decided) < 3:
                    appeal(alert, DECISIONS[len(decided)])
            seen = len(pipe.result.alerts)
        for at, jid in [d for d in due if d[0] <= ts]:  # before any later record: no minute after it is out yet
            due.remove((at, jid))
            mine = [s for s in steps if qualified_job(s["cluster"], s["job_id"]) == jid]
            pipe.jobs[0].grant(jid, granted_exemptions(fold(mine, policy)[0].values()).get(jid, ()))
        last_second = ts // 1000
        pipe.feed(topic if isinstance(topic, str) else topic.name, key, record)
    result = pipe.finish()
    assert not due and len(decided) == 3, decided
    sources = {
        topics.JOB_EVENTS.name: [r for t, _, r in records if t.name == topics.JOB_EVENTS.name],
        topics.DEVICE_MINUTES.name: result.device_minutes,
        topics.JOB_MINUTES.name: result.job_minutes,
        topics.ALERTS.name: result.alerts,
        topics.RECLAIM_ACTIONS.name: result.actions,
        topics.APPEALS.name: steps,
    }
    pending = [Pending(spec, row, Origin(name, 0, i)) for name, rows in sources.items() for spec in SINKS[name]
               for i, r in enumerate(rows) for row in spec.rows(r)]  # fmt: skip
    written = LedgerWriter(client).write(pending)
    assert not written.rejected, written.rejected[:3]
    return decided


@pytest.fixture(scope="module")
def month(
    clickhouse_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Settings, dict[str, str]]]:
    from sinks.statement_service import close

    text = sim_policy_text()
    policy_path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    policy_path.write_text(text, encoding="utf-8")
    with priced_database(clickhouse_server, "whatifm_") as (ch, client):
        decided = _seed(client, text)
        settings = Settings(clickhouse=ch, policy_path=policy_path).model_copy(
            update={"processor": Settings().processor.model_copy(update={"idle": POLICY})}
        )
        close(settings, PERIOD, FINANCE, dry_run=False)
        yield settings, decided


def _events(result: Any, scenario: str) -> list[tuple[Any, ...]]:
    return sorted((e["kind"], e["time_utc"], e["cluster"], e["job_id"], e["action"], e["idle_minutes"])
                  for e in result.events if e["scenario"] == scenario)  # fmt: skip


def test_the_policy_in_force_gives_back_a_month_with_appeals_and_a_closed_statement(
    month: tuple[Settings, dict[str, str]],
) -> None:
    from processors.whatif_cli import whatif
    from sinks.db import connect
    from sinks.statement_store import StatementStore

    settings, decided = month
    assert settings.policy_path is not None
    client = connect(settings.clickhouse)
    result = whatif(client, settings, PERIOD, parse_policy(settings.policy_path.read_text()), "team")

    actual, replayed = _events(result, "actual"), _events(result, "whatif")
    assert replayed == actual  # every warning and reclaim notice: same job, minute, action, idle minutes
    kinds = defaultdict(set)
    for kind, _, _, job_id, _, _ in actual:
        kinds[job_id].add(kind)
    exempted = next(j for j, d in decided.items() if d == "EXEMPTION")
    denied = next(j for j, d in decided.items() if d == "DENIED")
    assert "IDLE_WARNING" in kinds[exempted] and "RECLAIM_NOTICE" not in kinds[exempted]  # the appeal held
    assert "IDLE_WARNING" in kinds[denied]  # a denial changes nothing: replayed as it ran
    assert sum(k[0] == "RECLAIM_NOTICE" for k in actual) >= 2

    # without the appeals (no policy to judge them) the exempted job would have been reclaimed: they count
    bare = whatif(client, settings.model_copy(update={"policy_path": None}), PERIOD,
                  parse_policy(settings.policy_path.read_text()), "team")  # fmt: skip
    assert any(k[0] == "RECLAIM_NOTICE" and k[3] == exempted for k in _events(bare, "whatif"))

    # charges: each team's, as replayed, is what its closed statement charged for usage
    statements = StatementStore(client).statements(PERIOD)
    assert statements, "the month is closed"
    usage: dict[str, Decimal] = defaultdict(Decimal)
    credits = []
    for s in statements:
        for line in s.lines:
            if line.kind == "usage":
                usage[s.team] += Decimal(line.cents) / 100
            elif line.kind == "credit":
                credits.append((s.team, line.job_id, line.cents))
    lines = {r["line"]: r for r in result.lines if r["line"] != "TOTAL"}
    assert {t: r["charge_actual"] for t, r in lines.items() if r["charge_actual"]} == dict(usage)
    assert all(r["charge_whatif"] == r["charge_actual"] for r in result.lines)
    credited = next(j for j, d in decided.items() if d == "CREDIT")
    assert [(j, c) for _, j, c in credits] == [(credited, -125)]  # beside the usage, as the appeal decided


def test_the_closed_statements_still_verify(month: tuple[Settings, dict[str, str]]) -> None:
    """The replay wrote nothing: the closed statements verify against their hashes afterwards."""
    from sinks.db import connect
    from sinks.statement_store import StatementStore, verify

    settings, _ = month
    checked = verify(StatementStore(connect(settings.clickhouse)), PERIOD)
    assert checked and all(v.ok for v in checked)
