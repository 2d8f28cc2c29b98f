"""A name and its identifier in the ledger (issue 38, items 1 and 2), on the embedded ClickHouse with the worked
ledger of test_chargeback_ledger, the job events written through the sink's own rows and writer.

alice ran j1 as uid 1001 and, recreated under the same name, j4 as uid 2002: `report explain` shows two identities,
each with its own job and charge, never one alice. bob's j2 was stamped at admission while its label named carol:
charged to bob, counted on the data-quality line. A second cluster, `k8s`, whose only job's user is self-declared
(no admission stamp seen), is named by every report.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

from contract_records import job_event
from test_chargeback_ledger import (  # noqa: F401  (fixture)
    device_minute,
    ledger_settings,
    ms,
    run_cli,
    write_ledger,
)

from base.settings import BrokerSettings, ClickHouseSettings, Settings, WebSettings
from schemas import topics
from schemas.models import validate
from sinks import chargeback as cb
from sinks.data_quality import data_quality
from sinks.db import connect
from sinks.identities import cluster_identities, job_identities
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

K8S_UID = "3f2a9c1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
ROBOT = "system:serviceaccount:ci:ci-robot"


def _started(job: str, start: str, user: str, **kw: Any) -> dict[str, Any]:
    t = ms(start)
    record = job_event("STARTED", t, event_id=f"e-{job}", job_id=job, user=user, start_ts_ms=t, **kw)
    validate("sched.job-events", record)
    return record


def write_identities(ch: ClickHouseSettings) -> None:
    events = [
        _started("j1", "2026-11-10T10:00", "alice", user_uid="1001", user_source="SCHEDULER"),
        _started("j4", "2026-11-21T12:00", "alice", user_uid="2002", user_source="SCHEDULER"),
        _started("j2", "2026-11-15T23:30", "bob", user_uid=K8S_UID, user_source="STAMPED", user_claimed="carol",
                 user_groups=["system:authenticated", "nlp"], scheduler="KUEUE"),
        _started("j6", "2026-10-31T23:50", "erin"),  # a v3 event: no identifier, no source
        _started("ci-1", "2026-11-12T08:00", ROBOT, cluster="k8s", user_source="SELF_DECLARED", scheduler="KUEUE"),
    ]  # fmt: skip
    (dm_spec,) = SINKS[topics.DEVICE_MINUTES.name]
    robot_minutes = []
    for i in range(60):  # one GPU-hour on k8s, charged to vision's p-vision
        row = device_minute("j1", "k1", "GPU-k", ms("2026-11-12T08:00") + i * 60_000, "active")
        row.update(cluster="k8s", job_id="ci-1", user=ROBOT)
        robot_minutes.append(row)
    spec, identities = SINKS[topics.JOB_EVENTS.name]
    pending = [Pending(s, row, Origin("e", 0, i)) for i, e in enumerate(events) for s in (spec, identities)
               for row in s.rows(e)]  # fmt: skip
    pending += [Pending(dm_spec, row, Origin("k", 0, i)) for i, r in enumerate(robot_minutes)
                for row in dm_spec.rows(r)]  # fmt: skip
    client = connect(ch)
    try:
        assert not LedgerWriter(client).write(pending).rejected
    finally:
        client.close()


def test_two_identifiers_under_one_name_are_two_identities(ledger_settings: ClickHouseSettings) -> None:  # noqa: F811
    ch = ledger_settings
    write_ledger(ch)
    write_identities(ch)
    analyst = connect(ch, analyst=True)
    try:
        rows = cb.explain(analyst, "2026-11", "p-vision")
        quality = data_quality(analyst, "2026-11")
        clusters = {c.cluster: c for c in cluster_identities(analyst, "2026-11")}
        lives = job_identities(analyst, [("c1", "j2")])
        directory = analyst.query("SELECT user, user_uid, user_source, jobs FROM v_identities "
                                  "WHERE user = 'alice' ORDER BY user_uid").result_rows  # fmt: skip
    finally:
        analyst.close()
    assert list(rows[0]) == list(cb.EXPLAIN_COLUMNS)
    who = {(r["cluster"], r["job_id"]): (r["identity"], r["user_source"], r["charge"]) for r in rows}
    assert who == {
        ("c1", "j1"): ("alice (uid 1001)", "SCHEDULER", Decimal("4.89")),
        ("c1", "j4"): ("alice (uid 2002)", "SCHEDULER", Decimal("13.96")),
        ("c1", "j6"): ("erin (uid unknown)", None, Decimal("0.27")),
        ("k8s", "ci-1"): (f"{ROBOT} (uid unknown)", "SELF_DECLARED", Decimal("1.63")),
    }
    summary = {s["identity"]: (s["jobs"], s["allocated_s"], s["charge"]) for s in cb.explain_identities(rows)}
    assert summary["alice (uid 1001)"] == (1, 2 * 90 * 60, Decimal("4.89"))  # never summed with uid 2002's
    assert summary["alice (uid 2002)"] == (1, 4 * 30 * 60, Decimal("13.96"))
    assert directory == [("alice", "1001", "SCHEDULER", 1), ("alice", "2002", "SCHEDULER", 1)]
    (bob,) = lives.values()
    assert (bob.text, bob.source, bob.claimed, bob.groups) == (
        f"bob (uid {K8S_UID})", "STAMPED", "carol", ("system:authenticated", "nlp"))  # charged to bob, not carol

    # the data-quality line: one disagreeing label (j2), one self-declared GPU-hour (ci-1 on k8s)
    assert (quality.claimed_user_jobs, quality.self_declared_gpu_h) == (1, Decimal("1.000"))
    assert "self-declared user disagreed with the verified submitter on 1 jobs" in quality.text()
    assert "identity only self-declared 1.000 GPU-h" in quality.text()
    assert clusters["c1"].note() is None and clusters["c1"].claimed_user_jobs == 1
    assert clusters["k8s"].note() == (
        "identities on k8s are self-declared (the admission stamp is not applied): 1.000 GPU-h of 1 job(s) charged "
        "to a name the submitter wrote")

    # every report says so: report chargeback, report explain, the statements
    out = run_cli(ch, "report", "chargeback", "--period", "2026-11")
    assert "data quality: identities on k8s are self-declared (the admission stamp is not applied)" in out
    assert "data quality: on c1, 1 job(s) named a user other than their verified submitter" in out
    explained = run_cli(ch, "report", "explain", "--project", "p-vision", "--period", "2026-11", "--format", "csv")
    header, *lines = explained.strip().splitlines()
    assert "identity" in header.split(",") and "dq_claimed_user_jobs" in header.split(",")
    assert sum("alice (uid" in line for line in lines) == 2
    shown = run_cli(ch, "statement", "show", "--period", "2026-11", "--team", "vision")
    assert "identities on k8s are self-declared (the admission stamp is not applied)" in shown
    assert "identity only self-declared 1.000 GPU-h" in shown


def test_a_statement_keeps_its_hash_when_the_identity_counts_are_zero() -> None:
    from sinks.data_quality import Tally
    from sinks.statements import Statement

    before = Statement("2026-11", "vision", "1", (), Tally(jobs=2, allocated_s=60))
    # a tally read back after migration 032 has the new columns at 0: the same hash as before they existed
    assert before.canonical()["data_quality"] == {
        "jobs": 2, "allocated_s": 60, "dark_s": 0, "unidentified_s": 0, "unidentified_jobs": 0, "default_project_s": 0,
        "claimed_project_s": 0, "unpriced_s": 0, "unknown_mig_s": 0, "ceded_s": 0, "overlap_jobs": 0}  # fmt: skip
    after = Statement("2026-11", "vision", "1", (), Tally(jobs=2, allocated_s=60, claimed_user_jobs=1))
    assert after.content_hash != before.content_hash  # a counted disagreement is in the hash


POLICY = """\
version: 1
generations:
  hopper: {slurm_gres: h100, kueue_flavor: h100}
  ampere: {slurm_gres: a100, kueue_flavor: a100}
tiers:
  - {name: prod, priority: 10}
teams:
  - {name: vision}
  - {name: nlp}
robots:
  - {account: "%s", team: vision, project: p-vision}
"""


def test_the_job_page_and_the_team_page_show_name_identifier_and_owner(ledger_settings: ClickHouseSettings,  # noqa: F811
                                                                       tmp_path: Path) -> None:  # fmt: skip
    from fixtures_web import make_client

    ch = ledger_settings
    write_ledger(ch)
    write_identities(ch)
    operator = {"X-Forwarded-User": "ops", "X-Forwarded-Groups": "gpuledger-operators"}
    settings = Settings(state_dir=tmp_path, cluster="c1", clickhouse=ch, broker=BrokerSettings(enabled=False),
                        web=WebSettings(demo=False))  # fmt: skip
    plain = make_client(settings, now_ms=ms("2026-11-30T00:00"))
    robot_page = plain.get("/jobs/k8s/ci-1?period=2026-11", headers=operator)
    assert robot_page.status_code == 200, robot_page.text
    assert f"{ROBOT} (uid unknown)" in robot_page.text
    assert "self-declared (a label the submitter wrote)" in robot_page.text
    assert "owner: nobody (no robots: entry in policy.yaml)" in robot_page.text  # a robot nobody owns says so

    (tmp_path / "policy.yaml").write_text(POLICY % ROBOT, encoding="utf-8")
    owned = make_client(settings.model_copy(update={"policy_path": tmp_path / "policy.yaml"}),
                        now_ms=ms("2026-11-30T00:00"))  # fmt: skip
    robot_page = owned.get("/jobs/k8s/ci-1?period=2026-11", headers=operator)
    assert "owner: team vision, project p-vision" in robot_page.text
    bob = owned.get("/jobs/c1/j2?period=2026-11", headers=operator).text
    assert f"bob (uid {K8S_UID})" in bob and "stamped at admission" in bob
    assert "gpuledger report seconds --cluster c1 --node NODE" in bob  # below the device-minute: the seconds
    assert "label named carol: not trusted over the verified submitter" in bob

    team = owned.get("/teams/vision?period=2026-11", headers=operator)
    assert team.status_code == 200, team.text
    assert "identities on k8s are self-declared (the admission stamp is not applied)" in team.text
    rows = {r["identity"]: r for r in csv_rows(owned.get("/teams/vision?period=2026-11&csv=identities",
                                                         headers=operator).text)}  # fmt: skip
    assert {"alice (uid 1001)", "alice (uid 2002)", "erin (uid unknown)", f"{ROBOT} (uid unknown)"} <= set(rows)
    assert rows["alice (uid 1001)"]["jobs"] == "1" and rows["alice (uid 2002)"]["jobs"] == "1"  # two, not one alice
    assert rows[f"{ROBOT} (uid unknown)"]["owner"] == "team vision, project p-vision"
    assert rows["alice (uid 1001)"]["owner"] == ""  # a person has no owner
    nlp = owned.get("/teams/nlp?period=2026-11", headers=operator).text
    assert "Jobs whose self-declared user disagreed with the verified submitter (charged to the submitter): 1." in nlp


def csv_rows(text: str) -> list[dict[str, str]]:
    import csv
    import io

    return list(csv.DictReader(io.StringIO(text)))
