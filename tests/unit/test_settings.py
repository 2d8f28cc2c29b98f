from pydantic import SecretStr

from gpuledger.settings import MASK, Settings


def test_env_overrides_nested_kafka_keys(monkeypatch, tmp_path):
    monkeypatch.setenv("GPULEDGER_KAFKA__BOOTSTRAP_SERVERS", "broker:9093")
    monkeypatch.setenv("GPULEDGER_KAFKA__CONFIG", '{"security.protocol": "SASL_SSL"}')
    monkeypatch.setenv("GPULEDGER_KAFKA__SASL_PASSWORD", "hunter2")
    s = Settings(state_dir=tmp_path)
    conf = s.kafka.client_config()
    assert conf["bootstrap.servers"] == "broker:9093"
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.password"] == "hunter2"


def test_masked_hides_every_secret(tmp_path):
    s = Settings(state_dir=tmp_path)
    s.kafka.sasl_password = SecretStr("kafka-secret")
    s.kafka.config["ssl.key.password"] = "key-secret"
    s.clickhouse.password = SecretStr("ch-secret")
    text = str(s.masked())
    for secret in ("kafka-secret", "key-secret", "ch-secret"):
        assert secret not in text
    assert MASK in text


def test_toml_file_and_secret_file(monkeypatch, tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = tmp_path / "gpuledger.toml"
    cfg.write_text(
        f'cluster = "prod"\n[clickhouse]\nurl = "http://ch:8124"\npassword_file = "{secret}"\n'
    )
    monkeypatch.setenv("GPULEDGER_CONFIG", str(cfg))
    s = Settings(state_dir=tmp_path)
    assert s.cluster == "prod"
    assert s.clickhouse.port == 8124
    assert s.clickhouse.host == "ch"
    assert s.clickhouse.password.get_secret_value() == "from-file"
