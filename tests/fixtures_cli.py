"""Helpers for tests that drive the `gpuledger` command or stand in for scheduler tools (no fixtures).

run_gpuledger     runs `gpuledger ARGS...` in a fresh interpreter (this venv's), output captured as text; past
                  its timeout, fails with the end of its stderr.
fake_slurm_tools  writes `scontrol`/`scancel` stand-ins into a `bin` folder that only record their
                  calls (one line each, "tool args...", in the file it returns); put the folder on PATH.
"""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
from pathlib import Path

GPULEDGER = (sys.executable, "-c", "from gpuledger.cli import main; main()")


def run_gpuledger(
    args: list[str], env: dict[str, str], timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    # PYTHONFAULTHANDLER: past its timeout the command gets SIGABRT first, so its stderr ends with every
    # thread's stack (where it hung), shown in the failure instead of a truncated repr.
    with subprocess.Popen(
        [*GPULEDGER, *args], env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            try:
                out, err = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            raise AssertionError(f"gpuledger {' '.join(args)} ran past {timeout:.0f} s; its stderr ends:\n"
                                 f"{err[-8000:]}") from None  # fmt: skip
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def fake_slurm_tools(tmp_path: Path, tools: tuple[str, ...] = ("scontrol", "scancel")) -> tuple[Path, Path]:
    """(the bin folder, the calls file)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    for tool in tools:
        script = bindir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bindir, calls
