"""The analyst role is read-only, and SQL injection through CLI parameters fails safely.

Against the embedded ClickHouse server (the real chDB engine behind the HTTP interface), through
clickhouse-connect as the analyst, and through the real `gpuledger` entry point for the CLI
commands. "Fails safely" means: no extra rows, nothing executed, and either an empty result or
one line on stderr with exit code 2 (never a traceback).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.exceptions import ClickHouseError
from test_chargeback_ledger import EXPECTED, cli_env, ledger_settings, write_ledger  # noqa: F401 (fixture)

from base.settings import ClickHouseSettings
from sinks.db import connect

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
CLI = "from gpuledger.cli import main; main()"
PERIOD = "2026-11"
PROJECT = "p-nlp"  # a project of the worked ledger, with jobs in November


def _snapshot(ch: ClickHouseSettings) -> dict[str, Any]:
    """Every table and view of the ledger database with its row count and columns (as the writer)."""
    client = connect(ch)
    try:
        tables = client.query(
            "SELECT name, engine FROM system.tables WHERE database = {db:String} ORDER BY name",
            parameters={"db": ch.database},
        ).result_rows
        out: dict[str, Any] = {"databases": sorted(r[0] for r in client.query("SHOW DATABASES").result_rows)}
        for name, engine in tables:
            cols = client.query(
                "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}",
                parameters={"db": ch.database, "t": name},
            ).result_rows
            count = None
            if not engine.endswith("View"):
                count = client.query("SELECT count() FROM {t:Identifier}", parameters={"t": name}).result_rows[0][0]
            out[name] = (engine, sorted(cols), count)
        return out
    finally:
        client.close()


@pytest.fixture
def ledger(ledger_settings: ClickHouseSettings) -> ClickHouseSettings:  # noqa: F811
    write_ledger(ledger_settings)
    return ledger_settings


# ------------------------------------------------------------------------------------------------
# The analyst cannot write


WRITES = [
    "INSERT INTO device_minutes (cluster, node, device_uuid, minute_start_ms) VALUES ('x', 'y', 'z', 1)",
    "INSERT INTO device_minutes SELECT * FROM device_minutes",
    "CREATE TABLE evil (a UInt8) ENGINE = Memory",
    "CREATE VIEW evil AS SELECT 1",
    "CREATE DATABASE evil",
    "DROP TABLE device_minutes",
    "DROP VIEW v_chargeback_jobs",
    "TRUNCATE TABLE device_minutes",
    "ALTER TABLE device_minutes DELETE WHERE 1",
    "ALTER TABLE device_minutes UPDATE project = 'stolen' WHERE 1",
    "ALTER TABLE device_minutes ADD COLUMN evil UInt8",
    "RENAME TABLE device_minutes TO evil",
    "OPTIMIZE TABLE device_minutes FINAL",
    "SET readonly = 0",
    "CREATE USER evil IDENTIFIED BY 'evil'",
    "GRANT ALL ON *.* TO analyst",
    "SELECT 1; DROP TABLE device_minutes",
    "INSERT INTO FUNCTION file('evil.csv', 'CSV', 'a UInt8') VALUES (1)",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')",
]


@pytest.mark.parametrize("statement", WRITES)
def test_analyst_cannot_write(ledger: ClickHouseSettings, statement: str) -> None:
    before = _snapshot(ledger)
    analyst = connect(ledger, analyst=True)
    try:
        with pytest.raises(ClickHouseError):
            analyst.command(statement)
        # Asking for readonly=0 in the request's settings changes nothing either.
        with pytest.raises(ClickHouseError):
            analyst.command(statement, settings={"readonly": "0"})
        # The analyst still reads (the refusals are about writing, not a dead connection).
        assert analyst.query("SELECT count() FROM device_minutes").result_rows[0][0] > 0
    finally:
        analyst.close()
    assert _snapshot(ledger) == before


def test_analyst_insert_api_and_session_settings_refused(ledger: ClickHouseSettings) -> None:
    before = _snapshot(ledger)
    analyst = connect(ledger, analyst=True)
    try:
        with pytest.raises(ClickHouseError):
            analyst.insert("rate_card", [["x"]], column_names=["generation"])
        with pytest.raises(ClickHouseError):
            analyst.query("SELECT 1", settings={"readonly": "0", "allow_ddl": "1"})
    finally:
        analyst.close()
    assert _snapshot(ledger) == before


# ------------------------------------------------------------------------------------------------
# SQL injection through CLI parameters


def _cli(ch: ClickHouseSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    env.update(cli_env(ch))
    return subprocess.run(
        [sys.executable, "-c", CLI, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )


def _one_line_error(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error:") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


INJECTIONS = [
    "x' OR 1=1 --",
    "x' OR '1'='1",
    f"{PROJECT}' OR project != '",
    "x'; DROP TABLE device_minutes; --",
    "x\\' OR 1=1 --",
    "' UNION SELECT * FROM system.users --",
    "{project:String}",
]


def _explain(ch: ClickHouseSettings, project: str) -> subprocess.CompletedProcess[str]:
    return _cli(ch, "report", "explain", "--project", project, "--period", PERIOD, "--format", "json")


def test_report_explain_binds_the_project(ledger: ClickHouseSettings) -> None:
    real = _explain(ledger, PROJECT)
    assert real.returncode == 0, real.stderr
    assert json.loads(real.stdout) and {r["project"] for r in json.loads(real.stdout)} == {PROJECT}
    before = _snapshot(ledger)
    unknown = _explain(ledger, "no-such-project")
    for attempt in INJECTIONS:
        proc = _explain(ledger, attempt)
        # The text is a project name and nothing more: it behaves exactly like any unknown project
        # (no rows, nothing on stdout but an empty result), and nothing was executed.
        assert (proc.returncode, proc.stdout) == (unknown.returncode, unknown.stdout), (attempt, proc.stderr)
        assert proc.stdout.strip() in ("", "[]"), attempt
        assert PROJECT not in proc.stdout and "system" not in proc.stdout
    assert _snapshot(ledger) == before


def test_report_explain_of_an_injection_is_an_empty_result(ledger: ClickHouseSettings) -> None:
    proc = _explain(ledger, "x' OR 1=1 --")
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stderr[-300:]
    alerts = _cli(ledger, "alerts", "--kind", "x' OR 1=1 --", "--format", "json")
    assert alerts.returncode == 0 and json.loads(alerts.stdout) == [], alerts.stderr[-300:]


@pytest.mark.parametrize(
    "args",
    [
        ("report", "chargeback", "--period", PERIOD, "--by", "team UNION SELECT name FROM system.tables --"),
        ("report", "chargeback", "--period", PERIOD, "--by", "team' OR 1=1 --"),
        ("report", "chargeback", "--period", "2026-11' OR '1'='1", "--by", "team"),
        ("report", "explain", "--project", PROJECT, "--period", "2026-11'; DROP TABLE device_minutes; --"),
        ("report", "journal", "--period", "2026-11 OR 1=1"),
        ("alerts", "--limit", "1; DROP TABLE alerts"),
        ("sql", "SELECT 1", "--format", "csv; DROP TABLE alerts"),
        ("sql", "SELECT {x:String}", "--param", "x"),
    ],
)
def test_bad_parameters_are_one_line_errors(ledger: ClickHouseSettings, args: tuple[str, ...]) -> None:
    before = _snapshot(ledger)
    _one_line_error(_cli(ledger, *args))
    assert _snapshot(ledger) == before


def test_report_by_choices_give_no_extra_lines(ledger: ClickHouseSettings) -> None:
    proc = _cli(ledger, "report", "chargeback", "--period", PERIOD, "--by", "project", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    lines = {row["line"] for row in json.loads(proc.stdout)}
    assert lines - {"TOTAL"} == set(EXPECTED["project"])


def test_alerts_kind_and_sql_params_are_bound(ledger: ClickHouseSettings) -> None:
    before = _snapshot(ledger)
    unknown = _cli(ledger, "alerts", "--kind", "NO_SUCH_KIND", "--format", "json")
    for attempt in INJECTIONS:
        proc = _cli(ledger, "alerts", "--kind", attempt, "--format", "json")  # same as any unknown kind
        assert (proc.returncode, proc.stdout) == (unknown.returncode, unknown.stdout), (attempt, proc.stderr)
        assert proc.stdout.strip() in ("", "[]"), attempt
        query = "SELECT job_id FROM device_minutes WHERE project = {p:String}"
        proc = _cli(ledger, "sql", query, "--param", f"p={attempt}", "--format", "json")
        assert proc.returncode == 0 and proc.stdout == "", (attempt, proc.stdout, proc.stderr)
        # An identifier parameter is quoted as one identifier: no such table, one line, nothing run.
        proc = _cli(ledger, "sql", "SELECT count() FROM {t:Identifier}", "--param", f"t={attempt}")
        _one_line_error(proc)
    real = _cli(ledger, "sql", "SELECT count() FROM device_minutes WHERE project = {p:String}", "--param",
                f"p={PROJECT}", "--format", "csv")  # fmt: skip
    assert real.returncode == 0 and int(real.stdout.splitlines()[1]) > 0, real.stdout + real.stderr
    # `--database` is looked up as a bound identifier: a made-up one is simply not used.
    proc = _cli(ledger, "sql", "SELECT 1", "--database", "x`; DROP TABLE device_minutes; --", "--format", "csv")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1] == "1", proc.stdout + proc.stderr
    assert _snapshot(ledger) == before
