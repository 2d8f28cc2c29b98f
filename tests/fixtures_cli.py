"""Helpers for tests that drive the `gpuledger` command or stand in for scheduler tools (no fixtures).

run_gpuledger     runs `gpuledger ARGS...` in a fresh interpreter (this venv's), output captured as text.
fake_slurm_tools  writes `scontrol`/`scancel` stand-ins into a `bin` folder that only record their
                  calls (one line each, "tool args...", in the file it returns); put the folder on PATH.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

GPULEDGER = (sys.executable, "-c", "from gpuledger.cli import main; main()")


def run_gpuledger(
    args: list[str], env: dict[str, str], timeout: float = 180, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPULEDGER, *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


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
