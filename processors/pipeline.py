"""The whole processing graph in memory: the same stage objects the Kafka runtime drives, wired by a
deterministic partitioner. For tests, replays and what-if runs; no broker involved."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from base.processor_settings import ProcessorSettings
from processors.stages import JobOutputs, JobPartition, NodeOutputs, NodePartition, RekeyStage
from processors.windows import MINUTE_MS, Admit, Horizon, minute_of
from schemas.partition import murmur2, partition_of  # noqa: F401  (re-exported: its tests and the job stage)
from schemas.topics import job_key

LEDGER_FIELDS = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s")


@dataclass(slots=True)
class PipelineResult:
    device_minutes: list[dict[str, Any]] = field(default_factory=list)
    job_minutes: list[dict[str, Any]] = field(default_factory=list)
    coverage_minutes: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    late: list[dict[str, Any]] = field(default_factory=list)
    # Records not admitted: further ahead of event time than `max_future_ms` (the runtime dead-letters them).
    refused: list[dict[str, Any]] = field(default_factory=list)

    def ledger(self) -> dict[str, dict[str, int]]:
        """Per job: allocated / active / starved / idle / dark seconds, from the job-minutes."""
        return ledger_from_job_minutes(self.job_minutes)


def ledger_from_job_minutes(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        acc = out.setdefault(r["job_id"], dict.fromkeys(LEDGER_FIELDS, 0))
        for f in LEDGER_FIELDS:
            acc[f] += int(r[f])
    return out


class InMemoryPipeline:
    def __init__(self, settings: ProcessorSettings, partitions: int = 1) -> None:
        self.settings = settings
        self.n = partitions
        follow = not settings.realtime
        self.rekey = [RekeyStage(horizon=Horizon(settings.max_future_ms, follow)) for _ in range(partitions)]
        self.nodes = [NodePartition(settings) for _ in range(partitions)]
        self.jobs = [JobPartition(settings) for _ in range(partitions)]
        # No wall clock here: the processing clock of every stage is the latest event time admitted anywhere
        # (a job-events partition is sparse, so its own latest event would be no clock).
        self._horizons = [r.horizon for r in self.rekey] + [n.horizon for n in self.nodes]
        self._horizons += [j.horizon for j in self.jobs]
        self.offsets: dict[tuple[str, int], int] = {}
        self.result = PipelineResult()
        self.watermark = -(2**62)

    def _off(self, topic: str, p: int) -> int:
        o = self.offsets.get((topic, p), 0)
        self.offsets[(topic, p)] = o + 1
        return o

    def feed(self, topic: str, key: bytes, record: dict[str, Any]) -> None:
        if topic.startswith("inventory."):
            self.nodes[partition_of(key, self.n)].on_inventory(record)
        elif topic.startswith("sched.job-events"):
            p = partition_of(key, self.n)
            off = self._off(topic, p)
            routes = self.rekey[p].route(record, off)
            admitted = self.jobs[p].on_job_event(record, off)
            if routes is None or not admitted:
                self.result.refused.append(record)
                return
            for nk in routes:
                q = partition_of(nk.encode(), self.n)
                self.nodes[q].on_allocation(nk, record, self._off("allocations", q))
        elif topic.startswith("telemetry.device-samples"):
            p = partition_of(key, self.n)
            verdict = self.nodes[p].on_scrape(record, self._off(topic, p))
            if verdict is Admit.FUTURE:
                self.result.refused.append(record)
                return
            if verdict is Admit.LATE:
                self.result.late.append(record)
        ts = int(record["ts_ms"])
        if ts > self.watermark:
            self.watermark = ts
            for h in self._horizons:
                h.observe_clock(ts)

    def advance(self, watermark_ms: int | None = None) -> None:
        """Close windows up to `watermark_ms` (default: the latest event time); coverage and the idle
        machines tick at the latest event time (the end of a finite input is not silence)."""
        w = self.watermark if watermark_ms is None else watermark_ms
        for node in self.nodes:
            self._node_out(node.advance(w))
            for a in node.tick(self.watermark):
                self.result.alerts.append(a)
        for job in self.jobs:
            self._job_out(job.drain())
            self._job_out(job.tick(w))

    def _node_out(self, out: NodeOutputs) -> None:
        self.result.coverage_minutes.extend(out.coverage_minutes)
        for row in out.device_minutes:
            self.result.device_minutes.append(row)
            if row["job_id"] is None:
                continue
            p = partition_of(job_key(row["cluster"], row["job_id"]), self.n)
            self.jobs[p].on_device_minute(row, self._off("device-minutes", p))

    def _job_out(self, out: JobOutputs) -> None:
        self.result.job_minutes.extend(out.job_minutes)
        self.result.alerts.extend(out.alerts)
        self.result.actions.extend(out.actions)

    def finish(self) -> PipelineResult:
        """Close everything up to the last minute seen (the end of a finite input)."""
        end = minute_of(self.watermark) + 2 * MINUTE_MS + self.settings.grace_ms
        self.advance(end)
        self.advance(end + 10 * MINUTE_MS)
        return self.result


def run_in_memory(
    records: Iterable[tuple[Any, bytes, dict[str, Any]]], settings: ProcessorSettings, partitions: int = 1
) -> PipelineResult:
    """Feed (topic, key, record) in event-time order; windows close as event time passes."""
    pipe = InMemoryPipeline(settings, partitions)
    last_second = None
    for topic, key, record in records:
        name = topic if isinstance(topic, str) else topic.name
        sec = int(record["ts_ms"]) // 1000
        if last_second is not None and sec != last_second:
            pipe.advance()
        last_second = sec
        pipe.feed(name, key, record)
    return pipe.finish()


__all__ = ["InMemoryPipeline", "PipelineResult", "ledger_from_job_minutes", "run_in_memory"]
