"""The component principals' ACLs (stack.security.component_acls), as data: who may write what."""

from __future__ import annotations

from stack import broker, security
from stack.security import PRINCIPALS, component_acls


def _may(grants: list[security.Grant], component: str, operation: str) -> set[str]:
    """Topics `component` may `operation`."""
    user = PRINCIPALS[component]
    return {g.name for g in grants if g.user == user and g.operation == operation and g.resource == "topic"}


def test_only_processors_write_usage_alerts_and_actions_and_only_producers_write_events() -> None:
    grants = component_acls()
    ledger = {"usage.device-minutes.v1", "usage.job-minutes.v1", "usage.coverage-minutes.v1", "alerts.v1",
              "actions.reclaim.v1"}  # fmt: skip
    sources = {"telemetry.device-samples.v1", "inventory.devices.v1", "sched.job-events.v1",
               "attribution.corrections.v1"}  # fmt: skip
    writers = {topic: {c for c in PRINCIPALS if topic in _may(grants, c, "WRITE")} for topic in ledger | sources}
    corrections = {"attribution.corrections.v1": {"producers", "web"}}  # the team page publishes corrections
    drift = {"alerts.v1": {"processors", "policy-watch"}}  # issue 41: the policy watch's drift alerts
    assert writers == {**{t: {"processors"} for t in ledger}, **{t: {"producers"} for t in sources}, **corrections,
                       **drift}  # fmt: skip
    assert _may(grants, "policy-watch", "WRITE") == {"alerts.v1"}
    assert _may(grants, "policy-watch", "READ") == {"reservations.v1"}
    # the team page publishes corrections, appeals, and reservation requests and decisions
    # (issue 41: and the deciders' page escalation decisions)
    assert _may(grants, "web", "WRITE") == {"attribution.corrections.v1", "appeals.v1", "reservations.v1",
                                            "escalations.v1"}  # fmt: skip
    # read whole to check a new step, as the commands do
    assert _may(grants, "web", "READ") == {"appeals.v1", "reservations.v1", "escalations.v1"}
    # issue 19: people's steps, through the producers' login; issue 38: the baseline `policy apply` records;
    # issue 41: the record of every `policy apply`, and escalations
    governance = {"appeals.v1", "reservations.v1", "attribution.baseline.v1", "policy.applied.v1", "escalations.v1"}
    assert {t for t in governance if t in _may(grants, "producers", "WRITE") & _may(grants, "producers", "READ")} == (
        governance)
    assert not any(governance & _may(grants, c, "WRITE") for c in PRINCIPALS if c not in ("producers", "web"))
    assert governance & _may(grants, "web", "WRITE") == governance - {"attribution.baseline.v1", "policy.applied.v1"}
    assert _may(grants, "sinks", "WRITE") == {f"{t}.dlq" for t in ledger | sources | governance}
    # decisions into the warning's thread; issue 41: an idle reservation's warning and early release, to the team,
    # and an escalation's steps, to the team (read, never written)
    assert _may(grants, "chat", "READ") == {"alerts.v1", "appeals.v1", "reservations.v1", "escalations.v1"}
    # issue 41: an exemption, or a resume asked on the job's page, resumes a reclaimed job (read, never written)
    assert _may(grants, "reclaim", "READ") == {"actions.reclaim.v1", "appeals.v1"}
    assert _may(grants, "reclaim", "WRITE") == {"actions.reclaim.v1.dlq", "appeals.v1.dlq"}
    assert _may(grants, "chat", "WRITE") == {"alerts.v1.dlq", "appeals.v1.dlq", "reservations.v1.dlq",
                                             "escalations.v1.dlq"}  # fmt: skip
    groups = {(g.user, g.name, g.prefixed) for g in grants if g.resource == "group" and g.operation == "READ"}
    assert groups == {("gpuledger-processors", "gpuledger-processors", True),
                      ("gpuledger-sinks", "gpuledger-sinks", False), ("gpuledger-chat", "gpuledger-sinks-chat", False),
                      ("gpuledger-reclaim", "gpuledger-sinks-reclaim", False)}  # fmt: skip
    assert not [g for g in grants if g.user == security.ADMIN_USER]  # a super user needs none
    assert len(grants) == len(set(grants))


def test_only_policy_apply_writes_the_attribution_baseline_and_only_the_sinks_store_it() -> None:
    """The baseline is the organisation's fact: the producers' login (`policy apply`) writes and reads it; the sinks
    read it into ClickHouse and dead-letter it; no page, chat, reclaim or processor may touch it."""
    grants = component_acls("staging.")
    topic = "staging.attribution.baseline.v1"
    writers = {c for c in PRINCIPALS if topic in _may(grants, c, "WRITE")}
    readers = {c for c in PRINCIPALS if topic in _may(grants, c, "READ")}
    assert writers == {"producers"} and readers == {"producers", "sinks"}
    assert {c for c in PRINCIPALS if f"{topic}.dlq" in _may(grants, c, "WRITE")} == {"sinks"}


def test_topic_prefix_and_groups_follow_the_settings() -> None:
    grants = component_acls("staging.", processors_group="p", sinks_group="s")
    assert "staging.alerts.v1" in _may(grants, "processors", "WRITE")
    assert {g.name for g in grants if g.resource == "group"} >= {"p", "s", "s-chat", "s-reclaim"}
    default = [g for g in grants if g.user == security.DEFAULT_CLIENT_USER and g.resource == "topic"]
    assert [(g.name, g.operation, g.prefixed) for g in default] == [("staging.", "DESCRIBE", True)]


def test_the_authorizer_denies_by_default_and_the_plaintext_broker_has_none(tmp_path) -> None:
    plain = broker.BrokerConfig(data_dir=tmp_path)
    assert "authorizer.class.name" not in plain.properties()
    props = security.authorized_broker_config(plain).properties()
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["super.users"] == "User:gpuledger-admin;User:ANONYMOUS"
    assert props["allow.everyone.if.no.acl.found"] == "false"


def test_the_job_agents_log_in_as_the_processors_and_need_no_grant_of_their_own() -> None:
    """`processors agents` (faust) logs in as the processors: its group is under their group prefix, its
    Table's changelog is the idle-state topic they create, read and write, and it declares no
    `<app id>-__assignor-__leader` topic (outside the topic prefix, it would need a grant of its own)."""
    from base.settings import ProcessorSettings, Settings
    from processors.idle_agents import app_id, build_app

    settings = Settings(processor=ProcessorSettings(group_id="p"))
    grants = component_acls("staging.", processors_group="p")
    user = PRINCIPALS["processors"]
    group = [g for g in grants if g.user == user and g.resource == "group"]
    assert [(g.name, g.operation, g.prefixed) for g in group] == [("p", "READ", True)]
    assert app_id(settings).startswith("p")
    state = {g.operation for g in grants if g.user == user and g.name == "staging.processors.idle-state.v1"}
    assert state == {"READ", "WRITE", "CREATE", "DESCRIBE"}
    # The job stage reads the node stage's bundles, not the public device-minutes (which only the sinks read).
    reads = _may(grants, "processors", "READ")
    assert "staging.processors.job-device-minutes.v1" in reads and "staging.usage.device-minutes.v1" not in reads
    assert "staging.processors.job-device-minutes.v1.dlq" in _may(grants, "processors", "WRITE")
    app = build_app(settings, partitions=4)
    assert app.conf.topic_disable_leader


def test_the_chat_and_reclaim_agents_need_only_their_topic_their_group_and_its_dead_letters(tmp_path) -> None:
    """`chat run` and `reclaim run` (one faust app each, `streams.agents.build_record_app`): the app id is
    the consumer group their principal may read as, and the app declares nothing (no topic creation, no
    Table, no leader-assignor topic), so READ on the topics and the group and WRITE on `<topic>.dlq` suffice.
    The chat worker's agent reads alerts and appeals (its appeal steps: read whole too, with no group), reservations
    (issue 41: an idle reservation's warning and early release) and escalations (issue 41: read whole too); the
    reclaim worker's actions and appeals, with a
    policy (an exemption or a resume asked on the job's page resumes a reclaimed job)."""
    from base.settings import KafkaSettings
    from streams.agents import build_record_app

    grants = component_acls("staging.", sinks_group="s")
    for component, topics, group in (("chat", ("alerts.v1", "appeals.v1", "reservations.v1", "escalations.v1"),
                                      "s-chat"),
                                     ("reclaim", ("actions.reclaim.v1", "appeals.v1"), "s-reclaim")):  # fmt: skip
        user = PRINCIPALS[component]
        assert {(g.name, g.prefixed) for g in grants if g.user == user and g.resource == "group"} == {(group, False)}
        assert _may(grants, component, "READ") == {f"staging.{t}" for t in topics}
        assert _may(grants, component, "WRITE") == {f"staging.{t}.dlq" for t in topics}
        assert not {g for g in grants if g.user == user and g.resource == "cluster"}
        more = {f"staging.{t}": lambda r: None for t in topics[1:]}
        app, agent = build_record_app(KafkaSettings(topic_prefix="staging."), group, f"staging.{topics[0]}",
                                      lambda r: None, datadir=str(tmp_path), more=more)  # fmt: skip
        assert app.conf.id == group and app.conf.topic_disable_leader and not app.conf.topic_allow_declare
        assert not app.tables and agent.source.topics == tuple(f"staging.{t}" for t in topics)
        agent.pool.shutdown()
