"""The DCGM producer's pure parts: targets, the per-scrape pipeline, tick offsets; and `inspect dcgm`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from base.errors import ConfigError, ParseError
from producers import telemetry_cli
from producers.scraper import DcgmScraper, Target, _offset, parse_targets
from schemas.codec import AvroCodec
from schemas.topics import DEVICE_SAMPLES, Topic

EXPOSITIONS = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "exposition"


class Collect:
    def __init__(self) -> None:
        self.codec = AvroCodec()
        self.sent: list[tuple[Topic, bytes, bytes]] = []

    def publish(self, topic: Topic, key: bytes, record: dict[str, Any]) -> None:
        self.sent.append((topic, key, self.codec.encode(topic.subject, record)))


def test_parse_targets_forms() -> None:
    text = """
targets:
  - http://10.0.0.1:9400/metrics
  - {url: "http://10.0.0.2:9400/metrics", node: n2, exporter_version: 3.3.7-3.5.0}
  - {url_template: "http://{node}:9400/metrics", nodes: [gpu01, gpu02], exporter_version: 4.4.2-4.7.1}
"""
    assert parse_targets(text) == [
        Target("http://10.0.0.1:9400/metrics"),
        Target("http://10.0.0.2:9400/metrics", "n2", "3.3.7-3.5.0"),
        Target("http://gpu01:9400/metrics", "gpu01", "4.4.2-4.7.1"),
        Target("http://gpu02:9400/metrics", "gpu02", "4.4.2-4.7.1"),
    ]
    with pytest.raises(ConfigError):
        parse_targets("- ftp://x/metrics")
    with pytest.raises(ParseError):
        parse_targets("- {port: 1}")


def test_handle_builds_and_publishes_one_record_per_scrape() -> None:
    pub = Collect()
    scraper = DcgmScraper([Target("http://h:9400/metrics")], pub, "prod")
    (path,) = EXPOSITIONS.glob("nvidia-aicr_h100*")
    rec = scraper.handle(scraper.targets[0], path.read_text(), 1_700_000_000_000)
    assert rec["node"] == "gpu-node-1"  # from the Hostname label when the target names no node
    (topic, key, value) = pub.sent[0]
    assert topic is DEVICE_SAMPLES and key == b"prod/gpu-node-1"
    assert pub.codec.decode(value).record == rec and len(rec["devices"]) == 8
    assert scraper.stats.records == 1 and scraper.stats.devices == 8


def test_targets_spread_over_the_second() -> None:
    offsets = {_offset(f"http://node{i}:9400/metrics", 0.25) for i in range(200)}
    assert all(0 <= o < 0.25 for o in offsets) and len(offsets) > 100
    with pytest.raises(ConfigError):
        DcgmScraper([], Collect(), "c")


def _cli() -> typer.Typer:
    app = typer.Typer()
    inspect_app = typer.Typer()
    app.add_typer(inspect_app, name="inspect")
    telemetry_cli.register(app, inspect_app)
    return app


def test_inspect_dcgm_table_and_json() -> None:
    (path,) = EXPOSITIONS.glob("nvidia-cloud-native-docs_A100-MIG*")
    runner = CliRunner()
    res = runner.invoke(_cli(), ["inspect", "dcgm", str(path), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["record"]["mapping_version"] == "dcgm-v3" and out["record"]["node"] == "ub20-a100-k8s"
    assert [d["mig_instance_id"] for d in out["record"]["devices"]] == [None, 13]
    res = runner.invoke(_cli(), ["inspect", "dcgm", str(path)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "1g.5gb" in res.output and "dcgm-v3" in res.output
