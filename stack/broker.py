"""The local Apache Kafka broker: real broker jars from Maven Central, one KRaft node on loopback, or a
cluster of three (`broker.nodes = 3`, `LocalCluster`).

Steps, each usable on its own (the supervisor runs them as one component, the tests as a fixture):

1. `ensure_jars`: `mvn dependency:copy-dependencies` on `deploy/kafka/pom.xml` into
   `<user cache dir>/gpuledger/kafka-<version>/libs`, once; later runs reuse the directory.
   `ensure_class_archive`: the broker's class-data archive (stack.jvm_archive), made once.
2. `write_config` + `format_storage`: a `server.properties` for a combined broker+controller bound to
   loopback, and `kafka.tools.StorageTool format` on a data directory that is not formatted yet
   (an existing one is never reformatted, so data survives restarts).
3. `broker_argv`: the `java ... kafka.Kafka server.properties` command line, heap and threads sized
   for a 2-core, 24 GB machine.
4. `wait_until_ready`: until the broker answers a metadata request.
5. `stop_process`: SIGTERM, wait, then SIGKILL.

`LocalBroker` strings these together for in-process use (tests, benchmarks).

A cluster (`cluster_configs`, `LocalCluster`): three combined broker+controller nodes on loopback that
are the KRaft quorum too (`voters`), formatted with one cluster id; the internal topics are replicated
on three with a min ISR of 2, so any one node may die. A single node of a quorum of three never answers
on its own: nodes are launched together, and the cluster is ready once every node is in the metadata.

Listeners are described by `Listener` values; `stack.security` builds the SASL/SCRAM + TLS one
and turns the plaintext client listener off (`plaintext_listener=False`), and the SCRAM users it
passes in `scram_credentials` are created at format time (`--add-scram`, from a 0600 argument file
so no password is ever on a command line).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Self

from platformdirs import user_cache_dir

from base.errors import ConfigError, DependencyMissing, PortInUse, ServiceError
from base.settings import Settings, default_min_insync
from stack import jvm_archive

Progress = Callable[[str], None]

CLUSTER_ID_FILE = "cluster.id"
META_PROPERTIES = "meta.properties"
KAFKA_MAIN = "kafka.Kafka"
STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"


def _quiet(_: str) -> None:
    return None


# ---------------------------------------------------------------------------------------------
# Where things are


def deploy_dir() -> Path:
    """`deploy/kafka` of this checkout: the pom and the logging configuration."""
    here = Path(__file__).resolve().parents[1] / "deploy" / "kafka"
    if not (here / "pom.xml").is_file():
        raise ConfigError(
            f"the Kafka broker pom is not at {here / 'pom.xml'}; run gpuledger from a checkout of the "
            "project, or point it at an external cluster (GPULEDGER_KAFKA__BOOTSTRAP_SERVERS, "
            "GPULEDGER_BROKER__ENABLED=false)"
        )
    return here


def jar_cache_dir(kafka_version: str, cache_root: Path | None = None) -> Path:
    """The per-version directory that holds the broker jars (`libs/`)."""
    root = cache_root if cache_root is not None else Path(user_cache_dir("gpuledger"))
    return root / f"kafka-{kafka_version}"


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise DependencyMissing(
            "Java is not installed (no `java` on PATH): install a JDK 17 or newer, e.g. "
            "`apt-get install openjdk-17-jre-headless`"
        )
    return java


def find_mvn() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DependencyMissing(
            "Maven is not installed (no `mvn` on PATH); it fetches the Kafka broker jars once: "
            "install it, e.g. `apt-get install maven`"
        )
    return mvn


# ---------------------------------------------------------------------------------------------
# Jars


def _jars_complete(libs: Path, kafka_version: str) -> bool:
    return (libs / f"kafka_2.13-{kafka_version}.jar").is_file() and (libs / ".complete").is_file()


def jars_cached(kafka_version: str, cache_root: Path | None = None) -> bool:
    """Whether the broker jars of this version are in the cache already (no Maven run needed)."""
    return _jars_complete(jar_cache_dir(kafka_version, cache_root) / "libs", kafka_version)


def ensure_jars(
    kafka_version: str,
    cache_root: Path | None = None,
    *,
    progress: Progress = _quiet,
    maven_repo: Path | None = None,
) -> Path:
    """The `libs/` directory holding the broker's jars, fetched with Maven on first use."""
    target = jar_cache_dir(kafka_version, cache_root)
    libs = target / "libs"
    if _jars_complete(libs, kafka_version):
        return libs
    target.mkdir(parents=True, exist_ok=True)
    # Processes starting at once (test workers, `up` beside a test) fetch once: the first holds the lock, the
    # others find its result when they get it.
    with (target / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if _jars_complete(libs, kafka_version):
                return libs
            return _fetch_jars(kafka_version, target, progress=progress, maven_repo=maven_repo)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _fetch_jars(kafka_version: str, target: Path, *, progress: Progress, maven_repo: Path | None) -> Path:
    libs = target / "libs"
    mvn = find_mvn()
    find_java()  # Maven needs it too; say so before Maven does, in one line.
    pom = deploy_dir() / "pom.xml"
    progress(f"fetching Apache Kafka {kafka_version} broker jars with Maven into {libs} (first run only)")
    staging = target / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True, exist_ok=True)
    argv = [
        mvn,
        "--batch-mode",
        "--quiet",
        "-f",
        str(pom),
        f"-Dkafka.version={kafka_version}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    if maven_repo is not None:
        argv.append(f"-Dmaven.repo.local={maven_repo}")
    log = target / "mvn.log"
    with log.open("wb") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0 or not (staging / f"kafka_2.13-{kafka_version}.jar").is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise ServiceError(
            f"Maven could not fetch Apache Kafka {kafka_version} (exit {rc}): {tail[0][:200]} (full log: {log})"
        )
    (staging / ".complete").write_text(kafka_version + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    return libs


def classpath(libs: Path) -> str:
    return str(libs / "*")  # the JVM expands it to every jar in the directory


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Listener:
    """One client listener. `properties` is the extension point for SASL/SCRAM + TLS.

    A secured listener would set `security_protocol="SASL_SSL"` and return, from `extra`, the
    `listener.name.<name>.scram-sha-512.sasl.jaas.config`, `ssl.keystore.*` and
    `sasl.enabled.mechanisms` keys; `BrokerConfig.properties` merges them in unchanged.
    """

    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def properties(self) -> dict[str, str]:
        return dict(self.extra)


@dataclass(frozen=True)
class BrokerConfig:
    """Everything needed to run one local combined broker+controller."""

    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 19092
    controller_port: int = 19093
    heap: str = "512m"
    kafka_version: str = "4.1.1"
    cache_root: Path | None = None
    maven_repo: Path | None = None
    extra_listeners: tuple[Listener, ...] = ()
    overrides: tuple[tuple[str, str], ...] = field(default=())
    # False: only `extra_listeners` serve clients (a secured broker has no plaintext client port).
    plaintext_listener: bool = True
    # (mechanism, user, password) created by `format_storage` with `--add-scram`.
    scram_credentials: tuple[tuple[str, str, str], ...] = field(default=(), repr=False)
    # What `LocalBroker`'s own clients add to `bootstrap.servers` (a secured broker's admin login).
    client_overrides: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    node_id: int = 1
    # (node id, controller port) of every controller of the quorum; empty: this node alone.
    voters: tuple[tuple[int, int], ...] = ()
    # Where the KRaft cluster id is kept (shared by a cluster's nodes); None: beside the data.
    cluster_id_file: Path | None = None
    # "quick": the JVM compiles with C1 only, for brokers that live seconds to minutes (base.settings).
    jit: Literal["full", "quick"] = "full"
    # Map the class archive (`ensure_class_archive`); the throwaway life that makes it runs without one
    # and writes its classes to `archive_at_exit` when the JVM exits.
    class_archive: bool = True
    archive_at_exit: Path | None = None

    @classmethod
    def from_settings(cls, settings: Settings, node: int = 1) -> BrokerConfig:
        """Node `node` (1-based) of the local broker: the one node in `<state_dir>/kafka`, or a node of
        the `broker.nodes` cluster in `<state_dir>/kafka-cluster/node-<k>` (its own data: switching
        between one node and three never reuses the other's log)."""
        b = settings.broker
        if not 1 <= node <= b.nodes:
            raise ConfigError(f"broker node {node}: the local cluster has nodes 1..{b.nodes} (broker.nodes)")
        port, controller_port = b.node_ports(node)
        common: dict[str, Any] = {"host": b.host, "heap": b.heap, "kafka_version": b.kafka_version, "jit": b.jit}
        if b.nodes == 1:
            return cls(data_dir=settings.state_dir / "kafka", port=port, controller_port=controller_port, **common)
        root = settings.state_dir / "kafka-cluster"
        return cls(
            data_dir=root / f"node-{node}",
            port=port,
            controller_port=controller_port,
            node_id=node,
            voters=tuple((k, b.node_ports(k)[1]) for k in range(1, b.nodes + 1)),
            cluster_id_file=root / CLUSTER_ID_FILE,
            **common,
        )

    @property
    def quorum(self) -> tuple[tuple[int, int], ...]:
        return self.voters or ((self.node_id, self.controller_port),)

    @property
    def replication(self) -> int:
        """Replicas of the internal topics (and of topics created without saying): the cluster's size, up to 3."""
        return min(len(self.quorum), 3)

    @classmethod
    def on_free_ports(cls, data_dir: Path, kafka_version: str, **options: Any) -> BrokerConfig:
        """A loopback broker on two ports free a moment ago (tests and benchmarks run their own)."""
        port, controller_port = free_ports(2)
        return cls(
            data_dir=data_dir, port=port, controller_port=controller_port, kafka_version=kafka_version, **options
        )

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "data"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    def listeners(self) -> list[Listener]:
        plain = [Listener("PLAINTEXT", self.host, self.port)] if self.plaintext_listener else []
        return [*plain, *self.extra_listeners]

    def properties(self) -> dict[str, str]:
        """`server.properties` for one node, sized for a 2-core machine shared with other work."""
        client = self.listeners()
        controller = Listener("CONTROLLER", self.host, self.controller_port)
        rf, isr = str(self.replication), str(default_min_insync(self.replication))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": ",".join(f"{i}@{self.host}:{p}" for i, p in self.quorum),
            "controller.listener.names": controller.name,
            "inter.broker.listener.name": client[0].name,
            "listeners": ",".join(f"{li.name}://{li.address}" for li in [*client, controller]),
            "advertised.listeners": ",".join(f"{li.name}://{li.address}" for li in client),
            "listener.security.protocol.map": ",".join(
                f"{li.name}:{li.security_protocol}" for li in [*client, controller]
            ),
            "log.dirs": str(self.log_dir),
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": "0",
            # Two cores: few threads.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "num.replica.fetchers": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
            "log.cleaner.backoff.ms": "1000",
        }
        for li in client:
            props.update(li.properties())
        props.update(dict(self.overrides))
        return props


def write_private(path: Path, text: str) -> None:
    """Write `text` to a file only its owner can read (0600, also when it existed before)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


def write_config(cfg: BrokerConfig) -> Path:
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    text = "# Written by stack/broker.py; edits are overwritten at the next start.\n"
    text += "".join(f"{k}={v}\n" for k, v in cfg.properties().items())
    write_private(cfg.config_path, text)  # a secured broker's listener login is in it
    return cfg.config_path


def is_formatted(cfg: BrokerConfig) -> bool:
    return (cfg.log_dir / META_PROPERTIES).is_file()


def _cluster_id(cfg: BrokerConfig) -> str:
    """The KRaft cluster id, kept beside the data. Never one starting with "-": the storage tool would
    read it as an option and refuse to format (one random id in 64, as Kafka's own ids avoid too); a
    stored one like that never formatted anything, so it is replaced."""
    path = cfg.cluster_id_file or cfg.data_dir / CLUSTER_ID_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        cid = path.read_text(encoding="utf-8").strip()
        if cid and not cid.startswith("-"):
            return cid
    cid = "-"
    while cid.startswith("-"):
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
    path.write_text(cid + "\n", encoding="utf-8")
    return cid


def jvm_options(cfg: BrokerConfig, archive: Path | None = None) -> list[str]:
    """The JVM's options; `archive`: the class archive to map (`ensure_class_archive`)."""
    extra = ["-XX:TieredStopAtLevel=1"] if cfg.jit == "quick" else []
    if archive is not None:
        extra.append(f"-XX:SharedArchiveFile={archive}")
    if cfg.archive_at_exit is not None:
        extra.append(f"-XX:ArchiveClassesAtExit={cfg.archive_at_exit}")
    return [
        *extra,
        "-Xms128m",
        f"-Xmx{cfg.heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:ParallelGCThreads=2",
        "-XX:ConcGCThreads=1",
        "-XX:CICompilerCount=2",
        "-XX:MaxDirectMemorySize=256m",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={deploy_dir() / 'log4j2.xml'}",
        f"-Dkafka.logs.dir={cfg.data_dir / 'logs'}",
    ]


def format_storage(cfg: BrokerConfig, libs: Path, *, progress: Progress = _quiet, archive: Path | None = None) -> bool:
    """Format the KRaft log directory unless it already is; returns whether it formatted."""
    write_config(cfg)
    if is_formatted(cfg):
        return False
    progress(f"formatting KRaft storage in {cfg.log_dir}")
    tool = [STORAGE_TOOL_MAIN, "format", "--cluster-id", _cluster_id(cfg), "--config", str(cfg.config_path)]
    tool.append("--ignore-formatted")
    argfile = cfg.data_dir / "format.args"
    for mechanism, user, password in cfg.scram_credentials:
        if not (_SCRAM_SAFE.fullmatch(user) and _SCRAM_SAFE.fullmatch(password)):
            raise ConfigError(f"SCRAM user {user!r}: names and passwords for --add-scram must match [A-Za-z0-9_.-]+")
        tool += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    if cfg.scram_credentials:
        # The java launcher expands `@file` into arguments: the passwords never show in `ps`.
        write_private(argfile, "".join(f"'{arg}'\n" for arg in tool))
        tool = [f"@{argfile}"]
    argv = [find_java(), *jvm_options(cfg, archive), "-cp", classpath(libs), *tool]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    finally:
        argfile.unlink(missing_ok=True)
    if proc.returncode != 0 or not is_formatted(cfg):
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
        raise ServiceError(f"formatting Kafka storage in {cfg.log_dir} failed: {lines[-1][:300]}")
    return True


_SCRAM_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")


def broker_argv(cfg: BrokerConfig, libs: Path, archive: Path | None = None) -> list[str]:
    return [find_java(), *jvm_options(cfg, archive), "-cp", classpath(libs), KAFKA_MAIN, str(cfg.config_path)]


def class_archive_path(libs: Path) -> Path:
    return jvm_archive.archive_path(libs.parent, find_java(), classpath(libs))


def ensure_class_archive(cfg: BrokerConfig, libs: Path, *, progress: Progress = _quiet) -> Path | None:
    """The broker's class archive (stack.jvm_archive), made by starting and stopping a throwaway broker."""

    def write(part: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="kafka-classes-") as d:
            throwaway = BrokerConfig.on_free_ports(
                Path(d), cfg.kafka_version, cache_root=cfg.cache_root, class_archive=False, archive_at_exit=part
            )
            LocalBroker(throwaway).start(timeout=180).stop(timeout=120)  # the JVM writes the archive as it exits

    return jvm_archive.ensure_archive(class_archive_path(libs), find_java(), classpath(libs), write, progress)


_BROKER_PORT_SETTINGS = "GPULEDGER_BROKER__PORT / GPULEDGER_BROKER__CONTROLLER_PORT"


def check_port_free(host: str, port: int, what: str = "port", setting: str = _BROKER_PORT_SETTINGS) -> None:
    """Raise `PortInUse` unless `host:port` can be bound now; the message names the `setting` to change."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"{what} {host}:{port} is already taken by another process; stop it or choose another port ({setting})"
            ) from exc


def prepare(cfg: BrokerConfig, *, progress: Progress = _quiet) -> list[str]:
    """Jars, configuration and storage; returns the command line that runs the broker."""
    if not cfg.host.startswith("127.") and cfg.host != "localhost":
        raise ConfigError(f"the local broker binds loopback only; broker.host is {cfg.host!r}")
    find_java()
    check_port_free(cfg.host, cfg.port, "broker port")
    check_port_free(cfg.host, cfg.controller_port, "controller port")
    libs = ensure_jars(cfg.kafka_version, cfg.cache_root, progress=progress, maven_repo=cfg.maven_repo)
    archive = ensure_class_archive(cfg, libs, progress=progress) if cfg.class_archive else None
    format_storage(cfg, libs, progress=progress, archive=archive)
    return broker_argv(cfg, libs, archive)


# ---------------------------------------------------------------------------------------------
# Running


def metadata_ok(client_config: dict[str, str], timeout: float = 2.0, *, brokers: int = 1) -> bool:
    """Whether a broker answers a metadata request with at least `brokers` brokers in it."""
    return len(live_brokers(client_config, timeout)) >= brokers


def live_brokers(client_config: dict[str, str], timeout: float = 2.0) -> set[int]:
    """The node ids a metadata answer lists (registered, unfenced brokers); empty when none answers."""
    from confluent_kafka import KafkaException

    from base.kafka import new_admin

    admin = new_admin(client_config, **{"socket.connection.setup.timeout.ms": 1000, "log_level": 0})
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException:
        return set()
    return set(md.brokers)


def wait_until_ready(
    client_config: dict[str, str],
    timeout: float = 90.0,
    *,
    alive: Callable[[], bool] = lambda: True,
    what: str = "Kafka broker",
    log_path: Path | None = None,
    brokers: int = 1,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise ServiceError(f"{what} exited while starting{_see(log_path)}")
        if metadata_ok(client_config, timeout=2.0, brokers=brokers):
            return
        time.sleep(0.3)
    raise ServiceError(
        f"{what} at {client_config.get('bootstrap.servers')} did not answer within {timeout:.0f}s{_see(log_path)}"
    )


def _see(log_path: Path | None) -> str:
    return f"; see {log_path}" if log_path is not None else ""


def stop_process(proc_pid: int, *, timeout: float = 30.0, group: bool = True) -> None:
    """SIGTERM the process (its whole process group when `group`), wait, then SIGKILL what is left."""

    def send(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(proc_pid, sig)
            else:
                os.kill(proc_pid, sig)

    def gone() -> bool:
        return not pid_alive(proc_pid) and (not group or not group_members(proc_pid))

    send(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone():
            return
        time.sleep(0.1)
    send(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not gone():
        time.sleep(0.05)


def at_once(stops: Iterable[Callable[[], None]]) -> None:
    """Run each stop in a thread of its own, all started before any is waited for (the nodes of one KRaft
    quorum: stopped in turn, the last waits out its timeout for a quorum that already left)."""
    threads = [threading.Thread(target=stop) for stop in stops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not): reaps our own children."""
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the process that started it dies."""
    with contextlib.suppress(Exception):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class OwnedProcess:
    """A child process owned by this Python process, its output appended to `log_path`: stopped with the
    process that started it (on Linux), even when that one is killed; `with` starts and stops it."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 90.0) -> Self:
        raise NotImplementedError

    def _launch(self, argv: Sequence[str], ready: Callable[[Callable[[], bool]], None]) -> None:
        """Start `argv`, then `ready(alive)` (raises if it never gets ready: the process is stopped)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # a killed test run leaves nothing behind
        )
        proc = self._proc
        try:
            ready(lambda: proc.poll() is None)
        except BaseException:
            self.stop()
            raise

    def kill(self) -> None:
        """SIGKILL the process group now (a crash: nothing flushed, nothing closed), and reap it."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        self.stop(timeout=1)

    def stop(self, timeout: float = 30.0) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                stop_process(self._proc.pid, timeout=timeout)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalBroker(OwnedProcess):
    """A broker owned by this Python process: `with LocalBroker(cfg) as b: b.bootstrap`."""

    def __init__(self, cfg: BrokerConfig, *, progress: Progress = _quiet, log_path: Path | None = None):
        super().__init__(log_path or cfg.data_dir / "broker.log")
        self.cfg = cfg
        self.progress = progress

    @property
    def bootstrap(self) -> str:
        return self.cfg.bootstrap

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap, **dict(self.cfg.client_overrides)}

    def start(self, timeout: float = 90.0) -> Self:
        argv = prepare(self.cfg, progress=self.progress)
        self.progress(f"starting Kafka broker on {self.bootstrap}")
        self._launch(
            argv,
            lambda alive: wait_until_ready(self.client_config(), timeout, alive=alive, log_path=self.log_path),
        )
        return self

    def launch(self) -> None:
        """Prepare and start the process without waiting for it to serve (a node of a quorum of three
        cannot serve alone: `LocalCluster` waits for them together)."""
        argv = prepare(self.cfg, progress=self.progress)
        self.progress(f"starting Kafka node {self.cfg.node_id} on {self.bootstrap}")
        self._launch(argv, lambda alive: None)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None


def cluster_configs(settings: Settings) -> list[BrokerConfig]:
    """Every node of the local broker (`broker.nodes` of them), node 1 first."""
    return [BrokerConfig.from_settings(settings, k) for k in range(1, settings.broker.nodes + 1)]


def cluster_on_free_ports(root: Path, kafka_version: str, nodes: int = 3, **options: Any) -> list[BrokerConfig]:
    """A loopback cluster of `nodes` combined nodes on ports free a moment ago (tests, benchmarks)."""
    ports = free_ports(2 * nodes)
    voters = tuple((k, ports[2 * k - 1]) for k in range(1, nodes + 1))
    return [
        BrokerConfig(
            data_dir=root / f"node-{k}",
            port=ports[2 * k - 2],
            controller_port=ports[2 * k - 1],
            kafka_version=kafka_version,
            node_id=k,
            voters=voters,
            cluster_id_file=root / CLUSTER_ID_FILE,
            **options,
        )
        for k in range(1, nodes + 1)
    ]


class LocalCluster:
    """A KRaft cluster owned by this Python process: every node launched at once, ready when the
    metadata lists them all; one node may be killed (-9) and started again while the rest serve."""

    def __init__(self, cfgs: Sequence[BrokerConfig], *, progress: Progress = _quiet, logs: Path | None = None):
        self.nodes = {
            c.node_id: LocalBroker(c, progress=progress, log_path=(logs / f"node-{c.node_id}.log") if logs else None)
            for c in cfgs
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.nodes.values())

    def client_config(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    def start(self, timeout: float = 180.0) -> Self:
        try:
            for node in self.nodes.values():
                node.launch()
            self._wait(set(self.nodes), timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, node_id: int) -> None:
        self.nodes[node_id].kill()

    def stop_node(self, node_id: int) -> None:
        self.nodes[node_id].stop()

    def start_node(self, node_id: int, timeout: float = 180.0) -> None:
        """Start a stopped or killed node again, ready once the cluster lists it."""
        self.nodes[node_id].launch()
        self._wait({node_id}, timeout)

    def _wait(self, ids: set[int], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [i for i in ids if not self.nodes[i].alive]
            if dead:
                raise ServiceError(f"Kafka node {dead[0]} exited while starting; see {self.nodes[dead[0]].log_path}")
            if ids <= live_brokers(self.client_config(), timeout=2.0):
                return
            time.sleep(0.3)
        raise ServiceError(f"Kafka nodes {sorted(ids)} at {self.bootstrap} not all registered within {timeout:.0f}s")

    def stop(self) -> None:
        """Stop every node at once: stopped one by one, the last node waits out its stop timeout for a
        controller quorum that left before it (30 s), and is then killed."""
        at_once([node.stop for node in self.nodes.values()])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running_broker(cfg: BrokerConfig, *, progress: Progress = _quiet) -> Iterator[LocalBroker]:
    broker = LocalBroker(cfg, progress=progress)
    with broker:
        yield broker


# GPULEDGER_PORT_RANGE="lo-hi": free_ports draws from this range in turn instead of the kernel's ephemeral ones.
# The test workers of one machine each get a range of their own (tests/conftest.py), so two of them never draw
# the same port, and no client connection's ephemeral source port can take one between its draw and its bind.
PORT_RANGE_ENV = "GPULEDGER_PORT_RANGE"
_next_in_range: dict[tuple[int, int], int] = {}


def _port_range() -> tuple[int, int] | None:
    text = os.environ.get(PORT_RANGE_ENV)
    if not text:
        return None
    try:
        low, high = (int(part) for part in text.split("-", 1))
    except ValueError:
        raise ConfigError(f"{PORT_RANGE_ENV}={text!r}: write it as LOW-HIGH, e.g. 20000-20999") from None
    if not 1024 <= low < high <= 65535:
        raise ConfigError(f"{PORT_RANGE_ENV}={text!r}: needs 1024 <= LOW < HIGH <= 65535")
    return low, high


def free_ports(n: int, host: str = "127.0.0.1") -> Sequence[int]:
    """`n` distinct ports that were free a moment ago (for tests and benchmarks): from GPULEDGER_PORT_RANGE
    in turn when it is set, else whatever the kernel gives."""
    bounds = _port_range()
    socks: list[socket.socket] = []
    try:
        if bounds is None:
            for _ in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((host, 0))
                socks.append(s)
            return [s.getsockname()[1] for s in socks]
        low, high = bounds
        size = high - low + 1
        cursor = _next_in_range.get(bounds, low)
        for _ in range(size):
            port, cursor = cursor, low + (cursor + 1 - low) % size
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((host, port))  # no SO_REUSEADDR: a port with connections in TIME_WAIT is skipped too
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == n:
                _next_in_range[bounds] = cursor
                return [sock.getsockname()[1] for sock in socks]
        raise PortInUse(f"fewer than {n} free ports in {PORT_RANGE_ENV}={low}-{high}")
    finally:
        for s in socks:
            s.close()
