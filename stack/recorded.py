"""What `gpuledger dev kube|slurm up` leaves behind for `down` and `status`: `<state_dir>/pids.json`, the
processes it started (they outlive the command) and the cluster's configuration."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self

import typer

from stack.broker import _die_with_parent, pid_alive, stop_process

PIDS_FILE = "pids.json"


def record(state_dir: Path, config: Mapping[str, Any], pids: Mapping[str, int]) -> None:
    (state_dir / PIDS_FILE).write_text(json.dumps({"config": dict(config), "pids": dict(pids)}), encoding="utf-8")


class Harness:
    """What the live engine harnesses share (`stack.kube.cluster.LocalKube`, `stack.slurm.cluster.LocalSlurm`):
    `start` prepares their files, starts their processes (all stopped again when one fails), times it and, unless
    the harness owns them (tests: they die with this Python process), records them for `down` and `status`;
    `with harness:` starts and stops it."""

    cfg: Any  # its configuration: `state_dir`, `to_json()`, `log(process)`
    owned: bool
    procs: dict[str, subprocess.Popen[bytes]]
    _logs: dict[str, IO[bytes]]
    start_s: float | None

    def _spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start process `name`, its output appended to its log; owned, it dies with this Python process."""
        log = self.cfg.log(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        self._logs[name] = log.open("ab")
        proc = subprocess.Popen(
            list(argv), stdout=self._logs[name], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env, preexec_fn=_die_with_parent if self.owned else None,
        )  # fmt: skip
        self.procs[name] = proc
        return proc

    def _stop_one(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            if proc.poll() is None:
                stop_process(proc.pid, timeout=20)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        log = self._logs.pop(name, None)
        if log is not None:
            log.close()

    def _prepare(self) -> None:
        """The files and keys its processes read, written before any of them starts."""

    def _start_processes(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        began = time.monotonic()
        self._prepare()
        try:
            self._start_processes()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - began
        if not self.owned:
            record(self.cfg.state_dir, self.cfg.to_json(), {n: p.pid for n, p in self.procs.items()})
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def forget(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (state_dir / PIDS_FILE).unlink()


def stop_recorded(state_dir: Path, order: Sequence[str], after: Callable[[], None] = lambda: None) -> list[str]:
    """Stop the recorded processes, last of `order` first; `after` stops what they leave (a scheduler's jobs)."""
    path = state_dir / PIDS_FILE
    if not path.is_file():
        return []
    pids: dict[str, int] = json.loads(path.read_text(encoding="utf-8"))["pids"]
    stopped = []
    for name in reversed(order):
        pid = pids.get(name)
        if pid is not None and pid_alive(pid):
            stop_process(pid, timeout=20)
            stopped.append(name)
    after()
    path.unlink()
    return stopped


def running(state_dir: Path) -> Iterator[tuple[str, int, bool]]:
    """(name, pid, alive) of each recorded process."""
    path = state_dir / PIDS_FILE
    if path.is_file():
        for name, pid in json.loads(path.read_text(encoding="utf-8"))["pids"].items():
            yield name, pid, pid_alive(pid)


def echo_down(stopped: list[str]) -> None:
    typer.echo(f"stopped {', '.join(stopped)}" if stopped else "nothing running")


def echo_status(state_dir: Path) -> None:
    """One line per recorded process; exit 1 when none is recorded or one does not run."""
    found = list(running(state_dir))
    width = max((len(name) for name, _, _ in found), default=0) + 2
    for name, pid, alive in found:
        typer.echo(f"{name:<{width}} pid {pid:<8} {'running' if alive else 'stopped'}")
    if not found or not all(alive for _, _, alive in found):
        raise typer.Exit(1)
