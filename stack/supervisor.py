"""Run the local stack's components as detached processes, with pid and log files under the state dir.

    <state_dir>/run/<name>.json   pid, start time, argv (or a oneshot's exit code)
    <state_dir>/logs/<name>.log   the process's stdout and stderr

`up` starts what is enabled and not already running, in `COMPONENTS` order, waiting for each to be
ready; running it twice is harmless. `down` stops everything that has a pid file, in reverse order
(SIGTERM to the process group, wait, SIGKILL). `status` reports each component plus what the stack
looks like from outside: broker metadata, topics, consumer lag per group, ClickHouse ping and rows.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from base.errors import ConfigError, ServiceError
from base.outputs import mask_text
from base.settings import Settings
from stack import broker, security
from stack.components import COMPONENTS, Component, Health

Progress = Callable[[str], None]
CommandExists = Callable[[tuple[str, ...]], bool]


def _quiet(_: str) -> None:
    return None


def _every_command_exists(_: tuple[str, ...]) -> bool:
    return True


@dataclass
class ComponentStatus:
    name: str
    description: str
    enabled: bool
    # disabled | unavailable | stopped | running | ready | not-ready | done | failed
    state: str
    pid: int | None = None
    detail: str = ""
    log: str | None = None

    @property
    def healthy(self) -> bool:
        return self.state in ("disabled", "ready", "running", "done")


@dataclass
class GroupLag:
    group: str
    lag: int
    partitions: int


@dataclass
class StackStatus:
    components: list[ComponentStatus]
    broker_reachable: bool = False
    broker_detail: str = ""
    topics: list[str] = field(default_factory=list)
    missing_topics: list[str] = field(default_factory=list)  # in the topic catalogue, not on the broker
    consumer_lag: list[GroupLag] = field(default_factory=list)
    # The schema registry in effect (configured or the local one; None: none, or confluent-kafka's mock://).
    registry_url: str | None = None
    registry_reachable: bool | None = None  # None: not probed
    registry_detail: str = ""
    registry_subjects: int | None = None
    # Subjects `gpuledger schemas register` would create that the registry lacks.
    missing_subjects: list[str] = field(default_factory=list)
    registry_local: bool = False
    clickhouse_reachable: bool = False
    clickhouse_detail: str = ""
    clickhouse_rows: dict[str, int] | None = None
    clickhouse_queries_ok: bool | None = None  # None: not probed
    # Each running component's /metrics, summarised (base/metrics.py); informative only, an
    # unreachable endpoint is reported here and does not make the stack unhealthy.
    pipeline: list[dict[str, Any]] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        # A warehouse that answers /ping but refuses our queries (wrong password, say) is not healthy.
        return (
            all(c.healthy for c in self.components)
            and not self.missing_topics
            and self.clickhouse_queries_ok is not False
            and self.registry_reachable is not False
            and not (self.registry_local and self.missing_subjects)
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["healthy"] = self.healthy
        for comp, raw in zip(self.components, data["components"], strict=True):
            raw["healthy"] = comp.healthy
        return data


def _start_ticks(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        components: list[Component] | None = None,
        *,
        command_exists: CommandExists = _every_command_exists,
        progress: Progress = _quiet,
    ) -> None:
        self.settings = settings
        self.components = COMPONENTS if components is None else components
        self.command_exists = command_exists
        self.progress = progress
        self.run_dir = settings.state_dir / "run"
        self.log_dir = settings.state_dir / "logs"

    # -- files ------------------------------------------------------------------------------------

    def pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _read(self, name: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.pid_file(name).read_text())
        except (OSError, ValueError):
            return None
        return data

    def _write(self, name: str, data: dict[str, Any]) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.pid_file(name).with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(self.pid_file(name))

    def running_pid(self, name: str) -> int | None:
        """The pid of the component's live process (checked against its recorded start time)."""
        data = self._read(name)
        if not data or data.get("pid") is None:
            return None
        pid = int(data["pid"])
        if not broker.pid_alive(pid):
            return None
        ticks = data.get("start_ticks")
        if ticks is not None and _start_ticks(pid) not in (None, ticks):
            return None  # the pid was reused by an unrelated process
        return pid

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["GPULEDGER_STATE_DIR"] = str(self.settings.state_dir)
        if self.settings.policy_path is not None:  # what `up` runs with, the simulator's default policy included
            env["GPULEDGER_POLICY_PATH"] = str(self.settings.policy_path)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    # -- up ---------------------------------------------------------------------------------------

    def up(self, only: set[str] | None = None) -> list[ComponentStatus]:
        unknown = (only or set()) - {c.name for c in self.components}
        if unknown:
            raise ConfigError(
                f"no component named {', '.join(sorted(unknown))}; "
                f"known: {', '.join(c.name for c in self.components)}"
            )
        results = []
        security.private_state_dir(self.settings.state_dir)  # data, logs and secrets: owner only
        with self._locked():
            for comp in self.components:
                if only is not None and comp.name not in only:
                    continue
                st = self._up_one(comp)
                results.append(st)
                if st.state in ("failed", "not-ready"):
                    # What follows needs what came before: stop here, say why in one line.
                    raise ServiceError(f"{comp.name}: {st.detail}")
        return results

    def _up_one(self, comp: Component) -> ComponentStatus:
        st = self._base_status(comp)
        if st.state in ("disabled", "unavailable"):
            return st
        pid = self.running_pid(comp.name)
        if pid is not None:
            self.progress(f"{comp.name}: already running (pid {pid})")
            return self._checked(comp, st, pid)
        argv = comp.argv(self.settings, self.progress)  # a GpuledgerError here is the user's one line
        self.progress(f"starting {comp.name}: {comp.description}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file(comp.name).open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} start\n".encode())
            log.flush()
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                env=_component_env(self._child_env(), comp.env(self.settings)),
            )
        self._write(
            comp.name,
            {"pid": proc.pid, "start_ticks": _start_ticks(proc.pid), "argv": argv, "started": time.time()},
        )
        st.pid = proc.pid
        if comp.oneshot:
            return self._finish_oneshot(comp, st, proc)
        return self._wait_ready(comp, st, proc)

    def _finish_oneshot(
        self, comp: Component, st: ComponentStatus, proc: subprocess.Popen[bytes]
    ) -> ComponentStatus:
        try:
            rc = proc.wait(timeout=comp.ready_timeout_s)
        except subprocess.TimeoutExpired:
            broker.stop_process(proc.pid, timeout=comp.stop_timeout_s)
            proc.wait()
            rc = -1
        self._write(comp.name, {"pid": None, "exit_code": rc, "finished": time.time()})
        st.pid = None
        st.state = "done" if rc == 0 else "failed"
        st.detail = "completed" if rc == 0 else f"exited with code {rc}; see {st.log}"
        return st

    def _wait_ready(self, comp: Component, st: ComponentStatus, proc: subprocess.Popen[bytes]) -> ComponentStatus:
        deadline = time.monotonic() + comp.ready_timeout_s
        while True:
            rc = proc.poll()
            if rc is not None:
                st.state, st.pid = "failed", None
                st.detail = f"exited with code {rc} while starting; see {st.log}"
                self._write(comp.name, {"pid": None, "exit_code": rc, "finished": time.time()})
                return st
            health = comp.ready(self.settings) if comp.ready is not None else Health(True, "process alive")
            if health.ok:
                st.state, st.detail = ("ready" if comp.ready is not None else "running"), health.detail
                return st
            if time.monotonic() > deadline:
                st.state = "not-ready"
                st.detail = f"not ready after {comp.ready_timeout_s:.0f}s ({health.detail}); see {st.log}"
                return st
            time.sleep(0.3)

    # -- down -------------------------------------------------------------------------------------

    def down(self) -> list[str]:
        """Stop every component that has a pid file (known or not), last started first."""
        stopped: list[str] = []
        with self._locked():
            names = [c.name for c in self.components]
            extra = sorted(p.stem for p in self.run_dir.glob("*.json") if p.stem not in names)
            timeouts = {c.name: c.stop_timeout_s for c in self.components}
            for group in stop_groups([*extra, *reversed(names)], self.components):
                running: dict[str, int] = {}
                for name in group:
                    pid = self.running_pid(name) if self.pid_file(name).exists() else None
                    if pid is not None:
                        self.progress(f"stopping {name} (pid {pid})")
                        running[name] = pid
                broker.at_once(
                    functools.partial(broker.stop_process, pid, timeout=timeouts.get(name, 20.0))
                    for name, pid in running.items()
                )
                stopped.extend(running)
                for name in group:
                    self.pid_file(name).unlink(missing_ok=True)
        return stopped

    # -- status -----------------------------------------------------------------------------------

    def _base_status(self, comp: Component) -> ComponentStatus:
        enabled = comp.enabled(self.settings)
        st = ComponentStatus(
            name=comp.name,
            description=comp.description,
            enabled=enabled,
            state="stopped",
            log=str(self.log_file(comp.name)),
        )
        if not enabled:
            why = comp.why_disabled(self.settings) if comp.why_disabled is not None else ""
            st.state, st.detail = "disabled", why or "not wanted by this configuration"
        elif comp.command is not None and not self.command_exists(comp.command):
            st.state = "unavailable"
            st.detail = f"`gpuledger {' '.join(comp.command)}` is not part of this build yet"
        return st

    def _checked(self, comp: Component, st: ComponentStatus, pid: int, *, probe: bool = False) -> ComponentStatus:
        st.pid = pid
        ready = (comp.status_ready or comp.ready) if probe else comp.ready
        if ready is None:
            st.state, st.detail = "running", "process alive"
            return st
        health = ready(self.settings)
        st.state = "ready" if health.ok else "not-ready"
        st.detail = health.detail
        return st

    def component_status(self, comp: Component) -> ComponentStatus:
        st = self._base_status(comp)
        if st.state in ("disabled", "unavailable") and not self.pid_file(comp.name).exists():
            return st
        pid = self.running_pid(comp.name)
        if pid is not None:
            return self._checked(comp, st, pid, probe=True)
        data = self._read(comp.name)
        if data is None:
            st.state, st.detail = "stopped", "not started"
            ready = comp.status_ready or comp.ready
            if ready is not None and st.enabled:
                # Something else may serve it (an external broker/ClickHouse): say so.
                health = ready(self.settings)
                if health.ok:
                    st.state, st.detail = "ready", f"not managed by gpuledger; {health.detail}"
        elif comp.oneshot and data.get("exit_code") == 0:
            st.state, st.detail = "done", "completed"
        else:
            code = data.get("exit_code")
            st.state = "failed"
            st.detail = f"exited with code {code}; see {st.log}" if code is not None else f"died; see {st.log}"
        return st

    def status(self, *, probe: bool = True) -> StackStatus:
        """Each component's state; with `probe`, also the broker and ClickHouse as seen from outside."""
        result = StackStatus(components=[self.component_status(c) for c in self.components])
        if probe:
            _probe_kafka(self.settings, result)
            _probe_registry(self.settings, result)
            _probe_clickhouse(self.settings, result)
            _probe_pipeline(self.settings, result)
        return result


# ------------------------------------------------------------------------------------------------
# Probes from outside


def _probe_kafka(settings: Settings, result: StackStatus) -> None:
    from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    from base.kafka import new_admin

    admin = new_admin(settings.kafka, **{"socket.connection.setup.timeout.ms": 1000, "log_level": 0})
    try:
        md = admin.list_topics(timeout=3.0)
    except KafkaException as exc:
        result.broker_detail = mask_text(f"{settings.kafka.bootstrap_servers}: {exc.args[0]}")
        return
    result.broker_reachable = bool(md.brokers)
    result.broker_detail = f"{settings.kafka.bootstrap_servers}: {len(md.brokers)} broker(s)"
    result.topics = sorted(t for t in md.topics if not t.startswith("__"))
    result.missing_topics = sorted(set(expected_topics(settings)) - set(md.topics))
    try:
        groups = admin.list_consumer_groups(request_timeout=5).result().valid
        for g in sorted(groups, key=lambda g: g.group_id):
            offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g.group_id)])
            committed = [
                tp for tp in offsets[g.group_id].result(timeout=5).topic_partitions or [] if tp.offset >= 0
            ]
            if not committed:
                result.consumer_lag.append(GroupLag(g.group_id, 0, 0))
                continue
            ends = admin.list_offsets(
                {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in committed},
                request_timeout=5,
            )
            end = {(tp.topic, tp.partition): fut.result(timeout=5).offset for tp, fut in ends.items()}
            lag = sum(max(0, end[(tp.topic, tp.partition)] - tp.offset) for tp in committed)
            result.consumer_lag.append(GroupLag(g.group_id, lag, len(committed)))
    except KafkaException as exc:
        result.broker_detail += f"; consumer lag unknown: {exc.args[0]}"


def _probe_registry(settings: Settings, result: StackStatus) -> None:
    """The registry's Confluent API answers, how many subjects it holds and which of ours it lacks."""
    from stack.registry import check

    url = settings.registry_url
    if not url or url.startswith("mock://"):  # mock://: confluent-kafka's in-process stand-in
        return
    result.registry_url, result.registry_local = mask_text(url), settings.registry_local
    health = check(url)
    result.registry_reachable, result.registry_detail = health.ok, health.detail
    if health.subjects is None:
        return
    result.registry_subjects = len(health.subjects)
    try:
        from schemas import DEFAULT_STORE
        from schemas.registry_sync import plan
        from schemas.topics import all_topics

        wanted = plan(DEFAULT_STORE, all_topics(), settings.kafka.topic_prefix, settings.kafka.registry_subject)
    except Exception as exc:  # status reports, it does not fail
        result.registry_detail += f"; expected subjects unknown: {type(exc).__name__}"
        return
    have = set(health.subjects)
    result.missing_subjects = sorted(p.subject for p in wanted if p.subject not in have)


def _probe_pipeline(settings: Settings, result: StackStatus) -> None:
    """Scrape the metrics endpoint of every running component that serves one; never raises."""
    from base import metrics

    live = [c.name for c in result.components
            if c.state in ("running", "ready") and metrics.kind_of(c.name) in metrics.PORT_OFFSETS]
    try:
        result.pipeline = [asdict(e) for e in metrics.pipeline_summary(settings, live, timeout_s=1.5)]
    except Exception as exc:  # status reports, it does not fail
        detail = f"metrics summary failed: {type(exc).__name__}"
        result.pipeline = [{"component": "*", "url": None, "reachable": False, "detail": detail, "metrics": {}}]


def expected_topics(settings: Settings) -> list[str]:
    """The topic catalogue's names with the configured prefix (empty while no catalogue exists)."""
    try:
        from schemas.topics import all_topics
    except ImportError:
        return []
    return [settings.kafka.topic(topic.name) for topic in all_topics()]


def _probe_clickhouse(settings: Settings, result: StackStatus) -> None:
    from stack.components import clickhouse_ready

    health = clickhouse_ready(settings)
    result.clickhouse_reachable, result.clickhouse_detail = health.ok, health.detail
    if not health.ok:
        return
    try:
        import clickhouse_connect

        ch = settings.clickhouse
        client = clickhouse_connect.get_client(
            host=ch.host,
            port=ch.port,
            username=ch.user,
            password=ch.password.get_secret_value(),
            connect_timeout=3,
            send_receive_timeout=10,
        )
        rows = client.query(
            "SELECT name, total_rows FROM system.tables WHERE database = {db:String} "
            "AND engine NOT IN ('View', 'MaterializedView') AND NOT startsWith(name, '.inner') ORDER BY name",
            parameters={"db": ch.database},
        ).result_rows
        result.clickhouse_rows = {str(name): int(n or 0) for name, n in rows}
        result.clickhouse_queries_ok = True
        if not rows:
            result.clickhouse_detail += f"; no tables in database {ch.database!r} yet"
    except Exception as exc:  # any client or server error: report it, status must not fail
        result.clickhouse_queries_ok = False
        result.clickhouse_detail += f"; row counts unavailable: {type(exc).__name__}: {mask_text(str(exc))[:160]}"


def _component_env(inherited: dict[str, str], own: dict[str, str]) -> dict[str, str]:
    """A component that logs in as its own Kafka principal reads that principal's password file: a
    password configured for the operator's login must not follow it there."""
    env = {**inherited, **own}
    if "GPULEDGER_KAFKA__SASL_USERNAME" in own:
        env.pop("GPULEDGER_KAFKA__SASL_PASSWORD", None)
        env.pop("GPULEDGER_KAFKA__SASL_PASSWORD_FILE", None)
    return env


def stop_groups(order: list[str], components: list[Component]) -> list[list[str]]:
    """`order` cut into runs to stop at once: neighbours of one stop group together, the rest alone."""
    group_of = {c.name: c.stop_group for c in components}
    runs: list[list[str]] = []
    for name in order:
        label = group_of.get(name)
        if runs and label is not None and group_of.get(runs[-1][-1]) == label:
            runs[-1].append(name)
        else:
            runs.append([name])
    return runs
