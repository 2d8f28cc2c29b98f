"""`gpuledger inspect slurm FILE` on every captured format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from producers import scheduler_cli

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def _app():
    app, inspect_app = typer.Typer(), typer.Typer()
    app.add_typer(inspect_app, name="inspect")
    scheduler_cli.register(app, inspect_app)
    return app


@pytest.mark.parametrize("rel,expected", [
    ("slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json", [("9", "STARTED")]),
    ("sacct-json/mila-iqia-SARC_slurm_21_8_8.json", [("55978384", "STARTED"), ("55978384", "REQUEUED")]),
    ("scontrol-text/irush-cs_slurm-scripts_t_get_jobs.t.scontrol-show-job-d.txt",
     [("153291", "STARTED"), ("2423430_72", "STARTED"), ("25686416", "STARTED"), ("25687666", "STARTED")]),
])
def test_inspect_json(rel, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(_app(), ["inspect", "slurm", str(FIX / rel), "--json", "--gpu-only", "--cluster", "c"])
    assert res.exit_code == 0, res.output
    events = [json.loads(line) for line in res.output.splitlines()]
    assert [(e["job_id"], e["event_type"]) for e in events] == expected


def test_inspect_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(_app(), ["inspect", "slurm", str(FIX / "scontrol-text" /
                                      "irush-cs_slurm-scripts_t_get_nodes.t.scontrol-show-node.txt")])
    assert res.exit_code == 0, res.output
    assert "cortex-01" in res.output and "0 jobs, 0 events" in res.output
