"""Appeals in the browser on the real broker and the embedded ClickHouse (issue 19's rules, issue 20's page):
a job's user files an appeal on the job page, the sink stores it, the policy's decider sees it on the appeals
page and grants a credit; the credit is a line of the team's statement (pending in the open month, then in
the closed statement). The rules' refusals are the page's: another team's member, the filer deciding, a
second decision.
"""

from __future__ import annotations

import csv
import io
import re
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import PERIOD, REPO, SMALL, cli_env, make_client, small_ledger

from base.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.simulator import expected_ledger

pytestmark = pytest.mark.integration
__all__ = ["small_ledger"]
POLICY = REPO / "deploy" / "policy.sim.yaml"
OPS = "ops00"


def who(user: str) -> dict[str, str]:
    return {"X-Forwarded-User": user}


def token(client: Any, user: str) -> str:
    from web.access import csrf_token

    return csrf_token(client.app.state.ctx.secret, user)


def rows(client: Any, url: str, user: str) -> list[dict[str, str]]:
    resp = client.get(url, headers=who(user))
    assert resp.status_code == 200, resp.text
    return list(csv.DictReader(io.StringIO(resp.text)))


def sink_appeals(settings: Settings, ch: ClickHouseSettings) -> int:
    from schemas.topics import APPEALS
    from sinks.consumer import LedgerSink
    from sinks.db import connect
    from sinks.writer import LedgerWriter

    sink = LedgerSink(settings.kafka, settings.sinks, LedgerWriter(connect(ch)), topics=[APPEALS.name])
    return sink.run(lambda: False, max_idle_s=6.0).records


def test_an_appeal_filed_in_the_page_is_decided_by_an_operator_and_its_credit_is_on_the_statement(
    small_ledger: ClickHouseSettings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from typer.testing import CliRunner

    from gpuledger.cli import _register_all, app
    from schemas.topics import APPEALS

    ch = small_ledger
    prefix = f"t{uuid.uuid4().hex[:8]}."
    settings = Settings(
        state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False), policy_path=POLICY,
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
        sinks=SinksSettings(group_id=f"web-appeals-{uuid.uuid4().hex[:8]}"), web=WebSettings(demo=False),
    )  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = settings.kafka.topic(APPEALS.name)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    client = make_client(settings)
    job = max(expected_ledger(SMALL).values(), key=lambda j: j.allocated_s)
    page = client.get(f"/jobs/sim/{job.job_id}?period={PERIOD}", headers=who(job.user))
    assert 'id="appeal-form"' in page.text

    form = {"cluster": "sim", "job_id": job.job_id, "alert_id": "", "period": PERIOD,
            "reason": "the job was a benchmark the platform team asked for"}  # fmt: skip
    outsider = "nlp01" if job.team != "nlp" else "vis01"
    assert client.post("/appeals/file", data={**form, "token": token(client, outsider)},
                       headers=who(outsider)).status_code == 403  # fmt: skip
    filed = client.post("/appeals/file", data={**form, "token": token(client, job.user)}, headers=who(job.user))
    assert filed.status_code == 303, filed.text
    appeal_id = re.search(r"appealed=(ap-[0-9a-f]{12})", filed.headers["location"]).group(1)  # type: ignore[union-attr]
    again = client.post("/appeals/file", data={**form, "token": token(client, job.user)}, headers=who(job.user))
    assert again.status_code == 400 and "still open" in again.text  # one open appeal per charge
    assert sink_appeals(settings, ch) == 1

    # The filer may not decide; the operator sees it on the appeals page and grants a credit.
    decide = {"appeal_id": appeal_id, "decision": "credit", "amount": "5.00", "hours": "",
              "note": "benchmark for the platform: credited", "period": PERIOD}  # fmt: skip
    assert client.post("/appeals/decide", data={**decide, "token": token(client, job.user)},
                       headers=who(job.user)).status_code == 403  # fmt: skip
    assert client.get("/appeals", headers=who(job.user)).status_code == 403
    waiting = rows(client, "/appeals?csv=open", OPS)
    assert [r["appeal_id"] for r in waiting] == [appeal_id] and waiting[0]["filed_by"] == job.user
    assert client.post("/appeals/decide", data={**decide, "amount": "900.00", "token": token(client, OPS)},
                       headers=who(OPS)).status_code == 400  # above the policy's max_credit  # fmt: skip
    done = client.post("/appeals/decide", data={**decide, "token": token(client, OPS)}, headers=who(OPS))
    assert done.status_code == 303, done.text
    twice = client.post("/appeals/decide", data={**decide, "token": token(client, OPS)}, headers=who(OPS))
    assert twice.status_code == 400 and "already decided" in twice.text
    assert sink_appeals(settings, ch) == 1

    # The user follows the decision on the job's page; the open month's statement would carry the credit.
    mine = rows(client, f"/jobs/sim/{job.job_id}?period={PERIOD}&csv=appeals", job.user)
    assert (mine[0]["state"], mine[0]["decision"], mine[0]["credit"]) == ("DECIDED", "CREDIT", "5.00")
    pending = rows(client, f"/teams/{job.team}?period={PERIOD}&csv=pending", job.user)
    assert [(r["kind"], r["cause_ref"], r["charge"]) for r in pending] == [("credit", appeal_id, "-5.00")]
    team_page = client.get(f"/teams/{job.team}?period={PERIOD}", headers=who(job.user)).text
    charge = Decimal(re.search(r'id="fig-charge".*?data-raw="([^"]+)"', team_page, re.S).group(1))  # type: ignore[union-attr]
    total = Decimal(re.search(r'id="statement-total" data-raw="([^"]+)"', team_page).group(1))  # type: ignore[union-attr]
    assert total == charge - Decimal("5.00")

    # Closed: the credit is a line of the frozen statement.
    _register_all() if not any(g.name == "report" for g in app.registered_groups) else None
    env = {**cli_env(ch), "GPULEDGER_POLICY_PATH": str(POLICY)}
    closed = CliRunner().invoke(app, ["period", "close", PERIOD, "--by", "finance"], env=env, catch_exceptions=False)
    assert closed.exit_code == 0, closed.output
    held = rows(client, f"/teams/{job.team}?period={PERIOD}&csv=statement_lines", job.user)
    assert [(r["kind"], r["cause_ref"], r["charge"]) for r in held] == [("credit", appeal_id, "-5.00")]
