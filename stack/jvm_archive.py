"""Java's application class-data archives (AppCDS) for the JVM services the stack runs (the broker, the
registry): the classes an application loads while it starts, written once by a throwaway life of it
(-XX:ArchiveClassesAtExit) and mapped by every later JVM (-XX:SharedArchiveFile), which then starts on
about half the CPU (docs/benchmarks.md). An archive belongs to one JDK and one class path: its name is
derived from both, so an upgrade of either names a new one. It is kept only when the JVM maps it with
sharing required (-Xshare:on), and written under a lock beside the cached jars so processes starting at
once make it once. When it cannot be made, the services start without it, as before."""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from base.errors import GpuledgerError

log = logging.getLogger(__name__)


def archive_path(directory: Path, java: str, classpath: str) -> Path:
    """Where the archive of this JDK and class path is kept, in `directory`."""
    jdk = Path(java).resolve()
    key = f"{jdk}:{jdk.stat().st_mtime_ns}:{classpath}"
    return directory / f"classes-{hashlib.sha256(key.encode()).hexdigest()[:16]}.jsa"


def maps(java: str, archive: Path, classpath: str) -> bool:
    """The JVM maps `archive` with sharing required (it refuses a truncated or foreign one)."""
    argv = [java, "-Xshare:on", f"-XX:SharedArchiveFile={archive}", "-cp", classpath, "-version"]
    return subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, timeout=60).returncode == 0


def ensure_archive(
    path: Path, java: str, classpath: str, write: Callable[[Path], None], progress: Callable[[str], None]
) -> Path | None:
    """`path`, made first if missing: `write(part)` runs the throwaway life whose JVM writes `part` on exit. An
    attempt that fails leaves a marker, so the services start without an archive for a day instead of paying
    for a throwaway life at every start."""
    if path.is_file():
        return path
    failed = path.with_name(path.name + ".failed")
    if _recent(failed):
        return None
    with (path.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.is_file():
                return path
            if _recent(failed):
                return None
            progress(f"archiving the classes of {path.parent.name} for faster starts (first run only)")
            part = path.with_name(f"{path.name}.{os.getpid()}.part")
            try:
                write(part)
                if part.is_file() and maps(java, part, classpath):
                    os.replace(part, path)  # atomic: a reader sees no archive or the whole one
            except (GpuledgerError, OSError, subprocess.SubprocessError) as exc:
                log.warning("no class archive for %s (it starts without one): %s", path.parent.name, exc)
            finally:
                part.unlink(missing_ok=True)
            if not path.is_file():
                failed.touch()
            return path if path.is_file() else None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


RETRY_AFTER_S = 86_400


def _recent(marker: Path) -> bool:
    try:
        return time.time() - marker.stat().st_mtime < RETRY_AFTER_S
    except FileNotFoundError:
        return False
