"""What the start-up benchmarks share: the machine line and a process's resident memory.

Imported as `_common` (each benchmark runs as `.venv/bin/python bench/<name>.py`, so `bench/` is on the path).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path


def rss_mib(pid: int) -> float:
    """The process's resident set size in MiB (NaN when /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def machine() -> str:
    """Cores, memory and platform, as the figures in docs/benchmarks.md name the machine."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores, {memory_gib:.0f} GiB, {platform.platform()}"
