"""One server per data path: the lock file names its owner and goes away with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stack.clickhouse.lockfile import DataPathLock, PathInUse, chdb_status_pid


def test_second_lock_names_path_pid_and_url(tmp_path: Path) -> None:
    first = DataPathLock(tmp_path / "data")
    first.acquire()
    first.update({"url": "http://127.0.0.1:8123"})
    try:
        with pytest.raises(PathInUse) as err:
            DataPathLock(tmp_path / "data").acquire()
        message = str(err.value)
        assert str(tmp_path / "data") in message and f"process {os.getpid()}" in message
        assert "http://127.0.0.1:8123" in message
    finally:
        first.release()
    again = DataPathLock(tmp_path / "data")
    again.acquire()  # released: the path is free again
    again.release()


def test_chdb_status_pid(tmp_path: Path) -> None:
    assert chdb_status_pid(tmp_path) is None
    (tmp_path / "status").write_text("PID: 4242\nStarted at: 2026-11-30 01:00:00\nRevision: 54515\n")
    assert chdb_status_pid(tmp_path) == 4242
