"""One exception tree. Errors carry context; the CLI prints them as one line."""

from __future__ import annotations

from base.outputs import mask_text


class GpuledgerError(Exception):
    """Base of every error gpuledger raises on purpose. Its message is shown to the user as is,
    except that URL logins and secret query values in it are masked (`base.outputs.mask_text`)."""

    def __str__(self) -> str:
        return mask_text(super().__str__())


class ConfigError(GpuledgerError):
    """Settings or a command-line argument are wrong; the message says what to change."""


class DependencyMissing(GpuledgerError):
    """A tool the command needs (Java, Maven, ...) is not installed."""


class ServiceError(GpuledgerError):
    """A service (broker, ClickHouse, a component process) failed to start, answer or stop."""


class NotDelivered(ServiceError):
    """Records still waiting for the broker after a flush's timeout (not refused: they may go out later)."""


class PortInUse(ServiceError):
    """The port a service should bind is taken by another process."""


class ContractError(GpuledgerError):
    """A record does not satisfy its schema or cannot be decoded."""


class ParseError(GpuledgerError):
    """An input (exporter scrape, scheduler output, data file) cannot be parsed."""
