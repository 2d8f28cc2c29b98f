"""A report's period: one calendar month, `YYYY-MM`, checked once for every report and statement."""

from __future__ import annotations

import re

from base.errors import ConfigError

_PERIOD = re.compile(r"(\d{4})-(0[1-9]|1[0-2])")  # fullmatch: no trailing newline


def check_period(period: str) -> str:
    if not _PERIOD.fullmatch(period):
        raise ConfigError(f"--period must be a month as YYYY-MM (e.g. 2026-11), got {period!r}")
    return period
