"""Where the local stack keeps its secrets, and how every process reads them.

`gpuledger up` (stack/security.py) generates the broker's TLS material and the SCRAM and
ClickHouse passwords under `<state_dir>/security/` (0700, secrets 0600); `Settings` fills whatever is
not configured explicitly from those files (`apply_client_security`, `apply_clickhouse_passwords`).
Reading lives here, at the bottom, so that settings need nothing of the stack above them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from base.errors import ConfigError

if TYPE_CHECKING:
    from base.settings import Settings

MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "gpuledger-admin"
DEFAULT_CLIENT_USER = "gpuledger"
_SCRAM_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


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
    if kafka.sasl_password is None and _SCRAM_NAME.match(kafka.sasl_username):
        secret = password_file(m, kafka.sasl_username)  # a component's own principal, or the default login
        if secret.is_file():
            kafka.sasl_password = SecretStr(read_secret(secret))


CLICKHOUSE_ROLES = ("writer", "analyst")
_CLICKHOUSE_FIELDS = {"writer": ("password", "password_file"), "analyst": ("analyst_password", "analyst_password_file")}


def clickhouse_password_file(state_dir: Path, role: str) -> Path:
    """Where `gpuledger up` keeps the generated password of the ClickHouse `writer` or `analyst`."""
    if role not in CLICKHOUSE_ROLES:
        raise ValueError(f"unknown ClickHouse role {role!r}")
    return materials(state_dir).dir / f"clickhouse-{role}.password"


def _clickhouse_password_configured(settings: Settings, role: str) -> bool:
    field, file_field = _CLICKHOUSE_FIELDS[role]
    ch = settings.clickhouse
    return field in ch.model_fields_set or getattr(ch, file_field) is not None


def apply_clickhouse_passwords(settings: Settings) -> None:
    """Fill the unconfigured ClickHouse passwords from the generated files, where they exist (in place)."""
    from pydantic import SecretStr

    for role in CLICKHOUSE_ROLES:
        path = clickhouse_password_file(settings.state_dir, role)
        if not _clickhouse_password_configured(settings, role) and path.is_file():
            setattr(settings.clickhouse, _CLICKHOUSE_FIELDS[role][0], SecretStr(read_secret(path)))


def password_file(m: Materials, username: str) -> Path:
    """Where the password of a local SCRAM user lives (admin and the default login keep their files)."""
    if username == ADMIN_USER:
        return m.admin_password
    if username == DEFAULT_CLIENT_USER:
        return m.client_password
    if not _SCRAM_NAME.match(username):
        raise ConfigError(f"Kafka user {username!r}: a local SCRAM user name must match [A-Za-z0-9_.-]+")
    return m.dir / f"{username}.password"
