"""Recovery: a failed consumer never leaves the process running without consuming.

A stage's consumer that can no longer be used raises `ConsumerFailed`; `run_recovering` closes that
runtime (bounded) and builds a fresh one, which resumes from the committed offsets and the idle-state
topic exactly as a restarted process does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter as PromCounter

from base.errors import ServiceError
from base.recovery import RecoveryPolicy
from base.shutdown import StopSignal

if TYPE_CHECKING:  # the runtime imports this module
    from processors.drivers.base import Stats
    from processors.runtime import ProcessorRuntime

__all__ = ["RECOVERIES", "ConsumerFailed", "RecoveryPolicy", "run_recovering"]

log = logging.getLogger("gpuledger.processors")

RECOVERIES = PromCounter(
    "gpuledger_processor_recoveries",
    "Processor runtimes rebuilt in this process after a consumer failed (a fatal client error, e.g. a static "
    "member fenced): closed, then replaced by one that resumes from the committed offsets, as a restart does.",
    ["stage"],
)


class ConsumerFailed(ServiceError):
    """A consumer of one stage can no longer be used: a fatal client error (a static member fenced by the
    broker), or consume() raised. The process recovers as a restart would (`run_recovering`)."""

    def __init__(self, stage: str, error: str) -> None:
        super().__init__(f"{stage} consumer failed: {error}")
        self.stage = stage
        self.error = error


def run_recovering(
    build: Callable[[StopSignal], ProcessorRuntime],
    shutdown: StopSignal,
    policy: RecoveryPolicy | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Stats:
    """Run `build(shutdown)`'s runtime; when a consumer fails (`ConsumerFailed`), its consumers are closed
    (bounded, as every run ends) and a fresh runtime takes over: it reads the committed offsets (and their
    metadata) and the idle-state topic like a new process, which the fault suite shows is exactly-once
    after kill -9. Between rebuilds it waits `policy.delay` (a stop cuts the wait short); once the policy
    gives up, raises ServiceError. Other errors end the run as before."""
    policy = policy or RecoveryPolicy()
    own_signals = not shutdown.installed
    if own_signals:
        shutdown.install()
    failures: list[float] = []
    try:
        runtime = build(shutdown)
        while True:
            try:
                return runtime.run()
            except ConsumerFailed as exc:
                now = clock()
                failures.append(now)
                delay = policy.delay(failures, now)
                if delay is None:
                    raise ServiceError(
                        f"processors: {exc}; {policy.recent(failures, now)} consumer failures within "
                        f"{policy.window_s:.0f} s, giving up"
                    ) from exc
                RECOVERIES.labels(stage=exc.stage).inc()
                log.warning(
                    "processors: %s; rebuilding the runtime in %.1f s, from the committed offsets "
                    "(failure %d of %d allowed within %.0f s)",
                    exc, delay, policy.recent(failures, now), policy.max_failures - 1, policy.window_s,
                )  # fmt: skip
                runtime.release()
                if _wait_unless_stopped(shutdown, delay):
                    return runtime.stats
                fresh = build(shutdown)
                fresh.carry_from(runtime)
                runtime = fresh
    finally:
        if own_signals:
            shutdown.uninstall()


def _wait_unless_stopped(stop: StopSignal, seconds: float) -> bool:
    """Sleep up to `seconds` in short slices; True as soon as a stop is requested."""
    end = time.monotonic() + seconds
    while not stop.requested:
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.1))
    return True
