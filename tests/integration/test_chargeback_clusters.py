"""The reconciled view on the embedded ClickHouse: two clusters (Slurm `slurm-a`, Kubernetes `k8s-b`), one
ledger. `report chargeback --by cluster` gives a line per (team, cluster) and each team's total across
clusters, which is its `--by team` line; node n9 moved from Slurm to Kubernetes while the Slurm job's end
never arrived, so both clusters claim GPU-m for 29.5 minutes: the pod (started later) is charged for them,
the Slurm job cedes them, and the overlap is a data-quality finding naming both jobs.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from contract_records import job_event
from test_chargeback_ledger import device_minute, ledger_settings, ms, run_cli  # noqa: F401  (fixture)

from base.settings import ClickHouseSettings
from schemas import topics
from sinks import chargeback as cb
from sinks import reconcile
from sinks.db import connect
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

# job: cluster, user, team, project, cost centre, generation
JOBS = {
    "j1": ("slurm-a", "alice", "vision", "p-vision", "CC-100", "hopper"),
    "j3": ("slurm-a", "carol", "nlp", "p-nlp", "CC-200", "ampere"),
    "j2": ("slurm-a", "bob", "nlp", "p-nlp", "CC-200", "hopper"),  # on n9; its end never arrived
    "vision/train-7": ("k8s-b", "alice", "vision", "p-vision", "CC-100", "hopper"),
    "nlp/ft-1": ("k8s-b", "bob", "nlp", "p-nlp", "CC-200", "hopper"),  # n9 as a Kubernetes node (kn9)
}
STARTS = {"j1": "2026-11-10T09:59", "j3": "2026-11-20T07:59", "j2": "2026-11-12T00:00",
          "vision/train-7": "2026-11-10T12:00", "nlp/ft-1": "2026-11-12T01:00:30"}  # fmt: skip


def claim(
    job: str, node: str, uuid: str, start: str, cls: str, count: int, *, first_s: int = 60
) -> list[dict[str, Any]]:
    """`count` device-minutes of `job` on one device from `start`, the first holding `first_s` seconds."""
    cluster, user, team, project, cc, gen = JOBS[job]
    rows, t = [], ms(start)
    for i in range(count):
        row = device_minute(None, node, uuid, t, cls, generation=gen)
        allocated = first_s if i == 0 else 60
        row.update(cluster=cluster, job_id=job, user=user, team=team, project=project, cost_centre=cc,
                   unallocated_s=60 - allocated, allocated_s=allocated, sample_count=0 if cls == "dark" else allocated,
                   model="H100" if gen == "hopper" else "A100", **{f"{cls}_s": allocated})  # fmt: skip
        rows.append(row)
        t += 60_000
    return rows


def ledger() -> list[dict[str, Any]]:
    return [
        *claim("j1", "n1", "GPU-a", "2026-11-10T10:00", "active", 60),  # 3600 s
        *claim("j3", "n3", "GPU-d", "2026-11-20T08:00", "starved", 60),  # 3600 s
        *claim("vision/train-7", "kn1", "GPU-k", "2026-11-10T12:00", "active", 30),  # 1800 s
        # GPU-m: j2 ran an hour, then the node left Slurm at 01:00 (no end event): j2 claims it dark to 02:00.
        *claim("j2", "n9", "GPU-m", "2026-11-12T00:00", "active", 60),
        *claim("j2", "n9", "GPU-m", "2026-11-12T01:00", "dark", 60),
        # ...while the pod holds it from 01:00:30 (30 s of its first minute) to 01:30: 1770 s.
        *claim("nlp/ft-1", "kn9", "GPU-m", "2026-11-12T01:00", "active", 30, first_s=30),
    ]


def write(ch: ClickHouseSettings) -> None:
    (dm,) = SINKS[topics.DEVICE_MINUTES.name]
    events, _identities = SINKS[topics.JOB_EVENTS.name]
    pending = [Pending(dm, row, Origin("m", 0, i)) for i, r in enumerate(ledger()) for row in dm.rows(r)]
    for i, (job, start) in enumerate(STARTS.items()):
        ev = job_event("STARTED", ms(start), cluster=JOBS[job][0], job_id=job, user=JOBS[job][1],
                       project=JOBS[job][3], event_id=f"start-{job}")  # fmt: skip
        pending += [Pending(events, row, Origin("e", 0, i)) for row in events.rows(ev)]
    client = connect(ch)
    try:
        assert not LedgerWriter(client).write(pending).rejected
    finally:
        client.close()


# By hand (hopper on-prem 1.631018 $/GPU-h before 11-16, ampere on-prem 0.752878), numerators in micro-$ x s:
#   vision / slurm-a   j1 3600 s x 1631018              =  5,871,664,800 -> 163.1018 cents
#   vision / k8s-b     train-7 1800 s x 1631018         =  2,935,832,400 ->  81.5509
#   nlp / slurm-a      j3 3600 x 752878 = 2,710,360,800; j2 (7200 - 1770 ceded = 5430 s) x 1631018
#                      = 8,856,427,740; together        = 11,566,788,540 -> 321.2997
#   nlp / k8s-b        ft-1 1770 x 1631018              =  2,886,901,860 ->  80.1917
#   month 23,261,187,600 -> 646.1441 -> 646 cents; floors 645, the leftover cent to the largest remainder
#   (vision / k8s-b). Team totals: vision 1.63 + 0.82 = 2.45, nlp 3.21 + 0.80 = 4.01 (by team: 244.65 ->
#   2.45 and 401.49 -> 4.01, the leftover cent to vision: the same).
EXPECTED = [
    ("nlp", "k8s-b", "0.80", "0.4917", 1), ("nlp", "slurm-a", "3.21", "2.5083", 2), ("nlp", "ALL", "4.01", "3.0000", 3),
    ("vision", "k8s-b", "0.82", "0.5000", 1), ("vision", "slurm-a", "1.63", "1.0000", 1),
    ("vision", "ALL", "2.45", "1.5000", 2), ("TOTAL", "ALL", "6.46", "4.5000", 5),
]  # fmt: skip


def test_by_cluster_lines_total_per_team_and_an_overlap_is_charged_once(
    ledger_settings: ClickHouseSettings,  # noqa: F811
    tmp_path: Path,
) -> None:
    ch = ledger_settings
    write(ch)

    rows = json.loads(run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", "cluster", "--format", "json"))
    got = [(r["line"], r["cluster"], r["charge"], r["allocated_gpu_h"], r["jobs"]) for r in rows]
    assert got == EXPECTED
    assert list(rows[0])[:4] == ["period", "by", "line", "cluster"]
    # Each team's total across clusters is its --by team line.
    by_team = {r["line"]: r for r in json.loads(run_cli(ch, "report", "chargeback", "--period", "2026-11",
                                                        "--format", "json"))}  # fmt: skip
    for r in rows:
        if r["cluster"] == "ALL":
            assert (r["charge"], r["allocated_gpu_h"], r["dark_gpu_h"], r["jobs"]) == (
                by_team[r["line"]]["charge"], by_team[r["line"]]["allocated_gpu_h"],
                by_team[r["line"]]["dark_gpu_h"], by_team[r["line"]]["jobs"])  # fmt: skip
            assert r["utilisation_pct"] == by_team[r["line"]]["utilisation_pct"]
    # j2 ceded dark seconds: 3600 - 1770 left dark of 10,800 allocated on nlp, coverage (10800 - 1830) / 10800.
    nlp = next(r for r in rows if r["line"] == "nlp" and r["cluster"] == "ALL")
    assert nlp["dark_gpu_h"] == "0.5083" and nlp["coverage_pct"] == 83.1

    analyst = connect(ch, analyst=True)
    try:
        # GPU-m was held 00:00-02:00, 7200 device-seconds: charged 7200, never 8970 (both claims).
        charged = analyst.query(
            "SELECT sum(allocated_s) FROM v_usage_priced WHERE period = '2026-11' AND job_id IN ('j2', 'nlp/ft-1')"
        ).result_rows
        raw = analyst.query("SELECT sum(allocated_s) FROM device_minutes WHERE device_uuid = 'GPU-m'").result_rows
        explained = {r["job_id"]: r["allocated_s"] for r in cb.explain(analyst, "2026-11", "p-nlp")}
        found = reconcile.overlaps(analyst, "2026-11")
        assert reconcile.overlaps(analyst, "2026-10") == []
    finally:
        analyst.close()
    assert (charged, raw) == ([(7200,)], [(8970,)])
    assert explained == {"j2": 5430, "j3": 3600, "nlp/ft-1": 1770}
    assert found == [reconcile.Overlap("GPU-m", -1, "k8s-b", "nlp/ft-1", "slurm-a", "j2", ms("2026-11-12T01:00"),
                                       ms("2026-11-12T01:29"), 1770)]  # fmt: skip

    # The finance journal reads the same priced rows: the overlap is charged once there too.
    journal_csv = tmp_path / "journal.csv"
    run_cli(ch, "report", "journal", "--period", "2026-11", "--output", str(journal_csv))
    journal = list(csv.DictReader(io.StringIO(journal_csv.read_text(encoding="utf-8"))))
    assert [(r["line_kind"], r["cost_centre"], r["debit"], r["credit"]) for r in journal] == [
        ("usage", "CC-100", "2.45", "0.00"), ("usage", "CC-200", "4.01", "0.00"),
        ("contra", "CLUSTER-sim", "0.00", "6.46"),
    ]  # fmt: skip

    table = run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", "cluster")
    assert "GPU-m: 1770 s claimed by both slurm-a/j2 and k8s-b/nlp/ft-1; charged once, to k8s-b/nlp/ft-1" in table
    by_team_table = " ".join(run_cli(ch, "report", "chargeback", "--period", "2026-11").split())
    assert "claimed by both" in by_team_table  # every grouping
    assert "claimed by two clusters at once 0.492 GPU-h, ceded by 1 jobs (charged once)" in by_team_table
    # Machine-readable outputs carry it in the data-quality columns (1770 s = 0.492 GPU-h, one job ceded).
    assert {(r["dq_overlap_gpu_h"], r["dq_overlap_jobs"]) for r in by_team.values()} == {("0.492", 1)}


def figures(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Report rows without the data-quality columns (the figure reads the ledger as it is now)."""
    return [{k: v for k, v in r.items() if not k.startswith("dq_")} for r in rows]


def test_a_closed_month_by_cluster_is_its_frozen_statements(ledger_settings: ClickHouseSettings) -> None:  # noqa: F811
    ch = ledger_settings
    write(ch)
    open_rows = json.loads(run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", "cluster", "--format",
                                   "json"))  # fmt: skip
    run_cli(ch, "period", "close", "2026-11", "--by", "fin")
    # Late data for the closed month: j1 another hour on GPU-a. The open ledger has it; the closed month does not.
    (dm,) = SINKS[topics.DEVICE_MINUTES.name]
    late = claim("j1", "n1", "GPU-a", "2026-11-10T11:00", "active", 60)
    client = connect(ch)
    try:
        pending = [Pending(dm, row, Origin("late", 0, i)) for i, r in enumerate(late) for row in dm.rows(r)]
        assert not LedgerWriter(client).write(pending).rejected
    finally:
        client.close()
    closed_rows = json.loads(run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", "cluster", "--format",
                                     "json"))  # fmt: skip
    assert [(r["line"], r["cluster"], r["charge"], r["allocated_gpu_h"]) for r in closed_rows] == [
        (line, cluster, charge, hours) for line, cluster, charge, hours, _jobs in EXPECTED
    ]
    assert figures(closed_rows) == figures(open_rows)
    assert "the frozen statements" in run_cli(ch, "report", "chargeback", "--period", "2026-11", "--by", "cluster")
    analyst = connect(ch, analyst=True)
    try:
        live = reconcile.chargeback_by_cluster(analyst, "2026-11")
    finally:
        analyst.close()
    assert str(live.total.line.charge) == "8.09"  # 6.46 + one more hour of hopper on-prem (1.631018): the open ledger


def test_only_devices_two_clusters_claimed_are_searched_for_contested_days(
    ledger_settings: ClickHouseSettings,  # noqa: F811
) -> None:
    """Migration 026: `device_clusters` holds each identified device's claiming clusters, fed on insert, and
    v_device_days_contested, which now groups only the days of devices two clusters ever claimed, gives the rows
    017's grouping of every device-day gives."""
    ch = ledger_settings
    write(ch)
    analyst = connect(ch, analyst=True)
    try:
        clusters = analyst.query("SELECT DISTINCT device_uuid, mig_instance_id, cluster FROM device_clusters "
                                 "ORDER BY 1, 3").result_rows  # fmt: skip
        multi = analyst.query("SELECT * FROM v_devices_multi_cluster").result_rows
        contested = analyst.query("SELECT day, device_uuid, mig_instance_id, arraySort(all_holders), "
                                  "arraySort(all_jobs) FROM v_device_days_contested ORDER BY 1, 2").result_rows
        every_day = analyst.query(  # 017's view, over every device-day
            "SELECT day, device_uuid, mig_instance_id, arraySort(groupUniqArrayArray(holders)) AS h, "
            "arraySort(groupUniqArrayArray(jobs)) FROM device_cluster_days GROUP BY day, device_uuid, mig_instance_id "
            "HAVING length(arrayDistinct(arrayMap(x -> x.1, h))) > 1 ORDER BY 1, 2").result_rows
    finally:
        analyst.close()
    assert clusters == [("GPU-a", -1, "slurm-a"), ("GPU-d", -1, "slurm-a"), ("GPU-k", -1, "k8s-b"),
                        ("GPU-m", -1, "k8s-b"), ("GPU-m", -1, "slurm-a")]  # fmt: skip
    assert multi == [("GPU-m", -1)]
    assert contested == every_day
    assert [(str(day), uuid, sorted(jobs)) for day, uuid, _mig, _holders, jobs in contested] == [
        ("2026-11-12", "GPU-m", [("k8s-b", "nlp/ft-1"), ("slurm-a", "j2")])]
