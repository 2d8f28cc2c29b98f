"""A small at-least-once consumer for the chat and reclaim workers: decode, handle, commit.

Records that cannot be decoded are logged and skipped here: the ledger sink, reading the same
topics in its own group, is the one that dead-letters them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer

from gpuledger.errors import ContractError, ServiceError
from gpuledger.settings import Settings
from schemas.codec import AvroCodec
from schemas.topics import Topic

log = logging.getLogger(__name__)


def consume_records(
    settings: Settings,
    topic: Topic,
    group_id: str,
    handle: Callable[[dict[str, Any]], Any],
    should_stop: Callable[[], bool],
    max_idle_s: float | None = None,
    *,
    metrics_component: str | None = None,
    out_label: str = "handled",
) -> int:
    """Handle every record of `topic` until `should_stop()`; with `metrics_component`, count records
    in (per topic) and handled (`records_out{topic=out_label}`) per batch and serve /metrics."""
    codec = AvroCodec.from_settings(settings.kafka)
    consumer: Any = Consumer(
        {
            **settings.kafka.client_config(),
            "group.id": group_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    meter = None
    if metrics_component is not None and settings.metrics.enabled:
        from gpuledger import metrics

        meter = metrics.component(metrics_component)
        consumer = metrics.MeteredConsumer(consumer, meter, group_id, settings.metrics.lag_refresh_s)
        metrics.start_metrics_server(settings, metrics_component)
    consumer.subscribe([settings.kafka.topic(topic.name)])
    handled = 0
    idle_since = time.monotonic()
    try:
        while not should_stop():
            messages = consumer.consume(num_messages=500, timeout=0.5)
            if not messages:
                if not consumer.assignment():  # still joining the group: not idle yet
                    idle_since = time.monotonic()
                elif max_idle_s is not None and time.monotonic() - idle_since > max_idle_s:
                    break
                continue
            idle_since = time.monotonic()
            before = handled
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.fatal():
                        raise ServiceError(f"Kafka consumer failed: {err}")
                    continue
                try:
                    record = codec.decode(msg.value() or b"", expected_subject=topic.subject).record
                except ContractError as exc:
                    log.warning("skipping undecodable %s[%d]@%d: %s", msg.topic(), msg.partition(), msg.offset(), exc)
                    continue
                handle(record)
                handled += 1
            consumer.commit(asynchronous=False)
            if meter is not None and handled > before:
                meter.records_out(out_label, handled - before)
    finally:
        consumer.close()
    return handled
