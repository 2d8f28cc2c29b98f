"""stack.jvm_archive: an archive the JVM will not map is never kept, and a failed attempt is not repeated at every
start (the making of a good one is tests/integration/test_broker_launcher.py's)."""

from __future__ import annotations

from pathlib import Path

from base.errors import ServiceError
from stack import jvm_archive
from stack.broker import find_java


def test_a_file_the_jvm_will_not_map_is_not_kept_and_the_attempt_is_not_repeated(tmp_path: Path) -> None:
    java = find_java()
    path = jvm_archive.archive_path(tmp_path, java, str(tmp_path))
    calls: list[Path] = []

    def write_garbage(part: Path) -> None:
        calls.append(part)
        part.write_bytes(b"not a class-data archive" * 1000)

    assert jvm_archive.ensure_archive(path, java, str(tmp_path), write_garbage, print) is None
    assert not path.exists() and not list(tmp_path.glob("*.part"))  # the JVM refused it (-Xshare:on)
    assert jvm_archive.ensure_archive(path, java, str(tmp_path), write_garbage, print) is None
    assert len(calls) == 1  # the marker holds further attempts off


def test_a_life_that_fails_leaves_no_archive_and_a_marker(tmp_path: Path) -> None:
    java = find_java()
    path = jvm_archive.archive_path(tmp_path, java, "x.jar")

    def fail(part: Path) -> None:
        raise ServiceError("the throwaway broker did not start")

    assert jvm_archive.ensure_archive(path, java, "x.jar", fail, print) is None
    assert path.with_name(path.name + ".failed").is_file()


def test_the_name_follows_the_class_path(tmp_path: Path) -> None:
    java = find_java()
    a, b = (jvm_archive.archive_path(tmp_path, java, cp) for cp in ("libs/*", "app/runner.jar"))
    assert a != b and a.parent == b.parent == tmp_path and a.suffix == ".jsa"
