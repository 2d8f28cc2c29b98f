"""The engine's own confinement under the access checks: `user_files_path` is an empty folder of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from stack.clickhouse.engine import Engine, QueryFailed

pytestmark = pytest.mark.integration


def test_relative_file_paths_resolve_in_an_empty_folder_of_the_servers_own(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("in the state dir\n")
    engine = Engine(tmp_path / "clickhouse")
    try:
        handle = engine.open_handle()
        folder = handle.run("SELECT value FROM system.server_settings WHERE name = 'user_files_path'")
        assert folder.bytes().decode().strip().rstrip("/") == str(tmp_path / "clickhouse-user-files")
        assert (tmp_path / "clickhouse-user-files").stat().st_mode & 0o777 == 0o700
        with pytest.raises(QueryFailed):  # a relative path finds nothing outside that folder
            handle.run("SELECT * FROM file('secret.txt', LineAsString)")
        handle.close()
    finally:
        engine.close()
