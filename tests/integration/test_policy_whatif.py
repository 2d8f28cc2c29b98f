"""`policy whatif` (issue 43) on a simulated month in the embedded ClickHouse.

- Under the policy in force (the idle policy the month was processed with, the card loaded) the replay gives
  back every stored warning and reclaim notice and every charge, to the cent.
- Under a proposal (shorter idle thresholds and grace, a 50% preemptible discount) the warnings, reclaims and
  charges match a worked ledger computed here from the simulator's ground truth (`expected_device_minutes`,
  the card's rates), which shares no code with the processors or the views.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import PERIOD, POLICY, SIM, run_cli, simulated_database

from base.settings import ClickHouseSettings, Settings
from producers.simulator import expected_device_minutes, plan
from producers.simulator.model import clusters
from producers.simulator.org import sim_policy_text
from schemas.policy import parse_policy
from sinks.db import connect
from sinks.whatif import proposed_card

PROPOSAL_IDLE = {"idle_after_min_interactive": 5, "idle_after_min_batch": 8, "grace_min": 2}


@pytest.fixture(scope="module")
def ledger(clickhouse_server: Any) -> Any:
    with simulated_database(clickhouse_server, "whatif_") as (ch, _):
        yield ch


def _proposal(tmp_path: Path, idle: dict[str, int] | None, discount: str | None) -> Path:
    text = sim_policy_text()
    if idle is not None:
        text += "idle: " + json.dumps(idle) + "\n"
    if discount is not None:
        text = text.replace("tiers:\n", f"preemptible: {{tier: standard, discount: '{discount}'}}\ntiers:\n", 1)
    path = tmp_path / "proposed.yaml"
    path.write_text(text, encoding="utf-8")
    parse_policy(text)  # a valid proposal
    return path


def _run(ch: ClickHouseSettings, path: Path, by: str = "team") -> Any:
    from processors.whatif_cli import whatif

    settings = Settings(clickhouse=ch).model_copy(
        update={"processor": Settings().processor.model_copy(update={"idle": POLICY})}
    )
    return whatif(connect(ch), settings, PERIOD, parse_policy(path.read_text()), by)


def _key(a: dict[str, Any]) -> tuple[Any, ...]:
    return (a["scenario"], a["kind"], a["time_utc"], a["cluster"], a["job_id"], a["action"], a["idle_minutes"])


def test_the_policy_in_force_gives_the_month_back(ledger: ClickHouseSettings, tmp_path: Path) -> None:
    result = _run(ledger, _proposal(tmp_path, None, None))
    actual = sorted(_key({**e, "scenario": ""}) for e in result.events if e["scenario"] == "actual")
    whatif = sorted(_key({**e, "scenario": ""}) for e in result.events if e["scenario"] == "whatif")
    assert actual, "the simulated month has warnings and reclaims"
    assert {k[1] for k in actual} == {"IDLE_WARNING", "RECLAIM_NOTICE"}
    assert whatif == actual  # every warning and reclaim notice: same job, minute, action, idle minutes
    for line in result.lines:
        assert line["charge_whatif"] == line["charge_actual"], line
        assert line["warnings_whatif"] == line["warnings_actual"] and line["reclaims_whatif"] == line["reclaims_actual"]
    # the lines are the chargeback report's own
    report = json.loads(run_cli(ledger, "report", "chargeback", "--period", PERIOD, "--by", "team", "--format", "json"))
    charged = {r["line"]: Decimal(r["charge"]) for r in report}
    assert {r["line"]: r["charge_actual"] for r in result.lines} == charged


def _worked_ledger(after: dict[str, int], grace: int) -> tuple[dict[tuple[str, str], list[tuple[str, int]]], Any]:
    """Per job, the warnings and reclaims the rule in docs/policy.md gives (from the simulator's truth): a job-minute
    is idle when some device reported and none was active or starved, dark when none reported; a run of idle
    minutes (no gap, no busy or dark minute) warns at its `after`-th minute and reclaims `grace` minutes later."""
    jobs = {j.job_id: (cfg.cluster, j) for cfg in clusters(SIM) for j in plan(cfg).jobs}
    per_minute: dict[str, dict[int, list[bool]]] = defaultdict(dict)
    for dm in expected_device_minutes(SIM):
        flags = per_minute[dm.job_id].setdefault(dm.minute_start_ms, [False, False])
        flags[0] = flags[0] or dm.sample_count > 0
        flags[1] = flags[1] or dm.active_s + dm.starved_s > 0
    out: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for job_id, minutes in per_minute.items():
        cluster, job = jobs[job_id]
        limit = after["interactive" if job.interactive else "batch"]
        run, last, events = 0, None, []
        for m in sorted(minutes):
            reported, busy = minutes[m]
            if last is not None and m != last + 60_000:
                run = 0
            last = m
            run = run + 1 if reported and not busy else 0
            if run == limit:
                events.append(("IDLE_WARNING", m + 60_000))
            if run == limit + grace:
                events.append(("RECLAIM_NOTICE", m + 60_000))
        out[(cluster, job_id)] = events
    return out, jobs


def test_a_proposal_matches_the_simulators_worked_ledger(ledger: ClickHouseSettings, tmp_path: Path) -> None:
    path = _proposal(tmp_path, PROPOSAL_IDLE, "0.50")
    result = _run(ledger, path, by="team")
    expected, jobs = _worked_ledger({"interactive": 5, "batch": 8}, 2)
    got: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for e in result.events:
        if e["scenario"] == "whatif":
            ms = int(dt.datetime.strptime(e["time_utc"], "%Y-%m-%d %H:%M").replace(tzinfo=dt.UTC).timestamp() * 1000)
            got[(e["cluster"], e["job_id"])].append((e["kind"], ms))
    want = {k: sorted(v) for k, v in expected.items() if v}
    assert {k: sorted(v) for k, v in got.items()} == want
    assert sum(len(v) for v in want.values()) > sum(r["warnings_actual"] + r["reclaims_actual"]
                                                   for r in result.lines if r["line"] == "TOTAL")  # fmt: skip
    # charges: allocated seconds x the proposed card's rate (50% off preemptible on-prem work), per team
    card = proposed_card(None, parse_policy(path.read_text()))
    nums: dict[str, int] = defaultdict(int)
    p_devices = {cfg.cluster: plan(cfg).devices for cfg in clusters(SIM)}
    for dm in expected_device_minutes(SIM):
        cluster, job = jobs[dm.job_id]
        gen = next(d.generation for d in p_devices[cluster].values() if d.node == dm.node and d.uuid == dm.uuid)
        day = dt.datetime.fromtimestamp(dm.minute_start_ms / 1000, dt.UTC).date()
        rate = card.rate_for(gen, job.pricing_tier, job.preemptible, day)
        assert dm.mig_instance_id is None, "the worked ledger prices whole GPUs"
        nums[job.person.team] += dm.allocated_s * (rate.micro_per_gpu_hour if rate else 0)
    total = (Decimal(sum(nums.values())) / Decimal(3_600_000_000)).quantize(Decimal("0.01"), ROUND_HALF_UP)
    lines = {r["line"]: r for r in result.lines}
    assert lines["TOTAL"]["charge_whatif"] == total
    for team, num in nums.items():
        assert abs(lines[team]["charge_whatif"] - Decimal(num) / Decimal(3_600_000_000)) < Decimal("0.01"), team
    assert any(j.preemptible for _, j in jobs.values()), "the month has preemptible work to discount"
    assert lines["TOTAL"]["charge_whatif"] < lines["TOTAL"]["charge_actual"]


def test_the_command_prints_csv_with_its_assumptions(ledger: ClickHouseSettings, tmp_path: Path) -> None:
    path = _proposal(tmp_path, PROPOSAL_IDLE, "0.50")
    out = run_cli(ledger, "policy", "whatif", "--policy", str(path), "--period", PERIOD, "--by", "project",
                  "--format", "csv")  # fmt: skip
    header, *rows = out.strip().splitlines()
    assert header.startswith("period,line,jobs,charge_actual,charge_whatif,")
    assert rows[-1].startswith(f"{PERIOD},TOTAL,") and "later work does not move" in rows[-1]
    events = json.loads(run_cli(ledger, "policy", "whatif", "--policy", str(path), "--period", PERIOD,
                                "--show", "events", "--format", "json"))  # fmt: skip
    assert {e["scenario"] for e in events} == {"actual", "whatif"}


def test_a_bad_proposal_gets_one_line_and_nothing_runs(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpuledger.cli import _register_all, app

    if not any(g.name == "report" for g in app.registered_groups):
        _register_all()
    bad = tmp_path / "proposed.yaml"
    bad.write_text(sim_policy_text() + "idle: {grace_min: -5}\n", encoding="utf-8")
    env = {"GPULEDGER_CLICKHOUSE__URL": "http://127.0.0.1:9"}  # nothing listens: a query would fail differently
    result = CliRunner().invoke(app, ["policy", "whatif", "--policy", str(bad), "--period", PERIOD], env=env)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{bad}:") and "idle.grace_min" in lines[0], result.output


def test_runs_replay_as_every_minute(ledger: ClickHouseSettings) -> None:
    """The month handed over as runs (`run_classes`: the warehouse groups contiguous alike minutes) holds every
    stored minute (expanded, the runs are the minutes, class by class), replays to what every minute replays to,
    also when only the jobs with a long enough idle streak are loaded, and the released seconds read back from the
    warehouse equal the stored minutes' own sums."""
    from processors.classify import classify_job_minute
    from processors.whatif import replay_month, run_classes
    from sinks.whatif import first_reclaims, load_month, month_bounds, released_after, shortest_warning

    client = connect(ledger)
    idle = parse_policy(_proposal_text_for_idle()).idle_policy(POLICY)
    every, runs = load_month(client, PERIOD), load_month(client, PERIOD, run_classes(), min_streak=0)
    assert sum(map(len, runs.minutes.values())) < sum(map(len, every.minutes.values())) / 5
    assert runs.spans == every.spans and runs.jobs == every.jobs and runs.minutes.keys() == every.minutes.keys()

    def alike(m: dict[str, Any]) -> tuple[Any, ...]:
        cls = classify_job_minute(m["active_s"], m["starved_s"], m["idle_s"])
        return cls, m["allocated_s"], m["generation"], m["device_count"]

    for key, mins in every.minutes.items():
        assert {m["minutes"] for m in mins} == {1}
        expanded = sorted((r["minute_start_ms"] + i * 60_000, alike(r)) for r in runs.minutes[key]
                          for i in range(r["minutes"]))  # fmt: skip
        assert expanded == sorted((m["minute_start_ms"], alike(m)) for m in mins), key
    a = replay_month(every.minutes, every.jobs, every.appeals, idle, None)
    b = replay_month(runs.minutes, runs.jobs, runs.appeals, idle, None)
    assert a.alerts == b.alerts and a.actions == b.actions and a.actions
    # only the jobs with a streak as long as the shortest threshold: the same alerts again
    fewer = load_month(client, PERIOD, run_classes(), shortest_warning(idle))
    assert 0 < len(fewer.minutes) < len(every.minutes) and fewer.spans == every.spans
    c = replay_month(fewer.minutes, fewer.jobs, fewer.appeals, idle, None)
    assert c.alerts == a.alerts and c.actions == a.actions
    at = first_reclaims(every, a.actions)
    start, end = month_bounds(PERIOD)
    sums: dict[tuple[str, str], int] = defaultdict(int)
    for key, mins in every.minutes.items():
        for m in mins:
            if key in at and at[key] <= int(m["minute_start_ms"]) < end:
                sums[key] += int(m["allocated_s"])
    got = {k: sum(v[0] for v in days.values()) for k, days in released_after(client, every, at).items()}
    assert got == dict(sums) and start < min(at.values())


def _proposal_text_for_idle() -> str:
    return sim_policy_text() + "idle: " + json.dumps(PROPOSAL_IDLE) + "\n"
