"""When a failed consumer (or faust app) is rebuilt in-process, and when the process gives up instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """When a runtime whose consumer failed is rebuilt, and when the process gives up instead.

    The n-th failure within `window_s` waits `backoff_s * 2**(n-1)` (at most `max_backoff_s`) before the
    rebuild; the `max_failures`-th within `window_s` ends the process (status 2, one line)."""

    max_failures: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def recent(self, failures: Sequence[float], now: float) -> int:
        return sum(1 for t in failures if now - t < self.window_s)

    def delay(self, failures: Sequence[float], now: float) -> float | None:
        """Seconds to wait before the rebuild, given the (monotonic) times of every failure so far, this
        one included; None: give up."""
        n = self.recent(failures, now)
        if n >= self.max_failures:
            return None
        return min(self.max_backoff_s, self.backoff_s * 2 ** max(0, n - 1))
