import pytest
from pydantic import SecretStr

from base.settings import MASK, Settings


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


def test_masked_hides_logins_and_tokens_in_extra_and_urls(tmp_path):
    s = Settings(
        state_dir=tmp_path,
        extra={
            "registry": {"url": "https://bob:extrapw@reg.example/projects.csv?token=extratok", "api_key": "ak-1"},
            "mirrors": ["https://cdn.example/x?sig=sigval&v=2"],
        },
    )
    s.kafka.config["sasl.oauthbearer.token.endpoint.url"] = "https://idp.example/token?client_secret=clientsec9"
    s.kafka.config["ssl.ca.location"] = "/etc/ssl/ca.pem"
    s.kafka.schema_registry_url = "https://reg:regpw@sr.example:8081/?apikey=srkey"
    data = s.masked()
    text = str(data)
    for secret in ("extrapw", "extratok", "ak-1", "sigval", "clientsec9", "regpw", "srkey"):
        assert secret not in text, secret
    assert data["extra"]["registry"]["url"] == f"https://{MASK}@reg.example/projects.csv?token={MASK}"
    assert data["extra"]["mirrors"] == [f"https://cdn.example/x?sig={MASK}&v=2"]
    assert data["kafka"]["config"]["ssl.ca.location"] == "/etc/ssl/ca.pem"  # a path, shown
    assert data["kafka"]["schema_registry_url"].startswith(f"https://{MASK}@sr.example:8081/")


# -- the producers' typed sections (scheduler, dcgm) --------------------------------------------------


def _cli(tmp_path, toml: str, *args: str):
    import os
    import subprocess
    import sys

    cfg = tmp_path / "gpuledger.toml"
    cfg.write_text(toml)
    env = {**os.environ, "GPULEDGER_CONFIG": str(cfg), "GPULEDGER_STATE_DIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-c", "from gpuledger.cli import main; main()", *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('[scheduler]\nregistyr = "/etc/p.yaml"\n', "scheduler.registyr: unknown key (known: registry, directory"),
        ('[scheduler]\nmode = "hard"\n', "scheduler.mode: Input should be 'grace' or 'strict'"),
        ('[scheduler]\nslurm_timezone = "Mars/Olympus"\n', "scheduler.slurm_timezone: Value error, an IANA time zone"),
        ('[dcgm]\ntargets = ["ftp://n1:9400"]\n', "dcgm.targets: Value error, each target is an http(s) URL"),
    ],
)
def test_a_bad_producer_setting_is_one_line_naming_the_key(tmp_path, toml: str, expected: str) -> None:
    result = _cli(tmp_path, toml, "settings")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert expected in line and "Traceback" not in result.stderr


def test_gpuledger_settings_shows_the_producer_sections_masked(tmp_path) -> None:
    toml = (
        '[scheduler]\nregistry = "https://bob:regpw@reg.example/projects.csv"\nmode = "strict"\n'
        '[dcgm]\ntargets = ["http://n1:9400/metrics", {url_template = "http://{node}:9400/metrics", nodes = ["n2"]}]\n'
    )
    result = _cli(tmp_path, toml, "settings")
    assert result.returncode == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["scheduler"]["mode"] == "strict" and data["scheduler"]["slurm_timezone"] == "UTC"
    assert data["scheduler"]["registry"] == f"https://{MASK}@reg.example/projects.csv"
    assert data["dcgm"]["targets"][0] == "http://n1:9400/metrics"
    assert data["dcgm"]["targets"][1]["nodes"] == ["n2"]
    assert "regpw" not in result.stdout


def test_the_old_extra_sections_are_still_read_with_a_deprecation_line(tmp_path, monkeypatch, caplog) -> None:
    cfg = tmp_path / "gpuledger.toml"
    cfg.write_text(
        '[extra.scheduler]\nmode = "strict"\nregistry = "/etc/p.yaml"\n'
        '[extra.dcgm]\ntargets = ["http://n1:9400/metrics"]\n'
    )
    monkeypatch.setenv("GPULEDGER_CONFIG", str(cfg))
    monkeypatch.setenv("GPULEDGER_SCHEDULER__REGISTRY", "/etc/new.yaml")  # the new spelling wins a tie
    monkeypatch.setattr("base.settings._warned", set())
    with caplog.at_level("WARNING", logger="gpuledger.settings"):
        s = Settings(state_dir=tmp_path)
    assert (s.scheduler.mode, s.scheduler.registry) == ("strict", "/etc/new.yaml")
    assert s.dcgm.targets == ["http://n1:9400/metrics"]
    assert s.extra == {}
    assert "[extra.scheduler]" in caplog.text and "use [scheduler]" in caplog.text and "use [dcgm]" in caplog.text
