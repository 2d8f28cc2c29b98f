"""Scheduler commands: `inspect slurm`, `slurm poll|spool-drain|jobcomp`, `kube watch|podresources`, `policy render`
(`policy render|apply|diff --engine` in producers/policy_cli.py), `attribution correct`.

Configuration is the settings' `scheduler` section (TOML `[scheduler]`, or env `GPULEDGER_SCHEDULER__...`;
`base.producer_settings.SchedulerSettings`), validated when the settings are built; command-line options
override it. Each command parses its options and calls one function of `producers/scheduler_service.py` (its
job events built in the `EventContext` of `context`, published through `publisher`); `register` only wires them.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from base.cli_common import STATE_DIR_OPTION, settings_for
from producers import scheduler_service as service
from producers.policy_cli import register as register_policy


def _warn(message: str) -> None:
    typer.echo(message, err=True)


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
    from producers.present import slurm_capture

    capture, events = service.capture_events(settings_for(state_dir), file.read_text(encoding="utf-8"),
                                             cluster=cluster, tz_name=tz, gpu_only=gpu_only)  # fmt: skip
    if as_json:
        for ev in events:
            typer.echo(json.dumps(ev, sort_keys=True))
        return
    slurm_capture(file.name, capture, events)


@slurm_app.command("poll")
def slurm_poll(
    once: bool = typer.Option(False, "--once", help="One poll cycle, then exit."),
    interval_s: float | None = typer.Option(None, "--interval", help="Seconds between polls."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print events as JSON instead of publishing."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Poll squeue (+ scontrol for GPU indices, + sacct to reconcile) and publish job events."""
    service.poll_slurm(settings_for(state_dir), once=once, interval_s=interval_s, dry_run=dry_run, echo=typer.echo,
                       warn=_warn)  # fmt: skip


@slurm_app.command("spool-drain")
def slurm_spool_drain(
    spool: Path | None = typer.Option(None, "--spool", help="Spool directory of the prolog/epilog hook."),
    follow: bool = typer.Option(False, "--follow", help="Keep draining every --interval seconds."),
    interval_s: float = typer.Option(5.0, "--interval"),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Send the events spooled by deploy/slurm/gpuledger_hook.py; files are deleted once acknowledged."""
    service.drain_spool(settings_for(state_dir), spool, follow=follow, interval_s=interval_s, echo=typer.echo,
                        warn=_warn)  # fmt: skip


@slurm_app.command("jobcomp")
def slurm_jobcomp(
    topic: str | None = typer.Option(None, "--topic", help="Topic Slurm's jobcomp/kafka writes to."),
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Consume Slurm jobcomp/kafka records and publish STARTED/ENDED job events."""
    service.consume_jobcomp(settings_for(state_dir), topic)


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
    args = service.KubeWatch(kubeconfig, dry_run, once, timeout_s, dcgm_interval_s)
    for err in service.watch_kube(settings_for(state_dir), args, echo=typer.echo, warn=_warn):
        typer.echo(f"watch: {err}", err=True)


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
    args = service.PodResources(node, socket, interval_s, kubeconfig, once, dry_run)
    errors = service.publish_pod_resources(settings_for(state_dir), args, echo=typer.echo, warn=_warn)
    for err in errors:
        typer.echo(f"podresources: {err}", err=True)
    if once and errors:
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
    lua, vap, projects, chosen = service.render_submission_policy(
        settings_for(state_dir), out, registry=registry, directory=directory, mode=mode, apply_default=apply_default
    )
    typer.echo(f"wrote {lua} and {vap} ({projects} projects, mode {chosen})")


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
    settings = settings_for(state_dir)
    record = service.correction(settings, job, project, reason=reason, old_project=old_project, cluster=cluster,
                                by=by, force=force)  # fmt: skip
    if dry_run:
        typer.echo(json.dumps(record, sort_keys=True))
        return
    service.publish_correction(settings, record)
    typer.echo(f"correction {record['correction_id']} published: {job} -> {project}")
