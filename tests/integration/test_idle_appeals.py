"""A granted exemption reaches the running idle machine (issue 19 item 2), on the real broker, through the CLI.

Two interactive jobs sit idle on one GPU each: nb (ana's) and ctl. The job-stage faust agents
(`processors.idle_agents`, with the policy) warn both. Ana appeals nb's warning (`appeal file --alert`, the
alert read back from ClickHouse), ops1 grants an exemption of one hour (`appeal decide --grant exemption`). The
idle minutes that follow, past the reclaim due: ctl is reclaimed, nb is not, nor warned again. The agents
are then killed (SIGKILL) and restarted, and nb stays idle for longer than a fresh warning and grace would
take: still nothing for nb, the exemption restored with its idle state.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures_cli import run_gpuledger
from test_chat_appeals import POLICY  # ana of team vision, ops1 decides appeals
from test_idle_faust import _row, count, start_faust, stop, until
from test_processor_harness import create_topics, decode_all, publish, read_all, worker_env
from test_statements_close import env as cli_env

from base.settings import ClickHouseSettings, KafkaSettings, Settings, SinksSettings
from processors.testing import job_event, job_rows
from schemas.topics import ALERTS, JOB_DEVICE_MINUTES, JOB_EVENTS, JOB_MINUTES, RECLAIM_ACTIONS, Topic, job_key
from sinks.consumer import LedgerSink
from sinks.db import connect, migrate
from sinks.writer import LedgerWriter

pytestmark = pytest.mark.integration

M = 60_000
# Warned after 2 idle minutes, reclaimed 10 minutes after that: room for the appeal to be filed and decided.
IDLE = {"idle__idle_after_min_interactive": "2", "idle__grace_min": "10", "max_future_ms": str(2 * 3_600_000),
        "commit_interval_ms": "500"}  # fmt: skip
JOBS = {"nb": "n1", "ctl": "n2"}


def minutes(base: int, first: int, last: int) -> list[tuple[Topic, bytes, dict[str, Any]]]:
    """Both jobs idle in minutes first..last (from `base`)."""
    return [(JOB_DEVICE_MINUTES, job_key("c1", job), job_rows([_row(job, node, f"GPU-{job}", base + m * M, "idle")]))
            for m in range(first, last + 1) for job, node in JOBS.items()]  # fmt: skip


def of_job(bootstrap: str, prefix: str, topic: Topic, job: str) -> list[dict[str, Any]]:
    return [r for _, r in decode_all(read_all(bootstrap, prefix + topic.name), topic.subject) if r["job_id"] == job]


def cli(environ: dict[str, str], *args: str) -> str:
    done = run_gpuledger(list(args), environ)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_granted_exemption_stops_the_reclaim_at_once_and_after_a_restart(
    kafka_bootstrap: str, clickhouse_server: Any, clickhouse_database: str, tmp_path: Path
) -> None:
    prefix = f"ia-{uuid.uuid4().hex[:8]}."
    create_topics(kafka_bootstrap, prefix, 4)
    ch = ClickHouseSettings(url=clickhouse_server.url, database=clickhouse_database,
                            password=clickhouse_server.password,
                            analyst_password=clickhouse_server.analyst_password)  # fmt: skip
    client = connect(ch)
    migrate(client, ch)
    s = Settings(kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix), clickhouse=ch,
                 sinks=SinksSettings(group_id=f"sink-{uuid.uuid4().hex[:6]}", batch_max_wait_s=0.3))  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    environ = {**cli_env(s), "GPULEDGER_POLICY_PATH": str(policy)}
    wenv = {**worker_env(kafka_bootstrap, prefix, tmp_path / "agents", **IDLE), "PYTHONUNBUFFERED": "1",
            "GPULEDGER_POLICY_PATH": str(policy)}  # fmt: skip
    log = tmp_path / "agents.log"

    def nb_minutes() -> set[int]:
        return {r["minute_start_ms"] for r in of_job(kafka_bootstrap, prefix, JOB_MINUTES, "nb")}

    # The minutes are near the wall clock: the exemption holds from its decision (now) for an hour.
    base = (int(time.time() * 1000) // M - 3) * M
    starts = [(JOB_EVENTS, job_key("c1", job), job_event("STARTED", job, base, {node: [f"GPU-{job}"]},
               interactive=True)) for job, node in JOBS.items()]  # fmt: skip
    publish(kafka_bootstrap, prefix, starts + minutes(base, 0, 2))
    proc = start_faust(wenv, log)
    try:
        until(lambda: len(of_job(kafka_bootstrap, prefix, ALERTS, "nb")) == 1, "nb's warning", 180, log)
        (warning,) = of_job(kafka_bootstrap, prefix, ALERTS, "nb")
        assert warning["kind"] == "IDLE_WARNING" and warning["action_at_ms"] == base + 12 * M
        LedgerSink(s.kafka, s.sinks, LedgerWriter(client), topics=[ALERTS.name]).run(lambda: False, max_idle_s=3.0)
        filed = cli(environ, "appeal", "file", "--alert", warning["alert_id"], "--by", "ana", "--reason", "demo")
        appeal_id = filed.split()[1]
        decided_ms = int(time.time() * 1000)
        cli(environ, "appeal", "decide", appeal_id, "--grant", "exemption", "--hours", "1", "--by", "ops1",
            "--note", "demo day")  # fmt: skip
        assert decided_ms < base + 11 * M  # decided before the minute whose end the reclaim is due at

        # Past the reclaim due at base + 12 min: ctl's comes, nb's never does.
        publish(kafka_bootstrap, prefix, minutes(base, 3, 15))
        until(lambda: count(kafka_bootstrap, prefix, JOB_MINUTES) >= 2 * 16, "the job-minutes", 120, log)
        until(lambda: count(kafka_bootstrap, prefix, RECLAIM_ACTIONS) >= 1, "ctl's reclaim", 60, log)
        time.sleep(2)
        (ctl_action,) = of_job(kafka_bootstrap, prefix, RECLAIM_ACTIONS, "ctl")
        assert ctl_action["ts_ms"] == base + 12 * M
        assert of_job(kafka_bootstrap, prefix, RECLAIM_ACTIONS, "nb") == []
        assert [a["kind"] for a in of_job(kafka_bootstrap, prefix, ALERTS, "nb")] == ["IDLE_WARNING"]

        # Killed and restarted: the exemption still holds over longer than a new warning plus its grace.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        publish(kafka_bootstrap, prefix, minutes(base, 16, 35))
        proc = start_faust(wenv, log)
        until(lambda: len(nb_minutes()) == 36, "nb's job-minutes after a restart", 180, log)
        time.sleep(2)
    finally:
        stop(proc)
        client.close()
    assert of_job(kafka_bootstrap, prefix, RECLAIM_ACTIONS, "nb") == []
    assert [a["kind"] for a in of_job(kafka_bootstrap, prefix, ALERTS, "nb")] == ["IDLE_WARNING"]
    assert nb_minutes() == {base + m * M for m in range(36)}
    assert "exemptions granted on appeal" in log.read_text()
