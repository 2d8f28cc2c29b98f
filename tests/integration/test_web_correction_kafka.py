"""A correction made on the team page reaches the next report: the page publishes the AttributionCorrection
on the real broker, the sinks' consumer stores it in the embedded ClickHouse, and `report chargeback
--by project` charges the job to its new project; the job page lists the audited event.
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
from fixtures_web import PERIOD, SMALL, make_client, run_cli, small_ledger

from base.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.simulator import expected_ledger
from producers.simulator.org import sim_directory

pytestmark = pytest.mark.integration
__all__ = ["small_ledger"]  # a fixture, used by name


def by_project(ch: ClickHouseSettings) -> dict[str, dict[str, str]]:
    out = run_cli(ch, "report", "chargeback", "--period", PERIOD, "--by", "project", "--format", "csv")
    return {r["line"]: r for r in csv.DictReader(io.StringIO(out))}


def token_of(client: Any, job_id: str, user: str) -> str:
    page = client.get(f"/jobs/sim/{job_id}?period={PERIOD}", headers={"X-Forwarded-User": user})
    assert page.status_code == 200, page.text
    return re.search(r'name="token" value="([0-9a-f]+)"', page.text).group(1)  # type: ignore[union-attr]


def test_a_correction_made_in_the_page_shows_in_the_next_report(
    small_ledger: ClickHouseSettings, kafka_bootstrap: str, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.topics import CORRECTIONS
    from sinks.consumer import LedgerSink
    from sinks.db import connect
    from sinks.writer import LedgerWriter

    prefix = f"t{uuid.uuid4().hex[:8]}."
    settings = Settings(
        state_dir=tmp_path, cluster="sim", clickhouse=small_ledger, broker=BrokerSettings(enabled=False),
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
        sinks=SinksSettings(group_id=f"web-test-{uuid.uuid4().hex[:8]}"), web=WebSettings(demo=False),
    )  # fmt: skip
    topic = settings.kafka.topic(CORRECTIONS.name)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    job = max(expected_ledger(SMALL).values(), key=lambda j: j.allocated_s)
    lead = next(e.user for e in sim_directory().values() if job.team in e.leads)
    target = "infra-bench" if job.project != "infra-bench" else "asr"  # another team's project: only a lead may
    before = by_project(small_ledger)
    client = make_client(settings)  # the real publisher, on the real broker
    form = {"cluster": "sim", "job_id": job.job_id, "project": target, "reason": "benchmark for the platform team",
            "period": PERIOD}  # fmt: skip
    # A member of the team (not its lead, not in the target project) is refused, and nothing is published.
    member = next(e.user for e in sim_directory().values() if job.team in e.teams and not e.leads)
    from web.access import csrf_token

    forged = csrf_token(client.app.state.ctx.secret, member)  # a valid token of the member's own, page or not
    refused = client.post("/corrections", data={**form, "token": forged}, headers={"X-Forwarded-User": member})
    assert refused.status_code == 403 and "both projects" in refused.text
    done = client.post("/corrections", data={**form, "token": token_of(client, job.job_id, lead)},
                       headers={"X-Forwarded-User": lead})  # fmt: skip
    assert done.status_code == 303, done.text

    sink = LedgerSink(settings.kafka, settings.sinks, LedgerWriter(connect(small_ledger)), topics=[CORRECTIONS.name])
    stats = sink.run(lambda: False, max_idle_s=8.0)
    assert stats.records == 1 and stats.rows_inserted == 1

    after = by_project(small_ledger)
    moved = Decimal(before[job.project]["allocated_gpu_h"]) - Decimal(after.get(job.project, {}).get(
        "allocated_gpu_h", "0"))  # fmt: skip
    assert moved > 0
    gained = Decimal(after[target]["allocated_gpu_h"]) - Decimal(before.get(target, {}).get("allocated_gpu_h", "0"))
    assert gained == moved
    assert after["TOTAL"]["charge"] == before["TOTAL"]["charge"]
    shown = client.get(done.headers["location"], headers={"X-Forwarded-User": lead}).text
    assert "benchmark for the platform team" in shown and f"{target} <span" in shown.replace("\n", "")
