"""Stopping a component promptly whatever the broker is doing: one deadline, bounded waits.

A component's loop asks `stop.requested` (or calls `stop()`), and every wait on its way out (a producer
flush, a synchronous commit, a consumer close) is given `stop.budget(cap)` seconds and abandoned,
with a log line, when they run out. Abandoning is safe because every component commits its input
offsets only after the outputs they account for are delivered: an abandoned flush is followed by no
commit, and an abandoned commit leaves the previous one standing, so the next start replays a little
input, which the idempotent sinks and the processors' replay guards absorb (the same as a crash).

Why a watcher thread reads the signals: a Python signal handler runs only when the main thread
executes bytecode, and the main thread may sit in a client call that no signal interrupts (a
synchronous commit to a frozen broker waits for socket.timeout.ms, 60 s). The signal module's
wakeup fd is written by the C-level handler at once; the watcher reads it, so the first SIGTERM or
SIGINT is seen immediately, a second one ends the process at once (status 128 + the signal), and if
the bounded steps still overrun, the deadline ends it (status EXIT_DEADLINE).

Blocking client calls that take no timeout run through `BoundedCall`, on a helper thread the caller
waits for at most a bound (and less once a stop is requested).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

log = logging.getLogger("base.shutdown")

T = TypeVar("T")

STOP_DEADLINE_S = 15.0  # first signal to exit; the supervisor sends SIGKILL after 20 s (components.py)
EXIT_RESERVE_S = 2.0  # of the deadline kept back for the interpreter's exit
CLOSE_RESERVE_S = 4.0  # kept back by flushes and commits once stopping, for closing the clients
CLOSE_WAIT_S = 10.0  # the longest a consumer's close may take (it waits for its last commits), less once stopping
EXIT_DEADLINE = 124  # the deadline passed with a step still waiting (as timeout(1) reports a timeout)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SLICE_S = 0.1  # how often a bounded wait looks at the stop deadline


class StopSignal:
    """The stop request of one process: set by SIGTERM/SIGINT (once `install`ed) or `request()`.

    `budget(cap)` is what a wait may take: `cap` while running, and what is left of the deadline
    (less a reserve for the exit itself) once stopping. Callable, for loops that take a
    `should_stop` function.
    """

    def __init__(
        self,
        deadline_s: float = STOP_DEADLINE_S,
        *,
        on_stop: Callable[[], None] | None = None,
        name: str = "component",
        clock: Callable[[], float] = time.monotonic,
        exit_now: Callable[[int], Any] = os._exit,
    ) -> None:
        self.deadline_s = deadline_s
        self.name = name
        self._on_stop = on_stop
        self._clock = clock
        self._exit_now = exit_now
        self._lock = threading.Lock()
        self._stop_at: float | None = None  # clock() of the deadline, once requested
        self._signals = 0
        self._finished = threading.Event()  # the process is done: the watchdog stands down
        self._installed: dict[int, Any] = {}
        self._pipe: tuple[int, int] | None = None
        self._old_wakeup_fd = -1
        self.abandoned: list[str] = []

    # -- the request --------------------------------------------------------------------------
    def __call__(self) -> bool:
        return self.requested

    @property
    def requested(self) -> bool:
        return self._stop_at is not None

    def request(self, why: str = "stop requested") -> None:
        """Start the stop (idempotent: the first request fixes the deadline)."""
        with self._lock:
            if self._stop_at is not None:
                return
            self._stop_at = self._clock() + self.deadline_s
        log.info("%s: %s, stopping within %.0f s", self.name, why, self.deadline_s)
        if self._on_stop is not None:
            self._on_stop()

    def left(self) -> float:
        """Seconds left before the deadline; infinite while no stop is requested."""
        stop_at = self._stop_at
        return math.inf if stop_at is None else stop_at - self._clock()

    def budget(self, cap: float, keep: float = 0.0) -> float:
        """How long a wait may last now: `cap`, or once stopping what is left of the deadline less
        the exit's reserve and `keep` (kept for the steps after this one). Never negative."""
        if self._stop_at is None:
            return cap
        return max(0.0, min(cap, self.left() - EXIT_RESERVE_S - keep))

    def abandon(self, what: str) -> None:
        """Record and log a shutdown step given up on (its input is replayed at the next start)."""
        self.abandoned.append(what)
        log.warning("%s: stopping without %s (the next start replays from the last commit)", self.name, what)

    def finished(self) -> None:
        """The component is done: a watchdog armed by a signal stands down."""
        self._finished.set()

    def leave(self, code: int = 0) -> None:
        """Called by a command once its work and its output are done. With nothing abandoned it returns and the
        interpreter exits as usual. After an abandoned step a client call is still running on a helper thread
        (`BoundedCall`, e.g. a consumer close waiting on a broker that is gone), and finalizing the interpreter
        under a C client's thread can crash the process (seen: `processors run` ended by SIGSEGV, status -11,
        after abandoning its consumers' closes); so the process ends here, its output and logs flushed."""
        if not self.abandoned:
            return
        self.finished()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # exiting regardless
                stream.flush()
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        self._exit_now(code)

    # -- signals ------------------------------------------------------------------------------
    @property
    def installed(self) -> bool:
        return self._pipe is not None

    def install(self) -> StopSignal:
        """Handle SIGTERM and SIGINT in this process (call from the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("signal handlers can only be installed from the main thread")
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        for sig in STOP_SIGNALS:
            self._installed[sig] = signal.signal(sig, self._handler)
        self._old_wakeup_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(read_fd,), name="stop-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        """Put back the previous handlers (an in-process caller's, e.g. a test's) and stand down."""
        self.finished()
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._old_wakeup_fd)
        for sig, old in self._installed.items():
            signal.signal(sig, old)
        self._installed.clear()
        os.close(self._pipe[1])  # the watcher reads end-of-file and returns
        self._pipe = None

    def __enter__(self) -> StopSignal:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handler(self, signum: int, _frame: Any) -> None:
        # Runs late if the main thread is inside a client call; the watcher has acted by then.
        self.request(f"{signal.Signals(signum).name} received")

    def _watch(self, read_fd: int) -> None:
        try:
            while True:
                data = os.read(read_fd, 64)
                if not data:
                    return
                for signum in data:
                    if signum in STOP_SIGNALS:
                        self._on_signal(signum)
        finally:
            os.close(read_fd)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        with self._lock:
            self._signals += 1
            first = self._signals == 1
        if first:
            self.request(f"{name} received")
            threading.Thread(target=self._watchdog, name="stop-deadline", daemon=True).start()
        else:
            self._exit(128 + signum, "%s: second stop signal (%s): exiting now", self.name, name)

    def _watchdog(self) -> None:
        if not self._finished.wait(max(0.0, self.left())):
            with contextlib.suppress(Exception):  # where each thread waits: the step to bound next
                faulthandler.dump_traceback(all_threads=True)
            self._exit(
                EXIT_DEADLINE,
                "%s: still not stopped %.0f s after the stop signal: exiting (abandoned: %s)",
                self.name,
                self.deadline_s,
                ", ".join(self.abandoned) or "the step in progress",
            )

    def _exit(self, code: int, msg: str, *args: object) -> None:
        log.error(msg, *args)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):  # exiting regardless
                handler.flush()
        self._exit_now(code)


class BoundedCall(Generic[T]):
    """A blocking call with no timeout of its own (a synchronous commit, a consumer close), run on a
    helper thread so that the caller waits for it at most a bound. Left running when abandoned."""

    def __init__(self, fn: Callable[[], T], what: str) -> None:
        self.what = what
        self._fn = fn
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"bounded: {what}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._fn()
        except BaseException as exc:  # handed to the caller by result()
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float, stop: StopSignal | None = None, keep: float = 0.0) -> bool:
        """Wait up to `timeout_s`, cut short by a stop's budget (`StopSignal.budget`). True when the
        call has returned."""
        end = time.monotonic() + timeout_s
        while self._thread.is_alive():
            now = time.monotonic()
            limit = end if stop is None else min(end, now + stop.budget(math.inf, keep))
            if now >= limit:
                return False
            self._thread.join(min(limit - now, _SLICE_S))
        return True

    def result(self) -> T | None:
        """The call's return value, or its exception raised here (only once `done`)."""
        if self._error is not None:
            raise self._error
        return self._result


def call_within(
    fn: Callable[[], T], timeout_s: float, what: str, stop: StopSignal | None = None, keep: float = 0.0
) -> BoundedCall[T]:
    """Start `fn` on a helper thread and wait for it up to `timeout_s` (see `BoundedCall.wait`)."""
    call = BoundedCall(fn, what)
    call.wait(timeout_s, stop, keep)
    return call


class Flushable(Protocol):
    def flush(self, timeout: float) -> int: ...


def flush_within(producer: Flushable, timeout_s: float, stop: StopSignal | None = None, keep: float = 0.0) -> int:
    """`producer.flush` for up to `timeout_s`, in short slices so that a stop cuts it to the stop's
    budget (`StopSignal.budget`). Returns the number of records still undelivered (0: all delivered)."""
    end = time.monotonic() + timeout_s
    while True:
        now = time.monotonic()
        limit = end if stop is None else min(end, now + stop.budget(math.inf, keep))
        remaining = producer.flush(max(0.0, min(limit - now, 5 * _SLICE_S)))
        if remaining == 0 or time.monotonic() >= limit:
            return int(remaining)


def budget(stop: Callable[[], bool] | None, cap: float, keep: float = 0.0) -> float:
    """`stop.budget(cap, keep)` when `stop` is a `StopSignal`; `cap` for any other stop function."""
    return stop.budget(cap, keep) if isinstance(stop, StopSignal) else cap


def close_within(
    close: Callable[[], object], what: str, stop: Callable[[], bool] | None = None, timeout_s: float = CLOSE_WAIT_S
) -> bool:
    """Run a client's `close()` for at most `timeout_s` (less once `stop`, a `StopSignal`, is stopping).
    False, logged, when it was left running (its thread ends with the process)."""
    signal_ = stop if isinstance(stop, StopSignal) else None
    call = BoundedCall(close, what)
    if not call.wait(timeout_s, signal_):
        if signal_ is not None:
            signal_.abandon(what)
        else:
            log.warning("%s: still waiting after %.0f s, left behind", what, timeout_s)
        return False
    try:
        call.result()
    except Exception as exc:  # leaving the group is best effort
        log.warning("%s: %s", what, exc)
    return True
