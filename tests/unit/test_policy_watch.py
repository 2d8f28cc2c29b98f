"""The policy watch's decisions (producers/policy_watch.py): one alert per drift, with its exact lines, a clear when
it is gone, nothing while it stays, and an engine that cannot be read is not a clean one. The engines themselves:
tests/integration/test_policy_watch_live.py."""

from __future__ import annotations

from typing import Any

from base.errors import ServiceError
from producers.policy_engine import EngineDiff
from producers.policy_watch import CLEARED, DRIFT, one_pass, step
from schemas.codec import AvroCodec

QOS = "qos prod: MaxTRESPerUser is gres/gpu=4, policy says gres/gpu=2"
CQ = "ClusterQueue team-a: nominalQuota h100/nvidia.com/gpu is 9, policy says 8"


def test_one_alert_per_drift_and_a_clear_when_it_is_gone() -> None:
    state, alerts = step({}, "c1", EngineDiff("slurm", (QOS,)), 1_000)
    assert [(a["kind"], a["engine"], a["drift_lines"]) for a in alerts] == [(DRIFT, "slurm", [QOS])]
    assert QOS in alerts[0]["message"] and alerts[0]["action"] == "gpuledger policy apply --engine slurm"
    drift_id = alerts[0]["alert_id"]
    state, again = step(state, "c1", EngineDiff("slurm", (QOS,)), 2_000)
    assert again == []  # the same drift: said once
    state, changed = step(state, "c1", EngineDiff("slurm", (QOS, "qos x: missing")), 3_000)
    assert [a["kind"] for a in changed] == [DRIFT] and changed[0]["alert_id"] != drift_id
    state, cleared = step(state, "c1", EngineDiff("slurm", ()), 4_000)
    assert [(a["kind"], a["drift_lines"]) for a in cleared] == [(CLEARED, [])]
    assert cleared[0]["alert_id"] == changed[0]["alert_id"].replace("policy-drift/", "policy-drift-cleared/")
    assert step(state, "c1", EngineDiff("slurm", ()), 5_000)[1] == []


def test_a_restart_that_finds_the_same_drift_publishes_the_same_id() -> None:
    first = step({}, "c1", EngineDiff("kueue", (CQ,)), 1_000)[1][0]
    assert step({}, "c1", EngineDiff("kueue", (CQ,)), 9_000)[1][0]["alert_id"] == first["alert_id"]
    # and a first pass with no drift clears whatever the fleet page still shows
    assert [a["kind"] for a in step({}, "c1", EngineDiff("kueue", ()), 1)[1]] == [CLEARED]


def test_an_engine_that_cannot_be_read_keeps_its_state() -> None:
    published: list[dict[str, Any]] = []
    state, _ = step({}, "c1", EngineDiff("slurm", (QOS,)), 1)

    def differ(engine: str) -> EngineDiff:
        if engine == "slurm":
            raise ServiceError("sacctmgr: Connection refused")
        return EngineDiff(engine, ())

    after = one_pass(state, "c1", ("slurm", "kueue"), differ, published.append, 2)
    assert after["slurm"] == state["slurm"]
    assert [(a["kind"], a["engine"]) for a in published] == [(CLEARED, "kueue")]


def test_the_alerts_are_valid_alerts_v2_records() -> None:
    codec = AvroCodec()
    alerts = [*step({}, "c1", EngineDiff("slurm", (QOS,) * 300), 1)[1], *step({}, "c1", EngineDiff("kueue", ()), 1)[1]]
    for alert in alerts:
        assert codec.decode(codec.encode("alerts", alert)).record["drift_lines"] == alert["drift_lines"]
    assert len(step({}, "c1", EngineDiff("slurm", tuple(f"l{i}" for i in range(300))), 1)[1][0]["drift_lines"]) == 200


def test_chat_posts_the_drift_with_its_exact_lines_by_default() -> None:
    from base.settings import ChatSettings
    from sinks.chat import Destination, render

    alert = step({}, "c1", EngineDiff("slurm", (QOS,)), 1_000)[1][0]
    assert alert["kind"] in ChatSettings().kinds
    title, body = render(alert, Destination("default", "default", "#gpu-alerts", None), "appeal")  # type: ignore[arg-type]
    assert title == "[gpuledger] Scheduler differs from the policy: slurm on c1"
    assert QOS in body.splitlines() and "next: gpuledger policy apply --engine slurm" in body


def test_an_apply_is_recorded_with_each_setting_before_and_after() -> None:
    """producers/policy_audit.py: the differences `policy diff` saw before the apply become the record's changes;
    the record is a valid policy.applied.v1 and the sink stores one row with the changes side by side."""
    from producers.policy_audit import applied_event
    from producers.policy_kueue import KueueDrift
    from producers.policy_slurm import ConfDrift, Drift
    from schemas.records import PolicyApplied
    from schemas.topics import POLICY_APPLIED
    from sinks.rows import SINKS

    before = [Drift("qos", "prod", "Priority", "1000", "5"), Drift("association", "serve", "GrpTRES", "x=1", None),
              ConfDrift("PriorityDecayHalfLife", "7-00:00:00", "0"),
              KueueDrift(("ClusterQueue", "", "a"), "spec.nominalQuota", 2, 5)]  # fmt: skip
    event = applied_event(cluster="c1", engine="slurm", actor="root", actor_source="os-user", policy_hash="ab",
                          before=before, still_differs=[], now_ms=1_000)  # fmt: skip
    assert [(c["object"], c["setting"], c["before"], c["after"]) for c in event["changes"]] == [
        ("qos prod", "Priority", "5", "1000"), ("association serve", "", None, "x=1"),
        ("slurm.conf", "PriorityDecayHalfLife", "0", "7-00:00:00"),
        ("ClusterQueue a", "spec.nominalQuota", "5", "2")]  # fmt: skip
    again = applied_event(cluster="c1", engine="slurm", actor="root", actor_source="os-user", policy_hash="ab",
                          before=before, still_differs=[], now_ms=1_000)  # fmt: skip
    assert again["apply_id"] == event["apply_id"]  # a retried publish is stored once
    codec = AvroCodec()
    decoded = codec.decode(codec.encode(POLICY_APPLIED.subject, event)).record
    (spec,) = SINKS[POLICY_APPLIED.name]
    (row,) = spec.rows(PolicyApplied.from_avro(decoded))
    assert dict(zip(spec.columns, row, strict=True))["change_before"] == ["5", None, "0", "5"]
