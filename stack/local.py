"""The local stack as `gpuledger up|down|status` use it: its supervisor built from the settings (the simulated
organisation's policy when none is configured), the one check `up` makes before starting anything, and the
ledger's first rows while `up` waits for them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from base.cli_common import settings_for
from base.errors import ConfigError
from base.settings import Settings
from stack.supervisor import Supervisor


def supervisor(state_dir: Path | None, progress: Callable[[str], None]) -> Supervisor:
    """The stack's supervisor. Every component's command is part of this build (tests/unit/test_stack_cli_checks.py
    holds COMPONENTS to the commands the modules register); a call of `gpuledger` registers only its own command's
    modules (gpuledger/cli.py), so its command tree could not say so anyway."""
    from stack.components import with_demo_policy

    return Supervisor(with_demo_policy(settings_for(state_dir)), progress=progress)


def check_broker_address(settings: Settings) -> None:
    """The local broker must be the one the clients use (else a ConfigError that says how to choose)."""
    b = settings.broker
    if b.enabled and f"{b.host}:{b.port}" not in settings.kafka.bootstrap_servers.split(","):
        raise ConfigError(
            f"the local broker listens on {b.host}:{b.port} but clients use "
            f"{settings.kafka.bootstrap_servers}: set GPULEDGER_KAFKA__BOOTSTRAP_SERVERS to it, or "
            "GPULEDGER_BROKER__ENABLED=false to use that external cluster"
        )


def job_minute_rows(settings: Settings) -> int:
    """How many job-minutes the ledger holds (0 while it cannot say: migrations, the first window)."""
    from sinks.db import connect

    try:
        client = connect(settings.clickhouse, connect_timeout=2, send_receive_timeout=5)
        return int(client.command("SELECT count() FROM job_minutes"))
    except Exception:  # not there yet (migrations, first window): keep waiting
        return 0
