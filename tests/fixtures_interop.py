"""The reference-implementation program of tests/interop (a pytest plugin, listed in tests/conftest.py).

interop_java   the Java program (Apache Avro's BinaryMessageDecoder/Encoder, kafka-clients), built once:
               `mvn -q -B -o package` in a copy of tests/interop (online when the local Maven cache
               lacks something), the jar and its dependencies kept under
               `<user cache dir>/gpuledger/interop/<hash of pom.xml and src/>`, so a later session only
               starts it. `interop_java.run("decode", "--bootstrap", ...)` returns its JSON output.

Also a script: `.venv/bin/python tests/fixtures_interop.py [--rebuild]` builds (or finds) the jar and
prints where it is and how long the build took.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from platformdirs import user_cache_dir

INTEROP = Path(__file__).resolve().parent / "interop"
JAR_NAME = "gpuledger-interop.jar"


def source_files(root: Path = INTEROP) -> list[Path]:
    """What the build depends on: the pom and every file under src/."""
    return [root / "pom.xml", *sorted(p for p in (root / "src").rglob("*") if p.is_file())]


def source_hash(root: Path = INTEROP) -> str:
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class InteropJava:
    jar: Path
    build_s: float | None  # seconds Maven ran in this process; None: found in the cache

    def argv(self, *args: str) -> list[str]:
        java = shutil.which("java") or "java"
        return [java, "-jar", str(self.jar), *args]

    def run(self, *args: str, timeout_s: float = 300) -> dict[str, Any]:
        """Run one command of the program and return its JSON output; a non-zero exit fails with stderr."""
        proc = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout_s, check=False)
        if proc.returncode != 0:
            raise AssertionError(f"interop {args[0]} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
        result: dict[str, Any] = json.loads(proc.stdout)
        return result


def _mvn(build: Path, offline: bool) -> subprocess.CompletedProcess[str]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed to build tests/interop; install it, e.g. `apt-get install maven`")
    argv = [mvn, "-q", "-B", *(["-o"] if offline else []), "package"]
    return subprocess.run(argv, cwd=build, capture_output=True, text=True, timeout=600, check=False)


def build_interop(cache_root: Path | None = None, *, rebuild: bool = False) -> InteropJava:
    """The program's jar for the current sources: from the cache, or built now (offline first)."""
    root = (cache_root or Path(user_cache_dir("gpuledger"))) / "interop"
    dest = root / source_hash()
    if rebuild and dest.exists():
        shutil.rmtree(dest)
    if (dest / ".complete").is_file():
        return InteropJava(dest / JAR_NAME, None)
    root.mkdir(parents=True, exist_ok=True)
    # Test workers starting at once build once: the first holds the lock (two Mavens filling ~/.m2 at once can
    # leave it half-written), the others find its jar when they get it.
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / ".complete").is_file():
            return InteropJava(dest / JAR_NAME, None)
        return _build(root, dest)


def _build(root: Path, dest: Path) -> InteropJava:
    build = root / f".build-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    shutil.copy2(INTEROP / "pom.xml", build / "pom.xml")
    shutil.copytree(INTEROP / "src", build / "src")
    started = time.monotonic()
    proc = _mvn(build, offline=True)
    if proc.returncode != 0:  # something is not in ~/.m2 yet: let Maven fetch it
        proc = _mvn(build, offline=False)
    took = time.monotonic() - started
    if proc.returncode != 0:
        raise RuntimeError(f"building tests/interop failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    staged = build / "out"
    staged.mkdir()
    shutil.copy2(build / "target" / JAR_NAME, staged / JAR_NAME)
    shutil.copytree(build / "target" / "lib", staged / "lib")  # the manifest's Class-Path: lib/*.jar
    (staged / ".complete").write_text(f"{took:.1f}\n")
    try:
        staged.rename(dest)
    except OSError:  # another process finished the same build first: use theirs
        if not (dest / ".complete").is_file():
            raise
    shutil.rmtree(build, ignore_errors=True)
    return InteropJava(dest / JAR_NAME, took)


@pytest.fixture(scope="session")
def interop_java() -> InteropJava:
    return build_interop()


if __name__ == "__main__":
    started = time.monotonic()
    built = build_interop(rebuild="--rebuild" in sys.argv)
    how = f"built in {built.build_s:.1f} s (Maven)" if built.build_s is not None else "found in the cache"
    print(f"{built.jar}: {how}; {time.monotonic() - started:.1f} s in all")
