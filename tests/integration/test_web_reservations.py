"""Reservations in the browser on the real broker (issue 19's rules, issue 20's operator page): a member asks for
GPUs in the page (within the policy's automatic limits: approved at once; above them: waiting), an operator
approves, denies and releases on /reservations; a member may not act (403), sees only their teams'
reservations, finance sees every one and acts on none, and the rules' refusals are one line in the page.
`gpuledger reserve list` reads the same steps.
"""

from __future__ import annotations

import csv
import io
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import cli_env, make_client, web_ledger

from base.settings import BrokerSettings, ClickHouseSettings, KafkaSettings, Settings, SinksSettings, WebSettings
from producers.simulator import SimConfig

pytestmark = pytest.mark.integration
__all__ = ["web_ledger"]
OPS, MEMBER, OTHER = "ops00", "vis01", "nlp01"  # fin00: finance (producers/simulator/org.py)
POLICY = """\
version: 1
generations: {hopper: {slurm_gres: h100, kueue_flavor: h100}}
tiers: [{name: standard, priority: 100}]
governance:
  operators: [ops00]
  reservations: {max_hours: 72, max_lead_days: 7, auto_approve_gpus: 2, auto_approve_hours: 24}
teams:
  - {name: vision, members: [vis00, vis01, vis02, vis03], quota: {hopper: 8}}
  - {name: nlp, members: [nlp00, nlp01, nlp02, nlp03], quota: {hopper: 4}}
"""


def who(user: str) -> dict[str, str]:
    return {"X-Forwarded-User": user}


def token(client: Any, user: str) -> str:
    from web.access import csrf_token

    return csrf_token(client.app.state.ctx.secret, user)


def rows(client: Any, table: str, user: str) -> list[dict[str, str]]:
    resp = client.get(f"/reservations?csv={table}", headers=who(user))
    assert resp.status_code == 200, resp.text
    return list(csv.DictReader(io.StringIO(resp.text)))


def ask(client: Any, user: str, **form: str) -> Any:
    values = {"team": "vision", "cluster": "sim", "generation": "hopper", "gpus": "2", "hours": "4", "start": "now",
              "nodes": "", "reason": "paper deadline", **form}  # fmt: skip
    return client.post("/reservations/request", data={**values, "token": token(client, user)}, headers=who(user))


def act(client: Any, user: str, rid: str, action: str, note: str = "") -> Any:
    form = {"reservation_id": rid, "action": action, "note": note, "token": token(client, user)}
    return client.post("/reservations/act", data=form, headers=who(user))


def rid_of(resp: Any) -> str:
    assert resp.status_code == 303, resp.text
    return re.search(r"done=(rsv-[0-9a-f]{10})", resp.headers["location"]).group(1)  # type: ignore[union-attr]


def refusal(resp: Any) -> str:
    """The page's one-line message (error.html's paragraph)."""
    return " ".join(re.sub(r"<[^>]+>", " ", resp.text).split())


def test_members_ask_and_operators_approve_deny_and_release_in_the_page(
    web_ledger: tuple[ClickHouseSettings, SimConfig], kafka_bootstrap: str, tmp_path: Path
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from typer.testing import CliRunner

    from gpuledger.cli import _register_all, app
    from schemas.topics import RESERVATIONS

    ch, _ = web_ledger
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY, encoding="utf-8")
    prefix = f"t{uuid.uuid4().hex[:8]}."
    settings = Settings(
        state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False), policy_path=policy,
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix),
        sinks=SinksSettings(group_id=f"web-rsv-{uuid.uuid4().hex[:8]}"), web=WebSettings(demo=False),
    )  # fmt: skip
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    topic = settings.kafka.topic(RESERVATIONS.name)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    client = make_client(settings)

    page = client.get("/reservations", headers=who(MEMBER))
    assert page.status_code == 200 and 'id="request-form"' in page.text and "/reservations/act" not in page.text
    assert 'id="nav-reservations"' in page.text
    assert client.get("/reservations", headers=who("nobody")).status_code == 403  # in no team, not an operator
    # No engine configured (as `up` on the simulator): the page says nothing is held on a scheduler.
    assert "No scheduler engine is configured" in refusal(page)
    engines = settings.model_copy(deep=True)
    engines.sinks.reservations.engines = ["kueue"]
    assert "are put onto kueue by the reservation service" in refusal(
        make_client(engines).get("/reservations", headers=who(MEMBER)))

    small = rid_of(ask(client, MEMBER))  # 2 GPUs for 4 h: within the automatic limits
    big = rid_of(ask(client, MEMBER, gpus="6", hours="48", start="2026-03-03T08:00Z"))
    assert [(r["reservation_id"], r["approved_by"]) for r in rows(client, "active", MEMBER)] == [
        (small, "gpuledger-reservations")]  # fmt: skip
    assert [(r["reservation_id"], r["gpus"], r["state"]) for r in rows(client, "pending", MEMBER)] == [
        (big, "6", "REQUESTED")]  # fmt: skip

    # The rules' refusals, one line each; another team's request; the member acting.
    too_many = ask(client, MEMBER, gpus="20")
    assert too_many.status_code == 400 and "vision may reserve 1..8 hopper GPUs" in refusal(too_many)
    overlap = ask(client, MEMBER, gpus="1", hours="2")
    assert overlap.status_code == 400 and f"overlapping reservation {small}" in refusal(overlap)
    assert ask(client, MEMBER, hours="lots").status_code == 400
    assert ask(client, MEMBER, team="nlp").status_code == 403
    assert act(client, MEMBER, big, "approve").status_code == 403
    forged = client.post("/reservations/act", data={"reservation_id": big, "action": "approve", "token": "x" * 64},
                         headers=who(OPS))  # fmt: skip
    assert forged.status_code == 403  # a post without the operator's form token

    # Another team sees neither; asks its own, above the limits.
    assert rows(client, "pending", OTHER) == [] and rows(client, "active", OTHER) == []
    theirs = rid_of(ask(client, OTHER, team="nlp", gpus="4", hours="30"))

    # The operator sees every team's, approves one, denies the other (a note is required), releases one.
    ops_page = client.get("/reservations", headers=who(OPS)).text
    assert f'id="act-{big}"' in ops_page and f'id="act-{theirs}"' in ops_page
    assert {r["reservation_id"] for r in rows(client, "pending", OPS)} == {big, theirs}
    assert rid_of(act(client, OPS, big, "approve")) == big
    again = act(client, OPS, big, "approve")
    assert again.status_code == 400 and "already approved" in refusal(again)
    assert act(client, OPS, theirs, "deny").status_code == 400  # no note
    assert rid_of(act(client, OPS, theirs, "deny", "no hopper capacity that week")) == theirs
    assert rid_of(act(client, OPS, small, "release", "finished early")) == small

    assert rows(client, "pending", OPS) == []
    assert [(r["reservation_id"], r["approved_by"]) for r in rows(client, "active", MEMBER)] == [(big, OPS)]
    ended = {r["reservation_id"]: r for r in rows(client, "ended", OPS)}
    assert set(ended) == {small, theirs} and ended[theirs]["state"] == "RELEASED"
    assert [r["reservation_id"] for r in rows(client, "ended", OTHER)] == [theirs]
    # Finance sees every team's, and acts on none.
    assert {r["reservation_id"] for r in rows(client, "ended", "fin00")} == {small, theirs}
    finance = client.get("/reservations", headers=who("fin00")).text
    assert "/reservations/act" not in finance and 'id="request-form"' not in finance
    assert act(client, "fin00", big, "release", "over budget").status_code == 403

    # The command reads the same steps: the page published what `reserve` publishes.
    _register_all() if not any(g.name == "reserve" for g in app.registered_groups) else None
    env = {**cli_env(ch), "GPULEDGER_POLICY_PATH": str(policy), "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
           "GPULEDGER_KAFKA__TOPIC_PREFIX": prefix}  # fmt: skip
    listed = CliRunner().invoke(app, ["reserve", "list", "--state", "all", "--format", "json"], env=env,
                                catch_exceptions=False)  # fmt: skip
    assert listed.exit_code == 0, listed.output
    states = {r["reservation_id"]: (r["state"], r["approved_by"]) for r in json.loads(listed.output)}
    assert states == {small: ("RELEASED", "gpuledger-reservations"), big: ("APPROVED", OPS),
                      theirs: ("RELEASED", "")}  # fmt: skip
