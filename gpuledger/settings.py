"""One settings object per process, built at the entry point and passed down.

Sources, highest priority first: constructor arguments, environment (`GPULEDGER_` prefix, nested
sections joined with `__`, e.g. `GPULEDGER_KAFKA__BOOTSTRAP_SERVERS`), a TOML file (`GPULEDGER_CONFIG`
or `./gpuledger.toml`), defaults. Secrets are `SecretStr` and may also be read from a file
(`*_file` fields) so they never need to sit in the environment or on a command line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_data_dir
from pydantic import BaseModel, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gpuledger.errors import ConfigError
from processors.config import ProcessorSettings

MASK = "**********"
# librdkafka/Java client keys whose value is a secret (`sasl.jaas.config` carries a password).
_SECRET_WORDS = ("password", "secret", "jaas", "token", "credentials", "user.info", "oauthbearer.config")
_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def _read_secret_file(path: Path | None) -> SecretStr | None:
    if path is None:
        return None
    try:
        return SecretStr(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise ValueError(f"cannot read the secret file {path}: {exc.strerror}") from None


def describe_invalid(exc: ValidationError) -> str:
    """One line naming each bad setting and why, never its value (it may be a password or token)."""
    problems = [
        f"{'.'.join(str(part) for part in err['loc']) or '(settings)'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False, include_context=False)
    ]
    return "invalid settings: " + "; ".join(problems)


class KafkaSettings(BaseModel):
    """Kafka client configuration, passed through with the clients' standard keys."""

    bootstrap_servers: str = "127.0.0.1:19092"
    # Any librdkafka/Java client key (`security.protocol`, `sasl.mechanism`, `ssl.ca.location`, ...).
    config: dict[str, str] = Field(default_factory=dict)
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_password_file: Path | None = None
    schema_registry_url: str | None = None
    topic_prefix: str = ""

    @model_validator(mode="after")
    def _password_from_file(self) -> KafkaSettings:
        if self.sasl_password is None and self.sasl_password_file is not None:
            self.sasl_password = _read_secret_file(self.sasl_password_file)
        return self

    def client_config(self) -> dict[str, str]:
        """librdkafka configuration with standard keys; carries the secret, so never log it."""
        conf = {"bootstrap.servers": self.bootstrap_servers, **self.config}
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        return conf

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"


class ClickHouseSettings(BaseModel):
    """Where the warehouse is: a real server/cluster, or the embedded chDB-backed server."""

    url: str = "http://127.0.0.1:8123"
    database: str = "gpuledger"
    user: str = "gpuledger"
    password: SecretStr = SecretStr("")
    password_file: Path | None = None
    analyst_user: str = "analyst"
    analyst_password: SecretStr = SecretStr("")
    analyst_password_file: Path | None = None
    # Run the embedded server (chDB behind the ClickHouse HTTP interface) under `gpuledger up`.
    embedded: bool = True
    embedded_path: Path | None = None  # default: <state_dir>/clickhouse
    raw_sample_ttl_days: int = 14

    @model_validator(mode="after")
    def _passwords_from_files(self) -> ClickHouseSettings:
        if self.password_file is not None:
            self.password = _read_secret_file(self.password_file) or self.password
        if self.analyst_password_file is not None:
            self.analyst_password = _read_secret_file(self.analyst_password_file) or self.analyst_password
        return self

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].split(":", 1)[0].split("/", 1)[0]

    @property
    def port(self) -> int:
        rest = self.url.split("://", 1)[-1].split("/", 1)[0]
        return int(rest.rsplit(":", 1)[1]) if ":" in rest else 8123


class ChatRoute(BaseModel):
    """Where alerts for a user, a team or everyone else go: an apprise URL (secret: it carries the
    webhook token) and the channel or direct-message name shown in the message."""

    url: SecretStr
    channel: str = ""


class ChatSettings(BaseModel):
    """Chat alerts (sinks/chat.py): routing table, dedupe, rate limit; dry-run logs instead of sending."""

    dry_run: bool = False
    users: dict[str, ChatRoute] = Field(default_factory=dict)
    teams: dict[str, ChatRoute] = Field(default_factory=dict)
    default: ChatRoute | None = None
    rate_limit_per_minute: int = 20  # per destination
    dedupe_window: int = 10_000  # alert ids remembered
    appeal_route: str = "reply in this thread or open a ticket with the platform team"
    kinds: list[str] = Field(default_factory=lambda: ["IDLE_WARNING", "RECLAIM_NOTICE", "COVERAGE_GAP"])


class SinksSettings(BaseModel):
    """The ClickHouse sinks, rate card, chat alerts and reclaim executor (sinks/)."""

    group_id: str = "gpuledger-sinks"
    topics: list[str] = Field(default_factory=list)  # empty: every topic the sinks know
    batch_max_records: int = 5000
    batch_max_wait_s: float = 1.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 10.0
    ratecard_path: Path | None = None  # default: the card shipped in sinks/ratecard.toml
    reclaim_dry_run: bool = True
    reclaim_checkpoint_signal: str = "USR1"
    reclaim_checkpoint_grace_s: float = 120.0
    chat: ChatSettings = Field(default_factory=ChatSettings)


class BrokerSettings(BaseModel):
    """The local Apache Kafka broker that `gpuledger up` runs when no external cluster is configured."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 19092
    controller_port: int = 19093
    heap: str = "512m"
    kafka_version: str = "4.1.1"
    # "sasl_ssl": the client port speaks SASL/SCRAM-SHA-512 over TLS (no plaintext port), with a CA,
    # certificate and passwords under <state_dir>/security; clients pick it up (gpuledger/security.py).
    security: Literal["plaintext", "sasl_ssl"] = "plaintext"


class MetricsSettings(BaseModel):
    """Each long-running process serves Prometheus metrics (gpuledger/metrics.py, docs/operations.md)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    # Component ports are base_port + a fixed offset (processors +1, sinks +2, chat +3, reclaim +4,
    # simulator +5, dcgm +6); 0: any free port. The port bound is in <state_dir>/metrics/<component>.port.
    base_port: int = 9470
    lag_refresh_s: float = 2.0


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GPULEDGER_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    state_dir: Path = Field(default_factory=lambda: Path(user_data_dir("gpuledger")))
    cluster: str = "sim"
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    sinks: SinksSettings = Field(default_factory=SinksSettings)
    processor: ProcessorSettings = Field(default_factory=ProcessorSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    # Extra sections owned by later components (producers, processors, sinks) live here as they land.
    extra: dict[str, Any] = Field(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            # pydantic's own message quotes the rejected input, which can be a secret: say what and
            # where, not the value, and drop the original (`from None`) so no traceback shows it.
            raise ConfigError(describe_invalid(exc)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = Path(os.environ.get("GPULEDGER_CONFIG", "gpuledger.toml"))
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=toml_path),
            file_secret_settings,
        )

    @model_validator(mode="after")
    def _local_broker_security(self) -> Settings:
        if self.broker.enabled and self.broker.security == "sasl_ssl":
            from gpuledger.security import apply_client_security

            apply_client_security(self)  # SASL_SSL client keys and login, unless set explicitly
        return self

    @property
    def clickhouse_path(self) -> Path:
        return self.clickhouse.embedded_path or self.state_dir / "clickhouse"

    def masked(self) -> dict[str, Any]:
        """The settings as plain data with every secret masked: safe to print or log."""
        data = self.model_dump(mode="json")
        kafka_conf = data["kafka"]["config"]
        for key in list(kafka_conf):
            if any(word in key for word in _SECRET_WORDS) or key.endswith((".key", "key.pem")):
                kafka_conf[key] = MASK
        for section, key in (
            ("kafka", "sasl_password"),
            ("clickhouse", "password"),
            ("clickhouse", "analyst_password"),
        ):
            if data[section].get(key):
                data[section][key] = MASK
        for section, key in (("kafka", "schema_registry_url"), ("clickhouse", "url")):
            if data[section].get(key):  # `https://user:password@host` keeps the host, not the login
                data[section][key] = _URL_USERINFO.sub(MASK + "@", data[section][key])
        chat = data["sinks"]["chat"]
        for route in [*chat["users"].values(), *chat["teams"].values(), chat["default"]]:
            if route:
                route["url"] = MASK
        return data
