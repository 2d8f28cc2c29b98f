"""What every command module shares: the common options, settings and logging at a command's start,
and stop handling. Written once here; command modules stay thin (options in, a component call, output).
It sits in the bottom layer so that every folder's command modules (`producers/*_cli.py`, `sinks/cli.py`, ...)
import it downward.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import typer

from base.logs import configure_logging
from base.settings import Settings, load_settings

STATE_DIR_OPTION = typer.Option(None, "--state-dir", help="State directory (default: the settings').")
VERBOSE_OPTION = typer.Option(False, "--verbose", "-v", help="Log at DEBUG, third-party libraries included.")


def settings_for(state_dir: Path | None) -> Settings:
    """The command's one settings object (`--state-dir` wins); a bad value is a one-line ConfigError."""
    return load_settings(state_dir)


def start_service(state_dir: Path | None, verbose: bool = False) -> Settings:
    """A long-running command's start: logging configured once (third-party loggers quiet unless
    verbose), then its settings."""
    configure_logging(verbose)
    return load_settings(state_dir)


def stop_signal(name: str) -> Any:
    """SIGTERM/SIGINT stop this process within a deadline whatever the broker does (a second signal at
    once); loops bound their waits by it. Installed for the whole process (base.shutdown)."""
    from base.shutdown import StopSignal

    return StopSignal(name=name).install()


class StopFlag:
    """SIGTERM/SIGINT set a flag a polling loop reads between rounds (no deadline: the loop finishes its
    round, however long its sleep)."""

    def __init__(self) -> None:
        self.stopped = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, *_: Any) -> None:
        self.stopped = True

    def __call__(self) -> bool:
        return self.stopped
