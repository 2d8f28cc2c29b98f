"""The chat and reclaim workers' agent: one faust agent over one topic (`streams.agents.run_record_agent`)
with a handler per record.

Like every consumer of the project, a record that does not decode or validate goes to `<topic>.dlq`
(the reason in its headers, `streams.consume.decode_or_dead_letter`), and a batch is acked (faust commits
what was acked) only after each of its records was handled and its dead letters were delivered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from base.settings import Settings
from schemas.topics import Topic
from streams.agents import run_record_agent


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
    also: Mapping[Topic, Callable[[dict[str, Any]], Any]] | None = None,
) -> int:
    """Handle every record of `topic` until `should_stop()` (or `max_idle_s` without a record, once the
    topic is read to its end); returns how many were handled. `also`: more topics read by the same agent (one
    consumer group), each record of one handed to its own handler. The faust app's id is `group_id` (its
    consumer group). With `metrics_component`, count records in (per topic), handled
    (`records_out{topic=out_label}`) per batch, dead letters and lag, and serve /metrics.

    At least once: a batch not acked and committed is handled again at the next start (or by the fresh
    app that replaces a crashed one in-process). The stop is bounded by the deadline of `should_stop`
    when it is a `base.shutdown.StopSignal`."""
    meter = None
    count_dead_letters = None
    if metrics_component is not None and settings.metrics.enabled:
        from base import metrics

        meter = metrics.component(metrics_component)
        metrics.start_metrics_server(settings, metrics_component)

        def count_dead_letters(sink: Any) -> None:
            metrics.count_dead_letters(sink, meter)

    stats = run_record_agent(
        settings.kafka,
        group_id,
        settings.kafka.topic(topic.name),
        handle,
        should_stop,
        max_idle_s=max_idle_s,
        meter=meter,
        out_label=out_label,
        dead_letters=count_dead_letters,
        more={settings.kafka.topic(t.name): h for t, h in (also or {}).items()},
    )
    return stats.handled
