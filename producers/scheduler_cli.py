"""Scheduler commands: `inspect slurm`, `slurm poll|spool-drain|jobcomp`, `kube watch`, `policy render`,
`attribution correct`.

Configuration lives in the settings' `extra.scheduler` section (TOML `[extra.scheduler]`, or env
`GPULEDGER_EXTRA__SCHEDULER__...`), validated by `SchedulerSettings`; command-line options override it.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import signal
import time
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.table import Table

from gpuledger.errors import ConfigError, GpuledgerError

STATE_DIR_OPTION = typer.Option(None, "--state-dir", help="State directory (default: the settings').")
console = Console()


class SchedulerSettings(BaseModel):
    """The `extra.scheduler` settings section."""

    registry: str | None = None  # project registry: a YAML/CSV file, or an http(s) URL serving one
    directory: Path | None = None  # identity directory file (YAML/JSON)
    device_map: Path | None = None  # node GPU map file {cluster: {node: {index: uuid}}}
    device_map_from_inventory: bool = True  # also read the inventory topic at start
    mode: Literal["grace", "strict"] = "grace"
    project_from: list[str] = Field(default_factory=lambda: ["wckey", "comment:project", "account"])
    account_map: dict[str, str] = Field(default_factory=dict)
    kube_label: str = "gpuledger.io/project"
    help_url: str | None = None
    pricing_tier: str = "on-prem"
    preemptible_qos: list[str] = Field(default_factory=lambda: ["preemptible", "preempt", "scavenger", "low", "spot"])
    slurm_timezone: str = "UTC"  # zone of scontrol/jobcomp local times
    poll_interval_s: float = 30.0
    squeue: list[str] = Field(default_factory=lambda: ["squeue", "--json"])
    scontrol: list[str] = Field(default_factory=lambda: ["scontrol", "show", "job", "-d"])
    sacct: list[str] = Field(default_factory=lambda: ["sacct", "--json", "-X", "--allusers"])
    # slurmrestd instead of the commands: base URL, data_parser version, JWT user and token (file)
    slurmrestd_url: str | None = None
    slurmrestd_version: str = "v0.0.41"
    slurmrestd_user: str | None = None
    slurmrestd_token_file: Path | None = None
    spool_dir: Path = Path("/var/spool/gpuledger")
    jobcomp_topic: str = "slurm-jobcomp"
    kubeconfig: Path | None = None
    dcgm_urls: list[str] = Field(default_factory=list)  # dcgm-exporter /metrics for pod -> UUID labels


def _settings(state_dir: Path | None) -> Any:
    from gpuledger.cli import load_settings

    return load_settings(state_dir)


def _sched(settings: Any) -> SchedulerSettings:
    try:
        return SchedulerSettings.model_validate(settings.extra.get("scheduler") or {})
    except ValidationError as exc:
        raise ConfigError(f"settings extra.scheduler: {exc}") from exc


def _tz(name: str) -> Any:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"unknown time zone {name!r}") from exc


def _context(settings: Any, sched: SchedulerSettings, cluster: str | None = None, with_inventory: bool = False) -> Any:
    from producers.devicemap import InMemoryDeviceMap
    from producers.identity import FileDirectory
    from producers.jobevents import EventContext
    from producers.projects import Attributor, ProjectRule, load_registry

    registry = load_registry(sched.registry) if sched.registry else None
    rule = ProjectRule(tuple(sched.project_from), sched.account_map, sched.kube_label, sched.mode)
    devmap = InMemoryDeviceMap.from_file(sched.device_map) if sched.device_map else InMemoryDeviceMap()
    if with_inventory and sched.device_map_from_inventory:
        _load_inventory(settings, devmap)
    return EventContext(
        cluster=cluster or settings.cluster,
        attributor=Attributor(registry, rule),
        identity=FileDirectory(sched.directory) if sched.directory else None,
        devices=devmap,
        pricing_tier=sched.pricing_tier,
        preemptible_qos=frozenset(sched.preemptible_qos),
    )


def _load_inventory(settings: Any, devmap: Any, timeout_s: float = 10.0) -> int:
    """Read the compacted inventory topic from the start into the device map (best effort)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from schemas.codec import AvroCodec
    from schemas.topics import INVENTORY

    codec = AvroCodec()
    conf = {**settings.kafka.client_config(), "group.id": f"gpuledger-devmap-{time.time_ns()}",
            "enable.auto.commit": "false", "auto.offset.reset": "earliest"}
    consumer = Consumer(conf)
    n = 0
    try:
        topic = settings.kafka.topic(INVENTORY.name)
        meta = consumer.list_topics(topic, timeout=timeout_s)
        parts = meta.topics.get(topic)
        if parts is None or parts.error is not None:
            return 0
        tps = [TopicPartition(topic, p, 0) for p in parts.partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=timeout_s)[1] for tp in tps}
        consumer.assign(tps)
        pending = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            value, offset, partition = msg.value(), msg.offset(), msg.partition()
            if value:
                try:
                    devmap.apply_inventory(codec.decode(value, INVENTORY.subject).record)
                    n += 1
                except GpuledgerError:
                    pass
            if offset is not None and partition is not None and offset + 1 >= ends[partition]:
                pending.discard(partition)
    except KafkaException:
        return n
    finally:
        consumer.close()
    return n


def _publisher(settings: Any) -> Any:
    from gpuledger.kafka import RecordPublisher

    return RecordPublisher(settings.kafka)


class _Stop:
    def __init__(self) -> None:
        self.stopped = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, *_: Any) -> None:
        self.stopped = True

    def __call__(self) -> bool:
        return self.stopped


def _ms_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _devices_text(ev: dict[str, Any]) -> str:
    parts = []
    for a in ev["allocations"]:
        idx = [str(d["index"]) if d["index"] is not None else (d["uuid"] or "?") for d in a["devices"]]
        parts.append(f"{a['node']}[{','.join(idx)}]")
    return " ".join(parts) or (f"{ev['requested_devices']} requested" if ev["requested_devices"] else "-")


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add the scheduler sources' commands to the `gpuledger` command."""
    slurm_app = typer.Typer(help="Slurm job events: polling, prolog/epilog spool, jobcomp/kafka.", no_args_is_help=True)
    kube_app = typer.Typer(help="Kubernetes job events: pods, Kueue workloads, Volcano podgroups.",
                           no_args_is_help=True)
    policy_app = typer.Typer(help="Enforcement generated from the project registry.", no_args_is_help=True)
    attribution_app = typer.Typer(help="Audited project attribution changes.", no_args_is_help=True)
    app.add_typer(slurm_app, name="slurm")
    app.add_typer(kube_app, name="kube")
    app.add_typer(policy_app, name="policy")
    app.add_typer(attribution_app, name="attribution")

    @inspect_app.command("slurm")
    def inspect_slurm(
        file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Captured squeue/sacct/slurmrestd JSON "
                                    "or `scontrol show job -d` text."),
        as_json: bool = typer.Option(False, "--json", help="Print the job events as JSON lines."),
        cluster: str = typer.Option("inspect", "--cluster", help="Cluster name to put on the events."),
        tz: str = typer.Option("UTC", "--tz", help="Time zone of scontrol's local times."),
        gpu_only: bool = typer.Option(False, "--gpu-only", help="Only jobs that hold or request GPUs."),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Print the normalized job events a captured Slurm output yields (nothing is published)."""
        from producers.slurm import parse_capture
        from producers.slurm_events import het_gang_sizes, lifecycle_events

        settings = _settings(state_dir)
        ctx = _context(settings, _sched(settings), cluster=cluster)
        capture = parse_capture(file.read_text(encoding="utf-8"), _tz(tz))
        het = het_gang_sizes(capture.jobs)
        events = [
            ev for job in capture.jobs if (job.gpu_count or job.gpus or not gpu_only)
            for ev in lifecycle_events(job, ctx, het.get(job.het_job_id or ""))
        ]
        if as_json:
            for ev in events:
                typer.echo(json.dumps(ev, sort_keys=True))
            return
        title = f"{file.name}: {capture.kind}"
        if capture.slurm_version or capture.data_parser:
            title += f" (Slurm {capture.slurm_version or '?'}, {capture.data_parser or '?'})"
        table = Table(title=title)
        for col in ("job", "event", "time (UTC)", "user", "account", "project", "partition", "devices", "exit"):
            table.add_column(col)
        for ev in events:
            table.add_row(
                ev["job_id"], ev["event_type"], _ms_text(ev["ts_ms"]), ev["user"], ev["account"] or "-",
                f"{ev['project'] or '-'} ({ev['project_source'].lower()})", ev["partition"] or "-",
                _devices_text(ev), ev["exit_state"] or "",
            )
        console.print(table)
        if capture.nodes:
            nodes = Table(title="nodes")
            for col in ("node", "gpus", "type", "in use"):
                nodes.add_column(col)
            for n in capture.nodes:
                nodes.add_row(n.name, str(n.gpu_count), n.gpu_type or "-", ",".join(map(str, n.used_indices)) or "-")
            console.print(nodes)
        console.print(f"{len(capture.jobs)} jobs, {len(events)} events")

    @slurm_app.command("poll")
    def slurm_poll(
        once: bool = typer.Option(False, "--once", help="One poll cycle, then exit."),
        interval_s: float | None = typer.Option(None, "--interval", help="Seconds between polls."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print events as JSON instead of publishing."),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Poll squeue (+ scontrol for GPU indices, + sacct to reconcile) and publish job events."""
        from producers.slurm_poller import SlurmCommands, SlurmPoller, SlurmRestRunner

        settings = _settings(state_dir)
        sched = _sched(settings)
        ctx = _context(settings, sched, with_inventory=not dry_run)
        sink: Any = _PrintSink() if dry_run else _publisher(settings)
        runner = SlurmRestRunner()
        if sched.slurmrestd_url:
            base, ver = sched.slurmrestd_url.rstrip("/"), sched.slurmrestd_version
            commands = SlurmCommands((f"{base}/slurm/{ver}/jobs",), (), (f"{base}/slurmdb/{ver}/jobs",))
            token = None
            if sched.slurmrestd_token_file is not None:
                token = sched.slurmrestd_token_file.read_text(encoding="utf-8").strip()
            runner = SlurmRestRunner(sched.slurmrestd_user, token)
        else:
            commands = SlurmCommands(tuple(sched.squeue), tuple(sched.scontrol), tuple(sched.sacct))
        state_path = None if dry_run else settings.state_dir / "slurm-poller.json"
        poller = SlurmPoller(ctx, sink, commands=commands, runner=runner, tz=_tz(sched.slurm_timezone),
                             state_path=state_path)
        if once:
            poller.poll_once()
            if not dry_run:
                sink.flush()
                poller.save_state()
            return
        refreshed = [time.monotonic()]

        def refresh_gpu_map() -> None:  # the inventory changes as nodes come and go
            if dry_run or not sched.device_map_from_inventory or time.monotonic() - refreshed[0] < 600:
                return
            refreshed[0] = time.monotonic()
            _load_inventory(settings, ctx.devices)

        poller.run(interval_s or sched.poll_interval_s, _Stop(),
                   on_error=lambda exc: typer.echo(f"poll failed: {exc}", err=True), every_cycle=refresh_gpu_map)

    @slurm_app.command("spool-drain")
    def slurm_spool_drain(
        spool: Path | None = typer.Option(None, "--spool", help="Spool directory of the prolog/epilog hook."),
        follow: bool = typer.Option(False, "--follow", help="Keep draining every --interval seconds."),
        interval_s: float = typer.Option(5.0, "--interval"),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Send the events spooled by deploy/slurm/gpuledger_hook.py; files are deleted once acknowledged."""
        from producers.slurm_spool import drain

        settings = _settings(state_dir)
        sched = _sched(settings)
        ctx = _context(settings, sched, with_inventory=True)
        pub = _publisher(settings)
        stop = _Stop()
        while True:
            try:
                sent, bad = drain(spool or sched.spool_dir, ctx, pub, pub.flush)
                if sent or bad:
                    typer.echo(f"sent {sent}, quarantined {bad}")
            except GpuledgerError as exc:
                if not follow:
                    raise
                typer.echo(f"drain failed, will retry: {exc}", err=True)
            if not follow or stop():
                return
            time.sleep(interval_s)

    @slurm_app.command("jobcomp")
    def slurm_jobcomp(
        topic: str | None = typer.Option(None, "--topic", help="Topic Slurm's jobcomp/kafka writes to."),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Consume Slurm jobcomp/kafka records and publish STARTED/ENDED job events."""
        from confluent_kafka import Consumer

        from producers.slurm_jobcomp import StartIndex, jobcomp_events

        settings = _settings(state_dir)
        sched = _sched(settings)
        ctx = _context(settings, sched, with_inventory=True)
        pub = _publisher(settings)
        tz = _tz(sched.slurm_timezone)
        consumer = Consumer({**settings.kafka.client_config(), "group.id": "gpuledger-slurm-jobcomp",
                             "enable.auto.commit": "false", "auto.offset.reset": "earliest"})
        consumer.subscribe([topic or sched.jobcomp_topic])
        starts = StartIndex()
        stop = _Stop()
        try:
            while not stop():
                msg = consumer.poll(1.0)
                if msg is None or msg.error():
                    continue
                try:
                    events = jobcomp_events(json.loads(msg.value() or b"{}"), ctx, starts, tz)
                except (GpuledgerError, json.JSONDecodeError, UnicodeDecodeError) as exc:
                    _dead_letter(pub, msg, exc)
                    events = []
                for ev in events:
                    from schemas.topics import JOB_EVENTS, job_key

                    pub.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)
                pub.flush()
                consumer.commit(message=msg, asynchronous=False)
        finally:
            consumer.close()

    @kube_app.command("watch")
    def kube_watch(
        kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Default: in-cluster, else ~/.kube/config."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print events as JSON instead of publishing."),
        once: bool = typer.Option(False, "--once", help="List, follow each watch once (up to --timeout), exit."),
        timeout_s: int = typer.Option(300, "--timeout", help="Seconds per watch request."),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Watch GPU pods, Kueue Workloads and Volcano PodGroups; publish job events."""
        import httpx
        from kubernetes import client, config

        from producers.kube import DcgmPodLabels, KubeTracker, KubeWatcher

        settings = _settings(state_dir)
        sched = _sched(settings)
        ctx = _context(settings, sched, with_inventory=not dry_run)
        path = kubeconfig or sched.kubeconfig
        try:
            if path is not None:
                config.load_kube_config(str(path))
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ConfigError(f"no Kubernetes credentials: {exc}") from exc
        labels = DcgmPodLabels()
        for url in sched.dcgm_urls:
            try:
                labels.load_scrape(httpx.get(url, timeout=5.0).text)
            except httpx.HTTPError as exc:
                typer.echo(f"dcgm-exporter {url}: {exc}", err=True)
        sink: Any = _PrintSink() if dry_run else _FlushingSink(_publisher(settings))
        watcher = KubeWatcher(client.ApiClient(), KubeTracker(ctx, labels, project_label=sched.kube_label), sink,
                              clock=lambda: int(time.time() * 1000), timeout_seconds=timeout_s)
        signal.signal(signal.SIGTERM, lambda *_: watcher.stop())
        watcher.run(rounds=1 if once else None)
        for err in watcher.errors:
            typer.echo(f"watch: {err}", err=True)

    @policy_app.command("render")
    def policy_render(
        out: Path = typer.Option(Path("."), "--out", help="Directory to write job_submit.lua and the policy into."),
        registry: str | None = typer.Option(None, "--registry", help="Project registry file or URL (default: "
                                            "settings)."),
        directory: Path | None = typer.Option(None, "--directory", help="Identity directory (expands teams)."),
        mode: str | None = typer.Option(None, "--mode", help="strict (reject) or grace (warn). Default: settings."),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Generate Slurm job_submit.lua and a Kubernetes ValidatingAdmissionPolicy from the registry."""
        from producers.identity import FileDirectory, directory_from_data
        from producers.policy import PolicyOptions, render_admission_policy_yaml, render_job_submit_lua
        from producers.projects import load_registry

        settings = _settings(state_dir)
        sched = _sched(settings)
        reg_path = registry or sched.registry
        if reg_path is None:
            raise ConfigError("no project registry: pass --registry FILE or set extra.scheduler.registry")
        reg = load_registry(reg_path)
        chosen = mode or sched.mode
        if chosen not in ("strict", "grace"):
            raise ConfigError(f"--mode must be strict or grace, not {chosen!r}")
        options = PolicyOptions(
            mode=chosen,  # type: ignore[arg-type]
            slurm_from=tuple(sched.project_from),
            account_map=sched.account_map,
            kube_label=sched.kube_label,
            help_url=sched.help_url,
        )
        dir_path = directory or sched.directory
        entries = None
        if dir_path is not None:
            FileDirectory(dir_path).lookup("")  # validates the file
            import yaml

            entries = directory_from_data(yaml.safe_load(dir_path.read_text(encoding="utf-8")), str(dir_path))
        out.mkdir(parents=True, exist_ok=True)
        lua = out / "job_submit.lua"
        lua.write_text(render_job_submit_lua(reg, options, entries), encoding="utf-8")
        vap = out / "gpuledger-admission-policy.yaml"
        vap.write_text(render_admission_policy_yaml(reg, options), encoding="utf-8")
        typer.echo(f"wrote {lua} and {vap} ({len(reg.active_ids())} projects, mode {chosen})")

    @attribution_app.command("correct")
    def attribution_correct(
        job: str = typer.Argument(..., help="Job id as the scheduler prints it (1234, 1234_7, ns/name)."),
        project: str = typer.Option(..., "--project", help="Project the job is charged to from now on."),
        reason: str = typer.Option(..., "--reason", help="Why (kept in the audit trail)."),
        old_project: str | None = typer.Option(None, "--old-project", help="Project it was charged to."),
        cluster: str | None = typer.Option(None, "--cluster", help="Cluster (default: settings)."),
        by: str | None = typer.Option(None, "--by", help="Who makes the correction (default: current user)."),
        force: bool = typer.Option(False, "--force", help="Allow a project the registry does not know."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the record instead of publishing."),
        state_dir: Path | None = STATE_DIR_OPTION,
    ) -> None:
        """Publish an audited AttributionCorrection (a new event; nothing is edited in place)."""
        from producers.projects import load_registry
        from schemas.topics import CORRECTIONS, job_key

        settings = _settings(state_dir)
        sched = _sched(settings)
        if not reason.strip():
            raise ConfigError("--reason must say why the attribution changes")
        if sched.registry is not None and not force:
            reg = load_registry(sched.registry)
            if reg.get(project) is None:
                raise ConfigError(f"project {project!r} is not in the registry {sched.registry} (use --force)")
        record = correction_record(
            cluster or settings.cluster, job, project, reason.strip(), by or getpass.getuser(), old_project,
            int(time.time() * 1000),
        )
        if dry_run:
            typer.echo(json.dumps(record, sort_keys=True))
            return
        pub = _publisher(settings)
        pub.publish(CORRECTIONS, job_key(record["cluster"], job), record)
        pub.flush()
        typer.echo(f"correction {record['correction_id']} published: {job} -> {project}")


def correction_record(
    cluster: str, job_id: str, project: str, reason: str, corrected_by: str, old_project: str | None, ts_ms: int
) -> dict[str, Any]:
    """An `AttributionCorrection`; its id is deterministic so a retried publish de-duplicates."""
    text = "\x1f".join((cluster, job_id, old_project or "", project, reason, corrected_by, str(ts_ms)))
    return {
        "correction_id": hashlib.sha256(text.encode()).hexdigest()[:32],
        "ts_ms": ts_ms,
        "cluster": cluster,
        "job_id": job_id,
        "old_project": old_project,
        "new_project": project,
        "reason": reason,
        "corrected_by": corrected_by,
    }


def _dead_letter(pub: Any, msg: Any, exc: Exception) -> None:
    from schemas.topics import Topic

    topic = Topic(str(msg.topic()), "raw-json", "none").dead_letter_topic()
    pub.publish(topic, msg.key(), {
        "source_topic": msg.topic(), "source_partition": msg.partition(), "source_offset": msg.offset(),
        "key": msg.key(), "value": msg.value(), "error_class": type(exc).__name__, "error_message": str(exc)[:1000],
        "schema_fingerprint": None, "ts_ms": int(time.time() * 1000),
    })


class _PrintSink:
    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        typer.echo(json.dumps(record, sort_keys=True))

    def flush(self) -> None:
        pass


class _FlushingSink:
    """Publish and flush per event batch (watch events are sparse; latency matters more than batching)."""

    def __init__(self, pub: Any) -> None:
        self.pub = pub

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.pub.publish(topic, key, record)
        self.pub.flush()
