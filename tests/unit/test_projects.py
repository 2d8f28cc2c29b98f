"""Project registry, attribution (grace/strict), identity snapshot, audited corrections."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from base.errors import ParseError
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
        # A non-member's explicit project is a claim: never charged, in either mode.
        ("strict", "mallory", "atlas", (), (None, "MISSING", "NOT_A_MEMBER", None)),
        ("grace", "mallory", "atlas", (), (None, "MISSING", "NOT_A_MEMBER", None)),
        ("grace", "carol", "atlas", (), ("open-science", "DEFAULT", "VALID", None)),
        ("strict", "carol", "atlas", (), ("open-science", "DEFAULT", "VALID", None)),
        ("grace", "carol", "vision", ("nlp-team",), ("open-science", "DEFAULT", "VALID", None)),
    ],
)
def test_attribution_modes(mode, user, explicit, teams, expected):
    a = Attributor(REG, ProjectRule(mode=mode)).resolve(user, explicit, frozenset(teams))
    assert (a.project, a.source, a.validation, a.cost_centre) == expected
    claims = {("mallory", "atlas"), ("carol", "atlas"), ("carol", "vision")}  # real projects, not a member
    assert a.claimed == (explicit if (user, explicit) in claims else None)


def test_a_claimed_project_is_recorded_charged_to_the_default_and_never_exempt():
    """Worked example. carol (default open-science) submits with `project=atlas` (members alice, bob);
    atlas is exempt from reclaim. The job event keeps atlas as the claim, charges open-science, and the
    idle state machine warns then reclaims the job as it would any open-science job."""
    from base.processor_settings import Exemption, IdlePolicy
    from processors.attribution import JobInfo
    from processors.idle import new_state, step
    from processors.testing import T0
    from producers.jobevents import EventContext, HeldDevices, job_event

    ctx = EventContext(cluster="hpc", attributor=Attributor(REG, ProjectRule(mode="grace")))
    attribution = ctx.attributor.resolve_slurm("carol", None, "project=atlas", None)
    ev = job_event(ctx, event_type="STARTED", ts_ms=T0, scheduler="SLURM", job_id="77", user="carol",
                   attribution=attribution, held=[HeldDevices("n1", 1, (0,))])  # fmt: skip
    codec = AvroCodec()
    decoded = codec.decode(codec.encode("sched.job-events", ev)).record
    charged = (decoded["project"], decoded["project_source"], decoded["project_validation"])
    assert charged == ("open-science", "DEFAULT", "VALID") and decoded["project_claimed"] == "atlas"
    info = JobInfo.from_event(decoded)
    assert info.project == "open-science"

    exempt_atlas = Exemption(kind="project", value="atlas", reason="atlas deadline")
    policy = IdlePolicy(idle_after_min_batch=2, grace_min=1, exemptions=(exempt_atlas,))
    state, kinds = new_state(info, ("GPU-0",)), []
    for minute in range(3):
        jm = {"minute_start_ms": T0 + minute * 60_000, "active_s": 0, "starved_s": 0, "idle_s": 60, "dark_s": 0,
              "allocated_s": 60, "device_count": 1, "generation": "hopper"}  # fmt: skip
        state, outs = step(state, jm, policy)
        kinds += [o.record.get("kind") or o.kind for o in outs]
    assert "IDLE_WARNING" in kinds and "action" in kinds  # the claimed project's exemption did not apply
    # The same job charged to atlas by a member would have been exempt: the exemption itself works.
    member = JobInfo(cluster="hpc", job_id="78", user="alice", project="atlas")
    state, outs = new_state(member, ("GPU-1",)), []
    for minute in range(3):
        jm = {"minute_start_ms": T0 + minute * 60_000, "active_s": 0, "starved_s": 0, "idle_s": 60, "dark_s": 0,
              "allocated_s": 60, "device_count": 1, "generation": "hopper"}  # fmt: skip
        state, o = step(state, jm, policy)
        outs += o
    assert outs == []


def test_a_claim_recorded_before_the_rule_charges_no_project():
    """A v2 record from strict mode kept the non-member's project in `project` (EXPLICIT, NOT_A_MEMBER):
    it decodes with no `project_claimed` and charges no project, so it cannot earn atlas's exemption."""
    import io

    import fastavro
    from contract_records import job_event as contract_event

    from processors.attribution import JobInfo, charged_project
    from schemas import load_schema
    from schemas.codec import _strip_logical_types, crc64_fingerprint

    old = contract_event("STARTED", 1_000, user="mallory", project="atlas", project_validation="NOT_A_MEMBER")
    v2 = fastavro.parse_schema(_strip_logical_types(load_schema("sched.job-events", 2)))
    buf = io.BytesIO(b"\xc3\x01" + crc64_fingerprint(v2))
    buf.seek(0, io.SEEK_END)
    fastavro.schemaless_writer(buf, v2, old)
    decoded = AvroCodec().decode(buf.getvalue(), expected_subject="sched.job-events").record
    assert decoded["project_claimed"] is None and decoded["project"] == "atlas"
    assert charged_project(decoded) is None and JobInfo.from_event(decoded).project is None


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
