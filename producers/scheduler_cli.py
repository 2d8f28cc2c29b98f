"""Scheduler commands: `inspect slurm`, `slurm poll|spool-drain|jobcomp`, `kube watch`, `policy render`
(`policy render|apply|diff --engine` in producers/policy_cli.py),
`attribution correct`.

Configuration is the settings' `scheduler` section (TOML `[scheduler]`, or env `GPULEDGER_SCHEDULER__...`;
`base.producer_settings.SchedulerSettings`), validated when the settings are built; command-line options
override it. Each command is a module-level function; `register` only wires them.
"""

from __future__ import annotations

import getpass
import json
import signal
import time
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from base.cli_common import STATE_DIR_OPTION, StopFlag, settings_for
from base.errors import ConfigError, ContractError, GpuledgerError, ParseError
from base.kube import load_credentials
from base.producer_settings import SchedulerSettings
from producers.corrections import correction_record
from producers.policy_cli import register as register_policy

console = Console()


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
        preemptible_qos=preemptible_names(settings, sched).names,
    )


def preemptible_names(settings: Any, sched: SchedulerSettings) -> Any:
    """What the producers price as preemptible: the explicit override, else the configured policy's
    preemptible tier, else the conventional names (producers/preemptible.py)."""
    from producers.preemptible import resolve
    from schemas.policy import load_policy

    policy = None
    if not sched.preemptible_qos and settings.policy_path is not None:
        policy = load_policy(settings.policy_path)  # a PolicyError names each problem, file:line
    return resolve(sched.preemptible_qos, policy)


def _load_inventory(settings: Any, devmap: Any, timeout_s: float = 10.0) -> int:
    """Read the compacted inventory topic to its end into the device map (best effort): the latest
    record per node. Returns how many records were applied."""
    from confluent_kafka import KafkaException

    from base.errors import ServiceError
    from base.kafka import read_to_end
    from schemas.codec import AvroCodec
    from schemas.topics import INVENTORY

    codec = AvroCodec()
    topic = settings.kafka.topic(INVENTORY.name)
    try:
        table = read_to_end(settings.kafka, f"gpuledger-devmap-{time.time_ns()}", topic, timeout_s=timeout_s)
    except (ServiceError, KafkaException):
        return 0
    n = 0
    for _, value in sorted(table.items()):
        if value:
            try:
                devmap.apply_inventory(codec.decode(value, INVENTORY.subject).record)
                n += 1
            except GpuledgerError:
                pass
    return n


def _publisher(settings: Any) -> Any:
    from streams.publish import RecordPublisher

    return RecordPublisher(settings.kafka)


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


slurm_app = typer.Typer(help="Slurm job events: polling, prolog/epilog spool, jobcomp/kafka.", no_args_is_help=True)
kube_app = typer.Typer(help="Kubernetes job events: pods, Kueue workloads, Volcano podgroups.", no_args_is_help=True)
policy_app = typer.Typer(help="Enforcement generated from the project registry.", no_args_is_help=True)
attribution_app = typer.Typer(help="Audited project attribution changes.", no_args_is_help=True)


def register(app: typer.Typer, inspect_app: typer.Typer) -> None:
    """Add the scheduler sources' commands to the `gpuledger` command."""
    inspect_app.command("slurm")(inspect_slurm)
    app.add_typer(slurm_app, name="slurm")
    app.add_typer(kube_app, name="kube")
    app.add_typer(policy_app, name="policy")
    register_policy(policy_app)
    app.add_typer(attribution_app, name="attribution")


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

    settings = settings_for(state_dir)
    ctx = _context(settings, settings.scheduler, cluster=cluster)
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
    table = Table(title=escape(title))  # what the capture holds is text, never markup
    for col in ("job", "event", "time (UTC)", "user", "account", "project", "partition", "devices", "exit"):
        table.add_column(col)
    for ev in events:
        table.add_row(*map(escape, (
            ev["job_id"], ev["event_type"], _ms_text(ev["ts_ms"]), ev["user"], ev["account"] or "-",
            f"{ev['project'] or '-'} ({ev['project_source'].lower()})", ev["partition"] or "-",
            _devices_text(ev), ev["exit_state"] or "",
        )))
    console.print(table)
    if capture.nodes:
        nodes = Table(title="nodes")
        for col in ("node", "gpus", "type", "in use"):
            nodes.add_column(col)
        for n in capture.nodes:
            cells = (n.name, str(n.gpu_count), n.gpu_type or "-", ",".join(map(str, n.used_indices)) or "-")
            nodes.add_row(*map(escape, cells))
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

    settings = settings_for(state_dir)
    sched = settings.scheduler
    ctx = _context(settings, sched, with_inventory=not dry_run)
    sink: Any = _PrintSink() if dry_run else _publisher(settings)
    runner = SlurmRestRunner()
    if sched.slurmrestd_url:
        base, ver = sched.slurmrestd_url.rstrip("/"), sched.slurmrestd_version
        commands = SlurmCommands((f"{base}/slurm/{ver}/jobs",), (), (f"{base}/slurmdb/{ver}/jobs",), config=())
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

    poller.run(interval_s or sched.poll_interval_s, StopFlag(),
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

    settings = settings_for(state_dir)
    sched = settings.scheduler
    ctx = _context(settings, sched, with_inventory=True)
    pub = _publisher(settings)
    stop = StopFlag()
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
    from base.kafka import new_consumer
    from producers.slurm_jobcomp import StartIndex, jobcomp_events, parse_jobcomp_bytes
    from schemas.topics import JOB_EVENTS, job_key

    settings = settings_for(state_dir)
    sched = settings.scheduler
    ctx = _context(settings, sched, with_inventory=True)
    pub = _publisher(settings)
    tz = _tz(sched.slurm_timezone)
    consumer = new_consumer(settings.kafka, "gpuledger-slurm-jobcomp")
    consumer.subscribe([topic or sched.jobcomp_topic])
    starts = StartIndex()
    stop = StopFlag()
    try:
        while not stop():
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            try:  # one bad record is dead-lettered, never a crash loop on its offset
                for ev in jobcomp_events(parse_jobcomp_bytes(msg.value()), ctx, starts, tz):
                    pub.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)  # encodes: may refuse
            except (ParseError, ContractError) as exc:
                _dead_letter(pub, msg, exc)
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
    dcgm_interval_s: float = typer.Option(30.0, "--dcgm-interval", help="Seconds between two scrapes of the "
                                          "dcgm-exporters' pod labels (the device fallback where no "
                                          "`kube podresources` runs)."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Watch GPU pods, Kueue Workloads and Volcano PodGroups; publish job events."""
    import threading

    import httpx
    from kubernetes import client

    from producers.kube import DcgmPodLabels, KubeTracker, KubeWatcher

    settings = settings_for(state_dir)
    sched = settings.scheduler
    ctx = _context(settings, sched, with_inventory=not dry_run)
    path = kubeconfig or sched.kubeconfig
    load_credentials(path)
    labels = DcgmPodLabels()

    def scrape_labels() -> None:
        for url in sched.dcgm_urls:
            try:
                labels.load_scrape(httpx.get(url, timeout=5.0).text)
            except httpx.HTTPError as exc:
                typer.echo(f"dcgm-exporter {url}: {exc}", err=True)

    scrape_labels()
    from producers.kube_identity import ApiOwners, ApiStampTrust

    api = client.ApiClient()
    tracker = KubeTracker(ctx, labels, project_label=sched.kube_label, owners=ApiOwners(api),
                          trust=ApiStampTrust(api))
    sink: Any = _PrintSink() if dry_run else _FlushingSink(_metered_kube(_publisher(settings), settings, tracker))
    watcher = KubeWatcher(api, tracker, sink, clock=lambda: int(time.time() * 1000), timeout_seconds=timeout_s)
    following = threading.Event()  # set: stop following the labels

    def on_term(*_: Any) -> None:
        following.set()
        watcher.stop()

    signal.signal(signal.SIGTERM, on_term)
    if sched.dcgm_urls and not once:  # pods started after the watcher: their labels come later

        def follow_labels() -> None:
            while not following.wait(dcgm_interval_s):
                scrape_labels()
                watcher.recheck_devices()

        threading.Thread(target=follow_labels, name="dcgm-labels", daemon=True).start()
    watcher.run(rounds=1 if once else None)
    for err in watcher.errors:
        typer.echo(f"watch: {err}", err=True)


def _metered_kube(publisher: Any, settings: Any, tracker: Any) -> Any:
    """`kube watch`'s /metrics (base/metrics.py, component "kube"), as the telemetry producers serve theirs:
    records out per topic, and the submitter stamps its identity resolver ignored, read at scrape time
    (gpuledger_stamps_ignored_total{reason="oversized"|"untrusted"})."""
    if not settings.metrics.enabled:
        return publisher
    from base import metrics

    meter = metrics.component("kube")
    meter.add_source(tracker.identity.counters)
    counted = metrics.CountingPublisher(publisher, meter, settings.kafka.topic_prefix)
    metrics.start_metrics_server(settings, "kube")
    return counted


@kube_app.command("podresources")
def kube_podresources(
    node: str = typer.Option(..., "--node", envvar="NODE_NAME", help="This node's name (spec.nodeName)."),
    socket: Path = typer.Option(Path("/var/lib/kubelet/pod-resources/kubelet.sock"), "--socket",
                                help="The kubelet's PodResources socket."),
    interval_s: float = typer.Option(10.0, "--interval", help="Seconds between two List calls."),
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="Default: in-cluster credentials."),
    once: bool = typer.Option(False, "--once", help="One List, publish, exit (1 if it failed)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print events as JSON instead of publishing."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Per node (a DaemonSet): publish the GPUs (UUIDs, or indices) the kubelet gave each GPU pod, from its
    PodResources API, so every pod is charged for the devices it holds (MIG slices: dcgm-exporter's labels)."""
    import threading

    from kubernetes import client, config

    from producers.kube import GangBook, KubeEventBuilder
    from producers.podresources import PodResourcesClient, PodResourcesPublisher, PodResourcesTracker, api_pod_getter

    settings = settings_for(state_dir)
    sched = settings.scheduler
    path = kubeconfig or sched.kubeconfig
    try:
        if path is not None:
            api = config.new_client_from_config(config_file=str(path))
        else:
            config.load_incluster_config()
            api = client.ApiClient()
    except (config.ConfigException, OSError) as exc:
        raise ConfigError(f"no Kubernetes credentials: {exc}") from exc
    sink: Any = _PrintSink() if dry_run else _FlushingSink(_publisher(settings))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    tracker = PodResourcesTracker(node, KubeEventBuilder(_context(settings, sched), GangBook(), sched.kube_label))
    with PodResourcesClient(str(socket)) as kubelet:
        allocatable = [d.device_id for d in kubelet.allocatable()]
        typer.echo(json.dumps({"node": node, "allocatable": allocatable}), err=True)
        publisher = PodResourcesPublisher(kubelet, tracker, api_pod_getter(api), sink,
                                          clock=lambda: int(time.time() * 1000))
        publisher.run(stop, interval_s, rounds=1 if once else None)
    for err in publisher.errors:
        typer.echo(f"podresources: {err}", err=True)
    if once and publisher.errors:
        raise typer.Exit(1)


@policy_app.command("render")
def policy_render(
    out: Path = typer.Option(Path("."), "--out", help="Directory to write job_submit.lua and the policy into."),
    registry: str | None = typer.Option(None, "--registry", help="Project registry file or URL (default: "
                                        "settings)."),
    directory: Path | None = typer.Option(None, "--directory", help="Identity directory (expands teams)."),
    mode: str | None = typer.Option(None, "--mode", help="strict (reject) or grace (warn). Default: settings."),
    apply_default: bool = typer.Option(False, "--apply-default", help="Strict: a GPU job naming no project runs "
                                       "charged to its user's default project (set as wckey or comment), with a "
                                       "message; users without a default are still rejected."),
    engine: str | None = typer.Option(None, "--engine", help="slurm or kueue: render policy.yaml instead "
                                      "(quota, tiers, preemption, fair share; see `policy apply`, `policy diff`)."),
    policy_path: Path | None = typer.Option(None, "--policy", help="With --engine: policy.yaml (default: "
                                            "settings' policy_path)."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Generate Slurm job_submit.lua and a Kubernetes ValidatingAdmissionPolicy from the registry, or, with
    --engine, the organisation's policy.yaml for Slurm (sacctmgr script, slurm.conf fragment) or Kueue."""
    if engine is not None:
        from producers.policy_cli import render_engine

        render_engine(engine, out, policy_path, state_dir)
        return
    from producers.identity import FileDirectory, directory_from_data
    from producers.policy import PolicyOptions, default_places, render_admission_policy_yaml, render_job_submit_lua
    from producers.projects import load_registry

    settings = settings_for(state_dir)
    sched = settings.scheduler
    reg_path = registry or sched.registry
    if reg_path is None:
        raise ConfigError("no project registry: pass --registry FILE or set scheduler.registry")
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
        apply_default=apply_default,
    )
    if apply_default:
        try:
            default_places(options)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
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
    vap.write_text(render_admission_policy_yaml(reg, options, entries), encoding="utf-8")
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

    settings = settings_for(state_dir)
    sched = settings.scheduler
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
