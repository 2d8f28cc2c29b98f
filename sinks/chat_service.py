"""`gpuledger chat run`: alerts, appeal decisions, idle reservations' warnings and early releases, and escalation
steps posted to chat, each exactly once (sinks/chat.py, sinks/chat_appeals.py, sinks/chat_reservations.py,
sinks/chat_escalations.py), wired from the one settings object."""

from __future__ import annotations

import logging
from typing import Any

from base.settings import Settings
from sinks.warehouse import client, now_ms

log = logging.getLogger("gpuledger.chat")


def run_chat(settings: Settings, local_receiver: int | None, stop: Any, max_idle_s: float | None) -> None:
    """Consume the alerts topic and post each alert to its routed channel; and the appeals topic: each decision
    as a reply in its warning's thread, each escalation to the operators' channel (with the policy's rules); the
    reservations topic (idle warnings, early releases) and the escalations topic (asked, decided, lapsed, ended:
    to the job's team, with the policy's rules)
    `local_receiver`: with no route configured, post to `chat receiver` on this loopback port."""
    from schemas.policy import load_policy
    from schemas.topics import ALERTS, APPEALS, ESCALATIONS, RESERVATIONS
    from sinks.chat import ChatJournal, ChatNotifier, InDoubt, local_receiver_routes, recently_delivered
    from sinks.chat_appeals import appeal_notifier
    from sinks.chat_escalations import escalation_notifier
    from sinks.chat_reservations import ReservationNotifier
    from sinks.gang import ClickHouseGangs
    from sinks.worker_agent import consume_records

    db = client(settings)
    chat = settings.sinks.chat
    if local_receiver is not None:
        chat = local_receiver_routes(chat, local_receiver)
    recent = recently_delivered(db, chat.dedupe_window)
    two_phase = ChatJournal(db, now_ms)
    # posts a killed life began and never journalled, shared by the four notifiers (their keys share the journal)
    doubt = InDoubt(two_phase.in_doubt_since(chat.dedupe_window))
    notifier = ChatNotifier(chat, clock_ms=now_ms, already_sent=recent, gangs=ClickHouseGangs(db).alert,
                            intent=two_phase.begin, in_doubt=doubt)  # fmt: skip
    policy = None if settings.policy_path is None else load_policy(settings.policy_path)
    appeals = appeal_notifier(chat, db, settings.kafka, policy, recent, two_phase.begin, doubt)
    reservations = ReservationNotifier(chat, already_sent=recent, intent=two_phase.begin, doubt=doubt)
    escalations = escalation_notifier(chat, settings.kafka, policy, recent, two_phase.begin, doubt)

    def journal(delivery: Any) -> None:
        log.info("%s %s %s", delivery.alert_id, delivery.status, delivery.channel)
        two_phase.end(delivery)

    consume_records(
        settings,
        ALERTS,
        f"{settings.sinks.group_id}-chat",
        lambda record: journal(notifier.handle(record)),
        stop,
        max_idle_s,
        metrics_component="chat",
        out_label="chat",
        also={
            APPEALS: lambda record: journal(appeals.handle(record)),
            RESERVATIONS: lambda record: journal(reservations.handle(record)),
            ESCALATIONS: lambda record: journal(escalations.handle(record)),
        },
    )
