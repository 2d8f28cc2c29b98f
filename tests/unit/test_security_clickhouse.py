"""ClickHouse passwords for the embedded server: generated once by `up`, read by every `Settings`,
configured ones win; the state directory is its owner's alone; `clickhouse dsn` and the CSV of `sql`."""

from __future__ import annotations

import ast
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from pydantic import SecretStr

from base.errors import ConfigError
from base.settings import Settings
from stack import security
from stack.clickhouse.service import dsn_text, neutralise_clickhouse_csv


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ("PASSWORD", "PASSWORD_FILE", "ANALYST_PASSWORD", "ANALYST_PASSWORD_FILE", "EMBEDDED"):
        monkeypatch.delenv(f"GPULEDGER_CLICKHOUSE__{key}", raising=False)
    monkeypatch.setenv("GPULEDGER_CONFIG", str(tmp_path / "absent.toml"))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_up_generates_both_passwords_once_and_every_settings_reads_them(tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = Settings(state_dir=state)
    assert before.clickhouse.password.get_secret_value() == ""  # nothing generated yet

    progress: list[str] = []
    security.ensure_clickhouse_passwords(before, progress=progress.append)
    writer_file = security.clickhouse_password_file(state, "writer")
    analyst_file = security.clickhouse_password_file(state, "analyst")
    assert writer_file.name == "clickhouse-writer.password" and analyst_file.name == "clickhouse-analyst.password"
    assert _mode(writer_file) == _mode(analyst_file) == 0o600 and _mode(writer_file.parent) == 0o700
    writer, analyst = writer_file.read_text().strip(), analyst_file.read_text().strip()
    assert len(writer) >= 32 and len(analyst) >= 32 and writer != analyst
    assert len(progress) == 2 and all("ClickHouse" in line and writer not in line for line in progress)
    # The settings of the `up` process are completed in place ...
    assert before.clickhouse.password.get_secret_value() == writer
    assert before.clickhouse.analyst_password.get_secret_value() == analyst
    # ... and every other process (a new Settings on the same state dir) reads the same files.
    after = Settings(state_dir=state)
    assert after.clickhouse.password.get_secret_value() == writer
    assert after.clickhouse.analyst_password.get_secret_value() == analyst
    # A second `up` keeps them.
    security.ensure_clickhouse_passwords(Settings(state_dir=state))
    assert writer_file.read_text().strip() == writer and analyst_file.read_text().strip() == analyst
    # They are not in what `gpuledger settings` prints.
    assert writer not in str(after.masked()) and analyst not in str(after.masked())


def test_a_configured_password_wins_and_no_file_is_written_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    own = tmp_path / "writer.pw"
    own.write_text("from-my-file\n")
    monkeypatch.setenv("GPULEDGER_CLICKHOUSE__PASSWORD_FILE", str(own))
    monkeypatch.setenv("GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD", "from-env")
    settings = Settings(state_dir=state)
    security.ensure_clickhouse_passwords(settings)
    assert not security.clickhouse_password_file(state, "writer").exists()
    assert not security.clickhouse_password_file(state, "analyst").exists()
    assert settings.clickhouse.password.get_secret_value() == "from-my-file"
    assert settings.clickhouse.analyst_password.get_secret_value() == "from-env"

    # An explicitly configured password also wins over a file generated earlier.
    monkeypatch.delenv("GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD")
    security.ensure_clickhouse_passwords(Settings(state_dir=state))
    assert Settings(state_dir=state).clickhouse.analyst_password.get_secret_value() != "from-env"
    monkeypatch.setenv("GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD", "from-env")
    assert Settings(state_dir=state).clickhouse.analyst_password.get_secret_value() == "from-env"


def test_an_external_clickhouse_never_gets_the_local_passwords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    security.ensure_clickhouse_passwords(Settings(state_dir=state))
    monkeypatch.setenv("GPULEDGER_CLICKHOUSE__EMBEDDED", "false")
    external = Settings(state_dir=state)
    assert external.clickhouse.password.get_secret_value() == ""
    assert external.clickhouse.analyst_password.get_secret_value() == ""


def test_existing_state_and_security_dirs_are_tightened(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "security").mkdir(parents=True)
    state.chmod(0o755)
    (state / "security").chmod(0o755)
    loose = state / "security" / "clickhouse-analyst.password"
    loose.write_text("copied-in\n")
    loose.chmod(0o644)
    (state / "security" / "ca.pem").write_text("public\n")
    (state / "security" / "ca.pem").chmod(0o644)
    security.private_state_dir(state)
    assert _mode(state) == 0o700 and _mode(state / "security") == 0o700
    assert _mode(loose) == 0o600
    assert _mode(state / "security" / "ca.pem") == 0o644  # the CA certificate is public on purpose
    fresh = tmp_path / "new" / "state"
    security.private_state_dir(fresh)
    assert _mode(fresh) == 0o700


def _settings_with(tmp_path: Path, writer: str, analyst: str, **ch: object) -> Settings:
    settings = Settings(state_dir=tmp_path / "state")
    settings.clickhouse.password = SecretStr(writer)
    settings.clickhouse.analyst_password = SecretStr(analyst)
    for key, value in ch.items():
        setattr(settings.clickhouse, key, value)
    return settings


def test_dsn_is_what_tools_paste_with_the_password_quoted(tmp_path: Path) -> None:
    tricky = "p@ss:w/rd?#%'\""
    settings = _settings_with(tmp_path, "w-secret", tricky, url="http://127.0.0.1:18123")
    text = dsn_text(settings)
    url = urlsplit(text.splitlines()[0])
    assert (url.scheme, url.hostname, url.port, url.path) == ("http", "127.0.0.1", 18123, "/gpuledger")
    assert unquote(url.username or "") == "analyst" and unquote(url.password or "") == tricky
    assert "w-secret" not in text  # the analyst's, not the writer's
    # The clickhouse-connect snippet is valid Python whose call carries the same login.
    snippet = "\n".join(line for line in text.splitlines() if line and not line.startswith(("#", "http")))
    call = ast.parse(snippet).body[1]
    assert isinstance(call, ast.Assign) and isinstance(call.value, ast.Call)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.value.keywords}
    assert kwargs == {"host": "127.0.0.1", "port": 18123, "username": "analyst", "password": tricky,
                      "database": "gpuledger"}  # fmt: skip
    writer = urlsplit(dsn_text(settings, writer=True).splitlines()[0])
    assert (writer.username, writer.password) == ("gpuledger", "w-secret")


def test_dsn_without_a_password_says_how_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="gpuledger up"):
        dsn_text(_settings_with(tmp_path, "w", ""))
    external = dsn_text(_settings_with(tmp_path, "w", "", embedded=False, url="https://ch.example:8443"))
    assert external.splitlines()[0] == "https://analyst@ch.example:8443/gpuledger"  # no password to show
    assert "interface='https'" in external


def test_sql_csv_neutralises_formula_cells_and_keeps_the_rest() -> None:
    server = '"project","charge","note"\n"=HYPERLINK(""http://x"")",-12.5,"ok"\n"@evil",3,"-1+1"\n"a""b",\\N,"+"\n'
    assert neutralise_clickhouse_csv(server) == (
        '"project","charge","note"\n"\'=HYPERLINK(""http://x"")",-12.5,"ok"\n"\'@evil",3,"\'-1+1"\n"a""b",\\N,"\'+"\n'
    )
