"""One settings object per process, built at the entry point and passed down.

Sources, highest priority first: constructor arguments, environment (`GPULEDGER_` prefix, nested
sections joined with `__`, e.g. `GPULEDGER_KAFKA__BOOTSTRAP_SERVERS`), a TOML file (`GPULEDGER_CONFIG`
or `./gpuledger.toml`), defaults. Secrets are `SecretStr` and may also be read from a file
(`*_file` fields) so they never need to sit in the environment or on a command line.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from platformdirs import user_data_dir
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from base.errors import ConfigError
from base.outputs import MASK, mask_data, mask_text
from base.processor_settings import ProcessorSettings
from base.producer_settings import DcgmSettings, SchedulerSettings


def _read_secret_file(path: Path | None) -> SecretStr | None:
    if path is None:
        return None
    try:
        return SecretStr(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise ValueError(f"cannot read the secret file {path}: {exc.strerror}") from None


def describe_invalid(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line naming each bad setting and why, never its value (it may be a password or token); an
    unknown key of a section that refuses them lists the keys it knows (from `model`, the root)."""
    problems = []
    for err in exc.errors(include_url=False, include_input=False, include_context=False):
        msg = err["msg"]
        known = _known_keys(model, err["loc"][:-1]) if err["type"] == "extra_forbidden" else None
        if known is not None:
            msg = f"unknown key (known: {', '.join(known)})"
        problems.append(f"{'.'.join(str(part) for part in err['loc']) or '(settings)'}: {msg}")
    return "invalid settings: " + "; ".join(problems)


def _known_keys(model: type[BaseModel] | None, loc: tuple[int | str, ...]) -> list[str] | None:
    """The field names of the section at `loc` below `model`, when that is a plain nested section."""
    for part in loc:
        field = model.model_fields.get(str(part)) if model is not None else None
        annotation = field.annotation if field is not None else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return list(model.model_fields) if model is not None else None


SUBJECT_PLACEHOLDERS = frozenset({"topic", "record"})


class TelemetryProducerSettings(BaseModel):
    """How the telemetry producers (dcgm, nvsmi, the simulator, the replay load generator) batch and compress:
    they write the fleet's largest topic, `telemetry.device-samples`, a record a node a second.

    The defaults are the measured case (docs/benchmarks.md, "The broker's cost per GPU against the producer's
    settings"): zstd keeps a scrape in about half the bytes of lz4 on disk, on the network and in every replica (251
    against 493), for ~2 us more of the exporter's CPU a scrape and ~35% more broker CPU (it validates compressed
    batches); linger 100 ms did not cut the broker's CPU consistently and adds ~70 ms to every hop, so 20 ms stays.
    The other producers keep `base.kafka.PRODUCER_DEFAULTS` (lz4): small topics, latency first. These keys win over
    the same ones in `kafka.config` for the telemetry producers."""

    model_config = ConfigDict(extra="forbid")

    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "zstd"
    linger_ms: int = Field(default=20, ge=0, le=900_000)

    def producer_config(self) -> dict[str, str]:
        """The librdkafka keys these settings set."""
        return {"compression.type": self.compression_type, "linger.ms": str(self.linger_ms)}


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
    # Replication of every topic `gpuledger topics apply` creates (the job stage's changelog too) and the
    # `min.insync.replicas` it sets on them. None: the local cluster's size when the local broker runs
    # (`broker.nodes`), else 1; min ISR None: `default_min_insync(replication)` (2 of 3).
    replication_factor: int | None = Field(default=None, ge=1)
    min_insync_replicas: int | None = Field(default=None, ge=1)
    # Registry subject of each topic's values: Confluent's TopicNameStrategy by default. Placeholders:
    # {topic} (the topic name, prefix included) and {record} (the value schema's full record name):
    # "{record}" is RecordNameStrategy, "{topic}-{record}" TopicRecordNameStrategy.
    schema_registry_subject: str = "{topic}-value"
    # The telemetry producers' batching and compression (TOML `[kafka.telemetry]`, env
    # `GPULEDGER_KAFKA__TELEMETRY__COMPRESSION_TYPE`); `base.kafka.new_telemetry_producer` applies it.
    telemetry: TelemetryProducerSettings = Field(default_factory=TelemetryProducerSettings)

    @field_validator("schema_registry_subject")
    @classmethod
    def _known_subject_placeholders(cls, template: str) -> str:
        import string

        try:
            names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        except ValueError as exc:
            raise ValueError(f"not a subject template: {exc}") from None
        unknown = names - SUBJECT_PLACEHOLDERS
        if unknown or not names:
            raise ValueError('use {topic} and/or {record} (and no other placeholder), e.g. "{topic}-value"')
        return template

    def registry_subject(self, topic: str, record: str) -> str:
        """The registry subject of `topic`'s values (`topic` as the broker names it, prefix included)."""
        return self.schema_registry_subject.format(topic=topic, record=record)

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

    @property
    def topic_replication(self) -> int:
        return self.replication_factor or 1

    def topic_min_insync(self, replication: int | None = None) -> int:
        """`min.insync.replicas` for a topic of `replication` replicas (default: `topic_replication`)."""
        rf = replication or self.topic_replication
        if self.min_insync_replicas is not None:
            return min(self.min_insync_replicas, rf)
        return default_min_insync(rf)


def default_min_insync(replication: int) -> int:
    """A majority of the replicas from 3 up (2 of 3: one broker may be down and an acks=all write still
    lands on two); 1 below 3 (with 2 replicas, a min ISR of 2 would stop every write while one is down)."""
    return replication // 2 + 1 if replication >= 3 else 1


class AnalystLimitSettings(BaseModel):
    """What one analyst query may use on the embedded server; the engine holds them (readonly)."""

    max_execution_time_s: int = Field(default=60, ge=1)
    max_memory_mb: int = Field(default=4096, ge=16)
    max_result_rows: int = Field(default=10_000_000, ge=1)
    max_result_mb: int = Field(default=1024, ge=1)
    max_threads: int = Field(default=2, ge=1)


class ClickHouseSettings(BaseModel):
    """Where the warehouse is: a real server/cluster, or the embedded chDB-backed server."""

    url: str = "http://127.0.0.1:8123"
    database: str = "gpuledger"
    user: str = "gpuledger"
    # Neither a password nor its file set, with the embedded server: the ones `gpuledger up` generates
    # under <state_dir>/security (stack/security.py), read by every process through `Settings`.
    password: SecretStr = SecretStr("")
    password_file: Path | None = None
    analyst_user: str = "analyst"
    analyst_password: SecretStr = SecretStr("")
    analyst_password_file: Path | None = None
    # Run the embedded server (chDB behind the ClickHouse HTTP interface) under `gpuledger up`.
    embedded: bool = True
    embedded_path: Path | None = None  # default: <state_dir>/clickhouse
    raw_sample_ttl_days: int = 14
    # What `raw_samples` keeps (sinks/seconds_kept.py; docs/benchmarks.md, "What ClickHouse keeps per second"):
    # every_second; sampled (the scrapes whose second is a multiple of raw_sample_every_s: at 1 in 10, 14x fewer
    # bytes and 10x fewer rows than every second, measured); minutes (none). Every second stays readable from
    # telemetry.device-samples while its retention holds it (`report seconds --from-kafka`).
    raw_samples_kept: Literal["every_second", "sampled", "minutes"] = "sampled"
    raw_sample_every_s: int = Field(default=10, ge=2, le=3600)
    # The embedded server's limits: per analyst query, connections at once, a request without data.
    analyst_limits: AnalystLimitSettings = Field(default_factory=AnalystLimitSettings)
    max_connections: int = Field(default=64, ge=1)
    max_query_kb: int = Field(default=1024, ge=4)

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
    webhook token) and the channel or direct-message name shown in the message.

    `format = "slack"`: `url` is an http(s) endpoint taking Slack's message JSON (Slack's chat.postMessage with
    `token`, a Slack incoming webhook, or a compatible one), posted by gpuledger itself so that the `ts` the
    endpoint answers with is kept, and an appeal's decision goes as a reply (`thread_ts`) in its warning's thread
    (sinks/chat.py `slack_post`). apprise cannot thread: it gives no message id back."""

    url: SecretStr
    channel: str = ""
    format: Literal["apprise", "slack"] = "apprise"
    token: SecretStr | None = None  # format slack: sent as `Authorization: Bearer` (Slack's Web API)


class ChatSettings(BaseModel):
    """Chat alerts (sinks/chat.py): routing table, dedupe, rate limit; dry-run logs instead of sending."""

    dry_run: bool = False
    users: dict[str, ChatRoute] = Field(default_factory=dict)
    teams: dict[str, ChatRoute] = Field(default_factory=dict)
    default: ChatRoute | None = None
    rate_limit_per_minute: int = 20  # per destination
    dedupe_window: int = 10_000  # alert ids remembered
    appeal_route: str = "reply in this thread or open a ticket with the platform team"
    kinds: list[str] = Field(default_factory=lambda: ["IDLE_WARNING", "RECLAIM_NOTICE", "COVERAGE_GAP", "POLICY_DRIFT"])
    # With no route configured, `up` runs a local webhook receiver on this loopback port and chat posts to it.
    local_receiver_port: int = Field(default=8765, ge=1, le=65535)


class ReservationServiceSettings(BaseModel):
    """The reservation service (`gpuledger reserve run`, sinks/reserve_cli.py): the engines it puts approved
    reservations onto and takes them off at their end. No engine: `up` does not run it (there is nothing to
    render onto), and `reserve run` wants `--engine`."""

    model_config = ConfigDict(extra="forbid")

    engines: list[Literal["slurm", "kueue"]] = Field(default_factory=list)
    every_s: float = Field(default=30.0, gt=0)  # seconds between passes
    kubeconfig: Path | None = None  # Kueue: None is in-cluster (its ServiceAccount), else ~/.kube/config


class EscalationServiceSettings(BaseModel):
    """The escalation service (`gpuledger escalate run`, sinks/escalations.py): the engines it raises granted jobs
    on and lowers them again at expiry. No engine: `up` does not run it, and `escalate run` wants `--engine`."""

    model_config = ConfigDict(extra="forbid")

    engines: list[Literal["slurm", "kueue"]] = Field(default_factory=list)
    every_s: float = Field(default=30.0, gt=0)  # seconds between passes
    kubeconfig: Path | None = None  # Kueue: None is in-cluster (its ServiceAccount), else ~/.kube/config


class SinksSettings(BaseModel):
    """The ClickHouse sinks, rate card, chat alerts, reclaim executor, reservation and escalation services (sinks/)."""

    group_id: str = "gpuledger-sinks"
    topics: list[str] = Field(default_factory=list)  # empty: every topic the sinks know
    batch_max_records: int = 5000
    batch_max_wait_s: float = 1.0
    # Raw samples handed to ClickHouse as one Avro container per batch (sinks/bulk_samples.py); false: record by record.
    bulk_raw_samples: bool = True
    retry_initial_s: float = 0.5
    retry_max_s: float = 10.0
    ratecard_path: Path | None = None  # default: the card shipped in sinks/ratecard.toml
    reclaim_dry_run: bool = True
    reclaim_checkpoint_signal: str = "USR1"
    reclaim_checkpoint_grace_s: float = 120.0
    chat: ChatSettings = Field(default_factory=ChatSettings)
    reservations: ReservationServiceSettings = Field(default_factory=ReservationServiceSettings)
    escalations: EscalationServiceSettings = Field(default_factory=EscalationServiceSettings)


class BrokerSettings(BaseModel):
    """The local Apache Kafka broker that `gpuledger up` runs when no external cluster is configured."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 19092
    controller_port: int = 19093
    heap: str = "512m"
    kafka_version: str = "4.1.1"
    # "quick": the JVM compiles with C1 only (-XX:TieredStopAtLevel=1): a broker that lives seconds to
    # minutes (tests, a short demo) starts on about half the CPU; one that runs for hours keeps "full".
    jit: Literal["full", "quick"] = "full"
    # "sasl_ssl": the client port speaks SASL/SCRAM-SHA-512 over TLS (no plaintext port), with a CA,
    # certificate and passwords under <state_dir>/security; clients pick it up (stack/security.py).
    security: Literal["plaintext", "sasl_ssl"] = "plaintext"
    # 1: one combined broker+controller. 3: a KRaft cluster on loopback, three combined nodes that are
    # the controller quorum too; node k (1-based) listens on port + NODE_PORT_STEP*(k-1) and
    # controller_port + NODE_PORT_STEP*(k-1), data in <state_dir>/kafka-cluster/node-k (one node: <state_dir>/kafka).
    nodes: int = 1

    @field_validator("nodes")
    @classmethod
    def _one_or_three(cls, nodes: int) -> int:
        if nodes not in (1, 3):  # a quorum of 2 survives no failure; more is not a loopback stack
            raise ValueError("1 (a single node) or 3 (a KRaft cluster that survives one node down)")
        return nodes

    def node_ports(self, node: int) -> tuple[int, int]:
        """(client port, controller port) of node `node` (1-based) of the local cluster."""
        step = NODE_PORT_STEP * (node - 1)
        return self.port + step, self.controller_port + step

    def bootstrap(self) -> str:
        """Every node's client address: a client starting while one node is down still connects."""
        return ",".join(f"{self.host}:{self.node_ports(k)[0]}" for k in range(1, self.nodes + 1))


NODE_PORT_STEP = 10


class RegistrySettings(BaseModel):
    """The local Confluent-compatible schema registry (Apicurio Registry, stack/registry.py).

    `gpuledger up` runs it when it is enabled, the broker is the local one and no
    `kafka.schema_registry_url` is configured (`Settings.registry_local`); every component `up` starts
    then gets its URL as `kafka.schema_registry_url`, so the stack writes Confluent's wire format
    (readers accept both framings). Processes started otherwise keep their own settings. With an
    external cluster, point `kafka.schema_registry_url` at a registry its consumers can reach.
    """

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 19081
    # Apicurio Registry 3.x (3.0.x runs on Java 17; later 3.x need Java 21).
    version: str = "3.0.9"
    heap: str = "256m"

    @property
    def url(self) -> str:
        """The Confluent-compatible API of the local registry (what clients take as their registry URL)."""
        return f"http://{self.host}:{self.port}/apis/ccompat/v7"


class MetricsSettings(BaseModel):
    """Each long-running process serves Prometheus metrics (base/metrics.py, docs/operations.md)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    # Component ports are base_port + a fixed offset (processors +1, sinks +2, chat +3, reclaim +4,
    # simulator +5, dcgm +6, agents +7); 0: any free port. The port bound is in <state_dir>/metrics/<component>.port.
    base_port: int = 9470
    lag_refresh_s: float = 2.0
    # Which process of its kind this is (processor.instances): process k > 1 of "processors" records its port as
    # "processors-k" on any free port, so `status` finds each. `up` sets it; 1 otherwise.
    instance: int = Field(default=1, ge=1, le=64)


class WebSettings(BaseModel):
    """The team page (`gpuledger web`, web/): where it listens and whom it believes.

    Identity comes from a trusted reverse proxy (oauth2-proxy and the like set `X-Forwarded-User` and
    `X-Forwarded-Groups`), believed only from `trusted_proxies` (loopback by default: a proxy on the same
    host, or a local script). Demo mode lets a visitor pick a user from the directory, with a banner
    saying so: the default with the simulator (`cluster = "sim"`), never otherwise unless set.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    demo: bool | None = None  # None: on with the simulator's cluster, off otherwise
    trusted_proxies: list[str] = Field(default_factory=lambda: ["127.0.0.1", "::1"])
    user_header: str = "X-Forwarded-User"
    groups_header: str = "X-Forwarded-Groups"
    operator_groups: list[str] = Field(default_factory=lambda: ["gpuledger-operators"])
    finance_groups: list[str] = Field(default_factory=lambda: ["gpuledger-finance"])
    query_timeout_s: float = Field(default=30.0, gt=0, le=600)
    # The fleet page's what-if form (issue 43): off unless set. It reads as the read-only analyst, as the pages do.
    # The proposals offered to pick: the policy in force and the *.yaml files of `whatif_proposals` (uploads too).
    whatif: bool = False
    whatif_proposals: Path | None = None


class PolicyWatchSettings(BaseModel):
    """The policy watch (`gpuledger policy watch`, producers/policy_watch.py): the engines it diffs against the
    policy, how often, and how it reaches them. No engine: `up` does not run it."""

    model_config = ConfigDict(extra="forbid")

    engines: list[Literal["slurm", "kueue"]] = Field(default_factory=list)
    interval_s: float = Field(default=300.0, ge=1.0)  # seconds between passes; a drift is alerted within one
    kubeconfig: Path | None = None  # Kueue: None is in-cluster (its ServiceAccount), else ~/.kube/config
    sacctmgr: str = "sacctmgr"
    kueue_config: Path | None = None  # Kueue: the controller's Configuration file, compared when named


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GPULEDGER_",
        env_nested_delimiter="__",
        extra="ignore",
    )

    state_dir: Path = Field(default_factory=lambda: Path(user_data_dir("gpuledger")))
    cluster: str = "sim"
    # The cluster's cost centre: the contra line of `gpuledger report journal` (None: CLUSTER-<cluster>).
    cluster_cost_centre: str | None = None
    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    registry: RegistrySettings = Field(default_factory=RegistrySettings)
    clickhouse: ClickHouseSettings = Field(default_factory=ClickHouseSettings)
    sinks: SinksSettings = Field(default_factory=SinksSettings)
    processor: ProcessorSettings = Field(default_factory=ProcessorSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    web: WebSettings = Field(default_factory=WebSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    dcgm: DcgmSettings = Field(default_factory=DcgmSettings)
    # The organisation's policy.yaml (schemas/policy.py; deploy/policy.example.yaml): `gpuledger policy
    # render|apply|diff --engine`, the rate card's preemptible discount, quota in reports. None: no policy.
    policy_path: Path | None = None
    policy_watch: PolicyWatchSettings = Field(default_factory=PolicyWatchSettings)
    # Untyped sections for whatever has no typed section yet; `extra.scheduler` and `extra.dcgm` are
    # the deprecated spellings of `scheduler` and `dcgm` (moved there, with a warning).
    extra: dict[str, Any] = Field(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            # pydantic's own message quotes the rejected input, which can be a secret: say what and
            # where, not the value, and drop the original (`from None`) so no traceback shows it.
            raise ConfigError(describe_invalid(exc, type(self))) from None

    @model_validator(mode="before")
    @classmethod
    def _moved_from_extra(cls, data: Any) -> Any:
        """`[extra.scheduler]` and `[extra.dcgm]` (env `GPULEDGER_EXTRA__SCHEDULER__...`) are still read,
        as `[scheduler]` and `[dcgm]`; a key set in both places takes the new section's value."""
        if not isinstance(data, dict) or not isinstance(data.get("extra"), dict):
            return data
        extra = dict(data["extra"])
        moved = {name: extra.pop(name) for name in _MOVED_FROM_EXTRA if name in extra}
        if not moved:
            return data
        data = {**data, "extra": extra}
        for name, legacy in moved.items():
            current = data.get(name)
            if isinstance(legacy, dict) and isinstance(current, dict):
                data[name] = {**legacy, **current}
            elif current is None:
                data[name] = legacy
            _deprecated(name)
        return data

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
            from base.local_secrets import apply_client_security

            apply_client_security(self)  # SASL_SSL client keys and login, unless set explicitly
        return self

    @property
    def registry_local(self) -> bool:
        """Whether `gpuledger up` runs the local registry for this configuration: enabled, no registry
        configured, and the broker is the local one (an external cluster's consumers could not reach a
        loopback registry to resolve the ids its records carry)."""
        return self.registry.enabled and self.broker.enabled and not self.kafka.schema_registry_url

    @property
    def registry_url(self) -> str | None:
        """The registry in effect: the configured one, else the local stack's; None: no registry."""
        return self.kafka.schema_registry_url or (self.registry.url if self.registry_local else None)

    @model_validator(mode="after")
    def _local_cluster(self) -> Settings:
        """With the local broker: clients bootstrap from every node (unless set) and topics are replicated
        on every node (up to 3) unless `kafka.replication_factor` says otherwise."""
        b = self.broker
        if not b.enabled:
            return self
        if b.nodes > 1 and b.security != "plaintext":
            raise ConfigError(
                "broker.nodes = 3 runs plaintext only: the local launcher secures a single node (broker.security)"
            )
        if b.nodes > 1 and "bootstrap_servers" not in self.kafka.model_fields_set:
            self.kafka.bootstrap_servers = b.bootstrap()
        if self.kafka.replication_factor is None:
            self.kafka.replication_factor = min(b.nodes, 3)
        return self

    @model_validator(mode="after")
    def _embedded_clickhouse_passwords(self) -> Settings:
        if self.clickhouse.embedded:
            from base.local_secrets import apply_clickhouse_passwords

            apply_clickhouse_passwords(self)  # the passwords `gpuledger up` generated, unless configured
        return self

    @property
    def web_demo(self) -> bool:
        """Whether the web app lets a visitor pick who they are: `web.demo`, else on with the simulator."""
        return self.web.demo if self.web.demo is not None else self.cluster == "sim"

    @property
    def clickhouse_path(self) -> Path:
        return self.clickhouse.embedded_path or self.state_dir / "clickhouse"

    def masked(self) -> dict[str, Any]:
        """The settings as plain data with every secret masked: safe to print or log."""
        data = self.model_dump(mode="json")
        # librdkafka/Java client keys that name a secret (`sasl.jaas.config` carries a password,
        # `ssl.key.pem` is a private key); any other value may still be a URL with a login or token.
        data["kafka"]["config"] = mask_data(data["kafka"]["config"])
        for section, key in (
            ("kafka", "sasl_password"),
            ("clickhouse", "password"),
            ("clickhouse", "analyst_password"),
        ):
            if data[section].get(key):
                data[section][key] = MASK
        for section, key in (("kafka", "schema_registry_url"), ("clickhouse", "url")):
            if data[section].get(key):  # `https://user:password@host` keeps the host, not the login
                data[section][key] = mask_text(data[section][key])
        data["extra"] = mask_data(data["extra"])  # untyped: secret-named keys, URL logins, query tokens
        for section in _MOVED_FROM_EXTRA:  # as they were under `extra`: registry URLs may carry a login
            data[section] = mask_data(data[section])
        chat = data["sinks"]["chat"]
        for route in [*chat["users"].values(), *chat["teams"].values(), chat["default"]]:
            if route:
                route["url"] = MASK
        return data


_MOVED_FROM_EXTRA = ("scheduler", "dcgm")
_warned: set[str] = set()


def _deprecated(section: str) -> None:
    if section not in _warned:  # once per process, however often the settings are built
        _warned.add(section)
        logging.getLogger("gpuledger.settings").warning(
            "settings: [extra.%s] (env GPULEDGER_EXTRA__%s__...) is deprecated: use [%s] "
            "(env GPULEDGER_%s__...), same keys",
            section,
            section.upper(),
            section,
            section.upper(),
        )


def load_settings(state_dir: Path | None = None) -> Settings:
    """Build the process's one settings object; a CLI `--state-dir` wins over every other source."""
    if state_dir is not None:
        return Settings(state_dir=state_dir)
    return Settings()
