"""base/metrics.py: families and names, the endpoint and its port file, the instrumentation
helpers (metered consumer, dead-letter and publisher counting, processor observer), and the summary
`gpuledger status` prints (unreachable endpoints reported, never raised)."""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from rich.console import Console

from base import metrics
from base.settings import MetricsSettings, Settings
from stack.supervisor import ComponentStatus, StackStatus, _probe_pipeline

P = metrics.PREFIX


def _settings(tmp_path: Path, **m: Any) -> Settings:
    return Settings(state_dir=tmp_path, metrics=MetricsSettings(**m))


def _exposed(coll: metrics.PipelineCollector) -> list[metrics.Sample]:
    registry = CollectorRegistry()
    registry.register(coll)
    return metrics.parse_exposition(generate_latest(registry).decode())


def _value(samples: list[metrics.Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_families_follow_prometheus_conventions_and_add_up() -> None:
    coll = metrics.PipelineCollector()
    m = coll.component("sinks")
    m.records_in("t.a", 10)
    m.records_in("t.a", 5)
    m.records_out("device_minutes", 7)
    m.dead_letters("t.a", "MalformedRecord")
    m.dead_letters("t.a", "MalformedRecord", 2)
    m.set_lag("g", "t.a", 42)
    m.set_lag("g", "t.a", 3)
    m.set_coverage("sim", 0.75)
    m.late_samples(4)
    m.alert_latency("IDLE_WARNING", 0.3)
    m.alert_latency("IDLE_WARNING", 12.0)
    m.add_source(lambda: {"records_out": {("device_minutes",): 3.0, ("alerts",): 1.0}})
    s = _exposed(coll)
    assert _value(s, P + "records_in_total", component="sinks", topic="t.a") == 15
    assert _value(s, P + "records_out_total", topic="device_minutes") == 10  # pushed + pulled
    assert _value(s, P + "records_out_total", topic="alerts") == 1
    assert _value(s, P + "dead_letters_total", topic="t.a", error_class="MalformedRecord") == 3
    assert _value(s, P + "consumer_lag_records", group="g", topic="t.a") == 3
    assert _value(s, P + "coverage_ratio", cluster="sim") == 0.75
    assert _value(s, P + "late_samples_total", component="sinks") == 4
    assert _value(s, P + "alert_latency_seconds_count", kind="IDLE_WARNING") == 2
    assert _value(s, P + "alert_latency_seconds_bucket", le="0.5") == 1
    assert _value(s, P + "alert_latency_seconds_bucket", le="15.0") == 2
    assert _value(s, P + "alert_latency_seconds_sum") == pytest.approx(12.3)
    names = {x.name for x in s}
    assert all(n.startswith(P) for n in names)
    assert {P + "records_in_total", P + "alert_latency_seconds_bucket"} <= names


def test_a_failing_source_does_not_fail_the_scrape() -> None:
    coll = metrics.PipelineCollector()
    m = coll.component("x")
    m.records_in("t", 1)
    m.add_source(lambda: 1 / 0)  # type: ignore[arg-type,return-value]
    assert _value(_exposed(coll), P + "records_in_total", topic="t") == 1


def test_configured_ports_are_fixed_offsets_or_any() -> None:
    s = Settings(metrics=MetricsSettings(base_port=9470))
    assert metrics.configured_port(s, "processors") == 9471
    assert metrics.configured_port(s, "sinks") == 9472
    assert metrics.configured_port(s, "unknown") == 0
    assert metrics.configured_port(Settings(metrics=MetricsSettings(base_port=0)), "sinks") == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_server_serves_on_loopback_and_records_its_port(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    coll = metrics.PipelineCollector()
    registry.register(coll)
    coll.component("unit-a").records_in("t", 2)
    server = metrics.start_metrics_server(_settings(tmp_path, base_port=0), "unit-a", registry=registry)
    assert server is not None
    try:
        assert server.host == "127.0.0.1"
        assert metrics.read_port(_settings(tmp_path), "unit-a") == server.port > 0
        assert (tmp_path / "metrics" / "unit-a.port").read_text().strip() == str(server.port)
        text = httpx.get(server.url, timeout=5).text
        assert f'{P}records_in_total{{component="unit-a",topic="t"}} 2.0' in text
        again = metrics.start_metrics_server(_settings(tmp_path, base_port=0), "unit-a", registry=registry)
        assert again is server  # once per component and process
    finally:
        server.close()


def test_a_taken_port_falls_back_to_any_free_one(tmp_path: Path) -> None:
    taken = _free_port()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", taken))
        blocker.listen()
        base = taken - metrics.PORT_OFFSETS["reclaim"]
        server = metrics.start_metrics_server(
            _settings(tmp_path, base_port=base), "reclaim", registry=CollectorRegistry()
        )
        assert server is not None
        try:
            assert server.port != taken
            assert metrics.read_port(_settings(tmp_path), "reclaim") == server.port
        finally:
            server.close()


def test_disabled_serves_nothing(tmp_path: Path) -> None:
    assert metrics.start_metrics_server(_settings(tmp_path, enabled=False), "sinks") is None
    assert not (tmp_path / "metrics").exists()


class _Msg:
    def __init__(self, topic: str, error: Any = None) -> None:
        self._topic, self._error = topic, error

    def topic(self) -> str:
        return self._topic

    def error(self) -> Any:
        return self._error


class _FakeConsumer:
    def __init__(self, batches: list[list[_Msg]]) -> None:
        self.batches = batches
        self.positions = [
            SimpleNamespace(topic="a", partition=0, offset=90),
            SimpleNamespace(topic="b", partition=0, offset=-1001),
        ]
        self.marks = {("a", 0): (0, 100), ("b", 0): (5, 8)}

    def consume(self, n: int, timeout: float) -> list[_Msg]:
        return self.batches.pop(0) if self.batches else []

    def assignment(self) -> list[Any]:
        return self.positions

    def position(self, tps: list[Any]) -> list[Any]:
        return tps

    def get_watermark_offsets(self, tp: Any, cached: bool = False) -> tuple[int, int]:
        return self.marks[(tp.topic, tp.partition)]

    def close(self) -> str:
        return "closed"


def test_metered_consumer_counts_batches_by_topic_and_refreshes_lag() -> None:
    m = metrics.ComponentMetrics("sinks")
    fake = _FakeConsumer([[_Msg("a"), _Msg("a"), _Msg("b"), _Msg("a", error="eof")], [_Msg("b")]])
    c = metrics.MeteredConsumer(fake, m, "grp", refresh_s=0.0)
    assert len(c.consume(10, 0.1)) == 4
    c.consume(10, 0.1)
    assert m.records_in_ == {"a": 2, "b": 2}  # error events are not records
    assert m.lag_ == {("grp", "a"): 10, ("grp", "b"): 3}  # b: nothing read yet, from the low watermark
    assert c.close() == "closed"  # everything else passes through


def test_dead_letters_are_counted_by_source_topic_and_class() -> None:
    sent: list[Any] = []
    sink = SimpleNamespace(publish_raw=lambda *a: sent.append(a))
    m = metrics.ComponentMetrics("processors")
    metrics.count_dead_letters(sink, m)
    headers = [("dlq.error.class", b"MalformedRecord"), ("dlq.source.topic", b"p.telemetry.device-samples.v1")]
    sink.publish_raw("p.telemetry.device-samples.v1.dlq", b"k", b"v", headers)
    sink.publish_raw("other", b"k", b"v", None)  # not a dead letter
    assert len(sent) == 2
    assert m.dead_letters_ == {("p.telemetry.device-samples.v1", "MalformedRecord"): 1}


def test_counting_publisher_counts_records_out_per_topic() -> None:
    coll = metrics.PipelineCollector()
    m = coll.component("simulator")
    published: list[Any] = []
    inner = SimpleNamespace(publish=lambda *a: published.append(a), flush=lambda t=30.0: None, codec="c")
    pub = metrics.CountingPublisher(inner, m, "pre.")
    topic = SimpleNamespace(name="telemetry.device-samples.v1")
    for _ in range(3):
        pub.publish(topic, b"k", {})
    pub.flush()
    assert len(published) == 3 and pub.codec == "c"
    assert _value(_exposed(coll), P + "records_out_total", topic="pre.telemetry.device-samples.v1") == 3


def _runtime() -> Any:
    stats = SimpleNamespace(
        device_minutes=5, job_device_minutes=2, job_minutes=2, coverage_minutes=4, alerts=1, actions=0, late_scrapes=1,
        extra={"late_job_events_total": 3},
    )  # fmt: skip
    return SimpleNamespace(
        ps=SimpleNamespace(grace_ms=10_000, group_id="gp"),
        stats=stats,
        t_dm="dm", t_job_dm="job_dm", t_jm="jm", t_cov="cov", t_alerts="alerts", t_actions="actions", t_late="late",
        pos={}, start_pos={}, rekey_c=None, job_c=None, node_c=None,
    )  # fmt: skip


def test_processor_observer_alert_latency_coverage_and_counters() -> None:
    coll = metrics.PipelineCollector()
    m = coll.component("processors")
    obs = metrics.ProcessorObserver(_runtime(), m)
    # An idle warning is due at the end of its minute plus the window grace; a coverage gap at ts_ms.
    obs.alert({"kind": "IDLE_WARNING", "ts_ms": 60_000, "emitted_ts_ms": 72_500})
    obs.alert({"kind": "COVERAGE_GAP", "ts_ms": 60_000, "emitted_ts_ms": 61_000})
    assert m.latency_["IDLE_WARNING"].sum == pytest.approx(2.5)
    assert m.latency_["COVERAGE_GAP"].sum == pytest.approx(1.0)
    rows = [
        {"cluster": "sim", "minute_start_ms": 0, "expected_device_s": 480, "reporting_device_s": 480},
        {"cluster": "sim", "minute_start_ms": 60_000, "expected_device_s": 480, "reporting_device_s": 240},
        {"cluster": "sim", "minute_start_ms": 60_000, "expected_device_s": 480, "reporting_device_s": 480},
    ]
    obs.coverage(rows)
    assert m.coverage_ == {"sim": 0.75}  # the latest closed minute only
    obs.coverage(rows[:1])  # an older minute never replaces a newer one
    assert m.coverage_ == {"sim": 0.75}
    # Another partition's nodes closing the same minute add to it.
    obs.coverage([{"cluster": "sim", "minute_start_ms": 60_000, "expected_device_s": 480, "reporting_device_s": 0}])
    assert m.coverage_ == {"sim": 0.5}
    s = _exposed(coll)
    assert _value(s, P + "records_out_total", topic="dm") == 5
    assert _value(s, P + "records_out_total", topic="job_dm") == 2
    assert _value(s, P + "late_samples_total") == 1
    assert _value(s, P + "late_job_events_total") == 3


def test_processor_observer_counts_records_read_from_positions() -> None:
    rt = _runtime()
    tp = SimpleNamespace(topic="samples", partition=0)
    rt.node_c = SimpleNamespace(assignment=lambda: [tp], get_watermark_offsets=lambda tp, cached: (0, 50))
    rt.start_pos = {("node", "samples", 0): 10}
    m = metrics.ComponentMetrics("processors")
    obs = metrics.ProcessorObserver(rt, m)
    rt.pos[("node", "samples", 0)] = 30
    obs.refresh()
    rt.pos[("node", "samples", 0)] = 45
    obs.refresh()
    assert m.records_in_ == {"samples": 35}
    assert m.lag_ == {("gp.node", "samples"): 5}


def test_quantile_and_summary() -> None:
    assert metrics.histogram_quantile(0.99, []) is None
    assert metrics.histogram_quantile(0.5, [(1.0, 0), (2.0, 10), (float("inf"), 10)]) == pytest.approx(1.5)
    coll = metrics.PipelineCollector()
    m = coll.component("processors")
    m.records_in("a", 10)
    m.records_out("b", 4)
    m.dead_letters("a", "X")
    m.set_lag("g", "a", 2)
    m.set_coverage("sim", 0.5)
    for v in (1.5,) * 99 + (100.0,):
        m.alert_latency("IDLE_WARNING", v)
    summary = metrics.summarise(_exposed(coll))
    assert summary["records_in"] == 10 and summary["records_out"] == 4
    assert summary["dead_letters"] == 1 and summary["dead_letters_by_topic"] == {"a": 1}
    assert summary["consumer_lag"] == 2 and summary["coverage"] == {"sim": 0.5}
    assert summary["alerts"] == 100 and 1.0 <= summary["alert_latency_p99_s"] <= 2.0


def test_status_reports_unreachable_endpoints_without_failing(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "sinks.port").write_text(f"{_free_port()}\n")  # nobody listens there
    comps = [
        ComponentStatus("sinks", "", True, "running", pid=1),
        ComponentStatus("chat", "", True, "running", pid=2),  # no port file
        ComponentStatus("reclaim", "", False, "disabled"),  # not running: not scraped
        ComponentStatus("broker", "", True, "ready", pid=3),  # serves no gpuledger metrics
    ]
    st = StackStatus(components=comps)
    _probe_pipeline(settings, st)
    by = {p["component"]: p for p in st.pipeline}
    assert set(by) == {"sinks", "chat"}
    assert not by["sinks"]["reachable"] and "unreachable" in by["sinks"]["detail"]
    assert not by["chat"]["reachable"] and "no metrics port" in by["chat"]["detail"]
    assert st.healthy  # metrics are informative: the stack is as healthy as its components
    assert st.to_json()["pipeline"] == st.pipeline
    from stack.present import pipeline_table

    console = Console(record=True, width=100)
    console.print(pipeline_table(st.pipeline))
    assert "unreachable: ConnectError" in console.export_text()


def test_status_summarises_a_live_endpoint(tmp_path: Path) -> None:
    from stack.present import pipeline_table

    registry = CollectorRegistry()
    coll = metrics.PipelineCollector()
    registry.register(coll)
    coll.component("chat").records_in("alerts", 3)
    coll.component("chat").records_out("chat", 3)
    server = metrics.start_metrics_server(_settings(tmp_path, base_port=0), "chat", registry=registry)
    assert server is not None
    try:
        st = StackStatus(components=[ComponentStatus("chat", "", True, "running", pid=1)])
        _probe_pipeline(_settings(tmp_path), st)
        [row] = st.pipeline
        assert row["reachable"] and row["metrics"]["records_in"] == 3 and row["metrics"]["records_out"] == 3
        console = Console(record=True, width=80)
        console.print(pipeline_table(st.pipeline))
        text = console.export_text()
        assert "chat" in text and "3" in text
    finally:
        server.close()


def test_an_alerts_latency_counts_from_when_it_was_due() -> None:
    """Due: an idle alert's time (the end of the window that completed the idle period) plus the grace; any other
    alert's time. The runtime's observer and the faust agents both count it so (`alert_emitted`)."""
    coll = metrics.PipelineCollector()
    m = coll.component("agents")
    t = 1_700_000_000_000
    m.alert_emitted({"kind": "IDLE_WARNING", "ts_ms": t, "emitted_ts_ms": t + 60_000 + 2_000}, grace_ms=60_000)
    m.alert_emitted({"kind": "RECLAIM_NOTICE", "ts_ms": t, "emitted_ts_ms": t + 30_000}, grace_ms=60_000)
    m.alert_emitted({"kind": "COVERAGE_GAP", "ts_ms": t, "emitted_ts_ms": t + 500}, grace_ms=60_000)
    m.alert_emitted({"kind": "IDLE_WARNING", "ts_ms": t}, grace_ms=60_000)  # never emitted: not observed
    s = _exposed(coll)
    assert _value(s, P + "alert_latency_seconds_sum", kind="IDLE_WARNING") == pytest.approx(2.0)
    assert _value(s, P + "alert_latency_seconds_count", kind="IDLE_WARNING") == 1
    assert _value(s, P + "alert_latency_seconds_sum", kind="RECLAIM_NOTICE") == 0.0  # before due: 0, not negative
    assert _value(s, P + "alert_latency_seconds_sum", kind="COVERAGE_GAP") == pytest.approx(0.5)


def test_kube_watch_serves_the_stamps_its_identity_resolver_ignored(tmp_path: Path) -> None:
    """`kube watch`'s endpoint (component "kube"): the stamps producers/kube_identity.py did not take, by reason,
    read from the resolver at scrape time, beside the records it published."""
    from producers.kube_identity import MAX_NAME, IdentityResolver
    from producers.policy_stamp import SUBMITTER, SUBMITTER_UID
    from producers.scheduler_service import metered_kube

    class InForceSince:  # the stamp's admission objects, in force since 2026-01-01T00:00:00Z
        def since_ms(self) -> int:
            return 1_767_225_600_000

    def pod(name: str, user: str, created: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                             "annotations": {SUBMITTER: user, SUBMITTER_UID: "u-1"}}}  # fmt: skip

    resolver = IdentityResolver(trust=InForceSince())
    published: list[Any] = []
    inner = SimpleNamespace(publish=lambda *a: published.append(a), flush=lambda t=30.0: None)
    settings = _settings(tmp_path, base_port=0)
    assert metered_kube(inner, _settings(tmp_path, enabled=False), SimpleNamespace(identity=resolver)) is inner
    pub = metered_kube(inner, settings, SimpleNamespace(identity=resolver))
    server = metrics.start_metrics_server(settings, "kube")  # the endpoint metered_kube started
    assert server is not None and (tmp_path / "metrics" / "kube.port").is_file()
    try:
        for obj in (pod("big", "x" * (MAX_NAME + 1), "2026-02-01T00:00:00Z"),  # over the bound
                    pod("early", "mallory", "2025-12-31T23:59:59Z"),  # written before any policy stamped
                    pod("early", "mallory", "2025-12-31T23:59:59Z"),  # its next event: counted again
                    pod("ok", "alice", "2026-02-01T00:00:00Z")):  # fmt: skip
            resolver.resolve(obj)
        pub.publish(SimpleNamespace(name="sched.job-events.v4"), b"k", {})
        samples = metrics.parse_exposition(httpx.get(server.url, timeout=5).text)
        assert _value(samples, P + "stamps_ignored_total", component="kube", reason="oversized") == 1
        assert _value(samples, P + "stamps_ignored_total", component="kube", reason="untrusted") == 2
        assert _value(samples, P + "records_out_total", component="kube", topic="sched.job-events.v4") == 1
        assert len(published) == 1
    finally:
        server.close()
