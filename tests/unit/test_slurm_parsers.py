"""Every Slurm fixture parses into the right jobs, states, times, nodes and GPU indices."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from base.errors import ParseError
from producers.jobevents import EventContext
from producers.slurm import (
    expand_hostlist,
    parse_capture,
    parse_ctld_job,
    parse_gres,
    parse_index_list,
)
from producers.slurm_events import lifecycle_events
from schemas.codec import AvroCodec

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def ms(text: str, tz: timezone = UTC) -> int:
    return int(datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=tz).timestamp() * 1000)


def jobs_of(rel: str, **kw):
    cap = parse_capture((FIX / rel).read_text(), **kw)
    return cap, {j.job_id: j for j in cap.jobs}


def test_hostlists():
    assert expand_hostlist("gpu[1-2]") == ("gpu1", "gpu2")
    assert expand_hostlist("node-[63-65]") == ("node-63", "node-64", "node-65")
    assert expand_hostlist("cn[01-03,07]-ib,login1") == ("cn01-ib", "cn02-ib", "cn03-ib", "cn07-ib", "login1")
    assert expand_hostlist("r[1-2]n[1-2]") == ("r1n1", "r1n2", "r2n1", "r2n2")
    assert expand_hostlist("(null)") == () and expand_hostlist("None assigned") == ()


def test_gres_grammar():
    (g,) = parse_gres("gpu:h100:4(IDX:0-3)")
    assert (g.name, g.gpu_type, g.count, g.indices) == ("gpu", "h100", 4, (0, 1, 2, 3))
    (g,) = parse_gres("gpu(IDX:0,2-3,5)")
    assert (g.count, g.indices) == (4, (0, 2, 3, 5))
    gg, gpu = parse_gres("gg:g0(CNT:1),gpu:1(IDX:3)")
    assert (gg.name, gg.count, gpu.indices) == ("gg", 1, (3,))
    (g,) = parse_gres("gpu:quadro:0(IDX:N/A)")
    assert (g.count, g.indices) == (0, ())
    assert parse_index_list("0,2-3,5") == (0, 2, 3, 5)
    (mig,) = parse_gres("gpu:1g.10gb:2(IDX:3-4)")
    assert (mig.gpu_type, mig.indices) == ("1g.10gb", (3, 4))


def test_slurmrestd_0041_running_job_gres_detail():
    cap, jobs = jobs_of("slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json")
    assert (cap.kind, cap.slurm_version, cap.data_parser) == ("squeue-json", "24.05.3", "data_parser/v0.0.41")
    j = jobs["9"]
    assert (j.state, j.user, j.account, j.partition, j.qos) == ("RUNNING", "dperez", "acoustic", "gpu", "normal")
    assert (j.submit_ms, j.start_ms, j.end_ms) == (1762529652000, 1762529652000, None)  # end_time is projected
    assert j.nodes == ("gpu1",)
    assert [(g.node, g.gpu_type, g.indices) for g in j.gpus] == [("gpu1", "h100", (0, 1, 2, 3))]
    assert j.gpu_count == 4 and j.batch is True and j.exit_code == 0


def test_slurmrestd_0041_multi_node_job():
    _, jobs = jobs_of("slurmrestd-json/24.05_0.0.41_slurm-job-gpus-multi-nodes.json")
    j = jobs["11"]
    assert (j.state, j.user, j.account, j.name) == ("RUNNING", "jthomas", "biology", "wrap")
    assert j.nodes == ("gpu1", "gpu2") and j.start_ms == 1762529688000
    assert [(g.node, g.indices) for g in j.gpus] == [("gpu1", (0, 1, 2, 3)), ("gpu2", (0, 1, 2, 3))]
    assert j.gpu_count == 8


def test_slurmrestd_0041_slurmdb_records_have_no_gpu_tres():
    for rel, jid, start in (
        ("slurmrestd-json/24.05_0.0.41_slurmdb-job-gpus-running.json", "9", 1762529652000),
        ("slurmrestd-json/24.05_0.0.41_slurmdb-job-gpus-multi-nodes.json", "11", 1762529688000),
    ):
        cap, jobs = jobs_of(rel)
        j = jobs[jid]
        assert cap.kind == "sacct-json"
        assert j.state == "PENDING" and j.submit_ms == start and j.start_ms is None  # as slurmdbd recorded it
        assert j.nodes == ("gpu1",) and j.gpu_count == 0 and j.gpus == ()


def test_slurmrestd_node_inventory():
    cap, _ = jobs_of("slurmrestd-json/24.05_0.0.41_slurm-node-with-gpus-model-allocated.json")
    (n,) = cap.nodes
    assert (n.name, n.gpu_count, n.gpu_type, n.used_indices) == ("gpu1", 4, "h100", (0, 1, 2, 3))


def test_sacct_2108_dbv0037_requeued():
    cap, jobs = jobs_of("sacct-json/mila-iqia-SARC_slurm_21_8_8.json")
    assert (cap.kind, cap.slurm_version, cap.data_parser) == ("sacct-json", "21.08.8-2", "openapi/dbv0.0.37")
    j = jobs["55978384"]
    assert (j.state, j.user, j.account, j.partition, j.cluster) == (
        "REQUEUED", "purah", "rrg-bengioy-ad_gpu", "gpubackfill", "cedar")
    assert (j.submit_ms, j.start_ms, j.end_ms) == (1673275023000, 1673275023000, 1673369386000)
    assert j.nodes == ("cdr896",) and j.gpu_count == 1 and j.wckey == "submitit" and j.exit_code == 0
    assert [(g.node, g.count, g.indices) for g in j.gpus] == [("cdr896", 1, ())]


def test_sacct_2311_v0040_state_list():
    cap, jobs = jobs_of("sacct-json/mila-iqia-SARC_slurm_23_11_5.json")
    assert (cap.kind, cap.slurm_version, cap.data_parser) == ("sacct-json", "23.11.5", "data_parser/v0.0.40")
    j = jobs["4"]
    assert (j.state, j.user, j.account, j.cluster, j.name) == ("RUNNING", "masterkohga", "mila", "mila", "sh")
    assert (j.submit_ms, j.start_ms, j.end_ms) == (1613725209000, 1613725209000, None)
    assert j.nodes == ("mila02",) and j.gpu_count == 2 and j.wckey is None


def test_scontrol_show_job_both_gres_styles():
    cap, jobs = jobs_of("scontrol-text/irush-cs_slurm-scripts_t_get_jobs.t.scontrol-show-job-d.txt")
    assert cap.kind == "scontrol" and len(cap.jobs) == 9
    # old style, GRES_IDX=gpu(IDX:0,2-3,5)
    j = jobs["153291"]
    assert (j.state, j.user, j.account, j.partition) == ("RUNNING", "user3", "oabend", "medium")
    assert j.start_ms == ms("2019-02-07T16:05:09") and j.end_ms is None
    assert [(g.node, g.indices) for g in j.gpus] == [("node-06", (0, 2, 3, 5))] and j.gpu_count == 4
    # intermediate style, GRES=gpu(IDX:5), array task
    j = jobs["2423430_72"]
    assert (j.array_job_id, j.array_task_id, j.numeric_id) == ("2423430", 72, 2423559)
    assert [(g.node, g.indices) for g in j.gpus] == [("cortex-08", (5,))]
    # new style, JOB_GRES= and GRES=gg:g0(CNT:1),gpu:1(IDX:3); interactive (BatchFlag=0)
    j = jobs["25686416"]
    assert [(g.node, g.indices) for g in j.gpus] == [("node-005", (3,))] and j.batch is False
    j = jobs["25687666"]
    assert [(g.node, g.gpu_type, g.indices) for g in j.gpus] == [("node-001", "rtx2080", (1,))]
    assert j.wckey is None  # WCKey=* means the default wckey, none given
    # no GPUs; multi-node; completed array task with real end; pending jobs have no start
    assert jobs["1"].nodes == ("node-63", "node-64", "node-65") and jobs["1"].gpus == ()
    done = jobs["2398463_150"]
    assert (done.state, done.start_ms, done.end_ms) == (
        "COMPLETED", ms("2019-01-31T12:26:08"), ms("2019-01-31T16:19:20"))
    assert jobs["134238037"].state == "PENDING" and jobs["134238037"].start_ms is None
    assert jobs["20547"].start_ms is None and jobs["20547"].nodes == ()
    assert jobs["1306093"].gpus == () and jobs["1306093"].gpu_count == 0


def test_scontrol_times_take_the_configured_zone():
    tz = timezone(timedelta(hours=2))
    _, jobs = jobs_of("scontrol-text/irush-cs_slurm-scripts_t_get_jobs.t.scontrol-show-job-d.txt", tz=tz)
    assert jobs["153291"].start_ms == ms("2019-02-07T16:05:09") - 2 * 3600_000


def test_scontrol_show_node():
    cap, _ = jobs_of("scontrol-text/irush-cs_slurm-scripts_t_get_nodes.t.scontrol-show-node.txt")
    got = {n.name: (n.gpu_count, n.gpu_type, n.used_indices) for n in cap.nodes}
    assert got == {
        "cortex-01": (8, "m60", tuple(range(8))),
        "dumfries-002": (4, "rtx2080", (0, 1, 2, 3)),
        "oxygen-04": (0, None, ()),
        "cricket": (1, "quadro", ()),
    }


def _ctld_variant(version: str) -> dict:
    """The real 0.0.41 record rewritten the way other data_parser versions print it."""
    doc = json.loads((FIX / "slurmrestd-json/24.05_0.0.41_slurm-job-gpus-running.json").read_text())
    rec = doc["jobs"][0]
    if version == "openapi-0.0.37":  # older openapi plugin: plain ints and a string state
        for k, v in list(rec.items()):
            if isinstance(v, dict) and set(v) == {"set", "infinite", "number"}:
                rec[k] = v["number"]
        rec["job_state"] = "RUNNING"
        rec["exit_code"] = 0
    elif version == "v0.0.44":  # same shapes, flags in the state list
        rec["job_state"] = ["RUNNING", "COMPLETING"]
    return rec


@pytest.mark.parametrize("version", ["openapi-0.0.37", "v0.0.44"])
def test_other_slurmctld_dialects(version):
    j = parse_ctld_job(_ctld_variant(version))
    assert (j.job_id, j.state, j.start_ms) == ("9", "RUNNING", 1762529652000)
    assert [(g.node, g.indices) for g in j.gpus] == [("gpu1", (0, 1, 2, 3))]


def test_array_and_het_ids_from_json():
    rec = _ctld_variant("v0.0.44")
    rec.update(job_id=101, het_job_id={"set": True, "infinite": False, "number": 100},
               het_job_offset={"set": True, "infinite": False, "number": 1})
    j = parse_ctld_job(rec)
    assert (j.job_id, j.het_job_id, j.het_job_offset) == ("100+1", "100", 1)
    rec = _ctld_variant("v0.0.44")
    rec.update(job_id=57, array_job_id={"set": True, "infinite": False, "number": 50},
               array_task_id={"set": True, "infinite": False, "number": 7})
    assert parse_ctld_job(rec).job_id == "50_7"
    rec = _ctld_variant("v0.0.44")
    rec.update(job_state=["PENDING"], array_task_string="1-9")
    j = parse_ctld_job(rec)
    assert (j.job_id, j.state, j.start_ms) == ("9_[1-9]", "PENDING", None)


def test_every_fixture_yields_contract_valid_events():
    codec = AvroCodec()
    n = 0
    for path in sorted(FIX.glob("*/*")):
        # Not job listings: sacctmgr's accounts and QOS (policy diff), scontrol's configuration.
        if path.suffix == ".md" or path.parent.name in ("sacctmgr", "scontrol-config") or path.name.startswith(
            "scontrol-show-config"
        ):
            continue
        for job in parse_capture(path.read_text()).jobs:
            for ev in lifecycle_events(job, EventContext("test")):
                codec.decode(codec.encode("sched.job-events", ev), "sched.job-events")
                n += 1
    assert n >= 15


def test_garbage_is_a_parse_error():
    with pytest.raises(ParseError):
        parse_capture("hello")
    with pytest.raises(ParseError):
        parse_capture('{"jobs": [{"foo": 1}]}')


def test_het_job_is_one_gang_over_its_components():
    from producers.slurm_poller import PollState, step

    parts = []
    for offset, gpus in ((0, 8), (1, 4)):
        rec = _ctld_variant("v0.0.44")
        rec.update(job_id=100 + offset, het_job_id={"set": True, "infinite": False, "number": 100},
                   het_job_offset={"set": True, "infinite": False, "number": offset},
                   gres_detail=[f"gpu:h100:{gpus}(IDX:0-{gpus - 1})"], job_state=["RUNNING"])
        parts.append(parse_ctld_job(rec))
    events = step(PollState(), parts, [], 1762529700000, EventContext("hpc"))
    assert [(e["job_id"], e["gang_id"], e["gang_size"], e["het_job_offset"]) for e in events] == [
        ("100+0", "100", 12, 0), ("100+1", "100", 12, 1)]


def test_pending_array_meta_record_is_submitted_once():
    from producers.slurm_poller import PollState, step

    state = PollState()
    seen = []
    for k, rng in enumerate(("1-9", "3-9", "5-9")):
        rec = _ctld_variant("v0.0.44")
        rec.update(job_state=["PENDING"], array_task_string=rng,
                   array_job_id={"set": True, "infinite": False, "number": 9})
        seen += [(e["job_id"], e["event_type"]) for e in step(state, [parse_ctld_job(rec)], [], 1000 + k,
                                                               EventContext("c"))]
    assert seen == [("9_[1-9]", "SUBMITTED")]
