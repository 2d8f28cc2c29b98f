"""SASL/SCRAM-SHA-512 over TLS for the local broker, and the client settings that go with it.

Turned on with `broker.security = "sasl_ssl"` (`GPULEDGER_BROKER__SECURITY=sasl_ssl`). Then:

- `ensure_materials` makes, once, under `<state_dir>/security/` (directory 0700, secrets 0600):
  `ca.pem` (a local CA, public), `ca-key.pem`, `broker.pem` (the broker's key and certificate for
  127.0.0.1/localhost, signed by that CA), `admin.password` (the broker's own SCRAM login) and,
  unless a password is configured, `kafka.password` (the pipeline's login).
- `secure_broker_config` replaces the broker's plaintext client listener by a SASL_SSL one on the
  same port. The admin user is created when the storage is formatted (`--add-scram`); the
  pipeline's user is created or updated over that listener by `ensure_client_user` (an
  AdminClient as admin), so a changed password takes effect at the next `gpuledger up`.
- `apply_client_security` (run by `Settings` itself) gives every process the standard client
  keys: `security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`, `ssl.ca.location`, and
  `kafka.sasl_username` / `kafka.sasl_password` (from settings, `kafka.sasl_password_file`, or
  the generated `kafka.password`). Keys set explicitly in `kafka.config` win.
- `client.properties` in the same directory is the same login for Java tools
  (`kafka-console-consumer --consumer.config`).

No password is ever put on a command line or in a log: the broker reads its own from
`server.properties` (0600) and the format step reads its arguments from a 0600 `@file`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from base.errors import ConfigError, ServiceError
from base.local_secrets import (
    ADMIN_USER,
    CLICKHOUSE_ROLES,
    DEFAULT_CLIENT_USER,
    MECHANISM,
    Materials,
    _clickhouse_password_configured,
    apply_clickhouse_passwords,
    apply_client_security,
    clickhouse_password_file,
    materials,
    password_file,
    read_secret,
    write_secret,
)

if TYPE_CHECKING:
    from cryptography import x509

    from base.settings import Settings
    from stack.broker import BrokerConfig

Progress = Callable[[str], None]

LISTENER = "SASL_SSL"
SCRAM_ITERATIONS = 8192
SCRAM_MARKER = "scram.formatted"  # in the broker's data dir: storage formatted with the admin user
CERT_DAYS = 825


def _quiet(_: str) -> None:
    return None


def enabled(settings: Settings) -> bool:
    return settings.broker.enabled and settings.broker.security == "sasl_ssl"


# ------------------------------------------------------------------------------------------------
# Files


def new_password() -> str:
    """A random password in the characters `--add-scram` and JAAS take unquoted."""
    return secrets.token_urlsafe(24)


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


# ------------------------------------------------------------------------------------------------
# Certificates (the `cryptography` package; nothing leaves the machine)


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    org = x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpuledger local")
    return x509.Name([org, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _key_pem(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_certificates(m: Materials, hosts: tuple[str, ...], *, now: datetime | None = None) -> None:
    """A CA and a broker certificate (server and client auth) for `hosts`, signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    start = (now or datetime.now(UTC)) - timedelta(minutes=5)
    end = start + timedelta(days=CERT_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpuledger local CA")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write_secret(m.ca_key, _key_pem(ca_key).decode())
    write_secret(m.broker_pem, (_key_pem(key) + cert.public_bytes(pem) + ca.public_bytes(pem)).decode())
    m.ca_cert.write_bytes(ca.public_bytes(pem))  # public: clients need to read it
    os.chmod(m.ca_cert, 0o644)


def ensure_materials(
    state_dir: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"), *, progress: Progress = _quiet
) -> Materials:
    """The CA, the broker's certificate and the admin password, made once per state directory."""
    m = materials(state_dir)
    _private_dir(m.dir)
    if not (m.ca_cert.is_file() and m.ca_key.is_file() and m.broker_pem.is_file()):
        progress(f"making a local CA and a broker certificate for {', '.join(hosts)} in {m.dir}")
        make_certificates(m, hosts)
    if not m.admin_password.is_file():
        write_secret(m.admin_password, new_password() + "\n")
    return m


# ------------------------------------------------------------------------------------------------
# Client configuration


def client_config(ca_cert: Path, username: str, password: str) -> dict[str, str]:
    """Standard librdkafka keys for a SASL/SCRAM login over TLS checked against `ca_cert`."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "ssl.ca.location": str(ca_cert),
        "ssl.endpoint.identification.algorithm": "https",
        "sasl.username": username,
        "sasl.password": password,
    }


def admin_config(settings: Settings) -> dict[str, str] | None:
    """The broker admin's client configuration, when this state directory has one."""
    m = materials(settings.state_dir)
    if not m.admin_password.is_file():
        return None
    return {
        "bootstrap.servers": f"{settings.broker.host}:{settings.broker.port}",
        **client_config(m.ca_cert, ADMIN_USER, read_secret(m.admin_password)),
    }


def _jaas(username: str, password: str) -> str:
    module = "org.apache.kafka.common.security.scram.ScramLoginModule"
    return f'{module} required username="{username}" password="{password}";'


def write_client_properties(m: Materials, username: str, password: str) -> Path:
    """The pipeline's login for Java clients and Kafka's own tools (0600)."""
    text = (
        "# Written by stack/security.py: the local broker's SASL_SSL login for Java clients.\n"
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={MECHANISM}\n"
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={m.ca_cert}\n"
        f"sasl.jaas.config={_jaas(username, password)}\n"
    )
    write_secret(m.client_properties, text)
    return m.client_properties


# ------------------------------------------------------------------------------------------------
# Broker


def secure_broker_config(cfg: BrokerConfig, m: Materials) -> BrokerConfig:
    """`cfg` with its client port speaking SASL_SSL only; the admin user is added at format time."""
    from stack.broker import Listener

    admin_password = read_secret(m.admin_password)
    prefix = f"listener.name.{LISTENER.lower()}."
    extra = (
        ("sasl.enabled.mechanisms", MECHANISM),
        ("sasl.mechanism.inter.broker.protocol", MECHANISM),
        (prefix + "sasl.enabled.mechanisms", MECHANISM),
        (prefix + f"{MECHANISM.lower()}.sasl.jaas.config", _jaas(ADMIN_USER, admin_password)),
        (prefix + "ssl.keystore.type", "PEM"),
        (prefix + "ssl.keystore.location", str(m.broker_pem)),
        (prefix + "ssl.truststore.type", "PEM"),
        (prefix + "ssl.truststore.location", str(m.ca_cert)),
        (prefix + "ssl.client.auth", "none"),
        (prefix + "ssl.endpoint.identification.algorithm", "https"),
    )
    listener = Listener(LISTENER, cfg.host, cfg.port, security_protocol="SASL_SSL", extra=extra)
    admin = client_config(m.ca_cert, ADMIN_USER, admin_password)
    return dataclasses.replace(
        cfg,
        plaintext_listener=False,
        extra_listeners=(listener, *cfg.extra_listeners),
        scram_credentials=((MECHANISM, ADMIN_USER, admin_password),),
        client_overrides=tuple(admin.items()),
    )


def check_formatted_with_scram(cfg: BrokerConfig) -> None:
    from stack.broker import is_formatted

    if is_formatted(cfg) and not (cfg.data_dir / SCRAM_MARKER).is_file():
        raise ConfigError(
            f"the Kafka data in {cfg.data_dir} was formatted without SCRAM users, so broker.security=sasl_ssl "
            "cannot log in to it: use a new state directory (--state-dir) or remove that one"
        )


def prepare_local_broker(settings: Settings, cfg: BrokerConfig, *, progress: Progress = _quiet) -> BrokerConfig:
    """Certificates and passwords for `gpuledger up`, and the broker configuration that uses them.

    Also completes `settings.kafka` in place with the pipeline's login (a password generated here
    is not in it yet), so the caller's readiness checks log in like the components will.
    """
    from stack.broker import is_formatted

    hosts = tuple(dict.fromkeys((cfg.host, "127.0.0.1", "localhost")))
    m = ensure_materials(settings.state_dir, hosts, progress=progress)
    kafka = settings.kafka
    if kafka.sasl_password is None and not m.client_password.is_file():
        write_secret(m.client_password, new_password() + "\n")
        progress(f"generated the pipeline's Kafka password in {m.client_password}")
    apply_client_security(settings)
    assert kafka.sasl_username is not None and kafka.sasl_password is not None
    write_client_properties(m, kafka.sasl_username, kafka.sasl_password.get_secret_value())
    secured = authorized_broker_config(secure_broker_config(cfg, m))
    check_formatted_with_scram(secured)
    if not is_formatted(secured):
        # A fresh data directory: it is formatted with the admin user by broker.prepare; mark it then.
        (secured.data_dir).mkdir(parents=True, exist_ok=True)
        (secured.data_dir / SCRAM_MARKER).write_text(f"{ADMIN_USER}\n", encoding="utf-8")
    return secured


def ensure_client_user(admin: dict[str, str], username: str, password: str, timeout: float = 10.0) -> None:
    """Create or update the SCRAM credential of `username`, logged in as the broker admin."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    from base.kafka import new_admin

    client = new_admin(admin, log_level=0)
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    upsert = UserScramCredentialUpsertion(username, info, password.encode("utf-8"))
    try:
        for fut in client.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
            fut.result(timeout=timeout)
    except KafkaException as exc:
        raise ServiceError(f"could not set the SCRAM credential of Kafka user {username!r}: {exc.args[0]}") from exc


def broker_ready(settings: Settings, *, create_user: bool = False) -> tuple[bool, str]:
    """Whether the pipeline can log in. With `create_user` (only `gpuledger up` asks, never
    `status`), a refused login first creates or updates the pipeline's user through the admin login."""
    from stack.broker import metadata_ok

    kafka = settings.kafka
    where = f"{kafka.bootstrap_servers} (SASL_SSL as {kafka.sasl_username})"
    if kafka.sasl_password is None:
        return False, f"no Kafka password for {kafka.sasl_username!r} yet (gpuledger up makes one)"
    if metadata_ok(kafka.client_config(), timeout=3.0):
        return True, f"answers metadata at {where}"
    admin = admin_config(settings)
    if admin is None or not metadata_ok(admin, timeout=3.0):
        return False, f"no metadata answer from {where}"
    if not create_user:
        return False, f"login refused at {where}; the broker answers its admin (wrong password?)"
    assert kafka.sasl_username is not None
    with contextlib.suppress(ServiceError):
        ensure_client_user(admin, kafka.sasl_username, kafka.sasl_password.get_secret_value())
    ok = metadata_ok(kafka.client_config(), timeout=3.0)
    return ok, (f"answers metadata at {where}" if ok else f"login refused at {where}")


# ------------------------------------------------------------------------------------------------
# ClickHouse passwords for the embedded server
#
# With the embedded server and no password configured for a user, the first `gpuledger up`
# generates one into <state_dir>/security/clickhouse-<role>.password (0600); `Settings` then reads
# it in every process (`apply_clickhouse_passwords`), so the server, the components and the
# commands all log in with it. A configured password (`clickhouse.password[_file]`,
# `clickhouse.analyst_password[_file]`) always wins and no file is written for it.

def private_state_dir(state_dir: Path) -> None:
    """The state directory (data, logs, secrets) is its owner's alone: 0700, made so if it exists."""
    _private_dir(state_dir)
    security_dir = materials(state_dir).dir
    if security_dir.is_dir():
        os.chmod(security_dir, 0o700)
        for path in security_dir.iterdir():
            if path.is_file() and not path.is_symlink() and path != materials(state_dir).ca_cert:
                os.chmod(path, 0o600)  # a store copied in with looser modes is tightened


def ensure_clickhouse_passwords(settings: Settings, *, progress: Progress = _quiet) -> None:
    """For `gpuledger up` with the embedded server: generate each unconfigured ClickHouse password
    once (0600 under <state_dir>/security) and fill `settings.clickhouse` with it in place, so the
    caller's readiness checks log in as the components will."""
    _private_dir(materials(settings.state_dir).dir)
    for role in CLICKHOUSE_ROLES:
        path = clickhouse_password_file(settings.state_dir, role)
        if not _clickhouse_password_configured(settings, role) and not path.is_file():
            write_secret(path, new_password() + "\n")
            progress(f"generated the ClickHouse {role} password in {path}")
    apply_clickhouse_passwords(settings)


# ------------------------------------------------------------------------------------------------
# Authorisation: one principal per component, Kafka's StandardAuthorizer, ACLs through the admin API
#
# With `broker.security = "sasl_ssl"` the broker runs `StandardAuthorizer` (KRaft) with no access by
# default (`allow.everyone.if.no.acl.found=false`); the admin and the node's own controller login are
# the only super users. `gpuledger up` gives each component its own SCRAM user and a password in
# `<state_dir>/security/<user>.password` (0600), and `ensure_component_principals` (as admin)
# creates the users and the ACLs of `component_acls`: only producers write telemetry and job events,
# only processors write usage, alerts and reclaim actions; sinks, chat and reclaim read what they
# store or carry out, and write only their dead-letter topics. A component process learns which
# user it is from `GPULEDGER_KAFKA__SASL_USERNAME` (set per component by the supervisor), and
# `apply_client_security` reads that user's password file.

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# The controller listener is plaintext on loopback; the node's requests to its own controller
# (registration, heartbeats) arrive there as ANONYMOUS, which must be a super user for the node to
# start at all. See docs/security.md: anything that can reach the controller port is trusted.
CONTROLLER_PRINCIPAL = "User:ANONYMOUS"
PRINCIPALS = {
    "producers": "gpuledger-producers",
    "processors": "gpuledger-processors",
    "sinks": "gpuledger-sinks",
    "chat": "gpuledger-chat",
    "reclaim": "gpuledger-reclaim",
    "web": "gpuledger-web",
    "policy-watch": "gpuledger-policy-watch",
    "admin": ADMIN_USER,
}


def ensure_principal_passwords(m: Materials) -> dict[str, str]:
    """user -> password of every component principal, generated once (0600)."""
    out: dict[str, str] = {}
    for user in PRINCIPALS.values():
        path = password_file(m, user)
        if not path.is_file():
            write_secret(path, new_password() + "\n")
        out[user] = read_secret(path)
    return out


def authorized_broker_config(cfg: BrokerConfig) -> BrokerConfig:
    """`cfg` with the StandardAuthorizer on: nothing is allowed without an ACL but for the super users."""
    props = (
        ("authorizer.class.name", AUTHORIZER),
        ("super.users", f"User:{ADMIN_USER};{CONTROLLER_PRINCIPAL}"),
        ("allow.everyone.if.no.acl.found", "false"),
    )
    return dataclasses.replace(cfg, overrides=(*cfg.overrides, *props))


@dataclass(frozen=True, slots=True)
class Grant:
    """One ALLOW ACL: `principal` may do `operation` on a topic, group or the cluster."""

    user: str
    resource: str  # "topic", "group", "cluster"
    name: str
    operation: str  # READ, WRITE, DESCRIBE, CREATE, IDEMPOTENT_WRITE, DESCRIBE_CONFIGS
    prefixed: bool = False


def component_acls(
    topic_prefix: str = "", *, processors_group: str = "gpuledger-processors", sinks_group: str = "gpuledger-sinks"
) -> list[Grant]:
    """The ACLs of every component principal (pure: names in, grants out)."""
    from schemas import topics as t

    def name(topic: t.Topic | str) -> str:
        return topic_prefix + (topic if isinstance(topic, str) else topic.name)

    grants: list[Grant] = []

    def topics(user: str, operation: str, *names: t.Topic | str) -> None:
        for topic in names:
            grants.append(Grant(user, "topic", name(topic), operation))
            if operation != "DESCRIBE":
                grants.append(Grant(user, "topic", name(topic), "DESCRIBE"))

    producers, processors = PRINCIPALS["producers"], PRINCIPALS["processors"]
    sinks, chat, reclaim = PRINCIPALS["sinks"], PRINCIPALS["chat"], PRINCIPALS["reclaim"]
    produced = (t.DEVICE_SAMPLES, t.INVENTORY, t.JOB_EVENTS, t.CORRECTIONS)
    topics(producers, "WRITE", *produced)
    grants.append(Grant(producers, "cluster", "kafka-cluster", "IDEMPOTENT_WRITE"))

    internal = (t.ALLOCATIONS, t.LATE_SAMPLES, t.JOB_DEVICE_MINUTES, t.IDLE_STATE_TOPIC)
    outputs = (t.DEVICE_MINUTES, t.JOB_MINUTES, t.COVERAGE_MINUTES, t.ALERTS, t.RECLAIM_ACTIONS)
    topics(processors, "READ", *produced, *internal)
    dead_letters = (tp.dlq for tp in (*produced, t.ALLOCATIONS, t.JOB_DEVICE_MINUTES))
    topics(processors, "WRITE", *internal, *outputs, *dead_letters)
    grants.append(Grant(processors, "topic", name(t.IDLE_STATE_TOPIC), "CREATE"))
    grants.append(Grant(processors, "group", processors_group, "READ", prefixed=True))
    grants.append(Grant(processors, "cluster", "kafka-cluster", "IDEMPOTENT_WRITE"))

    # The default login (`gpuledger status`, a person's CLI) may only see what exists and the groups' lag.
    everything = topic_prefix or "*"
    grants.append(Grant(DEFAULT_CLIENT_USER, "topic", everything, "DESCRIBE", prefixed=bool(topic_prefix)))
    grants.append(Grant(DEFAULT_CLIENT_USER, "group", "*", "DESCRIBE"))

    # Appeals and reservations (issue 19): people's commands and the governance services publish their steps
    # with the producers' login and read the topics whole (assigned partitions, no group).
    # The attribution baseline (issue 38): `policy apply` reads it whole and writes a new one, as the producers.
    # Every policy apply (issue 41) is recorded on policy.applied.v1, by the same command, with the same login; so
    # are escalations (issue 41): the `escalate` commands and the escalation service, like reservations.
    governance = (t.APPEALS, t.RESERVATIONS, t.ATTRIBUTION_BASELINE, t.POLICY_APPLIED, t.ESCALATIONS)
    topics(producers, "WRITE", *governance)
    topics(producers, "READ", *governance)
    # The policy watch (issue 41) publishes drift alerts and reads reservations.v1 whole (a Kueue quota a reservation
    # raised is explained, not drift): its own login, so no producer on a GPU node may write an alert.
    watch = PRINCIPALS["policy-watch"]
    topics(watch, "WRITE", t.ALERTS)
    topics(watch, "READ", t.RESERVATIONS)
    grants.append(Grant(watch, "cluster", "kafka-cluster", "IDEMPOTENT_WRITE"))

    stored = (*produced, *outputs, *governance)
    topics(sinks, "READ", *stored)
    topics(sinks, "WRITE", *(tp.dlq for tp in stored))
    grants.append(Grant(sinks, "group", sinks_group, "READ"))
    # The team page publishes project corrections, appeal and reservation steps, and the deciders' page escalation
    # decisions; it reads those topics whole to check a new step, as the commands do (assigned partitions, no group).
    topics(PRINCIPALS["web"], "WRITE", t.CORRECTIONS, t.APPEALS, t.RESERVATIONS, t.ESCALATIONS)
    topics(PRINCIPALS["web"], "READ", t.APPEALS, t.RESERVATIONS, t.ESCALATIONS)
    grants.append(Grant(PRINCIPALS["web"], "cluster", "kafka-cluster", "IDEMPOTENT_WRITE"))
    # chat: appeals too (decisions into the warning's thread, escalations), reservations (issue 41: an idle
    # reservation's warning and early release, to the team) and escalations (issue 41: a raise asked, decided,
    # lapsed or ended, to the team; read whole too, to fold under the policy); reclaim: appeals too (an exemption,
    # or a resume asked on the job's page, resumes a reclaimed job: sinks/reclaim_resume.py)
    for user, read, group in (
        (chat, (t.ALERTS, t.APPEALS, t.RESERVATIONS, t.ESCALATIONS), "chat"),
        (reclaim, (t.RECLAIM_ACTIONS, t.APPEALS), "reclaim"),
    ):
        topics(user, "READ", *read)
        topics(user, "WRITE", *(topic.dlq for topic in read))
        grants.append(Grant(user, "group", f"{sinks_group}-{group}", "READ"))
    return list(dict.fromkeys(grants))  # DESCRIBE follows each READ and WRITE: once per topic


def _acl_binding(g: Grant) -> object:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    resource = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.BROKER}[g.resource]
    pattern = ResourcePatternType.PREFIXED if g.prefixed else ResourcePatternType.LITERAL
    return AclBinding(
        resource, g.name, pattern, f"User:{g.user}", "*", AclOperation[g.operation], AclPermissionType.ALLOW
    )


def apply_acls(admin: dict[str, str], grants: list[Grant], timeout: float = 30.0) -> int:
    """Create the ACLs (Kafka's CreateAcls; an existing one is left as it is). Returns how many."""
    from confluent_kafka import KafkaException

    from base.kafka import new_admin

    client = new_admin(admin, log_level=0)
    bindings = [_acl_binding(g) for g in grants]
    try:
        for fut in client.create_acls(bindings, request_timeout=timeout).values():  # type: ignore[arg-type]
            fut.result(timeout=timeout)
    except KafkaException as exc:
        raise ServiceError(f"could not create the Kafka ACLs: {exc.args[0]}") from exc
    return len(bindings)


def ensure_component_principals(settings: Settings, *, progress: Progress = _quiet) -> None:
    """As the broker admin: each component's SCRAM user (password generated once) and its ACLs."""
    m = materials(settings.state_dir)
    admin = admin_config(settings)
    if admin is None:
        raise ConfigError(f"no Kafka admin password in {m.dir}: run `gpuledger up` to make one")
    for user, password in ensure_principal_passwords(m).items():
        if user != ADMIN_USER:
            ensure_client_user(admin, user, password)
    grants = component_acls(
        settings.kafka.topic_prefix, processors_group=settings.processor.group_id, sinks_group=settings.sinks.group_id
    )
    progress(f"Kafka: {len(PRINCIPALS)} component users, {apply_acls(admin, grants)} ACLs")


def component_env(settings: Settings, component: str | None) -> dict[str, str]:
    """The environment that makes a component's process log in as its own principal (sasl_ssl only)."""
    if component is None or not enabled(settings):
        return {}
    return {"GPULEDGER_KAFKA__SASL_USERNAME": PRINCIPALS[component]}
