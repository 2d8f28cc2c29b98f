"""Both live engines into one ledger, checked against what the engines ran (issue 42 items 1 and 2).

The live Slurm (fixture `live_slurm`) and a Kubernetes control plane of this module's own with Kueue, the Job
controller and KWOK (the Kubernetes project's kubelet stand-in: it starts, completes and deletes the pods), run at
once; stack/two_engines.py puts the simulator's exporters on their devices (driven by what each engine says runs
where), and the real producers (`slurm poll`, `kube watch`, `kube podresources` against the fake kubelet's
PodResources, `dcgm run` per node) publish to the real broker; `processors run` and `sink run` put the ledger
into the embedded ClickHouse.

The work is stack/two_engines_scenarios.py's (`gpuledger dev two-engines --scenarios` runs the same for a person):
a gang on each engine, one person on both (`alice`), a preemption on each (a Slurm QOS preemption that cancels
the preempted job; a Kueue priority preemption that requeues the Workload, whose Job gets new pods), a reclaim on
each (`gpuledger reclaim exec --execute`) and a correction. The expected ledger is worked from
the engines' own accounting (sacct -D, each pod's own status), not from any plan. Compared: each job's GPU-seconds
(`v_chargeback_jobs`), `report chargeback --by cluster` per team and cluster (and each team across both),
`--by project` (the correction), and each device-second charged once (no device-minute over 60 s, no overlap,
every second on a real GPU), to the cent (1 $ a GPU-second)."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures_cli import run_gpuledger

from base.settings import ClickHouseSettings
from sinks.db import connect
from stack.broker import stop_process
from stack.components import gpuledger_argv
from stack.kube.build import KubeBinaries
from stack.kube.cluster import ClusterConfig, LocalKube, eventually
from stack.slurm.cluster import SlurmClient
from stack.two_engines import Clusters, TwoEngines, environ_without_gpuledger
from stack.two_engines_scenarios import (
    PERSON,
    SiteFiles,
    dollars,
    expected,
    job_story,
    ledger_seconds,
    person_account,
    run_scenarios,
    slurm_teardown,
)

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    engines: TwoEngines
    slurm: SlurmClient
    kube: LocalKube
    env: dict[str, str]  # every gpuledger command's settings (the cluster added per command)
    suffix: str
    procs: dict[str, subprocess.Popen[bytes]]

    ch: ClickHouseSettings

    def cli(self, *args: str, cluster: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "GPULEDGER_CLUSTER": cluster} if cluster else self.env
        return run_gpuledger(list(args), env=env, timeout=timeout)


def progress(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", file=sys.stderr)


@pytest.fixture(scope="module")
def two_engines(live_slurm: SlurmClient, kube_binaries: KubeBinaries, kafka_bootstrap: str, clickhouse_server: Any,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # fmt: skip
    s = uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("two-engines")
    person_account(PERSON)
    live_slurm.cancel_all()  # from an idle Slurm: alice's interactive allocation must be granted at once (below)
    database = f"two_{s}"
    admin = clickhouse_server.client()
    admin.command(f"CREATE DATABASE {database}")
    site = SiteFiles.write(tmp, s)
    env = {**environ_without_gpuledger(), **live_slurm.cfg.env,
           "GPULEDGER_CONFIG": str(tmp / "none.toml"), "GPULEDGER_STATE_DIR": str(tmp / "state"),
           "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "GPULEDGER_KAFKA__TOPIC_PREFIX": f"two{s}.",
           "GPULEDGER_PROCESSOR__GROUP_ID": f"two{s}.processors", "GPULEDGER_SINKS__GROUP_ID": f"two{s}.sinks",
           "GPULEDGER_CLICKHOUSE__URL": clickhouse_server.url, "GPULEDGER_CLICKHOUSE__DATABASE": database,
           "GPULEDGER_CLICKHOUSE__PASSWORD": clickhouse_server.password,
           "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": clickhouse_server.analyst_password,
           **site.env(), "GPULEDGER_METRICS__BASE_PORT": "0"}  # fmt: skip
    progress("topics, migrations, rate card")
    for args in (
        ["topics", "apply", "--timeout", "60"],
        ["db", "migrate"],
        ["ratecard", "load", "--card", str(site.card)],
    ):
        done = run_gpuledger(args, env=env, timeout=180)
        assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    clusters = Clusters(slurm=f"slurm-{s}", kube=f"kube-{s}")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp / "logs"
    logs.mkdir()
    progress("the control plane")
    with LocalKube(ClusterConfig.on_free_ports(tmp / "kube"), kube_binaries) as kube:
        engines = TwoEngines(live_slurm, kube, kube_binaries, env, tmp, clusters=clusters, progress=progress)
        try:
            for name, args in (
                ("processors", ["processors", "run"]),
                ("agents", ["processors", "agents"]),
                ("sinks", ["sink", "run"]),
            ):  # what `up` runs: node stages, job stage, sinks
                with open(logs / f"{name}.log", "wb") as log:
                    procs[name] = subprocess.Popen(gpuledger_argv(*args), env=env, cwd=REPO, stdout=log,
                                                   stderr=subprocess.STDOUT)  # fmt: skip
            engines.start()
            ch = ClickHouseSettings(url=clickhouse_server.url, database=database, password=clickhouse_server.password,
                                    analyst_password=clickhouse_server.analyst_password)  # fmt: skip
            yield Stack(engines, live_slurm, kube, env, s, procs, ch)
        finally:
            engines.stop()
            for proc in procs.values():
                if proc.poll() is None:
                    stop_process(proc.pid, timeout=30, group=False)
            slurm_teardown(live_slurm, s, PERSON)  # the session's Slurm as it was
            admin.command(f"DROP DATABASE IF EXISTS {database}")


# ------------------------------------------------------------------------------------------------
# Reading the ledger


def report_lines(stack: Stack, period: str, by: str) -> list[dict[str, Any]]:
    out = stack.cli("report", "chargeback", "--period", period, "--by", by, "--format", "json")
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


def query(stack: Stack, sql: str) -> list[dict[str, Any]]:
    client = connect(stack.ch, analyst=True)
    try:
        return list(client.query(sql).named_results())
    finally:
        client.close()


# ------------------------------------------------------------------------------------------------
# The test


def test_two_live_engines_feed_one_ledger_that_matches_their_own_accounting(two_engines: Stack) -> None:
    st = two_engines
    clusters = st.engines.clusters
    work = run_scenarios(st.engines, st.suffix, progress=progress)
    for note in work.notes:
        print(note)
    roles = work.slurm
    assert "Preempted to accommodate a workload" in work.evicted.get("message", ""), work.evicted

    # What the engines ran: Slurm's accounting (one run each: the preempted job cancelled), each pod's own status.
    want = expected(st.engines, work)
    runs = want.runs
    assert all(len(r) == 1 for r in runs.values()), runs
    assert {j: len(v) for j, v in want.pods.items()} == {"train": 2, "tune": 2, "urgent": 1, "idle-k": 1}, want.pods
    expected_s = want.seconds
    print(f"\nexpected GPU-seconds: {expected_s}")

    # The ledger: every job's GPU-seconds there, once the minutes after the last end have closed.
    def ledger() -> dict[tuple[str, str], int]:
        client = connect(st.ch, analyst=True)
        try:
            return ledger_seconds(client)
        finally:
            client.close()

    def complete() -> dict[tuple[str, str], int] | None:
        got = ledger()
        return got if all(got.get(k) == v for k, v in expected_s.items()) else None

    def story() -> str:
        """Each disagreeing job's events and device-minutes, as the warehouse holds them."""
        got = ledger()
        lines = [f"ledger {got}", f"expected {expected_s}"]
        client = connect(st.ch, analyst=True)
        try:
            for cluster, job in sorted(k for k in expected_s if got.get(k) != expected_s[k]):
                lines += job_story(client, cluster, job)
        finally:
            client.close()
        return "\n".join(lines)

    eventually(complete, "the ledger holds every job's GPU-seconds as the engines ran them", timeout=150, explain=story)
    # Who and what each job was, as the engines have it: Slurm's user and the job's project comment (alice's job
    # corrected to NLP), the pod's labels.
    team_of = {key: team for key, (team, _) in want.who.items()}
    assert want.users[roles["alice"]] == work.person
    assert team_of[(clusters.slurm, roles["alice"])] == team_of[(clusters.kube, want.pods["train"][0])]
    by_team, by_project = want.by_team(), want.by_project()
    period = dt.datetime.now(dt.UTC).strftime("%Y-%m")
    lines = report_lines(st, period, "cluster")
    got_team = {(r["line"], r["cluster"]): r["charge"] for r in lines if r["line"] != "TOTAL"}
    assert got_team == {k: dollars(v) for k, v in by_team.items()}, lines
    total = [r["charge"] for r in lines if r["line"] == "TOTAL"]
    assert total == [dollars(want.total())], lines
    lines = report_lines(st, period, "project")
    got_project = {r["line"]: r["charge"] for r in lines if r["line"] != "TOTAL"}
    assert {k: v for k, v in got_project.items() if k in by_project} == {k: dollars(v) for k, v in
                                                                         by_project.items()}, lines  # fmt: skip
    # Jobs the session's earlier Slurm tests ran are in the live Slurm's accounting, and the poller reports them:
    # their projects get lines, but not one second in this test's window.
    assert {v for k, v in got_project.items() if k not in by_project} <= {"0.00"}, lines

    # Each device-second charged once: no device-minute holds more than 60 allocated seconds, none is contested.
    crowded = query(st, "SELECT cluster, device_uuid, minute_start_ms, sum(allocated_s) AS s FROM device_minutes "
                        "FINAL GROUP BY cluster, device_uuid, minute_start_ms HAVING s > 60")  # fmt: skip
    assert crowded == []
    assert query(st, f"SELECT * FROM v_device_overlaps WHERE period = '{period}'") == []
    held = query(st, "SELECT cluster, toInt64(sum(allocated_s)) AS s FROM device_minutes FINAL WHERE job_id != '' "
                     "AND device_uuid NOT LIKE 'unidentified%' GROUP BY cluster")  # fmt: skip
    assert {r["cluster"]: r["s"] for r in held} == {
        c: sum(v for (k, _), v in expected_s.items() if k == c) for c in (clusters.slurm, clusters.kube)
    }  # on the real GPUs
