"""Contract records -> warehouse rows (sinks/rows.py): every column filled, nulls where ClickHouse
wants a default, identity snapshot taken from STARTED events."""

from __future__ import annotations

import json

from contract_records import IDENTITY, job_event

from schemas import topics
from schemas.models import validate
from sinks.rows import SINKS


def test_job_event_rows_and_identity_snapshot() -> None:
    started = job_event("STARTED", 1_000, identity=IDENTITY)
    validate("sched.job-events", started)
    events, identities = SINKS[topics.JOB_EVENTS.name]
    (row,) = events.rows(started)
    values = dict(zip(events.columns, row, strict=True))
    assert values["team"] == "vision" and values["cost_centre"] == "CC-100"
    assert json.loads(values["allocations"])[0]["devices"][0]["uuid"] == "GPU-a"
    assert values["event_type"] == "STARTED" and values["checkpointable"] is True
    assert (values["user_uid"], values["user_source"], values["user_claimed"], values["user_groups"]) == (
        None, None, None, [])  # a v3 event: no identifier, source unknown
    stamped = job_event("STARTED", 1_000, user_uid="3f2a", user_source="STAMPED", user_claimed="bob",
                        user_groups=["system:authenticated"])  # fmt: skip
    validate("sched.job-events", stamped)
    values = dict(zip(events.columns, events.rows(stamped)[0], strict=True))
    assert (values["user_uid"], values["user_source"], values["user_claimed"], values["user_groups"]) == (
        "3f2a", "STAMPED", "bob", ["system:authenticated"])
    (snap,) = identities.rows(started)
    assert dict(zip(identities.columns, snap, strict=True))["teams"] == ["vision", "infra"]
    assert identities.rows(job_event("ENDED", 2_000)) == []  # only STARTED carries the snapshot


def test_device_minute_nulls_become_keys() -> None:
    (spec,) = SINKS[topics.DEVICE_MINUTES.name]
    record = {c: 0 for c in spec.columns}
    record.update({"cluster": "c1", "node": "n1", "device_uuid": "GPU-z", "mig_instance_id": None, "job_id": None,
                   "user": None, "project": None, "team": None, "cost_centre": None, "model": None,
                   "generation": "hopper", "preemptible": False, "pricing_tier": "on-prem", "sm_weighted_s": 0,
                   "mapping_version": "m1", "classifier_version": "c1", "unallocated_s": 60})  # fmt: skip
    (row,) = spec.rows(record)
    values = dict(zip(spec.columns, row, strict=True))
    assert values["mig_instance_id"] == -1 and values["job_id"] == "" and values["project"] == ""
    assert spec.dedupe_key == ("cluster", "node", "device_uuid", "mig_instance_id", "minute_start_ms", "job_id")


def test_every_sink_topic_is_in_the_catalogue() -> None:
    names = {t.name for t in topics.CATALOGUE}
    assert set(SINKS) <= names
    for specs in SINKS.values():
        for spec in specs:
            assert len(set(spec.columns)) == len(spec.columns)
            assert set(spec.dedupe_key) <= set(spec.columns)
