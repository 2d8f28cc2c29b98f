"""What `gpuledger dev kube|slurm up` leaves behind for `down` and `status`: `<state_dir>/pids.json`, the
processes it started (they outlive the command) and the cluster's configuration."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

from stack.broker import pid_alive, stop_process

PIDS_FILE = "pids.json"


def record(state_dir: Path, config: Mapping[str, Any], pids: Mapping[str, int]) -> None:
    (state_dir / PIDS_FILE).write_text(json.dumps({"config": dict(config), "pids": dict(pids)}), encoding="utf-8")


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
