"""What the scheduler commands run (`producers/scheduler_cli.py`): each source's job events built in the
`EventContext` of the settings (`context`), published through `publisher`, or printed as JSON lines on a dry run;
the Slurm poller, spool drain and jobcomp consumer, the Kubernetes watcher and PodResources publisher, the
submission policy files, and the audited attribution correction.

Configuration is the settings' `scheduler` section (`base.producer_settings.SchedulerSettings`); the command
line's options arrive as arguments. What a command prints arrives as `echo` (stdout) and `warn` (stderr).
"""

from __future__ import annotations

import getpass
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from base.cli_common import StopFlag
from base.errors import ConfigError, ContractError, GpuledgerError, ParseError
from base.kube import load_credentials
from base.producer_settings import SchedulerSettings
from producers.corrections import correction_record

Echo = Callable[[str], None]


def tz(name: str) -> Any:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"unknown time zone {name!r}") from exc


def context(settings: Any, sched: SchedulerSettings, cluster: str | None = None, with_inventory: bool = False) -> Any:
    """The `EventContext` every source's job events are built in: cluster, project attribution, identity
    directory, device map (filled from the inventory topic with `with_inventory`), pricing tier, preemptible names."""
    from producers.devicemap import InMemoryDeviceMap
    from producers.identity import FileDirectory
    from producers.jobevents import EventContext
    from producers.projects import Attributor, ProjectRule, load_registry

    registry = load_registry(sched.registry) if sched.registry else None
    rule = ProjectRule(tuple(sched.project_from), sched.account_map, sched.kube_label, sched.mode)
    devmap = InMemoryDeviceMap.from_file(sched.device_map) if sched.device_map else InMemoryDeviceMap()
    if with_inventory and sched.device_map_from_inventory:
        load_inventory(settings, devmap)
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


def load_inventory(settings: Any, devmap: Any, timeout_s: float = 10.0) -> int:
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


def publisher(settings: Any) -> Any:
    from streams.publish import RecordPublisher

    return RecordPublisher(settings.kafka)


class PrintSink:
    """A dry run's sink: each event as a JSON line."""

    def __init__(self, echo: Echo) -> None:
        self.echo = echo

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.echo(json.dumps(record, sort_keys=True))

    def flush(self) -> None:
        pass


class FlushingSink:
    """Publish and flush per event batch (watch events are sparse; latency matters more than batching)."""

    def __init__(self, pub: Any) -> None:
        self.pub = pub

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.pub.publish(topic, key, record)
        self.pub.flush()


# -- Slurm ----------------------------------------------------------------------------------------


def capture_events(settings: Any, text: str, *, cluster: str, tz_name: str, gpu_only: bool) -> tuple[Any, list[Any]]:
    """`inspect slurm`: a captured Slurm output and the job events it yields (nothing is published)."""
    from producers.slurm import parse_capture
    from producers.slurm_events import het_gang_sizes, lifecycle_events

    ctx = context(settings, settings.scheduler, cluster=cluster)
    capture = parse_capture(text, tz(tz_name))
    het = het_gang_sizes(capture.jobs)
    events = [
        ev for job in capture.jobs if (job.gpu_count or job.gpus or not gpu_only)
        for ev in lifecycle_events(job, ctx, het.get(job.het_job_id or ""))
    ]  # fmt: skip
    return capture, events


def poll_slurm(settings: Any, *, once: bool, interval_s: float | None, dry_run: bool, echo: Echo, warn: Echo) -> None:
    """`slurm poll`: squeue (+ scontrol for GPU indices, + sacct to reconcile), or slurmrestd, polled into job
    events; once, or until SIGTERM/SIGINT."""
    from producers.slurm_poller import SlurmCommands, SlurmPoller, SlurmRestRunner

    sched = settings.scheduler
    ctx = context(settings, sched, with_inventory=not dry_run)
    sink: Any = PrintSink(echo) if dry_run else publisher(settings)
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
    poller = SlurmPoller(ctx, sink, commands=commands, runner=runner, tz=tz(sched.slurm_timezone),
                         state_path=state_path)  # fmt: skip
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
        load_inventory(settings, ctx.devices)

    poller.run(interval_s or sched.poll_interval_s, StopFlag(), on_error=lambda exc: warn(f"poll failed: {exc}"),
               every_cycle=refresh_gpu_map)  # fmt: skip


def drain_spool(settings: Any, spool: Path | None, *, follow: bool, interval_s: float, echo: Echo, warn: Echo) -> None:
    """`slurm spool-drain`: the events spooled by deploy/slurm/gpuledger_hook.py sent (files deleted once
    acknowledged); once, or with `follow` every `interval_s` until SIGTERM/SIGINT."""
    from producers.slurm_spool import drain

    sched = settings.scheduler
    ctx = context(settings, sched, with_inventory=True)
    pub = publisher(settings)
    stop = StopFlag()
    while True:
        try:
            sent, bad = drain(spool or sched.spool_dir, ctx, pub, pub.flush)
            if sent or bad:
                echo(f"sent {sent}, quarantined {bad}")
        except GpuledgerError as exc:
            if not follow:
                raise
            warn(f"drain failed, will retry: {exc}")
        if not follow or stop():
            return
        time.sleep(interval_s)


def consume_jobcomp(settings: Any, topic: str | None) -> None:
    """`slurm jobcomp`: Slurm's jobcomp/kafka records consumed into STARTED/ENDED job events until SIGTERM/SIGINT;
    a bad record is dead-lettered, never a crash loop on its offset."""
    from base.kafka import new_consumer
    from producers.slurm_jobcomp import StartIndex, jobcomp_events, parse_jobcomp_bytes
    from schemas.topics import JOB_EVENTS, job_key

    sched = settings.scheduler
    ctx = context(settings, sched, with_inventory=True)
    pub = publisher(settings)
    zone = tz(sched.slurm_timezone)
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
                for ev in jobcomp_events(parse_jobcomp_bytes(msg.value()), ctx, starts, zone):
                    pub.publish(JOB_EVENTS, job_key(ev["cluster"], ev["job_id"]), ev)  # encodes: may refuse
            except (ParseError, ContractError) as exc:
                dead_letter(pub, msg, exc)
            pub.flush()
            consumer.commit(message=msg, asynchronous=False)
    finally:
        consumer.close()


def dead_letter(pub: Any, msg: Any, exc: Exception) -> None:
    from schemas.topics import Topic

    topic = Topic(str(msg.topic()), "raw-json", "none").dead_letter_topic()
    pub.publish(topic, msg.key(), {
        "source_topic": msg.topic(), "source_partition": msg.partition(), "source_offset": msg.offset(),
        "key": msg.key(), "value": msg.value(), "error_class": type(exc).__name__, "error_message": str(exc)[:1000],
        "schema_fingerprint": None, "ts_ms": int(time.time() * 1000),
    })  # fmt: skip


# -- Kubernetes -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KubeWatch:
    """`kube watch`'s arguments."""

    kubeconfig: Path | None
    dry_run: bool
    once: bool
    timeout_s: int
    dcgm_interval_s: float


def watch_kube(settings: Any, args: KubeWatch, *, echo: Echo, warn: Echo) -> list[Any]:
    """`kube watch`: GPU pods, Kueue Workloads and Volcano PodGroups watched into job events until SIGTERM (or one
    round with `once`), devices from the dcgm-exporters' pod labels where no PodResources publisher runs; the
    watch's errors."""
    import threading

    import httpx
    from kubernetes import client

    from producers.kube import DcgmPodLabels, KubeTracker, KubeWatcher
    from producers.kube_identity import ApiOwners, ApiStampTrust

    sched = settings.scheduler
    ctx = context(settings, sched, with_inventory=not args.dry_run)
    load_credentials(args.kubeconfig or sched.kubeconfig)
    labels = DcgmPodLabels()

    def scrape_labels() -> None:
        for url in sched.dcgm_urls:
            try:
                labels.load_scrape(httpx.get(url, timeout=5.0).text)
            except httpx.HTTPError as exc:
                warn(f"dcgm-exporter {url}: {exc}")

    scrape_labels()
    api = client.ApiClient()
    tracker = KubeTracker(ctx, labels, project_label=sched.kube_label, owners=ApiOwners(api),
                          trust=ApiStampTrust(api))  # fmt: skip
    sink: Any = PrintSink(echo) if args.dry_run else FlushingSink(metered_kube(publisher(settings), settings, tracker))
    watcher = KubeWatcher(api, tracker, sink, clock=lambda: int(time.time() * 1000), timeout_seconds=args.timeout_s)
    following = threading.Event()  # set: stop following the labels

    def on_term(*_: Any) -> None:
        following.set()
        watcher.stop()

    signal.signal(signal.SIGTERM, on_term)
    if sched.dcgm_urls and not args.once:  # pods started after the watcher: their labels come later

        def follow_labels() -> None:
            while not following.wait(args.dcgm_interval_s):
                scrape_labels()
                watcher.recheck_devices()

        threading.Thread(target=follow_labels, name="dcgm-labels", daemon=True).start()
    watcher.run(rounds=1 if args.once else None)
    return list(watcher.errors)


def metered_kube(publisher: Any, settings: Any, tracker: Any) -> Any:
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


@dataclass(frozen=True, slots=True)
class PodResources:
    """`kube podresources`' arguments."""

    node: str
    socket: Path
    interval_s: float
    kubeconfig: Path | None
    once: bool
    dry_run: bool


def publish_pod_resources(settings: Any, args: PodResources, *, echo: Echo, warn: Echo) -> list[Any]:
    """`kube podresources`: the GPUs the kubelet gave each GPU pod of this node (its PodResources API) as job
    events, every `interval_s` until SIGTERM (or one List with `once`); the publisher's errors."""
    import threading

    from kubernetes import client, config

    from producers.kube import GangBook, KubeEventBuilder
    from producers.podresources import PodResourcesClient, PodResourcesPublisher, PodResourcesTracker, api_pod_getter

    sched = settings.scheduler
    path = args.kubeconfig or sched.kubeconfig
    try:
        if path is not None:
            api = config.new_client_from_config(config_file=str(path))
        else:
            config.load_incluster_config()
            api = client.ApiClient()
    except (config.ConfigException, OSError) as exc:
        raise ConfigError(f"no Kubernetes credentials: {exc}") from exc
    sink: Any = PrintSink(echo) if args.dry_run else FlushingSink(publisher(settings))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    tracker = PodResourcesTracker(args.node, KubeEventBuilder(context(settings, sched), GangBook(), sched.kube_label))
    with PodResourcesClient(str(args.socket)) as kubelet:
        allocatable = [d.device_id for d in kubelet.allocatable()]
        warn(json.dumps({"node": args.node, "allocatable": allocatable}))
        pods = PodResourcesPublisher(kubelet, tracker, api_pod_getter(api), sink, clock=lambda: int(time.time() * 1000))
        pods.run(stop, args.interval_s, rounds=1 if args.once else None)
    return list(pods.errors)


# -- submission policy and corrections ------------------------------------------------------------


def render_submission_policy(settings: Any, out: Path, *, registry: str | None, directory: Path | None,
                             mode: str | None, apply_default: bool) -> tuple[Path, Path, int, str]:  # fmt: skip
    """`policy render`: Slurm's job_submit.lua and a Kubernetes ValidatingAdmissionPolicy from the project
    registry, written into `out`; (the two files, how many projects, the mode)."""
    from producers.identity import FileDirectory, directory_from_data
    from producers.policy import PolicyOptions, default_places, render_admission_policy_yaml, render_job_submit_lua
    from producers.projects import load_registry

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
    return lua, vap, len(reg.active_ids()), chosen


def correction(settings: Any, job: str, project: str, *, reason: str, old_project: str | None, cluster: str | None,
               by: str | None, force: bool) -> dict[str, Any]:  # fmt: skip
    """`attribution correct`: the audited AttributionCorrection record (a project the registry does not know
    only with `force`)."""
    from producers.projects import load_registry

    sched = settings.scheduler
    if not reason.strip():
        raise ConfigError("--reason must say why the attribution changes")
    if sched.registry is not None and not force:
        reg = load_registry(sched.registry)
        if reg.get(project) is None:
            raise ConfigError(f"project {project!r} is not in the registry {sched.registry} (use --force)")
    return correction_record(
        cluster or settings.cluster, job, project, reason.strip(), by or getpass.getuser(), old_project,
        int(time.time() * 1000),
    )  # fmt: skip


def publish_correction(settings: Any, record: dict[str, Any]) -> None:
    from schemas.topics import CORRECTIONS, job_key

    pub = publisher(settings)
    pub.publish(CORRECTIONS, job_key(record["cluster"], record["job_id"]), record)
    pub.flush()
