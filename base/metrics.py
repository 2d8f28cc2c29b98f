"""The pipeline's own health: Prometheus metrics served by each long-running process.

Each process (`processors run`, `sink run`, `chat run`, `reclaim run`, `simulate run`, `dcgm run`,
`kube watch`) calls `start_metrics_server(settings, component)` once: prometheus_client's HTTP server on
`metrics.host` (loopback by default) at `metrics.base_port` + a fixed offset per component (or any
free port when `base_port` is 0 or that port is taken). The port actually bound is written to
`<state_dir>/metrics/<component>.port`, which is how `gpuledger status` finds it.

Families (all with the `gpuledger_` prefix, besides prometheus_client's `process_*`/`python_*`):

    gpuledger_records_in_total{component,topic}               records consumed
    gpuledger_records_out_total{component,topic}              records produced (or rows written; topic = table)
    gpuledger_dead_letters_total{component,topic,error_class} records sent to <topic>.dlq
    gpuledger_consumer_lag_records{component,group,topic}     high watermark - position, summed over partitions
    gpuledger_alert_latency_seconds{component,kind}           histogram: emitted wall time - moment the alert was due
    gpuledger_coverage_ratio{cluster}                         reporting / expected device-seconds, last closed minute
    gpuledger_late_samples_total{component}                   samples that arrived after their window closed
    gpuledger_late_job_events_total{component}                job events that arrived after a minute they bound closed
    gpuledger_stamps_ignored_total{component,reason}          Kubernetes submitter stamps not taken (oversized,
                                                              untrusted: producers/kube_identity.py)
    gpuledger_legacy_fingerprint_records_total{subject}       single-object records read with the old big-endian
                                                              fingerprint (defined in schemas/codec.py)

Cost on the hot path: callers add whole batches (`records_in(topic, n)`), or expose counters they
already keep through a pull source read at scrape time; a metered consumer counts a batch's topics
and refreshes lag (cached watermarks, no broker round trip) at most every `metrics.lag_refresh_s`.
State is plain dicts written by the worker thread and copied by the scrape thread.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from base.settings import Settings

log = logging.getLogger(__name__)

PREFIX = "gpuledger_"
# Fixed offsets from `metrics.base_port`, one per long-running component (0: any free port).
PORT_OFFSETS = {"processors": 1, "sinks": 2, "chat": 3, "reclaim": 4, "simulator": 5, "dcgm": 6, "agents": 7, "kube": 8}
# Seconds; alerts can be due long before they are emitted when history is replayed (event time).
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 10800.0)
IDLE_ALERT_KINDS = ("IDLE_WARNING", "RECLAIM_NOTICE", "IDLE_RESOLVED")
DLQ_CLASS_HEADER = "dlq.error.class"
DLQ_SOURCE_HEADER = "dlq.source.topic"

Labels = tuple[str, ...]
# A pull source: called at scrape time, returns {family: {labels: value}} to add to what was pushed.
Source = Callable[[], Mapping[str, Mapping[Labels, float]]]


class _Histogram:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        self.sum += value


@dataclass
class ComponentMetrics:
    """The metrics one component of this process reports. Methods take whole batches."""

    component: str
    records_in_: dict[str, float] = field(default_factory=dict)
    records_out_: dict[str, float] = field(default_factory=dict)
    dead_letters_: dict[tuple[str, str], float] = field(default_factory=dict)
    lag_: dict[tuple[str, str], float] = field(default_factory=dict)
    coverage_: dict[str, float] = field(default_factory=dict)
    late_: float = 0.0
    latency_: dict[str, _Histogram] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)

    def records_in(self, topic: str, n: float = 1) -> None:
        self.records_in_[topic] = self.records_in_.get(topic, 0) + n

    def records_out(self, topic: str, n: float = 1) -> None:
        self.records_out_[topic] = self.records_out_.get(topic, 0) + n

    def dead_letters(self, topic: str, error_class: str, n: float = 1) -> None:
        key = (topic, error_class)
        self.dead_letters_[key] = self.dead_letters_.get(key, 0) + n

    def late_samples(self, n: float) -> None:
        self.late_ += n

    def set_lag(self, group: str, topic: str, lag: float) -> None:
        self.lag_[(group, topic)] = lag

    def set_coverage(self, cluster: str, ratio: float) -> None:
        self.coverage_[cluster] = ratio

    def alert_latency(self, kind: str, seconds: float) -> None:
        hist = self.latency_.get(kind)
        if hist is None:
            hist = self.latency_[kind] = _Histogram()
        hist.observe(seconds)

    def alert_emitted(self, alert: Mapping[str, Any], grace_ms: int) -> None:
        """An alert sent: its latency is emitted minus due, due being its time plus the grace for an idle alert
        (the window that completed the idle period, then the grace) and its time for any other."""
        emitted, ts = alert.get("emitted_ts_ms"), alert.get("ts_ms")
        if emitted is None or ts is None:
            return
        kind = str(alert.get("kind") or "")
        due_ms = ts + (grace_ms if kind in IDLE_ALERT_KINDS else 0)
        self.alert_latency(kind, max(0.0, (emitted - due_ms) / 1000))

    def add_source(self, source: Source) -> None:
        """Counters the component already keeps, read at scrape time (nothing on the hot path)."""
        self.sources.append(source)


class PipelineCollector(Collector):
    """Every component's `gpuledger_*` families, merged at scrape time."""

    def __init__(self) -> None:
        self.components: dict[str, ComponentMetrics] = {}
        self._lock = threading.Lock()

    def component(self, name: str) -> ComponentMetrics:
        with self._lock:
            if name not in self.components:
                self.components[name] = ComponentMetrics(name)
            return self.components[name]

    def collect(self) -> Iterator[Metric]:
        rin = CounterMetricFamily(PREFIX + "records_in", "Records consumed.", labels=["component", "topic"])
        rout = CounterMetricFamily(
            PREFIX + "records_out",
            "Records produced (sinks: rows written, topic = table).",
            labels=["component", "topic"],
        )
        dlq = CounterMetricFamily(
            PREFIX + "dead_letters", "Records sent to <topic>.dlq.", labels=["component", "topic", "error_class"]
        )
        lag = GaugeMetricFamily(
            PREFIX + "consumer_lag_records",
            "High watermark minus position, summed over the assigned partitions.",
            labels=["component", "group", "topic"],
        )
        cov = GaugeMetricFamily(
            PREFIX + "coverage_ratio",
            "Reporting / expected device-seconds of the last closed minute.",
            labels=["cluster"],
        )
        late = CounterMetricFamily(
            PREFIX + "late_samples", "Samples that arrived after their window closed.", labels=["component"]
        )
        late_events = CounterMetricFamily(
            PREFIX + "late_job_events",
            "Job events that reached the node stage after a minute they bound had closed (beyond the grace).",
            labels=["component"],
        )
        ignored = CounterMetricFamily(
            PREFIX + "stamps_ignored",
            "Kubernetes submitter stamps not taken: over a bound (oversized) or written where no policy in force "
            "stamps (untrusted).",
            labels=["component", "reason"],
        )
        lat = HistogramMetricFamily(
            PREFIX + "alert_latency_seconds",
            "Alert emitted (wall clock) minus the moment it became due (window end + grace).",
            labels=["component", "kind"],
        )
        for name, m in sorted(self.components.items()):
            pulled: dict[str, dict[Labels, float]] = {}
            for source in list(m.sources):
                try:
                    for fam, values in source().items():
                        into = pulled.setdefault(fam, {})
                        for labels, v in values.items():
                            into[labels] = into.get(labels, 0) + v
                except Exception as exc:  # a scrape must never fail because of one source
                    log.debug("metrics source failed: %s", exc)

            def merged(
                fam: str, pushed: Mapping[Any, float], pulled: dict[str, dict[Labels, float]] = pulled
            ) -> dict[Labels, float]:
                return _merge(pushed, pulled.get(fam, {}))

            for (topic,), v in sorted(merged("records_in", m.records_in_).items()):
                rin.add_metric([name, topic], v)
            for (topic,), v in sorted(merged("records_out", m.records_out_).items()):
                rout.add_metric([name, topic], v)
            for (topic, cls), v in sorted(merged("dead_letters", m.dead_letters_).items()):
                dlq.add_metric([name, topic, cls], v)
            for (group, topic), v in sorted(merged("consumer_lag", m.lag_).items()):
                lag.add_metric([name, group, topic], v)
            for (cluster,), v in sorted(merged("coverage", m.coverage_).items()):
                cov.add_metric([cluster], v)
            late_total = m.late_ + sum(pulled.get("late_samples", {}).values())
            if late_total or "late_samples" in pulled:
                late.add_metric([name], late_total)
            if "late_job_events" in pulled:
                late_events.add_metric([name], sum(pulled["late_job_events"].values()))
            for (reason,), v in sorted(pulled.get("stamps_ignored", {}).items()):
                ignored.add_metric([name, reason], v)
            for kind, hist in sorted(dict(m.latency_).items()):
                counts, cum, buckets = list(hist.counts), 0, []
                for bound, n in zip((*LATENCY_BUCKETS, math.inf), counts, strict=True):
                    cum += n
                    buckets.append(("+Inf" if bound == math.inf else repr(bound), cum))
                lat.add_metric([name, kind], buckets, hist.sum)
        yield from (rin, rout, dlq, lag, cov, late, late_events, ignored, lat)


def _merge(pushed: Mapping[Any, float], pulled: Mapping[Labels, float]) -> dict[Labels, float]:
    out = {(k if isinstance(k, tuple) else (k,)): v for k, v in dict(pushed).items()}
    for labels, v in pulled.items():
        out[labels] = out.get(labels, 0) + v
    return out


_COLLECTOR: PipelineCollector | None = None
_SERVERS: dict[str, MetricsServer] = {}
_GLOBAL_LOCK = threading.Lock()


def collector(registry: CollectorRegistry = REGISTRY) -> PipelineCollector:
    """This process's collector, registered with prometheus_client's default registry once."""
    global _COLLECTOR
    with _GLOBAL_LOCK:
        if _COLLECTOR is None:
            _COLLECTOR = PipelineCollector()
            registry.register(_COLLECTOR)
        return _COLLECTOR


def component(name: str) -> ComponentMetrics:
    return collector().component(name)


# ------------------------------------------------------------------------------------------------
# The HTTP endpoint


@dataclass
class MetricsServer:
    component: str
    host: str
    port: int
    port_file: Path | None
    _server: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        _SERVERS.pop(self.component, None)


def metrics_dir(settings: Settings) -> Path:
    return settings.state_dir / "metrics"


def port_file(settings: Settings, component_name: str) -> Path:
    return metrics_dir(settings) / f"{component_name}.port"


def instance_name(kind: str, k: int) -> str:
    """Process `k` of a kind that runs several: the kind's own name for the first, "<kind>-<k>" after it (the
    name the stack's process, its log and its metrics endpoint go by; `kind_of` reverses it)."""
    return kind if k == 1 else f"{kind}-{k}"


def endpoint_name(settings: Settings, component_name: str) -> str:
    """The name this process's endpoint of `component_name` is recorded under (`metrics.instance`)."""
    return instance_name(component_name, settings.metrics.instance)


def kind_of(name: str) -> str:
    """The component kind an endpoint name is of (`instance_name` reversed): "processors-2" is of "processors"."""
    head, _, k = name.rpartition("-")
    return head if head and k.isdigit() else name


def configured_port(settings: Settings, component_name: str) -> int:
    """The port a component asks for: base_port + its offset; 0 (any free port) without either."""
    base = settings.metrics.base_port
    offset = PORT_OFFSETS.get(component_name)
    return 0 if base == 0 or offset is None else base + offset


def start_metrics_server(
    settings: Settings, component_name: str, registry: CollectorRegistry = REGISTRY
) -> MetricsServer | None:
    """Serve /metrics for this process (once per component) and record the port; None when disabled.

    Never fails the component: a taken port falls back to any free one, any other error is logged.
    """
    cfg = settings.metrics
    if not cfg.enabled:
        return None
    with _GLOBAL_LOCK:
        if component_name in _SERVERS:
            return _SERVERS[component_name]
    if registry is REGISTRY:
        collector()
    name = endpoint_name(settings, component_name)
    wanted = configured_port(settings, name)
    try:
        try:
            httpd, _ = start_http_server(wanted, addr=cfg.host, registry=registry)
        except OSError as exc:
            if wanted == 0:
                raise
            log.info("metrics port %s:%d unavailable (%s): using any free port", cfg.host, wanted, exc.strerror)
            httpd, _ = start_http_server(0, addr=cfg.host, registry=registry)
    except OSError as exc:
        log.warning("metrics endpoint not started: %s", exc)
        return None
    port = int(httpd.server_address[1])
    path: Path | None = port_file(settings, name)
    try:
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(f"{port}\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot record the metrics port in %s: %s", path, exc)
        path = None
    server = MetricsServer(component_name, cfg.host, port, path, httpd)
    with _GLOBAL_LOCK:
        _SERVERS[component_name] = server
    log.info("metrics for %s on %s", name, server.url)
    return server


# ------------------------------------------------------------------------------------------------
# Instrumentation helpers


def _invalid(offset: int | None) -> bool:
    return offset is None or offset < 0


class MeteredConsumer:
    """A confluent-kafka consumer that counts each batch by topic and refreshes lag now and then.

    Wraps the consumer (every other attribute passes through), so a loop that calls `consume` needs
    no change. Lag is computed in the consuming thread from cached watermarks and positions.
    """

    def __init__(self, consumer: Any, metrics: ComponentMetrics, group: str, refresh_s: float = 2.0) -> None:
        self._consumer = consumer
        self._metrics = metrics
        self._group = group
        self._refresh_s = refresh_s
        self._next_refresh = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def consume(self, *args: Any, **kwargs: Any) -> list[Any]:
        messages: list[Any] = self._consumer.consume(*args, **kwargs)
        if messages:
            count_batch(self._metrics, messages)
        now = time.monotonic()
        if now >= self._next_refresh:
            self._next_refresh = now + self._refresh_s
            self.refresh_lag()
        return messages

    def refresh_lag(self) -> None:
        try:
            assigned = self._consumer.assignment()
            positions = self._consumer.position(assigned) if assigned else []
        except Exception:  # closed or between rebalances: try again at the next refresh
            return
        lag: dict[str, int] = {}
        for tp in positions:
            lag.setdefault(tp.topic, 0)
            try:
                lo, hi = self._consumer.get_watermark_offsets(tp, cached=True)
            except Exception:  # not fetched yet: unknown, counted as none
                lo, hi = -1, -1
            if _invalid(hi):
                continue
            pos = tp.offset if not _invalid(tp.offset) else (lo if not _invalid(lo) else hi)
            lag[tp.topic] += max(0, hi - pos)
        for topic in {t for g, t in self._metrics.lag_ if g == self._group} - set(lag):
            self._metrics.set_lag(self._group, topic, 0)  # no longer assigned here
        for topic, n in lag.items():
            self._metrics.set_lag(self._group, topic, n)


def count_batch(metrics: ComponentMetrics, messages: Iterable[Any]) -> None:
    """Add a consumed batch to records_in, one increment per topic."""
    for topic, n in Counter(m.topic() for m in messages if m.error() is None).items():
        metrics.records_in(str(topic), n)


def _header(headers: Iterable[tuple[str, Any]] | None, name: str) -> str | None:
    for key, value in headers or ():
        if key == name:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return None


def count_dead_letters(sink: Any, metrics: ComponentMetrics) -> None:
    """Count what `sink.publish_raw` sends to a `.dlq` topic (the dead-letter helper's sink), by
    source topic and error class (from the headers `streams.consume` sets). Dead letters are rare:
    this wraps the instance's method, the records it publishes are untouched."""
    inner = sink.publish_raw

    def publish_raw(
        topic_name: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, Any]] | None = None
    ) -> None:
        inner(topic_name, key, value, headers)
        cls = _header(headers, DLQ_CLASS_HEADER)
        if cls is not None:
            source = _header(headers, DLQ_SOURCE_HEADER) or topic_name.removesuffix(".dlq")
            metrics.dead_letters(source, cls)

    sink.publish_raw = publish_raw


class CountingPublisher:
    """A `RecordPublisher` (or anything with `publish`/`flush`) that counts records out per topic.

    One dict increment per record, read at scrape time; the encode behind it costs far more."""

    def __init__(self, publisher: Any, metrics: ComponentMetrics, topic_prefix: str = "") -> None:
        self._publisher = publisher
        self._prefix = topic_prefix
        self.counts: dict[str, int] = {}
        metrics.add_source(
            lambda: {"records_out": {(self._prefix + t,): float(n) for t, n in dict(self.counts).items()}}
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._publisher, name)

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self._publisher.publish(topic, key, record)
        name = topic.name
        self.counts[name] = self.counts.get(name, 0) + 1

    def flush(self, timeout_s: float = 30.0) -> None:
        self._publisher.flush(timeout_s)


# ------------------------------------------------------------------------------------------------
# The processors: their runtime's own counters, alert latency and coverage


class ProcessorObserver:
    """Hooks the processor runtime calls (`processors.runtime`): per alert, per closed-minute batch of
    coverage rows, and `refresh()` once a second from its stats loop (records in, lag, counters)."""

    def __init__(self, runtime: Any, metrics: ComponentMetrics) -> None:
        self.rt = runtime
        self.m = metrics
        self._seen: dict[tuple[str, str, int], int] = {}
        self._minutes: dict[str, dict[int, list[int]]] = {}  # cluster -> minute -> [expected, reporting] s
        metrics.add_source(self._counters)

    def alert(self, alert: Mapping[str, Any]) -> None:
        try:
            self._alert(alert)
        except Exception as exc:  # metrics never stop the pipeline
            log.debug("alert metrics: %s", exc)

    def coverage(self, rows: list[dict[str, Any]]) -> None:
        try:
            self._coverage(rows)
        except Exception as exc:
            log.debug("coverage metrics: %s", exc)

    def refresh(self) -> None:
        try:
            self._refresh()
        except Exception as exc:
            log.debug("metrics refresh: %s", exc)

    def _alert(self, alert: Mapping[str, Any]) -> None:
        self.m.alert_emitted(alert, self.rt.ps.grace_ms)

    def _coverage(self, rows: list[dict[str, Any]]) -> None:
        """Coverage minutes just closed (one partition's nodes per call): summed per cluster and minute
        across the partitions of this process; the ratio shown is the cluster's latest minute."""
        for r in rows:
            per_minute = self._minutes.setdefault(r["cluster"], {})
            acc = per_minute.setdefault(r["minute_start_ms"], [0, 0])
            acc[0] += r["expected_device_s"]
            acc[1] += r["reporting_device_s"]
        for cluster in {r["cluster"] for r in rows}:
            per_minute = self._minutes[cluster]
            for old in sorted(per_minute)[:-5]:  # a lagging partition may still close a recent minute
                del per_minute[old]
            expected, reporting = per_minute[max(per_minute)]
            if expected > 0:
                self.m.set_coverage(cluster, min(1.0, reporting / expected))

    def _counters(self) -> dict[str, dict[Labels, float]]:
        rt, s = self.rt, self.rt.stats
        out = {
            rt.t_dm: s.device_minutes,
            rt.t_job_dm: s.job_device_minutes,
            rt.t_jm: s.job_minutes,
            rt.t_cov: s.coverage_minutes,
            rt.t_alerts: s.alerts,
            rt.t_actions: s.actions,
            rt.t_late: s.late_scrapes,
        }
        late = s.extra.get("late_samples_total", s.late_scrapes)
        return {
            "records_out": {(topic,): float(n) for topic, n in out.items() if n},
            "late_samples": {(): float(late)},
            "late_job_events": {(): float(s.extra.get("late_job_events_total", 0))},
        }

    def _refresh(self) -> None:
        """Records read (from consumed positions) and lag per group and topic; runs in the worker thread."""
        rt = self.rt
        gid = rt.ps.group_id
        for stage in ("rekey", "node", "job"):
            consumer = getattr(rt, f"{stage}_c", None)
            if consumer is None:
                continue
            try:
                assigned = consumer.assignment()
            except Exception:  # closed (shutting down): nothing assigned
                assigned = []
            lag: dict[str, int] = {}
            for tp in assigned:
                key = (stage, tp.topic, tp.partition)
                try:
                    lo, hi = consumer.get_watermark_offsets(tp, cached=True)
                except Exception:
                    lo, hi = -1, -1
                base = rt.start_pos.get(key)
                if base is None:
                    base = lo if not _invalid(lo) else 0
                pos = rt.pos.get(key, base)
                seen = self._seen.get(key, base)
                if pos > seen:
                    self.m.records_in(tp.topic, pos - seen)
                self._seen[key] = pos
                lag.setdefault(tp.topic, 0)
                if not _invalid(hi):
                    lag[tp.topic] += max(0, hi - pos)
            for topic, n in lag.items():
                self.m.set_lag(f"{gid}.{stage}", topic, n)


def instrument_processor(runtime: Any) -> ProcessorObserver | None:
    """Serve /metrics for a processor runtime; returns the observer its hooks call (None: disabled)."""
    settings: Settings = runtime.settings
    if not settings.metrics.enabled:
        return None
    m = component("processors")
    observer = ProcessorObserver(runtime, m)
    count_dead_letters(runtime, m)
    start_metrics_server(settings, "processors")
    return observer


# ------------------------------------------------------------------------------------------------
# Reading endpoints (gpuledger status)


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> list[Sample]:
    """The samples of a Prometheus text exposition (only what status needs)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.append(Sample(s.name, dict(s.labels), float(s.value)))
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus-style quantile from cumulative (upper bound, count) buckets; None when empty."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def summarise(samples: list[Sample]) -> dict[str, Any]:
    """One component's endpoint in a few numbers: records in/out, dead letters, lag, alert p99, coverage."""

    def total(name: str) -> float:
        return sum(s.value for s in samples if s.name == name)

    buckets: dict[float, float] = {}
    for s in samples:
        if s.name == PREFIX + "alert_latency_seconds_bucket":
            bound = float(s.labels["le"])
            buckets[bound] = buckets.get(bound, 0) + s.value
    p99 = histogram_quantile(0.99, list(buckets.items()))
    coverage = {s.labels.get("cluster", ""): s.value for s in samples if s.name == PREFIX + "coverage_ratio"}
    dlq: dict[str, float] = {}
    for s in samples:
        if s.name == PREFIX + "dead_letters_total":
            dlq[s.labels.get("topic", "")] = dlq.get(s.labels.get("topic", ""), 0) + s.value
    return {
        "records_in": int(total(PREFIX + "records_in_total")),
        "records_out": int(total(PREFIX + "records_out_total")),
        "dead_letters": int(total(PREFIX + "dead_letters_total")),
        "dead_letters_by_topic": {k: int(v) for k, v in sorted(dlq.items())},
        "consumer_lag": int(total(PREFIX + "consumer_lag_records")),
        "late_samples": int(total(PREFIX + "late_samples_total")),
        "late_job_events": int(total(PREFIX + "late_job_events_total")),
        "alerts": int(total(PREFIX + "alert_latency_seconds_count")),
        "alert_latency_p99_s": None if p99 is None else round(p99, 3),
        "coverage": {k: round(v, 4) for k, v in sorted(coverage.items())},
    }


def scrape(url: str, timeout_s: float = 2.0) -> list[Sample]:
    import httpx

    resp = httpx.get(url, timeout=timeout_s)
    resp.raise_for_status()
    return parse_exposition(resp.text)


def read_port(settings: Settings, component_name: str) -> int | None:
    try:
        return int(port_file(settings, component_name).read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


@dataclass
class EndpointSummary:
    component: str
    url: str | None
    reachable: bool
    detail: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)


def pipeline_summary(settings: Settings, components: Iterable[str], timeout_s: float = 2.0) -> list[EndpointSummary]:
    """Scrape each component's endpoint (port from its port file); unreachable is reported, never raised."""
    out: list[EndpointSummary] = []
    for name in components:
        port = read_port(settings, name)
        if port is None:
            out.append(
                EndpointSummary(name, None, False, "no metrics port recorded (not started, or metrics disabled)")
            )
            continue
        url = f"http://{settings.metrics.host}:{port}/metrics"
        try:
            summary = summarise(scrape(url, timeout_s))
        except Exception as exc:
            out.append(EndpointSummary(name, url, False, f"unreachable: {type(exc).__name__}"))
            continue
        out.append(EndpointSummary(name, url, True, "", summary))
    return out
