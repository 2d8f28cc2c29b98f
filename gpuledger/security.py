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

from gpuledger.errors import ConfigError, ServiceError

if TYPE_CHECKING:
    from cryptography import x509

    from gpuledger.broker import BrokerConfig
    from gpuledger.settings import Settings

Progress = Callable[[str], None]

MECHANISM = "SCRAM-SHA-512"
LISTENER = "SASL_SSL"
ADMIN_USER = "gpuledger-admin"
DEFAULT_CLIENT_USER = "gpuledger"
SCRAM_ITERATIONS = 8192
SCRAM_MARKER = "scram.formatted"  # in the broker's data dir: storage formatted with the admin user
CERT_DAYS = 825


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Materials:
    """Where the security files of one state directory live."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca-key.pem"

    @property
    def broker_pem(self) -> Path:
        """The broker's private key (PKCS#8) followed by its certificate chain (Kafka's PEM keystore)."""
        return self.dir / "broker.pem"

    @property
    def admin_password(self) -> Path:
        return self.dir / "admin.password"

    @property
    def client_password(self) -> Path:
        return self.dir / "kafka.password"

    @property
    def client_properties(self) -> Path:
        return self.dir / "client.properties"

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.ca_cert, self.ca_key, self.broker_pem, self.admin_password))


def materials(state_dir: Path) -> Materials:
    return Materials(state_dir / "security")


def enabled(settings: Settings) -> bool:
    return settings.broker.enabled and settings.broker.security == "sasl_ssl"


# ------------------------------------------------------------------------------------------------
# Files


def write_secret(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600), atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)
    tmp.replace(path)


def read_secret(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()


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


def apply_client_security(settings: Settings) -> None:
    """Fill `settings.kafka` for the local SASL_SSL broker (in place; explicit settings win)."""
    from pydantic import SecretStr

    m = materials(settings.state_dir)
    kafka = settings.kafka
    kafka.config.setdefault("security.protocol", "SASL_SSL")
    kafka.config.setdefault("sasl.mechanism", MECHANISM)
    kafka.config.setdefault("ssl.ca.location", str(m.ca_cert))
    if kafka.sasl_username is None:
        kafka.sasl_username = DEFAULT_CLIENT_USER
    if kafka.sasl_password is None and m.client_password.is_file():
        kafka.sasl_password = SecretStr(read_secret(m.client_password))


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
        "# Written by gpuledger/security.py: the local broker's SASL_SSL login for Java clients.\n"
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
    from gpuledger.broker import Listener

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
    from gpuledger.broker import is_formatted

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
    from gpuledger.broker import is_formatted

    hosts = tuple(dict.fromkeys((cfg.host, "127.0.0.1", "localhost")))
    m = ensure_materials(settings.state_dir, hosts, progress=progress)
    kafka = settings.kafka
    if kafka.sasl_password is None and not m.client_password.is_file():
        write_secret(m.client_password, new_password() + "\n")
        progress(f"generated the pipeline's Kafka password in {m.client_password}")
    apply_client_security(settings)
    assert kafka.sasl_username is not None and kafka.sasl_password is not None
    write_client_properties(m, kafka.sasl_username, kafka.sasl_password.get_secret_value())
    secured = secure_broker_config(cfg, m)
    check_formatted_with_scram(secured)
    if not is_formatted(secured):
        # A fresh data directory: it is formatted with the admin user by broker.prepare; mark it then.
        (secured.data_dir).mkdir(parents=True, exist_ok=True)
        (secured.data_dir / SCRAM_MARKER).write_text(f"{ADMIN_USER}\n", encoding="utf-8")
    return secured


def ensure_client_user(admin: dict[str, str], username: str, password: str, timeout: float = 10.0) -> None:
    """Create or update the SCRAM credential of `username`, logged in as the broker admin."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    client = AdminClient({**admin, "log_level": 0})
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
    from gpuledger.broker import metadata_ok

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
