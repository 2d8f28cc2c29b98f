"""The polling loop end to end: replayed real outputs through fake squeue/scontrol/sacct on PATH."""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from fixtures_events import ListSink

from producers.devicemap import InMemoryDeviceMap
from producers.jobevents import EventContext
from producers.slurm import parse_capture
from producers.slurm_poller import PollConfig, PollState, SlurmCommands, SlurmPoller, step
from schemas.topics import JOB_EVENTS

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
RUNNING = FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json"
MULTI = FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-multi-nodes.json"
DB_RUNNING = FIX / "slurmrestd-json/24.05_0.0.41_slurmdb-job-gpus-running.json"
SACCT_2311 = FIX / "sacct-json/mila-iqia-SARC_slurm_23_11_5.json"
SCONTROL = FIX / "scontrol-text/irush-cs_slurm-scripts_t_get_jobs.t.scontrol-show-job-d.txt"

FAKE_TOOL = """#!{python}
import os, sys
tool = os.path.basename(sys.argv[0])
d = os.environ["FAKE_SLURM_DIR"]
with open(os.path.join(d, "calls.log"), "a") as log:
    log.write(" ".join([tool] + sys.argv[1:]) + "\\n")
step = open(os.path.join(d, "step")).read().strip()
name = f"{{tool}}-{{step}}.out"
if tool == "scontrol" and len(sys.argv) > 4:
    name = f"scontrol-{{sys.argv[4]}}.out"
path = os.path.join(d, name)
if not os.path.exists(path):
    sys.stderr.write("slurm_load_jobs error: Invalid job id specified\\n")
    sys.exit(1)
sys.stdout.write(open(path).read())
"""


@pytest.fixture()
def fake_slurm(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("squeue", "sacct", "scontrol"):
        p = bindir / tool
        p.write_text(FAKE_TOOL.format(python=sys.executable))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(data))
    return data


def _sacct_doc(*jobs: dict) -> str:
    """The real 23.11 sacct document, with its job list replaced."""
    doc = json.loads(SACCT_2311.read_text())
    doc["jobs"] = list(jobs)
    return json.dumps(doc)


def _db_job(job_id: int, state: str, start: int, end: int, gpus: int) -> dict:
    """The real slurmdbd record of job 9, as accounting shows it once the job has run (AccountingStorageTRES
    includes gres/gpu, as on the SARC clusters)."""
    rec = copy.deepcopy(json.loads(DB_RUNNING.read_text())["jobs"][0])
    rec["job_id"] = job_id
    rec["state"]["current"] = [state]
    rec["time"].update(start=start, end=end, elapsed=end - start)
    rec["tres"]["allocated"] = [{"type": "gres", "name": "gpu", "id": 1001, "count": gpus}]
    return rec


def _ctx() -> EventContext:
    devmap = InMemoryDeviceMap()
    for i in range(4):
        devmap.set("hpc", "gpu1", i, f"GPU-gpu1-{i}")
    return EventContext("hpc", devices=devmap)


def test_poll_loop_with_job_that_starts_and_ends_between_polls(fake_slurm):
    t0 = 1762529660000
    clock = iter([t0, t0 + 60_000, t0 + 120_000])
    (fake_slurm / "squeue-0.out").write_text(RUNNING.read_text())
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc())
    # poll 1: job 9 has left squeue; job 11 runs; sacct knows 9 ended and 10 ran entirely between the polls
    (fake_slurm / "squeue-1.out").write_text(MULTI.read_text())
    (fake_slurm / "sacct-1.out").write_text(
        _sacct_doc(
            _db_job(9, "COMPLETED", 1762529652, 1762529712, 4),
            _db_job(10, "FAILED", 1762529690, 1762529700, 2),
        )
    )
    # poll 2: job 11 is listed as completed (MinJobAge); sacct repeats itself: nothing is emitted twice
    done = json.loads(MULTI.read_text())
    done["jobs"][0]["job_state"] = ["COMPLETED"]
    done["jobs"][0]["end_time"]["number"] = 1762529770
    (fake_slurm / "squeue-2.out").write_text(json.dumps(done))
    (fake_slurm / "sacct-2.out").write_text((fake_slurm / "sacct-1.out").read_text())

    sink = ListSink()
    poller = SlurmPoller(_ctx(), sink, clock=lambda: next(clock))
    got = []
    for step_no in range(3):
        (fake_slurm / "step").write_text(str(step_no))
        got.append([(e["job_id"], e["event_type"], e["ts_ms"]) for e in poller.poll_once()])

    assert got[0] == [("9", "STARTED", 1762529652000)]
    assert sorted(got[1]) == sorted(
        [
            ("11", "STARTED", 1762529688000),
            ("9", "ENDED", 1762529712000),
            ("10", "STARTED", 1762529690000),
            ("10", "ENDED", 1762529700000),
        ]
    )
    assert got[2] == [("11", "ENDED", 1762529770000)]

    events = {(r["job_id"], r["event_type"]): r for _, _, r in sink.records}
    started9 = events[("9", "STARTED")]
    devices = [{"index": i, "uuid": f"GPU-gpu1-{i}", "mig_instance_id": None, "mig_profile": None} for i in range(4)]
    assert started9["allocations"] == [{"node": "gpu1", "devices": devices}]
    assert started9["identity"]["user"] == "dperez" and started9["gang_size"] == 4
    ended9 = events[("9", "ENDED")]
    assert (ended9["exit_state"], ended9["end_ts_ms"], ended9["start_ts_ms"]) == (
        "COMPLETED", 1762529712000, 1762529652000)
    assert events[("10", "ENDED")]["exit_state"] == "FAILED"
    assert [a["node"] for a in events[("11", "STARTED")]["allocations"]] == ["gpu1", "gpu2"]
    assert all(topic == JOB_EVENTS.name for topic, _, _ in sink.records)
    assert sink.records[0][1] == b"hpc/9"
    calls = (fake_slurm / "calls.log").read_text().splitlines()
    assert calls[0] == "squeue --json"
    assert calls[1].startswith("sacct --json -X --allusers -S now-")


def test_restarted_poller_emits_the_same_event_ids(fake_slurm):
    (fake_slurm / "step").write_text("0")
    (fake_slurm / "squeue-0.out").write_text(MULTI.read_text())
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc())
    a = SlurmPoller(_ctx(), ListSink(), clock=lambda: 1762529700000).poll_once()
    b = SlurmPoller(_ctx(), ListSink(), clock=lambda: 1762529760000).poll_once()
    assert [e["event_id"] for e in a] == [e["event_id"] for e in b]


def test_indices_from_scontrol_when_the_listing_lacks_gres_detail(fake_slurm):
    doc = json.loads(RUNNING.read_text())
    del doc["jobs"][0]["gres_detail"]
    (fake_slurm / "step").write_text("0")
    (fake_slurm / "squeue-0.out").write_text(json.dumps(doc))
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc())
    # the real new-style scontrol record, renamed to this job and node
    block = SCONTROL.read_text().strip().split("\n\n")[-1]
    (fake_slurm / "scontrol-9.out").write_text(block.replace("JobId=25687666", "JobId=9").replace("node-001", "gpu1"))
    (ev,) = SlurmPoller(_ctx(), ListSink(), clock=lambda: 1762529700000).poll_once()
    dev = {"index": 1, "uuid": "GPU-gpu1-1", "mig_instance_id": None, "mig_profile": None}
    assert ev["allocations"] == [{"node": "gpu1", "devices": [dev]}]
    assert "scontrol show job -d 9" in (fake_slurm / "calls.log").read_text()


def test_scontrol_listing_then_job_vanishes_and_sacct_closes_it(fake_slurm):
    text = SCONTROL.read_text()
    (fake_slurm / "squeue-0.out").write_text(text)
    blocks = [b for b in text.split("\n\n") if not b.startswith("JobId=153291")]
    (fake_slurm / "squeue-1.out").write_text("\n\n".join(blocks))
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc())
    gone = _db_job(153291, "TIMEOUT", 1549555509, 1550160309, 4)
    (fake_slurm / "sacct-1.out").write_text(_sacct_doc(gone))
    clock = iter([1549560000000, 1549600000000])
    poller = SlurmPoller(EventContext("irush"), ListSink(), commands=SlurmCommands(listing=("squeue",)),
                         clock=lambda: next(clock))
    (fake_slurm / "step").write_text("0")
    first = {(e["job_id"], e["event_type"]) for e in poller.poll_once()}
    assert first == {("153291", "STARTED"), ("2423430_72", "STARTED"), ("25686416", "STARTED"),
                     ("25687666", "STARTED")}  # GPU jobs only
    (fake_slurm / "step").write_text("1")
    (ev,) = poller.poll_once()
    assert (ev["job_id"], ev["event_type"], ev["ts_ms"], ev["exit_state"]) == (
        "153291", "ENDED", 1550160309000, "TIMEOUT")


def test_lost_job_is_closed_at_last_seen_time():
    ctx = EventContext("hpc")
    running = parse_capture(RUNNING.read_text()).jobs
    state = PollState()
    step(state, running, [], 1000, ctx)
    assert step(state, [], [], 2000, ctx, PollConfig(lost_after_ms=10_000)) == []
    (ev,) = step(state, [], [], 12_000, ctx, PollConfig(lost_after_ms=10_000))
    assert (ev["event_type"], ev["ts_ms"], ev["exit_state"]) == ("ENDED", 1000, "UNKNOWN")


def test_suspend_resume_requeue_transitions():
    from dataclasses import replace

    ctx = EventContext("hpc")
    (job,) = parse_capture(RUNNING.read_text()).jobs
    state = PollState()
    seq = [
        (replace(job, state="SUSPENDED", suspend_ms=1762529700000), "SUSPENDED"),
        (replace(job, state="RUNNING", suspend_ms=1762529800000), "RESUMED"),
        (replace(job, state="PENDING", start_ms=None), "REQUEUED"),
        (replace(job, start_ms=1762529900000), "STARTED"),
    ]
    step(state, [job], [], 1762529660000, ctx)
    for i, (cur, expected) in enumerate(seq):
        evs = step(state, [cur], [], 1762529700000 + i * 100_000, ctx)
        assert [e["event_type"] for e in evs] == [expected]


def test_a_requeue_seen_through_completing_and_requeued_ends_the_run_and_starts_the_next():
    """Slurm shows a requeued running job as COMPLETING, then REQUEUED, then PENDING (found by the two-engine live
    test: the run was never ended and the next never started); the run ends at Slurm's end time, not the poll's."""
    from dataclasses import replace

    ctx = EventContext("hpc")
    (job,) = parse_capture(RUNNING.read_text()).jobs
    assert job.start_ms is not None
    end = job.start_ms + 30_000
    state = PollState()
    step(state, [job], [], job.start_ms + 1_000, ctx)
    seq = [
        (replace(job, state="COMPLETING"), []),
        (replace(job, state="REQUEUED", end_ms=end), [("REQUEUED", end)]),
        (replace(job, state="PENDING", start_ms=None, end_ms=None), []),
        (replace(job, start_ms=end + 60_000), [("STARTED", end + 60_000)]),
    ]
    for i, (cur, expected) in enumerate(seq):
        evs = step(state, [cur], [], end + 10_000 + i * 60_000, ctx)
        assert [(e["event_type"], e["ts_ms"]) for e in evs] == expected, i


def test_a_completing_job_that_completes_ends_once_and_a_requeue_hold_is_a_requeue():
    from dataclasses import replace

    ctx = EventContext("hpc")
    (job,) = parse_capture(RUNNING.read_text()).jobs
    assert job.start_ms is not None
    state = PollState()
    step(state, [job], [], job.start_ms + 1_000, ctx)
    assert step(state, [replace(job, state="COMPLETING")], [], job.start_ms + 2_000, ctx) == []
    done = replace(job, state="COMPLETED", end_ms=job.start_ms + 1_500)
    assert [e["event_type"] for e in step(state, [done], [], job.start_ms + 3_000, ctx)] == ["ENDED"]
    other = replace(job, job_id=job.job_id + "9")
    held = PollState()
    step(held, [other], [], job.start_ms + 1_000, ctx)
    evs = step(held, [replace(other, state="REQUEUE_HOLD", end_ms=None)], [], job.start_ms + 5_000, ctx)
    assert [(e["event_type"], e["ts_ms"]) for e in evs] == [("REQUEUED", job.start_ms + 5_000)]


def test_a_requeue_ends_the_run_when_the_listing_showed_it_completing():
    """Found by the two-engine live test (ledger 1 GPU-s over sacct's for the QOS-preempted job, at load 17-26):
    back in the queue a job's listed end is a projection (not kept), so the requeue was stamped with the poll's time.
    The end Slurm printed while the run was completing (or requeued) is real and is kept: the requeue ends there,
    also when the job ran again before the next poll."""
    from dataclasses import replace

    from producers.slurm import parse_ctld_job

    rec = json.loads(RUNNING.read_text())["jobs"][0]
    start_s, end_s = rec["start_time"]["number"], rec["end_time"]["number"]
    assert parse_ctld_job(rec).end_ms is None  # running: the projected end
    for state in ("COMPLETING", "REQUEUED"):
        assert parse_ctld_job({**rec, "job_state": [state]}).end_ms == end_s * 1000
    assert parse_ctld_job({**rec, "job_state": ["PENDING"]}).end_ms is None

    ctx = EventContext("hpc")
    (job,) = parse_capture(RUNNING.read_text()).jobs
    end = end_s * 1000
    completing = replace(job, state="COMPLETING", end_ms=end)
    pending = replace(job, state="PENDING", start_ms=None, end_ms=None)
    state = PollState()
    step(state, [job], [], start_s * 1000 + 1_000, ctx)
    assert step(state, [completing], [], end + 400, ctx) == []
    evs = step(state, [pending], [], end + 2_300, ctx)
    assert [(e["event_type"], e["ts_ms"]) for e in evs] == [("REQUEUED", end)]

    state = PollState()
    step(state, [job], [], start_s * 1000 + 1_000, ctx)
    step(state, [completing], [], end + 400, ctx)
    again = replace(job, start_ms=end + 4_000)
    evs = step(state, [again], [], end + 5_000, ctx)
    assert [(e["event_type"], e["ts_ms"]) for e in evs] == [("REQUEUED", end), ("STARTED", end + 4_000)]
    assert [(e["event_type"], e["ts_ms"]) for e in step(PollState(), [job], [], end, ctx)] == [
        ("STARTED", start_s * 1000)
    ]
    state = PollState()  # not seen completing: the poll's time, and the new start, as before
    step(state, [job], [], start_s * 1000 + 1_000, ctx)
    evs = step(state, [pending], [], end + 2_300, ctx)
    assert [(e["event_type"], e["ts_ms"]) for e in evs] == [("REQUEUED", end + 2_300)]


def test_poll_command_once_dry_run_with_registry(fake_slurm, tmp_path, monkeypatch):
    import typer
    from typer.testing import CliRunner

    from producers import scheduler_cli

    (fake_slurm / "step").write_text("0")
    (fake_slurm / "squeue-0.out").write_text(RUNNING.read_text())
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc())
    reg = tmp_path / "projects.yaml"
    reg.write_text("projects:\n  - id: acoustic\n    cost_centre: CC-42\n")
    directory = tmp_path / "directory.yaml"
    directory.write_text("users:\n  dperez:\n    teams: [sound]\n    groups: [hpc]\n")
    monkeypatch.setenv("GPULEDGER_SCHEDULER", json.dumps({
        "registry": str(reg), "directory": str(directory), "project_from": ["wckey", "account"]}))
    monkeypatch.setenv("GPULEDGER_CLUSTER", "hpc")
    monkeypatch.chdir(tmp_path)
    app, inspect_app = typer.Typer(), typer.Typer()
    scheduler_cli.register(app, inspect_app)
    res = CliRunner().invoke(app, ["slurm", "poll", "--once", "--dry-run"])
    assert res.exit_code == 0, res.output
    (ev,) = [json.loads(line) for line in res.output.splitlines()]
    assert (ev["job_id"], ev["cluster"], ev["project"], ev["project_source"], ev["project_validation"]) == (
        "9", "hpc", "acoustic", "EXPLICIT", "VALID")
    assert ev["identity"]["teams"] == ["sound"] and ev["identity"]["cost_centre"] == "CC-42"


def test_restart_reaches_back_to_the_last_poll(fake_slurm, tmp_path):
    """A job that ran entirely while the poller was down is recorded after restart, from sacct."""
    state = tmp_path / "state" / "slurm-poller.json"
    (fake_slurm / "step").write_text("0")
    empty_listing = json.loads(RUNNING.read_text())
    empty_listing["jobs"] = []
    (fake_slurm / "squeue-0.out").write_text(json.dumps(empty_listing))
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc())
    first = SlurmPoller(_ctx(), ListSink(), clock=lambda: 1762520000000, state_path=state)
    first.run(0, stop=iter([False, True]).__next__)
    assert json.loads(state.read_text()) == {"last_poll_ms": 1762520000000}
    # two hours later: job 12 ran and ended in between
    (fake_slurm / "sacct-0.out").write_text(_sacct_doc(_db_job(12, "COMPLETED", 1762522000, 1762523000, 4)))
    second = SlurmPoller(_ctx(), ListSink(), clock=lambda: 1762527200000, state_path=state)
    events = second.poll_once()
    assert [(e["job_id"], e["event_type"]) for e in events] == [("12", "STARTED"), ("12", "ENDED")]
    sacct_call = (fake_slurm / "calls.log").read_text().splitlines()[-1]
    assert "-S now-7500seconds" in sacct_call  # 7,200 s since the last poll + 300 s overlap


def test_poll_through_slurmrestd(tmp_path):
    """The same cycle against a loopback slurmrestd serving the captured 24.05 responses."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from producers.slurm_poller import SlurmRestRunner

    seen = []
    bodies = {
        "/slurm/v0.0.41/jobs": RUNNING.read_text(),
        "/slurmdb/v0.0.41/jobs": _sacct_doc(_db_job(10, "COMPLETED", 1762529600, 1762529640, 2)),
    }

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            url = urlparse(self.path)
            seen.append((url.path, parse_qs(url.query), self.headers.get("X-SLURM-USER-TOKEN")))
            body = bodies.get(url.path)
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write((body or "{}").encode())

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        commands = SlurmCommands((f"{base}/slurm/v0.0.41/jobs",), (), (f"{base}/slurmdb/v0.0.41/jobs",))
        clock = lambda: 1762529700000  # noqa: E731
        runner = SlurmRestRunner("gpuledger", "jwt-token", clock=clock)
        events = SlurmPoller(_ctx(), ListSink(), commands=commands, runner=runner, clock=clock).poll_once()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert sorted((e["job_id"], e["event_type"]) for e in events) == [
        ("10", "ENDED"), ("10", "STARTED"), ("9", "STARTED")]
    assert [p for p, _, _ in seen] == ["/slurm/v0.0.41/jobs", "/slurmdb/v0.0.41/jobs"]
    assert seen[1][1] == {"start_time": [str(1762529700 - 3900)]} and seen[0][2] == "jwt-token"
