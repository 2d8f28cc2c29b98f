"""The local schema registry: Apicurio Registry from Maven Central, its Confluent-compatible API on loopback.

Steps, each usable on its own (the supervisor runs them as one component, the tests as a fixture):

1. `ensure_app`: `mvn dependency:get` of `io.apicurio:apicurio-registry-app:<version>:tar.gz:all` (the
   prebuilt Quarkus application, ~105 MB), unpacked into `<user cache dir>/gpuledger/apicurio-registry-
   <version>/app` once; later runs reuse the directory.
2. `registry_argv`: the `java ... -jar apicurio-registry-app-<version>-runner.jar` command line: HTTP on
   loopback only (the management interface off), storage in an H2 *file* database under
   `<state_dir>/registry`, so schema ids survive `down`/`up` (the default in-memory database would hand
   out new ids after every restart while records carrying the old ones stay on the topics).
3. `wait_until_ready`: until `GET /apis/ccompat/v7/subjects` answers.

`LocalRegistry` strings these together for in-process use (tests, benchmarks); `stop` is the broker's
(`stack.broker.stop_process`). `check` is the read-only probe `status` and readiness use.
Apicurio's defaults differ from Confluent's in one way that matters: compatibility is NONE unless set;
`gpuledger schemas register` (schemas/registry_sync.py) sets BACKWARD.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

import httpx
from platformdirs import user_cache_dir

from base.errors import ConfigError, ServiceError
from base.settings import Settings
from stack import broker, jvm_archive

Progress = Callable[[str], None]

GROUP = "io.apicurio"
ARTIFACT = "apicurio-registry-app"


def _quiet(_: str) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# The application


def app_cache_dir(version: str, cache_root: Path | None = None) -> Path:
    """The per-version directory that holds the unpacked application (`app/`)."""
    root = cache_root if cache_root is not None else Path(user_cache_dir("gpuledger"))
    return root / f"apicurio-registry-{version}"


def runner_jar(app: Path, version: str) -> Path:
    return app / f"{ARTIFACT}-{version}-runner.jar"


def _app_complete(app: Path, version: str) -> bool:
    return runner_jar(app, version).is_file() and (app / ".complete").is_file()


def app_cached(version: str, cache_root: Path | None = None) -> bool:
    """Whether this version is unpacked in the cache already (no Maven run needed)."""
    return _app_complete(app_cache_dir(version, cache_root) / "app", version)


def _check_version(version: str) -> None:
    # The start-up properties below are Apicurio 3's (2.x names its storage and datasource differently).
    if not version.startswith("3."):
        raise ConfigError(f"registry.version {version!r}: gpuledger runs Apicurio Registry 3.x (e.g. 3.0.9)")


def ensure_app(
    version: str,
    cache_root: Path | None = None,
    *,
    progress: Progress = _quiet,
    maven_repo: Path | None = None,
) -> Path:
    """The unpacked application directory (runner jar + `lib/`), fetched with Maven on first use."""
    _check_version(version)
    target = app_cache_dir(version, cache_root)
    app = target / "app"
    if _app_complete(app, version):
        return app
    mvn = broker.find_mvn()
    broker.find_java()
    repo = maven_repo if maven_repo is not None else Path.home() / ".m2" / "repository"
    coords = f"{GROUP}:{ARTIFACT}:{version}:tar.gz:all"
    progress(f"fetching Apicurio Registry {version} ({coords}, ~105 MB) with Maven into {app} (first run only)")
    target.mkdir(parents=True, exist_ok=True)
    argv = [
        mvn,
        "--batch-mode",
        "--quiet",
        "dependency:get",
        f"-Dartifact={coords}",
        "-Dtransitive=false",  # its parent pom is not on Central; the assembly needs nothing else
        f"-Dmaven.repo.local={repo}",
    ]
    log = target / "mvn.log"
    with log.open("wb") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    archive = repo / GROUP.replace(".", "/") / ARTIFACT / version / f"{ARTIFACT}-{version}-all.tar.gz"
    if rc != 0 or not archive.is_file():
        lines = log.read_text(errors="replace").strip().splitlines()
        tail = next((ln for ln in reversed(lines) if "ERROR" in ln), lines[-1] if lines else "(no output)")
        raise ServiceError(
            f"Maven could not fetch Apicurio Registry {version} (exit {rc}): {tail[:200]} (full log: {log})"
        )
    progress(f"unpacking {archive.name}")
    staging = target / "app.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, links out or devices
    except (tarfile.TarError, OSError) as exc:
        raise ServiceError(f"cannot unpack {archive}: {exc}") from exc
    if not runner_jar(staging, version).is_file():
        raise ServiceError(f"{archive} holds no {runner_jar(staging, version).name}")
    (staging / ".complete").write_text(version + "\n")
    shutil.rmtree(app, ignore_errors=True)
    staging.rename(app)
    return app


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class RegistryConfig:
    """Everything needed to run one local registry."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 19081
    version: str = "3.0.9"
    heap: str = "256m"
    cache_root: Path | None = None
    maven_repo: Path | None = None
    # Map the class archive (stack.jvm_archive); the throwaway life that makes it writes it on exit instead.
    class_archive: bool = True
    archive_at_exit: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> RegistryConfig:
        r = settings.registry
        return cls(data_dir=settings.state_dir / "registry", host=r.host, port=r.port, version=r.version, heap=r.heap)

    @property
    def url(self) -> str:
        """The Confluent-compatible API (the URL clients are given)."""
        return f"http://{self.host}:{self.port}/apis/ccompat/v7"

    @property
    def database(self) -> Path:
        """The H2 database's base name (H2 adds `.mv.db`)."""
        return self.data_dir.resolve() / "db" / "registry"

    def properties(self) -> dict[str, str]:
        """Quarkus/Apicurio settings, passed as `-D` options (they win over the jar's own)."""
        if ";" in str(self.database):
            raise ConfigError(f"the registry's data directory {self.data_dir} contains ';' (H2 reads it as an option)")
        return {
            "quarkus.http.host": self.host,
            "quarkus.http.port": str(self.port),
            # Later 3.x releases open a management port on 0.0.0.0:9000 by default: never here.
            "quarkus.management.enabled": "false",
            "quarkus.management.host": self.host,
            "quarkus.http.access-log.enabled": "false",
            "apicurio.storage.kind": "sql",
            "apicurio.storage.sql.kind": "h2",
            "apicurio.datasource.url": f"jdbc:h2:file:{self.database}",
            "apicurio.datasource.jdbc.initial-size": "2",
            "apicurio.datasource.jdbc.min-size": "2",
            "apicurio.datasource.jdbc.max-size": "8",
            "apicurio.storage.snapshot.location": str(self.data_dir.resolve() / "snapshots"),
        }


def jvm_options(cfg: RegistryConfig, archive: Path | None = None) -> list[str]:
    # A registry answers a few requests a minute: a small serial-GC heap and the C1 compiler only start
    # faster and hold less memory on a 2-core machine than the defaults.
    extra = [f"-XX:SharedArchiveFile={archive}"] if archive is not None else []
    if cfg.archive_at_exit is not None:
        extra.append(f"-XX:ArchiveClassesAtExit={cfg.archive_at_exit}")
    return [
        *extra,
        "-Xms32m",
        f"-Xmx{cfg.heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-XX:CICompilerCount=1",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Djava.io.tmpdir={cfg.data_dir.resolve() / 'tmp'}",
    ]


def registry_argv(cfg: RegistryConfig, app: Path, archive: Path | None = None) -> list[str]:
    props = [f"-D{k}={v}" for k, v in cfg.properties().items()]
    return [broker.find_java(), *jvm_options(cfg, archive), *props, "-jar", str(runner_jar(app, cfg.version))]


def ensure_class_archive(cfg: RegistryConfig, app: Path, *, progress: Progress = _quiet) -> Path | None:
    """The registry's class archive (stack.jvm_archive), made by starting and stopping a throwaway registry."""
    java, jar = broker.find_java(), str(runner_jar(app, cfg.version))

    def write(part: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="registry-classes-") as d:
            (port,) = broker.free_ports(1)
            throwaway = replace(
                cfg, data_dir=Path(d), port=port, class_archive=False, archive_at_exit=part, maven_repo=None
            )
            LocalRegistry(throwaway).start(timeout=180).stop(timeout=120)  # the JVM writes it as it exits

    return jvm_archive.ensure_archive(jvm_archive.archive_path(app.parent, java, jar), java, jar, write, progress)


def prepare(cfg: RegistryConfig, *, progress: Progress = _quiet) -> list[str]:
    """Application, directories and port check; returns the command line that runs the registry."""
    if not cfg.host.startswith("127.") and cfg.host != "localhost":
        raise ConfigError(f"the local schema registry binds loopback only; registry.host is {cfg.host!r}")
    broker.find_java()
    broker.check_port_free(cfg.host, cfg.port, "schema registry port", "GPULEDGER_REGISTRY__PORT")
    app = ensure_app(cfg.version, cfg.cache_root, progress=progress, maven_repo=cfg.maven_repo)
    archive = ensure_class_archive(cfg, app, progress=progress) if cfg.class_archive else None
    for sub in ("db", "tmp", "snapshots"):
        (cfg.data_dir / sub).mkdir(parents=True, exist_ok=True)
    return registry_argv(cfg, app, archive)


# ---------------------------------------------------------------------------------------------
# Health


@dataclass(frozen=True)
class RegistryHealth:
    ok: bool
    detail: str
    subjects: list[str] | None = None  # None: unknown (not reachable)


def check(url: str, timeout: float = 2.0) -> RegistryHealth:
    """`GET <url>/subjects`: whether the Confluent-compatible API answers, and the subjects it holds."""
    from base.outputs import mask_text

    shown = mask_text(url)  # a configured external registry may carry a login
    try:
        resp = httpx.get(url.rstrip("/") + "/subjects", timeout=timeout)
    except httpx.HTTPError as exc:
        return RegistryHealth(False, f"{shown}: {type(exc).__name__}")
    if resp.status_code != 200:
        return RegistryHealth(False, f"{shown}: HTTP {resp.status_code}")
    try:
        subjects = [str(s) for s in resp.json()]
    except (ValueError, TypeError):
        return RegistryHealth(False, f"{shown}: not a subject list")
    return RegistryHealth(True, f"{shown}: {len(subjects)} subject(s)", sorted(subjects))


def wait_until_ready(
    url: str, timeout: float = 90.0, *, alive: Callable[[], bool] = lambda: True, log_path: Path | None = None
) -> None:
    deadline = time.monotonic() + timeout
    see = f"; see {log_path}" if log_path is not None else ""
    while time.monotonic() < deadline:
        if not alive():
            raise ServiceError(f"schema registry exited while starting{see}")
        if check(url, timeout=2.0).ok:
            return
        time.sleep(0.2)
    raise ServiceError(f"schema registry at {url} did not answer within {timeout:.0f}s{see}")


# ---------------------------------------------------------------------------------------------
# Running


class LocalRegistry(broker.OwnedProcess):
    """A registry owned by this Python process: `with LocalRegistry(cfg) as r: r.url`."""

    def __init__(self, cfg: RegistryConfig, *, progress: Progress = _quiet, log_path: Path | None = None):
        super().__init__(log_path or cfg.data_dir / "registry.log")
        self.cfg = cfg
        self.progress = progress

    @property
    def url(self) -> str:
        return self.cfg.url

    def start(self, timeout: float = 90.0) -> Self:
        argv = prepare(self.cfg, progress=self.progress)
        self.progress(f"starting schema registry on {self.url}")
        self._launch(argv, lambda alive: wait_until_ready(self.url, timeout, alive=alive, log_path=self.log_path))
        return self


@contextlib.contextmanager
def running_registry(cfg: RegistryConfig, *, progress: Progress = _quiet) -> Iterator[LocalRegistry]:
    with LocalRegistry(cfg, progress=progress) as registry:
        yield registry
