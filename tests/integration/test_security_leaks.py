"""No secret appears in any output, log or command line.

A real `gpuledger up` in a tmp state dir with the SASL_SSL broker on, configured with a Kafka
password, ClickHouse writer and analyst passwords, and chat webhook URLs whose paths carry tokens
(one reachable receiver, one dead endpoint so the failure path logs too). Then `settings`,
`status` (table and `--json`), `db migrate`, an alert through `chat run`, commands that fail
(wrong ClickHouse password, wrong Kafka password, unreachable ClickHouse), and `down`. Every
stdout/stderr, every file under the state dir (logs, pid files, broker logs, data) and every
component's command line is searched for every secret, wrong passwords included. The only files
allowed to hold a secret are the 0600 credential stores under `<state_dir>/security/`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from base.settings import Settings
from schemas.topics import ALERTS, job_key
from sinks.chat import WebhookReceiver
from stack import broker
from stack.security import component_env
from streams.publish import RecordPublisher

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
CLI = "from gpuledger.cli import main; main()"


class Outputs:
    """Every command run, with what it printed, for the final search."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.seen: list[tuple[str, str]] = []

    def run(self, *args: str, timeout: float = 300, **env: str | None) -> subprocess.CompletedProcess[str]:
        merged = {k: v for k, v in {**self.env, **env}.items() if v is not None}  # None: unset
        proc = subprocess.run(
            [sys.executable, "-c", CLI, *args],
            env=merged,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.seen.append((" ".join(args), proc.stdout + proc.stderr))
        return proc


def _secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


def _cmdlines(pids: set[int]) -> list[str]:
    out = []
    for pid in pids:
        for member in {pid, *broker.group_members(pid)}:
            try:
                out.append(Path(f"/proc/{member}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                continue
    return out


def test_no_secret_in_outputs_logs_or_command_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = uuid.uuid4().hex[:10]
    kafka_pw = f"kafkaPW{tag}"
    ch_pw = f"chWriterPW{tag}"
    analyst_pw = f"chAnalystPW{tag}"
    hook_token = f"HOOKTOKEN{tag}"
    dead_token = f"DEADTOKEN{tag}"
    wrong_ch_pw = f"wrongChPW{tag}"
    wrong_kafka_pw = f"wrongKafkaPW{tag}"
    registry_pw = f"registryPW{tag}"
    secrets = [kafka_pw, ch_pw, analyst_pw, hook_token, dead_token, wrong_ch_pw, wrong_kafka_pw, registry_pw]

    port, controller_port, ch_port, dead_port, registry_port = broker.free_ports(5)
    receiver = WebhookReceiver(port=0).start()
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir(mode=0o700)
    config = tmp_path / "gpuledger.toml"
    config.write_text(
        "[sinks.chat.default]\n"
        f'url = "json://127.0.0.1:{receiver.port}/hooks/{hook_token}"\n'
        'channel = "#gpu-alerts"\n'
        "[sinks.chat.teams.vision]\n"
        f'url = "json://127.0.0.1:{dead_port}/hooks/{dead_token}"\n'
        'channel = "#vision"\n',
        encoding="utf-8",
    )
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_")}
    gl = {
        "GPULEDGER_CONFIG": str(config),
        "GPULEDGER_STATE_DIR": str(state),
        "GPULEDGER_BROKER__SECURITY": "sasl_ssl",
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(controller_port),
        "GPULEDGER_REGISTRY__PORT": str(registry_port),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "GPULEDGER_KAFKA__SASL_PASSWORD_FILE": str(_secret_file(secrets_dir / "kafka", kafka_pw)),
        "GPULEDGER_CLICKHOUSE__URL": f"http://127.0.0.1:{ch_port}",
        "GPULEDGER_CLICKHOUSE__PASSWORD_FILE": str(_secret_file(secrets_dir / "ch", ch_pw)),
        "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD_FILE": str(_secret_file(secrets_dir / "analyst", analyst_pw)),
        "GPULEDGER_SINKS__CHAT__RATE_LIMIT_PER_MINUTE": "100",
        # Not the simulated cluster: `up` runs no simulator, so the stack's chat sees only this test's alerts.
        "GPULEDGER_CLUSTER": "leaks",
    }
    env.update(gl)
    for key, value in gl.items():  # the in-process publisher below builds the same settings
        monkeypatch.setenv(key, value)
    cli = Outputs(env)
    pids: set[int] = set()
    try:
        up = cli.run("up")
        assert up.returncode in (0, 2), up.stdout + up.stderr  # 2: a component not landed yet says so
        status = cli.run("status", "--json")
        st = json.loads(status.stdout)
        comps = {c["name"]: c for c in st["components"]}
        assert comps["broker"]["state"] == "ready" and comps["clickhouse"]["state"] == "ready", st
        assert "SASL_SSL" in comps["broker"]["detail"] and st["broker_reachable"], st
        pids.update(c["pid"] for c in st["components"] if c["pid"])
        cmdlines = _cmdlines(pids)
        assert any("kafka.Kafka" in c for c in cmdlines), cmdlines

        assert cli.run("db", "migrate").returncode == 0, cli.seen[-1]
        cli.run("status")
        settings_out = cli.run("settings")
        assert settings_out.returncode == 0 and json.loads(settings_out.stdout)["kafka"]["sasl_password"]

        # One alert to the reachable webhook, one to the dead endpoint: both paths log.
        settings = Settings()
        assert settings.kafka.config["security.protocol"] == "SASL_SSL"
        alert: dict[str, Any] = {
            "alert_id": f"idle-{tag}", "kind": "IDLE_WARNING", "ts_ms": 1_795_000_000_000, "cluster": "sim",
            "job_id": "88", "node": "n1", "device_uuids": ["GPU-aa11"], "user": "bob", "team": "nlp",
            "project": "p-nlp", "idle_minutes": 40, "cost_so_far": 2.17, "action": "REQUEUE",
            "action_at_ms": 1_795_000_900_000, "dry_run": True, "message": "Job 88 has held 1 GPU idle for 40 minutes.",
            "appeal_route": "reply here", "emitted_ts_ms": None,
        }  # fmt: skip
        # The test stands in for the processors; it publishes as the admin principal (a super user), as the
        # ACLs themselves are tested in test_security_kafka.py.
        for key, value in component_env(settings, "admin").items():
            monkeypatch.setenv(key, value)
        for key in ("GPULEDGER_KAFKA__SASL_PASSWORD_FILE", "GPULEDGER_KAFKA__SASL_PASSWORD"):
            monkeypatch.delenv(key, raising=False)  # the principal's own password file, under security/
        publisher = RecordPublisher(Settings().kafka)
        publisher.publish(ALERTS, job_key("sim", "88"), alert)
        publisher.publish(ALERTS, job_key("sim", "89"), {**alert, "alert_id": f"idle2-{tag}", "job_id": "89",
                                                          "team": "vision"})  # fmt: skip
        publisher.flush()
        # The stack's own `chat` component (started by `up`) delivers them; its log is searched below too.
        chat_log = state / "logs" / "chat.log"
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline:
            text = chat_log.read_text(errors="replace") if chat_log.exists() else ""
            if receiver.received and f"idle-{tag} sent" in text and f"idle2-{tag} failed" in text:
                break
            time.sleep(0.5)
        assert receiver.received  # the reachable route got its alert through the SASL_SSL pipeline
        assert f"idle-{tag} sent" in text and f"idle2-{tag} failed" in text, text[-2000:]  # both routes tried
        # What the chat sink recorded (ClickHouse parts are compressed, so read them back as text).
        for _ in range(20):  # the delivery row is inserted just after the log line
            recorded = cli.run("sql", "SELECT * FROM chat_deliveries FINAL", "--format", "csv")
            if recorded.returncode != 0 or f"idle-{tag}" in recorded.stdout:
                break
            time.sleep(0.5)
        assert recorded.returncode == 0 and f"idle-{tag}" in recorded.stdout, recorded.stdout + recorded.stderr

        # Commands that fail, with wrong secrets and with the right ones.
        wrong_ch = {"GPULEDGER_CLICKHOUSE__PASSWORD_FILE": None, "GPULEDGER_CLICKHOUSE__PASSWORD": wrong_ch_pw}
        failed = cli.run("sql", "SELECT 1", "--writer", **wrong_ch)
        assert failed.returncode == 2 and "error:" in failed.stderr, failed.stderr
        assert cli.run("db", "migrate", **wrong_ch).returncode != 0
        wrong_analyst = {"GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD_FILE": None,
                         "GPULEDGER_CLICKHOUSE__ANALYST_PASSWORD": wrong_ch_pw}  # fmt: skip
        failed = cli.run("sql", "SELECT 1", **wrong_analyst)  # `sql` logs in as the analyst by default
        assert failed.returncode == 2 and "error:" in failed.stderr, failed.stderr
        assert cli.run("report", "chargeback", "--period", "2026-11", **wrong_analyst).returncode != 0
        assert cli.run("status", "--json", **wrong_ch).returncode == 1
        dead_ch = {"GPULEDGER_CLICKHOUSE__URL": f"http://127.0.0.1:{dead_port}"}
        assert cli.run("sql", "SELECT 1", **dead_ch).returncode == 2
        wrong_kafka = {"GPULEDGER_KAFKA__SASL_PASSWORD_FILE": None, "GPULEDGER_KAFKA__SASL_PASSWORD": wrong_kafka_pw}
        bad_status = cli.run("status", "--json", **wrong_kafka)
        assert bad_status.returncode == 1 and json.loads(bad_status.stdout)["broker_reachable"] is False
        assert cli.run("simulate", "run", "--fast", "--nodes", "1", "--duration", "60", timeout=120,
                       **wrong_kafka).returncode != 0  # fmt: skip
        # Settings that are wrong, or hold secrets in places people put them: one line, no value.
        bad = cli.run("settings", GPULEDGER_SINKS__CHAT__DEFAULT=json.dumps([f"json://127.0.0.1/{hook_token}"]))
        assert bad.returncode == 2 and bad.stderr.startswith("error: invalid settings: sinks.chat.default"), bad
        missing = cli.run("status", GPULEDGER_KAFKA__SASL_PASSWORD_FILE=str(tmp_path / "absent"))
        assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
        registry = cli.run(
            "settings",
            GPULEDGER_KAFKA__SCHEMA_REGISTRY_URL=f"https://bob:{registry_pw}@127.0.0.1:1",
            GPULEDGER_KAFKA__CONFIG=json.dumps({"basic.auth.user.info": f"bob:{registry_pw}",
                                                "sasl.jaas.config": f'x password="{registry_pw}";'}),
            GPULEDGER_EXTRA=json.dumps({"registry": {"url": f"https://bob:{registry_pw}@r.example/p.csv?token={registry_pw}",
                                                     "api_key": registry_pw}}),
        )  # fmt: skip
        assert registry.returncode == 0 and "127.0.0.1:1" in registry.stdout, registry.stderr
        cmdlines = _cmdlines(pids)  # still running: nothing secret in any argv
    finally:
        receiver.stop()
        down = cli.run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert not any(broker.pid_alive(pid) for pid in pids)

    leaks = []
    for what, text in cli.seen:
        leaks += [f"output of `gpuledger {what}`: {s}" for s in secrets if s in text]
    for line in cmdlines:
        leaks += [f"command line {line[:80]}: {s}" for s in secrets if s in line]
    stores = state / "security"
    for path in sorted(p for p in state.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found = [s for s in secrets if s.encode() in data]
        if found and path.parent == stores:
            assert path.stat().st_mode & 0o077 == 0, path  # a credential store: owner only
            assert found == [kafka_pw], (path, found)  # and it holds the Kafka login, nothing else
            continue
        leaks += [f"{path.relative_to(state)}: {s}" for s in found]
    assert not leaks, "\n".join(leaks)
    # The search does find a secret where one is kept on purpose (the Java clients' login file).
    assert kafka_pw in (stores / "client.properties").read_text()
    assert list(state.joinpath("logs").glob("*.log")), "the stack wrote no logs to search"
