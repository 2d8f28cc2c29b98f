"""What `raw_samples` keeps (sinks/seconds_kept.py): which scrapes each choice keeps, and a scrape's time read from
its first bytes, as the sink's bulk path reads it, equal to the decoded one for every framing."""

from __future__ import annotations

import pytest

from base.settings import ClickHouseSettings
from processors.testing import device, scrape
from schemas import DEFAULT_STORE
from schemas.codec import CONFLUENT_MAGIC, AvroCodec
from schemas.topics import DEVICE_SAMPLES
from sinks.seconds_kept import SecondsKept, scrape_ts_ms

T0 = 1_795_999_980_000  # a whole minute


def test_each_choice_keeps_its_seconds() -> None:
    seconds = [T0 + 1000 * s + 250 for s in range(60)]
    assert all(SecondsKept("every_second").keeps(t) for t in seconds)
    assert not any(SecondsKept("minutes").keeps(t) for t in seconds)
    kept = [(t - T0) // 1000 for t in seconds if SecondsKept("sampled", 10).keeps(t)]
    assert kept == [0, 10, 20, 30, 40, 50]  # the same seconds on every node: a replay keeps the same rows
    assert [s for s in range(60) if SecondsKept("sampled", 15).keeps(T0 + 1000 * s)] == [0, 15, 30, 45]
    assert (SecondsKept("minutes").writes, SecondsKept("sampled").writes) == (False, True)


def test_the_settings_choose_it_and_refuse_what_is_not_a_choice() -> None:
    assert SecondsKept.of(ClickHouseSettings()) == SecondsKept("sampled", 10)  # the default (docs/benchmarks.md)
    assert SecondsKept.of(ClickHouseSettings(raw_samples_kept="minutes")).writes is False
    with pytest.raises(ValueError):
        ClickHouseSettings(raw_samples_kept="hourly")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ClickHouseSettings(raw_sample_every_s=1)
    with pytest.raises(ValueError):
        SecondsKept("sampled", 0)


def test_every_version_of_the_samples_schema_begins_with_cluster_node_and_time() -> None:
    for schema in DEFAULT_STORE.versions(DEVICE_SAMPLES.subject):
        names = [f["name"] for f in schema["fields"][:3]]
        assert names == ["cluster", "node", "ts_ms"]
        assert [schema["fields"][0]["type"], schema["fields"][1]["type"]] == ["string", "string"]


@pytest.mark.parametrize("node", ["n1", "nöde-" + "x" * 200])  # a multi-byte length prefix
@pytest.mark.parametrize("ts_ms", [T0, 0, 1, 2**62])
def test_a_scrapes_time_is_read_from_its_first_bytes(node: str, ts_ms: int) -> None:
    body = AvroCodec().encode(DEVICE_SAMPLES.subject, scrape(node, ts_ms, [device("GPU-a", 0, sm=0.5)]))
    assert scrape_ts_ms(body) == ts_ms  # single-object framing
    confluent = CONFLUENT_MAGIC + (7).to_bytes(4, "big") + body[10:]
    assert scrape_ts_ms(confluent) == ts_ms
    assert scrape_ts_ms(memoryview(body)) == ts_ms
    assert scrape_ts_ms(body[:14]) is None  # cut short: the row path decides
    assert scrape_ts_ms(b"{not avro}") is None
