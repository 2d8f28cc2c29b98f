"""The team page's context (`web.app.WebContext`) from the one settings object: the analyst's ClickHouse client
(never the writer's), the project registry and identity directory of the scheduler settings (the simulator's
organisation when the cluster is the simulator's and neither is configured), policy.yaml's quotas, and a Kafka
publisher for corrections, appeal and reservation steps.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from base.settings import Settings

log = logging.getLogger("gpuledger.web")


def build_context(settings: Settings, publisher: Any = None) -> Any:
    """The app's WebContext from the settings (a test passes its own publisher)."""
    from web.app import WebContext, shared_warehouse
    from web.queries import connect_analyst

    registry, lookup, users = _organisation(settings)
    web = settings.web
    policy = _policy(settings)
    publish = _publisher(settings, publisher)
    return WebContext(
        warehouse=shared_warehouse(lambda: connect_analyst(settings.clickhouse, web.query_timeout_s)),
        lookup=lookup,
        registry=registry,
        publish_correction=_correction_publisher(publish),
        cluster=settings.cluster,
        demo=settings.web_demo,
        demo_users=users if settings.web_demo else [],
        quota={t.name: dict(t.quota) for t in policy.teams} if policy is not None else None,
        credits=_credits(policy),
        policy=policy,
        appeals=_appeal_service(settings, policy, publish),
        reservations=_reservation_service(settings, policy, publish),
        escalations=_escalation_service(settings, policy, publish),
        reservation_engines=tuple(settings.sinks.reservations.engines),
        trusted_proxies=tuple(web.trusted_proxies),
        user_header=web.user_header,
        groups_header=web.groups_header,
        operator_groups=tuple(web.operator_groups),
        finance_groups=tuple(web.finance_groups),
        whatif=_whatif(settings),
        whatif_choices=lambda: _whatif_choices(settings),
        publish_resume=_resume_publisher(policy, publish),
    )  # fmt: skip


def _whatif(settings: Settings) -> Any:
    """The fleet page's what-if (issue 43), `policy whatif`'s own comparison; None unless `web.whatif` is set."""
    if not settings.web.whatif:
        return None
    from web.queries import whatif_comparison

    return lambda proposal, period, by, now_ms: whatif_comparison(settings, proposal, period, by, now_ms)


def _whatif_choices(settings: Settings) -> Any:
    from web.whatif import proposals

    return proposals(settings.web.whatif_proposals, settings.policy_path)


def _organisation(settings: Settings) -> tuple[Any, Any, list[str]]:
    """(registry or None, user -> DirectoryEntry, the users a demo may pick)."""
    from producers.identity import FileDirectory, directory_from_data
    from producers.projects import load_registry

    sched = settings.scheduler
    simulated = settings.cluster == "sim"
    registry = load_registry(sched.registry) if sched.registry else None
    if registry is None and simulated:
        from producers.simulator.org import sim_registry

        registry = sim_registry()
    if sched.directory is not None:
        import yaml

        directory = FileDirectory(sched.directory)
        data = yaml.safe_load(sched.directory.read_text(encoding="utf-8"))
        return registry, directory.lookup, sorted(directory_from_data(data, str(sched.directory)))
    if simulated:
        from producers.simulator.org import sim_directory

        entries = sim_directory()
        # A visitor picks a person: the CI robot's service account is in the directory, not at a browser.
        return registry, entries.get, sorted(u for u in entries if not u.startswith("system:serviceaccount:"))
    return registry, lambda _user: None, []


def _policy(settings: Settings) -> Any:
    if settings.policy_path is None:
        return None
    from schemas.policy import load_policy

    return load_policy(settings.policy_path)


def _credits(policy: Any) -> Any:
    """The credits and reservation charges `period close` routes onto statements (issue 19's governance events,
    judged under the policy), so an open month shows what its statement would carry."""
    from web.queries import governance_charges

    return lambda client: governance_charges(client, policy)


def _publisher(settings: Settings, given: Any) -> Any:
    """publish(topic, key, record), delivered before the page answers: one producer for the process, made at the
    first event (the app's Kafka login may write corrections and appeal steps only)."""
    lock = threading.Lock()
    made: list[Any] = [given] if given is not None else []

    def publish(topic: Any, key: bytes, record: dict[str, Any]) -> None:
        with lock:
            if not made:
                from streams.publish import RecordPublisher

                made.append(RecordPublisher(settings.kafka))
            made[0].publish(topic, key, record)
            made[0].flush(15.0)

    return publish


def _correction_publisher(publish: Any) -> Any:
    from schemas.topics import CORRECTIONS, job_key

    def correction(record: dict[str, Any]) -> None:
        publish(CORRECTIONS, job_key(record["cluster"], record["job_id"]), record)
        log.info("web: correction %s published for job %s/%s by %s", record["correction_id"], record["cluster"],
                 record["job_id"], record["corrected_by"])  # fmt: skip

    return correction


def _appeal_service(settings: Settings, policy: Any, publish: Any) -> Any:
    """Filing and deciding appeals under the policy, checked against appeals.v1 read whole (as the commands do)."""
    if policy is None:
        return None
    from schemas.topics import APPEALS, job_key
    from web.appeals import AppealService

    def read() -> list[dict[str, Any]]:
        from streams.eventlog import read_events

        events, unreadable = read_events(settings.kafka, APPEALS)
        if unreadable:
            log.warning("web: %d records of %s not read (the sinks dead-letter them)", len(unreadable), APPEALS.name)
        return events

    def step(event: dict[str, Any]) -> None:
        publish(APPEALS, job_key(event["cluster"], event["job_id"]), event)
        log.info("web: appeal %s %s by %s", event["appeal_id"], event["event_type"].lower(), event["actor"])

    return AppealService(policy, read, step)


def _escalation_service(settings: Settings, policy: Any, publish: Any) -> Any:
    """Deciding escalations under the policy, checked against escalations.v1 read whole (as `gpuledger escalate`
    does); None unless the policy allows escalations."""
    if policy is None or policy.governance.escalations is None:
        return None
    from schemas.governance_escalations import step_key
    from schemas.topics import ESCALATIONS
    from web.escalations import EscalationService

    def read() -> list[dict[str, Any]]:
        from streams.eventlog import read_events

        events, unreadable = read_events(settings.kafka, ESCALATIONS)
        if unreadable:
            log.warning("web: %d records of %s not read", len(unreadable), ESCALATIONS.name)
        return events

    def step(event: dict[str, Any]) -> None:
        publish(ESCALATIONS, step_key(event), event)
        log.info("web: escalation %s %s by %s", event["escalation_id"], event["event_type"].lower(), event["actor"])

    return EscalationService(policy, read, step)


def _reservation_service(settings: Settings, policy: Any, publish: Any) -> Any:
    """Requesting and deciding reservations under the policy, checked against reservations.v1 read whole (as
    `gpuledger reserve` does)."""
    if policy is None:
        return None
    from schemas.governance_reservations import step_key
    from schemas.topics import RESERVATIONS
    from web.reservations import ReservationService

    def read() -> list[dict[str, Any]]:
        from streams.eventlog import read_events

        events, unreadable = read_events(settings.kafka, RESERVATIONS)
        if unreadable:
            log.warning("web: %d records of %s not read", len(unreadable), RESERVATIONS.name)
        return events

    def step(event: dict[str, Any]) -> None:
        publish(RESERVATIONS, step_key(event), event)
        log.info("web: reservation %s %s by %s", event["reservation_id"], event["event_type"].lower(), event["actor"])

    return ReservationService(policy, read, step)


def _resume_publisher(policy: Any, publish: Any) -> Any:
    """The job page's resume button: a RESUME_ASKED step on appeals.v1 (a topic the app already writes; `reclaim run`
    reads it and holds the engine credentials); None without a policy, which says who may resume."""
    if policy is None:
        return None
    from schemas.topics import APPEALS, job_key

    def ask(event: dict[str, Any]) -> None:
        from schemas.models import validate

        validate(APPEALS.subject, event)  # the contract before the broker: nothing malformed reaches the worker
        publish(APPEALS, job_key(event["cluster"], event["job_id"]), event)
        log.info("web: resume of %s/%s asked by %s (%s)", event["cluster"], event["job_id"], event["actor"],
                 event["event_id"])  # fmt: skip

    return ask
