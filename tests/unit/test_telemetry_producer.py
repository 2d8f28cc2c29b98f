"""The telemetry producers' compression and linger (`kafka.telemetry`, base.settings.TelemetryProducerSettings)
reach the configuration their producer is built with, and only theirs."""

import pytest

from base import kafka
from base.errors import ConfigError
from base.settings import KafkaSettings, Settings
from producers import telemetry_service


def test_the_chosen_defaults_reach_a_telemetry_producer_and_no_other():
    conf = kafka.producer_config(KafkaSettings(), telemetry=True)
    assert (conf["compression.type"], conf["linger.ms"]) == ("zstd", "20")
    assert conf["partitioner"] == "murmur2_random" and conf["acks"] == "all"  # the rest of the defaults kept
    other = kafka.producer_config(KafkaSettings())
    assert (other["compression.type"], other["linger.ms"]) == ("lz4", "20")


def test_the_setting_from_the_environment_wins_over_kafka_config_and_yields_to_the_caller(monkeypatch, tmp_path):
    monkeypatch.setenv("GPULEDGER_KAFKA__TELEMETRY__COMPRESSION_TYPE", "gzip")
    monkeypatch.setenv("GPULEDGER_KAFKA__TELEMETRY__LINGER_MS", "5")
    monkeypatch.setenv("GPULEDGER_KAFKA__CONFIG", '{"compression.type": "snappy"}')
    s = Settings(state_dir=tmp_path)
    conf = kafka.producer_config(s.kafka, telemetry=True)
    assert (conf["compression.type"], conf["linger.ms"]) == ("gzip", "5")
    assert kafka.producer_config(s.kafka)["compression.type"] == "snappy"  # other producers: kafka.config
    assert kafka.producer_config(s.kafka, telemetry=True, **{"linger.ms": "0"})["linger.ms"] == "0"


def test_an_unknown_codec_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("GPULEDGER_KAFKA__TELEMETRY__COMPRESSION_TYPE", "brotli")
    with pytest.raises(ConfigError, match=r"kafka\.telemetry\.compression_type"):
        Settings(state_dir=tmp_path)


def test_the_telemetry_commands_publisher_is_built_with_it(monkeypatch, tmp_path):
    built: list[dict[str, object]] = []

    class Recorded:  # stands in for confluent_kafka.Producer: what the client would be configured with
        def __init__(self, conf: dict[str, object]) -> None:
            built.append(conf)

    monkeypatch.setattr(kafka, "Producer", Recorded)
    s = Settings(state_dir=tmp_path, kafka=KafkaSettings(telemetry={"compression_type": "lz4", "linger_ms": 50}))
    telemetry_service.telemetry_publisher(s)
    telemetry_service.telemetry_publisher(Settings(state_dir=tmp_path))
    assert [(c["compression.type"], c["linger.ms"]) for c in built] == [("lz4", "50"), ("zstd", "20")]
    assert all(callable(c["error_cb"]) for c in built)
