"""The uid beside every Slurm user name (issue 38 item 2): each source that prints it (squeue --json and
slurmrestd's slurmctld records `user_id`, `scontrol show job -d` `UserId=name(uid)`, jobcomp/kafka `user_id`,
the prolog/epilog's SLURM_JOB_UID) puts it into the event's `user_uid` with `user_source` SCHEDULER; where
the source has none (sacct --json, slurmdbd) `user_uid` is null. Real outputs from tests/fixtures/slurm."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fixtures_events import ListSink
from test_slurm_hooks import JOBCOMP_2311, PROLOG_ENV, _spool

from producers.jobevents import EventContext
from producers.slurm import MAX_UID, parse_capture, parse_ctld_job, uid_text
from producers.slurm_events import lifecycle_events, slurm_event
from producers.slurm_jobcomp import jobcomp_events, parse_jobcomp
from producers.slurm_poller import PollState, step
from producers.slurm_spool import drain
from schemas.codec import AvroCodec
from schemas.topics import JOB_EVENTS

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
CTX = EventContext("hpc")


def users(rel: str) -> dict[str, tuple[str, str | None]]:
    return {j.job_id: (j.user, j.user_uid) for j in parse_capture((FIX / rel).read_text()).jobs}


def test_scontrol_text_gives_the_uid_in_parentheses() -> None:
    got = users("scontrol-text/irush-cs_slurm-scripts_t_get_jobs.t.scontrol-show-job-d.txt")
    assert set(got.values()) == {("user1", "100"), ("user2", "200"), ("user3", "300"), ("user4", "400"),
                                 ("user5", "500"), ("user6", "600")}  # fmt: skip


@pytest.mark.parametrize(("rel", "expected"), [
    ("slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json", {("dperez", "10006")}),
    ("slurmrestd-json/24.05_0.0.41_slurm-job-gpus-multi-nodes.json", {("jthomas", "10005")}),
    ("live-22.05/squeue-notres-completed.json", {("root", "0")}),  # uid 0 is a uid, not "unknown"
    ("live-22.05/squeue-noacct-pending.json", {("root", "0")}),
])  # fmt: skip
def test_slurmctld_json_gives_user_id(rel: str, expected: set[tuple[str, str]]) -> None:
    assert set(users(rel).values()) == expected


@pytest.mark.parametrize("rel", [
    "sacct-json/mila-iqia-SARC_slurm_21_8_8.json",
    "sacct-json/mila-iqia-SARC_slurm_23_11_5.json",
    "slurmrestd-json/24.05_0.0.41_slurmdb-job-gpus-running.json",
    "live-22.05/sacct-notres-completed.json",
])  # fmt: skip
def test_slurmdbd_json_has_no_uid_and_the_event_says_so(rel: str) -> None:
    cap = parse_capture((FIX / rel).read_text())
    assert cap.jobs and all(j.user_uid is None and j.user != "unknown" for j in cap.jobs)
    codec = AvroCodec()
    for job in cap.jobs:
        for ev in lifecycle_events(job, CTX):
            assert (ev["user_uid"], ev["user_source"]) == (None, "SCHEDULER")
            codec.encode(JOB_EVENTS.subject, ev)  # the contract takes it


def test_events_carry_uid_and_scheduler_source_through_the_contract() -> None:
    (job,) = parse_capture((FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json").read_text()).jobs
    events = lifecycle_events(job, CTX)
    assert events and all((e["user"], e["user_uid"], e["user_source"]) == ("dperez", "10006", "SCHEDULER")
                          for e in events)  # fmt: skip
    codec = AvroCodec()
    for ev in events:
        assert codec.decode(codec.encode(JOB_EVENTS.subject, ev), JOB_EVENTS.subject).record["user_uid"] == "10006"


def test_the_poller_keeps_the_listed_uid_when_sacct_closes_the_job() -> None:
    """A job seen running by squeue (uid printed) that ends between polls is closed from sacct (no uid): the
    ENDED event still has the uid squeue printed for the same user."""
    doc = json.loads((FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json").read_text())
    (listed,) = parse_capture(json.dumps(doc)).jobs
    ended = replace(listed, state="COMPLETED", end_ms=(listed.start_ms or 0) + 60_000, user_uid=None,
                    source="sacct-json")  # fmt: skip
    state = PollState()
    first = step(state, [listed], [], 1, CTX)
    closed = step(state, [], [ended], 2, CTX)
    assert [e["event_type"] for e in first] == ["STARTED"] and [e["event_type"] for e in closed] == ["ENDED"]
    assert first[0]["user_uid"] == closed[0]["user_uid"] == "10006"
    other = replace(ended, user="mallory")  # another name: the listed uid is not borrowed
    state = PollState()
    step(state, [listed], [], 1, CTX)
    assert step(state, [], [other], 2, CTX)[0]["user_uid"] is None


def test_jobcomp_user_id_and_the_hooks_slurm_job_uid(tmp_path: Path) -> None:
    job = parse_jobcomp(JOBCOMP_2311)
    assert (job.user, job.user_uid) == ("dperez", "10004")
    assert {(e["user_uid"], e["user_source"]) for e in jobcomp_events(JOBCOMP_2311, CTX)} == {("10004", "SCHEDULER")}
    assert parse_jobcomp({k: v for k, v in JOBCOMP_2311.items() if k != "user_id"}).user_uid is None
    sink = ListSink()
    envs = [("start", {**PROLOG_ENV, "SLURM_JOB_UID": "1000"}), ("end", {**PROLOG_ENV, "SLURM_JOB_ID": "4243"})]
    drain(_spool(tmp_path, envs), CTX, sink, flush=lambda: None)
    got = sorted((r["job_id"], r["user"], r["user_uid"], r["user_source"]) for _, _, r in sink.records)
    assert got == [("4242", "alice", "1000", "SCHEDULER"), ("4243", "alice", None, "SCHEDULER")]


@pytest.mark.parametrize("value", [-1, MAX_UID + 1, 1 << 70, "12a", "0x10", "9" * 40, True, {"x": 1}, None, ""])
def test_what_is_not_a_uid_is_none(value: Any) -> None:
    assert uid_text(value) is None


def test_hostile_uids_leave_the_name_and_no_uid() -> None:
    base = {"job_id": 7, "job_state": "RUNNING", "user_name": "ana"}
    assert parse_ctld_job({**base, "user_id": 4294967295}).user_uid is None  # (uid_t)-1: no user
    assert parse_ctld_job({**base, "user_id": {"set": True, "number": 42}}).user_uid == "42"  # data_parser wrapper
    assert parse_ctld_job({**base, "user_id": 1001, "user_name": None}).user == "1001"
    text = "JobId=5 JobName=x\n   UserId=ana(99999999999999999999) GroupId=g(1)\n   JobState=PENDING Reason=None\n"
    (job,) = parse_capture(text).jobs
    assert (job.user, job.user_uid) == ("ana", None)
    (job,) = parse_capture(text.replace("(99999999999999999999)", "")).jobs
    assert (job.user, job.user_uid) == ("ana", None)
    ev = slurm_event(job, "SUBMITTED", 1, CTX)
    assert ev["user_uid"] is None and ev["user_source"] == "SCHEDULER"
