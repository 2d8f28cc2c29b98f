"""One server per data path: an advisory lock next to chDB's own, naming the owner.

chDB locks `<path>/status` itself, but a second process learns only "Error initializing
EmbeddedServer". This lock is taken first, and its file says who holds the path, so the second
server can fail at once with a message that names the path and the owning process. The kernel
drops an flock when its process dies (even `kill -9`), so a stale file never blocks a restart.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

from base.errors import ServiceError

LOCK_NAME = "gpuledger-clickhouse.lock"


class PathInUse(ServiceError):
    """Another process owns the data path."""

    def __init__(self, path: Path, owner: dict[str, Any]) -> None:
        pid = owner.get("pid", "unknown")
        where = f" serving {owner['url']}" if owner.get("url") else ""
        super().__init__(
            f"ClickHouse data path {path} is in use by process {pid}{where}; "
            f"stop that process or choose another --path"
        )
        self.path = path
        self.owner = owner


def chdb_status_pid(path: Path) -> int | None:
    """The pid in chDB's own `<path>/status` file (written by the process holding the engine)."""
    try:
        text = (path / "status").read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"PID:\s*(\d+)", text)
    return int(match.group(1)) if match else None


class DataPathLock:
    """Holds the lock for the life of the server; `update` records where it listens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PathInUse(self.path, self.read_owner()) from None
        self._fd = fd
        self.update({"pid": os.getpid()})

    def read_owner(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text() or "{}")
        except (OSError, ValueError):
            data = {}
        return data if isinstance(data, dict) else {}

    def update(self, owner: dict[str, Any]) -> None:
        if self._fd is None:
            raise ServiceError(f"lock on {self.path} is not held")
        payload = json.dumps({"pid": os.getpid(), **owner}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, payload, 0)

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
