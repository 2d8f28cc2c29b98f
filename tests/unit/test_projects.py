"""Project registry, attribution (grace/strict), identity snapshot, audited corrections."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from gpuledger.errors import ParseError
from producers.identity import DirectoryEntry, FileDirectory, StaticDirectory, snapshot
from producers.projects import Attributor, ProjectRule, load_registry, parse_comment_pairs, registry_from_data
from schemas.codec import AvroCodec

YAML_REGISTRY = """
projects:
  - id: atlas
    cost_centre: CC-100
    members: [alice, bob]
  - id: vision
    cost_centre: CC-200
    teams: [cv-team]
  - id: open-science
defaults:
  alice: atlas
  carol: open-science
"""

CSV_REGISTRY = """project,cost_centre,description,members,teams,default_for,active
atlas,CC-100,Atlas detector,alice bob,,alice,true
vision,CC-200,,,cv-team,,true
old,CC-9,,,,,false
"""


def test_yaml_and_csv_registries(tmp_path):
    y = tmp_path / "projects.yaml"
    y.write_text(YAML_REGISTRY)
    c = tmp_path / "projects.csv"
    c.write_text(CSV_REGISTRY)
    ry, rc = load_registry(y), load_registry(c)
    assert ry.get("atlas").cost_centre == rc.get("atlas").cost_centre == "CC-100"
    assert ry.default_for("alice") == rc.default_for("alice") == "atlas"
    assert rc.get("old") is None and rc.active_ids() == ["atlas", "vision"]


def test_registry_errors_name_the_problem():
    with pytest.raises(ParseError, match="not in the registry"):
        registry_from_data({"projects": [{"id": "a"}], "defaults": {"u": "b"}})
    with pytest.raises(ParseError, match="invalid project id"):
        registry_from_data({"projects": [{"id": "bad id;"}]})
    with pytest.raises(ParseError, match="defined twice"):
        registry_from_data({"projects": [{"id": "a"}, {"id": "a"}]})


REG = registry_from_data(__import__("yaml").safe_load(YAML_REGISTRY))


@pytest.mark.parametrize(
    "mode,user,explicit,teams,expected",
    [
        ("grace", "alice", "atlas", (), ("atlas", "EXPLICIT", "VALID", "CC-100")),
        ("grace", "alice", None, (), ("atlas", "DEFAULT", "VALID", "CC-100")),
        ("grace", "alice", "nope", (), ("atlas", "DEFAULT", "VALID", "CC-100")),
        ("grace", "dave", None, (), (None, "MISSING", "NOT_CHECKED", None)),
        ("grace", "dave", "nope", (), ("nope", "EXPLICIT", "UNKNOWN_PROJECT", None)),
        ("grace", "dave", "vision", ("cv-team",), ("vision", "EXPLICIT", "VALID", "CC-200")),
        ("strict", "alice", None, (), (None, "MISSING", "NOT_CHECKED", None)),
        ("strict", "alice", "nope", (), ("nope", "EXPLICIT", "UNKNOWN_PROJECT", None)),
        ("strict", "mallory", "atlas", (), ("atlas", "EXPLICIT", "NOT_A_MEMBER", "CC-100")),
    ],
)
def test_attribution_modes(mode, user, explicit, teams, expected):
    a = Attributor(REG, ProjectRule(mode=mode)).resolve(user, explicit, frozenset(teams))
    assert (a.project, a.source, a.validation, a.cost_centre) == expected


def test_project_places_on_a_slurm_job():
    rule = ProjectRule(slurm_from=("comment:project", "wckey", "account"), account_map={"phys-gpu": "atlas"})
    assert rule.slurm_project("w", "project=vision,checkpoint=yes", "x") == "vision"
    assert rule.slurm_project("w", None, "x") == "w"
    assert rule.slurm_project(None, "", "phys-gpu") == "atlas"
    assert parse_comment_pairs("project:atlas; owner=bob") == {"project": "atlas", "owner": "bob"}
    with pytest.raises(Exception, match="wckey, account or comment"):
        ProjectRule(slurm_from=("partition",))


def test_identity_snapshot_from_file(tmp_path):
    d = tmp_path / "directory.yaml"
    d.write_text("users:\n  alice:\n    teams: [physics]\n    groups: [hpc-users]\n    cost_centre: CC-7\n")
    src = FileDirectory(d)
    snap = snapshot(src, "alice", 1000, project_cost_centre=None)
    assert snap == {"user": "alice", "teams": ["physics"], "groups": ["hpc-users"], "cost_centre": "CC-7",
                    "snapshot_ts_ms": 1000, "projects": [], "primary_team": "physics"}
    assert snapshot(src, "alice", 1, projects=REG.projects_of)["projects"] == ["atlas"]
    assert snapshot(src, "alice", 1000, "CC-100")["cost_centre"] == "CC-100"  # project's centre wins
    # a reorganisation changes the file: later snapshots change, the one already taken does not
    d.write_text("users:\n  alice:\n    teams: [chemistry]\n")
    import os
    os.utime(d, (2_000_000_000, 2_000_000_000))
    assert snapshot(src, "alice", 2000)["teams"] == ["chemistry"] and snap["teams"] == ["physics"]
    assert snapshot(StaticDirectory({"b": DirectoryEntry("b")}), "nobody", 1)["teams"] == []


def _cli_app():
    from producers import scheduler_cli

    app, inspect_app = typer.Typer(), typer.Typer()
    app.add_typer(inspect_app, name="inspect")
    scheduler_cli.register(app, inspect_app)
    return app


def test_attribution_correct_dry_run_is_a_valid_audited_record(tmp_path, monkeypatch):
    reg = tmp_path / "projects.yaml"
    reg.write_text(YAML_REGISTRY)
    monkeypatch.setenv("GPULEDGER_EXTRA", json.dumps({"scheduler": {"registry": str(reg)}}))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(_cli_app(), ["attribution", "correct", "1234_7", "--project", "vision", "--reason",
                                     "wrong wckey", "--old-project", "atlas", "--by", "admin", "--cluster", "hpc",
                                     "--dry-run"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    assert (rec["job_id"], rec["old_project"], rec["new_project"], rec["corrected_by"], rec["cluster"]) == (
        "1234_7", "atlas", "vision", "admin", "hpc")
    AvroCodec().encode("attribution.corrections", rec)
    res = runner.invoke(_cli_app(), ["attribution", "correct", "1", "--project", "nope", "--reason", "x",
                                     "--dry-run"])
    assert res.exit_code != 0 and "not in the registry" in str(res.exception)


def test_registry_from_an_http_source():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body, ctype = (CSV_REGISTRY, "text/csv") if self.path.startswith("/export") else (YAML_REGISTRY,
                                                                                              "application/yaml")
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.end_headers()
            self.wfile.write(body.encode())

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        assert load_registry(f"{base}/projects.yaml").default_for("carol") == "open-science"
        assert load_registry(f"{base}/export?format=csv").active_ids() == ["atlas", "vision"]
    finally:
        httpd.shutdown()
        httpd.server_close()
