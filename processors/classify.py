"""Classifier c1 (docs/classification.md): the activity of a sample and the class of a device-minute."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from base.processor_settings import Thresholds


class MinuteClass(StrEnum):
    ACTIVE = "active"
    STARVED = "starved"
    IDLE = "idle"


class JobMinuteClass(StrEnum):
    """What a job-minute means to the idle state machine."""

    BUSY = "busy"  # at least one device active or starved: a gang with one busy device is busy
    IDLE = "idle"  # at least one device reported, none active or starved
    DARK = "dark"  # no device reported: missing data, never idle


def activity_of(sample: Mapping[str, Any]) -> float | None:
    """`sm_active_ratio`, else `gr_engine_active_ratio`, else `gpu_util_pct / 100`, else None."""
    value = sample.get("sm_active_ratio")
    if value is not None:
        return float(value)
    value = sample.get("gr_engine_active_ratio")
    if value is not None:
        return float(value)
    value = sample.get("gpu_util_pct")
    if value is not None:
        return float(value) / 100.0
    return None


def classify_minute(mean_activity: float, fb_used_mib_max: float | None, thresholds: Thresholds) -> MinuteClass:
    """The class every sampled allocated second of a device-minute takes."""
    if mean_activity >= thresholds.active_min_ratio:
        return MinuteClass.ACTIVE
    if (
        mean_activity >= thresholds.starved_min_ratio
        and fb_used_mib_max is not None
        and fb_used_mib_max >= thresholds.starved_min_fb_mib
    ):
        return MinuteClass.STARVED
    return MinuteClass.IDLE


def classify_job_minute(active_s: int, starved_s: int, idle_s: int) -> JobMinuteClass:
    """A job-minute from its devices' seconds (summed over the whole gang)."""
    if active_s > 0 or starved_s > 0:
        return JobMinuteClass.BUSY
    if idle_s > 0:
        return JobMinuteClass.IDLE
    return JobMinuteClass.DARK
