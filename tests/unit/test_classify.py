from __future__ import annotations

import pytest

from base.processor_settings import Thresholds
from processors.classify import JobMinuteClass, MinuteClass, activity_of, classify_job_minute, classify_minute

TH = Thresholds()


def test_activity_fallbacks_in_contract_order() -> None:
    assert activity_of({"sm_active_ratio": 0.4, "gr_engine_active_ratio": 0.9, "gpu_util_pct": 100}) == 0.4
    assert activity_of({"sm_active_ratio": None, "gr_engine_active_ratio": 0.3, "gpu_util_pct": 100}) == 0.3
    assert activity_of({"sm_active_ratio": None, "gr_engine_active_ratio": None, "gpu_util_pct": 55.0}) == 0.55
    assert activity_of({"sm_active_ratio": None, "gpu_util_pct": None}) is None
    assert activity_of({"sm_active_ratio": 0.0}) == 0.0  # zero is a reading, not a missing value


@pytest.mark.parametrize(
    ("mean", "fb", "expected"),
    [
        (0.25, None, MinuteClass.ACTIVE),
        (0.9, 0.0, MinuteClass.ACTIVE),
        (0.2499, 1024.0, MinuteClass.STARVED),
        (0.05, 8192.0, MinuteClass.STARVED),
        (0.0499, 8192.0, MinuteClass.IDLE),
        (0.10, 1023.9, MinuteClass.IDLE),  # low activity with nothing loaded
        (0.10, None, MinuteClass.IDLE),
        (2 / 60, 4000.0, MinuteClass.IDLE),  # a poker's minute: 2 s at 1.0
        (0.0, 80000.0, MinuteClass.IDLE),
    ],
)
def test_c1_thresholds(mean: float, fb: float | None, expected: MinuteClass) -> None:
    assert classify_minute(mean, fb, TH) is expected


def test_thresholds_are_configuration() -> None:
    strict = Thresholds(active_min_ratio=0.5, version="c1-strict")
    assert classify_minute(0.4, 8192.0, strict) is MinuteClass.STARVED
    assert strict.version == "c1-strict"


def test_job_minute_class() -> None:
    assert classify_job_minute(1, 0, 479) is JobMinuteClass.BUSY  # a gang with one busy device
    assert classify_job_minute(0, 60, 0) is JobMinuteClass.BUSY  # starved is not idle
    assert classify_job_minute(0, 0, 60) is JobMinuteClass.IDLE
    assert classify_job_minute(0, 0, 0) is JobMinuteClass.DARK
