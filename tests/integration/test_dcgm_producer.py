"""The DCGM producer scrapes a loopback HTTP server serving real expositions; the records land on the real broker."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from base.settings import KafkaSettings
from producers.dcgm import normalize_text
from producers.scraper import DcgmScraper, parse_targets
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration

EXPOSITIONS = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "exposition"
PAGES = {p.name.split("_")[0] + "-" + p.name.split("_")[1][:8]: p.read_bytes() for p in EXPOSITIONS.iterdir()}


class _Handler(BaseHTTPRequestHandler):
    hits: dict[str, int] = {}

    def do_GET(self) -> None:
        name = self.path.strip("/").split("/")[0]
        _Handler.hits[name] = _Handler.hits.get(name, 0) + 1
        if name == "broken":
            self.send_error(500, "exporter broke")
            return
        if name == "slow":
            time.sleep(1.5)
        body = PAGES.get(name)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _consume(bootstrap: str, topic: str, expected: int, timeout: float = 30.0) -> list[tuple[bytes, bytes]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex}", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    out: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(out) < expected and time.monotonic() < deadline:
            for msg in consumer.consume(100, timeout=0.5):
                if msg.error() is None:
                    out.append((msg.key(), msg.value()))
    finally:
        consumer.close()
    return out


def test_scrapes_real_expositions_onto_the_broker(kafka_bootstrap: str, exporter_server: str) -> None:
    prefix = f"test.{uuid.uuid4().hex[:8]}."
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)
    targets = parse_targets(
        "\n".join(f"- {{url: '{exporter_server}/{name}/metrics', node: {name}}}" for name in sorted(PAGES))
        + f"\n- {exporter_server}/broken/metrics\n- {{url: '{exporter_server}/slow/metrics', node: slow}}\n"
    )
    publisher = RecordPublisher(kafka)
    scraper = DcgmScraper(targets, publisher, "it", timeout_s=0.5, jitter_s=0.2)
    stats = asyncio.run(scraper.run(duration_s=3.2))
    publisher.flush()

    good = [t for t in targets if t.node in PAGES]
    assert stats.ok >= 2 * len(good)
    # The broken exporter and the slow one fail, back off (not retried every second), and are counted.
    broken = stats.targets[f"{exporter_server}/broken/metrics"]
    slow = stats.targets[f"{exporter_server}/slow/metrics"]
    assert broken.failed >= 1 and broken.ok == 0 and broken.skipped >= 1
    assert slow.failed >= 1 and slow.ok == 0

    records = _consume(kafka_bootstrap, prefix + DEVICE_SAMPLES.name, stats.records)
    assert len(records) == stats.records
    codec = AvroCodec()
    by_node: dict[str, list[dict]] = {}
    for key, value in records:
        rec = codec.decode(value, DEVICE_SAMPLES.subject).record
        assert key == f"it/{rec['node']}".encode()
        by_node.setdefault(rec["node"], []).append(rec)
    assert set(by_node) == {t.node for t in good}
    for name, recs in by_node.items():
        expected = normalize_text(PAGES[name].decode())
        for rec in recs:
            assert rec["source"] == "dcgm-exporter" and rec["mapping_version"] == expected.mapping_version
            assert [(d["uuid"], d["mig_instance_id"]) for d in rec["devices"]] == [
                (d["uuid"], d["mig_instance_id"]) for d in expected.devices
            ]
            assert rec["devices"] == expected.devices
        ts = sorted(r["ts_ms"] for r in recs)
        assert all(b - a >= 900 for a, b in itertools.pairwise(ts)), "about 1 Hz per target"
