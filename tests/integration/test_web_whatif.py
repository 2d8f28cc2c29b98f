"""The fleet page's what-if (issue 43 item 3) on the simulated month in the embedded ClickHouse: operators and
finance pick or upload a proposal and see `policy whatif`'s own comparison (the CSV equals the command's function,
row for row), a member gets 403, a proposal that does not parse gets the command's line and nothing runs, an
upload over the command's bound is refused, and the ledger's database holds the same tables afterwards. The
fleet page links to it while the form is on.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import PERIOD, POLICY, Published, make_client, simulated_database
from pydantic import SecretStr

from base.settings import BrokerSettings, ClickHouseSettings, Settings, WebSettings
from producers.simulator.org import sim_policy_text
from schemas.policy import MAX_FILE_BYTES, PolicyError, parse_policy

pytestmark = pytest.mark.integration
OPS = {"X-Forwarded-User": "ops00"}
PROPOSAL_IDLE = {"idle_after_min_interactive": 5, "idle_after_min_batch": 8, "grace_min": 2}


@pytest.fixture(scope="module")
def whatif_ledger(clickhouse_server: Any) -> Iterator[ClickHouseSettings]:
    with simulated_database(clickhouse_server, "wweb_") as (ch, _):
        yield ch


def _proposal_text() -> str:
    text = sim_policy_text() + "idle: " + json.dumps(PROPOSAL_IDLE) + "\n"
    return text.replace("tiers:\n", "preemptible: {tier: standard, discount: '0.50'}\ntiers:\n", 1)


@pytest.fixture
def settings(whatif_ledger: ClickHouseSettings, tmp_path: Path) -> Settings:
    folder = tmp_path / "proposals"
    folder.mkdir()
    (folder / "shorter-grace.yaml").write_text(_proposal_text(), encoding="utf-8")
    (folder / "notes.txt").write_text("not a proposal", encoding="utf-8")
    in_force = tmp_path / "policy.yaml"
    in_force.write_text(sim_policy_text(), encoding="utf-8")
    web = WebSettings(demo=False, whatif=True, whatif_proposals=folder)
    base = Settings(state_dir=tmp_path, cluster="sim", clickhouse=whatif_ledger, broker=BrokerSettings(enabled=False),
                    web=web, policy_path=in_force)  # fmt: skip
    return base.model_copy(update={"processor": base.processor.model_copy(update={"idle": POLICY})})


def _token(html: str) -> str:
    found = re.search(r'name="token" value="([0-9a-f]{64})"', html)
    assert found, "the form carries its token"
    return found.group(1)


def _tables(client: Any, database: str) -> list[str]:
    return sorted(r[0] for r in client.query("SELECT name FROM system.tables WHERE database = {d:String}",
                                              parameters={"d": database}).result_rows)  # fmt: skip


def _rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_an_operator_picks_a_proposal_and_downloads_the_commands_comparison(settings: Settings) -> None:
    from processors.whatif_cli import whatif
    from sinks.db import connect

    app = make_client(settings, Published())
    page = app.get(f"/fleet/whatif?period={PERIOD}", headers=OPS)
    assert page.status_code == 200 and 'id="whatif-form"' in page.text
    assert ">current<" in page.text and ">shorter-grace.yaml<" in page.text and "notes.txt" not in page.text
    client = connect(settings.clickhouse)
    before = _tables(client, settings.clickhouse.database)
    shown = app.get(f"/fleet/whatif?period={PERIOD}&proposal=shorter-grace.yaml&by=team", headers=OPS)
    assert shown.status_code == 200 and 'id="table-lines"' in shown.text and 'id="whatif-assumptions"' in shown.text
    download = app.get(f"/fleet/whatif?period={PERIOD}&proposal=shorter-grace.yaml&by=team&csv=lines", headers=OPS)
    assert download.status_code == 200 and download.headers["content-type"].startswith("text/csv")
    got = _rows(download.text)
    # one implementation: the command's comparison of the same proposal, row for row
    expected = whatif(client, settings, PERIOD, parse_policy(_proposal_text()), "team")
    assert [r["line"] for r in got] == [r["line"] for r in expected.lines] and got[-1]["line"] == "TOTAL"
    for mine, theirs in zip(got, expected.lines, strict=True):
        assert {k: mine[k] for k in theirs} == {k: str(v) for k, v in theirs.items()}
        assert mine["period"] == PERIOD and "later work does not move" in mine["assumptions"]
    total = expected.lines[-1]
    assert total["charge_whatif"] < total["charge_actual"] and total["warnings_whatif"] > total["warnings_actual"]
    events = _rows(app.get(f"/fleet/whatif?period={PERIOD}&proposal=shorter-grace.yaml&csv=events", headers=OPS).text)
    assert len(events) == len(expected.events) and {e["scenario"] for e in events} == {"actual", "whatif"}
    # the policy in force gives the month back: every line's what-if charge is its actual one
    current = _rows(app.get(f"/fleet/whatif?period={PERIOD}&proposal=current&csv=lines", headers=OPS).text)
    assert all(r["charge_whatif"] == r["charge_actual"] and r["reclaims_whatif"] == r["reclaims_actual"]
               for r in current)  # fmt: skip
    # nothing written: the ledger's tables are as they were, and no scratch database is left
    assert _tables(client, settings.clickhouse.database) == before
    assert not client.query("SELECT name FROM system.databases WHERE name LIKE 'gpuledger_whatif_%'").result_rows


def test_an_upload_is_compared_and_a_bad_one_gets_the_commands_line(settings: Settings) -> None:
    # the writer's password wrong: the comparison still comes, so the page never logs in as the writer
    wrong = settings.clickhouse.model_copy(update={"password": SecretStr("not-the-writers")})
    app = make_client(settings.model_copy(update={"clickhouse": wrong}), Published())
    token = _token(app.get(f"/fleet/whatif?period={PERIOD}", headers=OPS).text)
    form = {"token": token, "period": PERIOD, "by": "project"}
    good = app.post("/fleet/whatif", headers=OPS, data=form,
                    files={"file": ("mine.yaml", _proposal_text().encode(), "application/yaml")})  # fmt: skip
    assert good.status_code == 200 and 'id="table-lines"' in good.text and "mine.yaml, by project" in good.text
    as_csv = app.post("/fleet/whatif", headers=OPS, data={**form, "csv": "lines"},
                      files={"file": ("mine.yaml", _proposal_text().encode(), "application/yaml")})  # fmt: skip
    assert as_csv.status_code == 200 and _rows(as_csv.text)[-1]["line"] == "TOTAL"
    bad_text = sim_policy_text() + "idle: {grace_min: -5}\n"
    with pytest.raises(PolicyError) as raised:
        parse_policy(bad_text, "bad.yaml")
    bad = app.post("/fleet/whatif", headers=OPS, data=form,
                   files={"file": ("bad.yaml", bad_text.encode(), "text/yaml")})  # fmt: skip
    assert bad.status_code == 400 and 'id="table-lines"' not in bad.text
    shown = re.findall(r'<p class="error">([^<]*)</p>', bad.text)
    assert shown == raised.value.problems and len(shown) == 1 and shown[0].startswith("bad.yaml:")
    assert "idle.grace_min" in shown[0]
    huge = app.post("/fleet/whatif", headers=OPS, data=form,
                    files={"file": ("big.yaml", b"#" * (MAX_FILE_BYTES + 100_000), "text/yaml")})  # fmt: skip
    assert huge.status_code == 400 and "at most" in huge.text
    assert app.post("/fleet/whatif", headers=OPS, data={**form, "token": "0" * 64},
                    files={"file": ("mine.yaml", b"x", "text/yaml")}).status_code == 403  # fmt: skip
    unknown = app.get(f"/fleet/whatif?period={PERIOD}&proposal=..%2Fpolicy.yaml", headers=OPS)
    assert unknown.status_code == 400 and "no such proposal" in unknown.text


def test_a_team_member_cannot_open_it(settings: Settings) -> None:
    app = make_client(settings, Published())
    assert app.get(f"/fleet/whatif?period={PERIOD}", headers={"X-Forwarded-User": "fin00"}).status_code == 200
    fleet = app.get(f"/fleet?period={PERIOD}", headers=OPS)  # the fleet page links to it, for the month shown
    assert fleet.status_code == 200 and f'id="whatif-link" href="/fleet/whatif?period={PERIOD}"' in fleet.text
    for user in ("vis01", "vis00"):  # a member, a team's lead
        who = {"X-Forwarded-User": user}
        denied = app.get(f"/fleet/whatif?period={PERIOD}&proposal=current", headers=who)
        assert denied.status_code == 403 and "operators and finance" in denied.text
        posted = app.post("/fleet/whatif", headers=who, data={"period": PERIOD, "proposal": "current"})
        assert posted.status_code == 403
    assert app.get(f"/fleet/whatif?period={PERIOD}").status_code == 401
    off = make_client(settings.model_copy(update={"web": WebSettings(demo=False)}), Published())
    assert off.get(f"/fleet/whatif?period={PERIOD}", headers=OPS).status_code == 400
    assert 'id="whatif-link"' not in off.get(f"/fleet?period={PERIOD}", headers=OPS).text  # off: no link


def test_the_pages_login_is_refused_writes_by_the_engine(settings: Settings, tmp_path: Path) -> None:
    """The page reads as the analyst (`web.queries.whatif_comparison`). Through the server, the analyst's writes
    are refused on the engine's parse of them; under that, the handle the server opens for a read-only user
    (`readonly = 1`, its limits fixed first) is refused a write by the engine itself."""
    from clickhouse_connect.driver.exceptions import DatabaseError

    from sinks.db import connect
    from stack.clickhouse.engine import Engine, QueryFailed
    from stack.clickhouse.server import AnalystLimits

    analyst = connect(settings.clickhouse, analyst=True)
    try:
        for statement in ("INSERT INTO rate_card (generation) VALUES ('x')", "CREATE DATABASE gpuledger_whatif_x",
                          "DROP TABLE rate_card", "SELECT 1 SETTINGS readonly = 0"):  # fmt: skip
            with pytest.raises(DatabaseError):
                analyst.command(statement)
    finally:
        analyst.close()
    engine = Engine(tmp_path / "engine", readonly_limits=AnalystLimits().settings())
    try:
        engine.open_handle().run("CREATE TABLE default.t (a UInt8) ENGINE = MergeTree ORDER BY a")
        handle = engine.open_handle(readonly=1)
        for statement in ("INSERT INTO default.t VALUES (1)", "CREATE DATABASE gpuledger_whatif_x",
                          "SET readonly = 0"):  # fmt: skip
            with pytest.raises(QueryFailed) as err:
                handle.run(statement)
            assert err.value.name == "READONLY", statement
    finally:
        engine.close()
