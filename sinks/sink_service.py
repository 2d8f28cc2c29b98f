"""`gpuledger sink run`: the ledger topics into ClickHouse until stopped, with /metrics when enabled."""

from __future__ import annotations

from typing import Any

from base.settings import Settings
from sinks.warehouse import client


def run_sink(settings: Settings, topics: list[str] | None, stop: Any, max_idle_s: float | None) -> Any:
    """Consume `topics` (None: every catalogue topic) into ClickHouse until `stop` or `max_idle_s` without
    records (idempotent; commits after insert); the run's counters."""
    from sinks.consumer import LedgerSink
    from sinks.writer import LedgerWriter

    sink_cls = metered_sink_class(settings) if settings.metrics.enabled else LedgerSink
    from sinks.seconds_kept import SecondsKept

    sink = sink_cls(settings.kafka, settings.sinks, LedgerWriter(client(settings)), topics=topics,
                    kept=SecondsKept.of(settings.clickhouse))  # fmt: skip
    return sink.run(stop, max_idle_s=max_idle_s)


def metered_sink_class(settings: Settings) -> Any:
    """LedgerSink that reports to /metrics: records in per topic and lag (per batch, from its
    consumer), rows written per table, dead letters by topic and error class."""
    from base import metrics
    from sinks.consumer import LedgerSink

    m = metrics.component("sinks")

    class MeteredSink(LedgerSink):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            group = self._cfg.group_id
            self.loop.consumer = metrics.MeteredConsumer(self.loop.consumer, m, group, settings.metrics.lag_refresh_s)
            metrics.count_dead_letters(self.loop.publisher, m)
            metrics.start_metrics_server(settings, "sinks")

        def _write_with_retry(self, pending: list[Any]) -> Any:
            result = super()._write_with_retry(pending)
            for table, n in result.inserted.items():
                m.records_out(table, n)
            return result

        def _bulk_landed(self, rows: int) -> None:
            super()._bulk_landed(rows)
            if rows:
                m.records_out("raw_samples", rows)

    return MeteredSink
