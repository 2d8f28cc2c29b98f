"""Quota beside use (sinks/chargeback.py quota_lines): a worked month, exact."""

from __future__ import annotations

from decimal import Decimal

import pytest

from base.errors import ConfigError
from sinks.chargeback import QuotaLine, period_hours, quota_lines


def test_month_hours_follow_the_calendar() -> None:
    assert period_hours("2026-11") == 720 and period_hours("2026-12") == 744
    assert period_hours("2028-02") == 696  # leap year
    with pytest.raises(ConfigError):
        period_hours("2026-13")


def test_worked_quota_month() -> None:
    quota = {"vision": {"hopper": 2, "ampere": 0}, "nlp": {"ampere": 1}}
    used = {("vision", "hopper"): 720 * 3600, ("nlp", "ampere"): 1800, ("audio", "hopper"): 3600}
    assert quota_lines(quota, "2026-11", used) == [
        # no quota: its use is shown, its percentage is not a number
        QuotaLine("2026-11", "audio", "hopper", Decimal("1.0000"), Decimal(0), None),
        QuotaLine("2026-11", "nlp", "ampere", Decimal("0.5000"), Decimal(720), 0.1),
        # 720 GPU-h of a 2-GPU quota in a 30-day month: half of it
        QuotaLine("2026-11", "vision", "hopper", Decimal("720.0000"), Decimal(1440), 50.0),
    ]


def test_a_quota_with_no_use_is_a_line_at_zero() -> None:
    assert quota_lines({"t": {"hopper": 1}}, "2026-02", {}) == [
        QuotaLine("2026-02", "t", "hopper", Decimal("0.0000"), Decimal(672), 0.0)]
