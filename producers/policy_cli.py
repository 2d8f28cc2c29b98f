"""`gpuledger policy render|apply|diff --engine slurm|kueue [--policy FILE]`: the organisation's policy.yaml
(schemas/policy.py) onto the scheduler, and the drift between the two.

- render: files only (Slurm: `sacctmgr-policy.sh` and `slurm-policy.conf`; Kueue: `kueue-policy.yaml` and
  `submitter-stamp.yaml`, the admission policies that stamp and lock the verified submitter,
  producers/policy_stamp.py).
- apply: Slurm: the fair-share settings written into slurm.conf as one marked block and `scontrol reconfigure`
  (a PriorityType change also needs a slurmctld restart, which apply says, exiting 1; producers/policy_slurm.py),
  then the `sacctmgr -i` commands that turn today's accounting state into the policy's (add what is missing,
  modify what differs); Kueue: server-side apply of every object (the submitter stamp's
  admission policies first, then the Kueue objects) through the Kubernetes API.
- diff: reads the live state (`scontrol show config`, `sacctmgr -n -P show qos|assoc`, the Kubernetes API) and
  prints one line per difference; exit 1 when there is any, 0 when none. It also says where the pricing disagrees
  with the engine (`pricing: ...`: an explicit `scheduler.preemptible_qos` that names another QOS /
  WorkloadPriorityClass than the policy's preemptible tier, or leaves that tier out; producers/preemptible.py). On
  Kueue a team's quota raised by its active reservations (reservations.v1, the reservation service's bump) is
  expected: a raise they account for exactly is printed as "explained by reservation R (+N) until T" and is not
  drift; a bump missing or of another size is.
A policy file with problems prints one `file:line: what` per problem and exits 2, rendering nothing.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
import yaml

from base.cli_common import STATE_DIR_OPTION, settings_for
from base.errors import ConfigError, ServiceError
from base.settings import Settings
from producers import policy_kueue, policy_slurm, policy_stamp
from producers.baseline_cli import policy_baseline, record_applied
from producers.policy_audit import applied_event, kubernetes_user, os_user
from producers.policy_engine import (
    ENGINES,
    EngineDiff,
    Pruned,
    engine_diff,
    kube_api,
    kueue_apply,
    kueue_config_apply,
    kueue_managed,
    kueue_prune,
    prune_guard_objects,
    prune_plan,
    prune_refusal,
    reservation_bumps_from,
    run_command,
    slurm_apply,
    slurm_conf_apply,
    slurm_prune,
)
from schemas.policy import Policy, PolicyError, load_policy

RECORD_TIMEOUT_S = 30.0  # publishing the apply's record
RECORD_PROBE_S = 2.0  # does the broker answer at all


def policy_from(path: Path | None, state_dir: Path | None) -> Policy:
    chosen = path or settings_for(state_dir).policy_path
    if chosen is None:
        raise ConfigError("no policy: pass --policy FILE or set policy_path (GPULEDGER_POLICY_PATH)")
    try:
        return load_policy(chosen)
    except PolicyError as exc:
        for line in exc.problems:
            typer.echo(line, err=True)
        raise typer.Exit(2) from exc


def check_engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ConfigError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    return engine


def render_files(policy: Policy, engine: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    if engine == "slurm":
        script, conf = out / "sacctmgr-policy.sh", out / "slurm-policy.conf"
        script.write_text(policy_slurm.render_script(policy_slurm.desired_state(policy)), encoding="utf-8")
        conf.write_text(policy_slurm.render_conf(policy), encoding="utf-8")
        return [script, conf]
    manifest, stamp = out / "kueue-policy.yaml", out / "submitter-stamp.yaml"
    manifest.write_text(policy_kueue.render_yaml(policy_kueue.render_objects(policy)), encoding="utf-8")
    stamp.write_text(policy_kueue.render_yaml(policy_stamp.render_objects()), encoding="utf-8")
    config = out / "kueue-config.yaml"  # the controller's Configuration, its admission fair sharing only
    want = policy_kueue.kueue_config(policy)
    config.write_text("# Merge into the Kueue controller's Configuration (config.kueue.x-k8s.io/v1beta2), then restart "
                      "it.\n" + ("# fair_share accumulate: Kueue's usage always fades; admission fair sharing stays "
                                 "off (no admissionFairSharing).\n{}\n" if want is None else
                                 yaml.safe_dump({policy_kueue.CONFIG_KEY: want}, sort_keys=False)),
                      encoding="utf-8")  # fmt: skip
    return [manifest, stamp, config]


def reservation_bumps(policy: Policy, state_dir: Path | None) -> list[policy_kueue.Bump]:
    """The active reservations of this cluster as quota bumps; none, with a warning, when the topic cannot be read:
    then every quota difference is drift."""
    settings = settings_for(state_dir)
    try:
        return reservation_bumps_from(policy, settings.kafka, settings.cluster, time.time_ns() // 1_000_000)
    except ServiceError as exc:
        typer.echo(f"reservations not read ({exc}): a reservation's quota bump shows as drift", err=True)
        return []


# -- commands -------------------------------------------------------------------------------------

ENGINE_OPTION = typer.Option(..., "--engine", help="slurm or kueue.")
POLICY_OPTION = typer.Option(None, "--policy", help="policy.yaml (default: settings' policy_path).")
KUBECONFIG_OPTION = typer.Option(None, "--kubeconfig", help="Kueue: default in-cluster, else ~/.kube/config.")
SACCTMGR_OPTION = typer.Option("sacctmgr", "--sacctmgr", help="Slurm: the sacctmgr to run.")
SLURM_CONF_OPTION = typer.Option(None, "--slurm-conf", help="Slurm: the slurm.conf to write the fair-share block "
                                 "into (default: the SLURM_CONF `scontrol show config` names).")
KUEUE_CONFIG_OPTION = typer.Option(None, "--kueue-config", help="Kueue: the controller's Configuration file (its "
                                   "admissionFairSharing is the policy's fair share); not read or written without it.")
KUEUE_RESTART_OPTION = typer.Option(None, "--kueue-restart", help="Kueue: the command that restarts the controller "
                                    "after its Configuration changed (e.g. kubectl -n kueue-system rollout restart "
                                    "deployment/kueue-controller-manager).")
PRUNE_OPTION = typer.Option(False, "--prune", help="Also remove what an earlier apply created that the policy no "
                            "longer names (never anything gpuledger did not create); for policy governance.pruners.")
RESERVATIONS_OPTION = typer.Option(True, "--reservations/--no-reservations",
                                   help="Kueue: expect active reservations' quota raises.")  # fmt: skip


def render_engine(engine: str, out: Path, policy_path: Path | None, state_dir: Path | None) -> None:
    policy = policy_from(policy_path, state_dir)
    written = render_files(policy, check_engine(engine), out)
    typer.echo(f"wrote {', '.join(str(p) for p in written)} ({len(policy.teams)} teams, {len(policy.tiers)} tiers)")


def policy_apply(
    engine: str = ENGINE_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    sacctmgr: str = SACCTMGR_OPTION,
    slurm_conf: Path | None = SLURM_CONF_OPTION,
    kueue_config: Path | None = KUEUE_CONFIG_OPTION,
    kueue_restart: str | None = KUEUE_RESTART_OPTION,
    prune: bool = PRUNE_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Apply the policy to the running scheduler (Slurm accounting, or Kueue objects); every apply is recorded on
    policy.applied.v1: who, when, each setting before and after (kept and sent later when the broker is away)."""
    policy = policy_from(policy_path, state_dir)
    settings = settings_for(state_dir)
    if check_engine(engine) == "slurm":
        actor = os_user()
        refusal = prune_refusal(policy, actor) if prune else None
        if refusal:
            raise ConfigError(refusal)
        changes = engine_diff(policy, engine, preemptible_qos=(), sacctmgr=sacctmgr)
        before, after = slurm_conf_apply(policy, run_command, slurm_conf, time.time())
        for d in before:
            typer.echo(f"slurm.conf {d.setting}={d.want} (slurmctld ran {d.have or '(none)'})")
        typer.echo(f"applied: {len(before)} slurm.conf settings" + (" (scontrol reconfigure)" if before else ""))
        commands = slurm_apply(policy, run_command, sacctmgr)
        for argv in commands:
            typer.echo(" ".join(["sacctmgr", "-i", *argv]))
        typer.echo(f"applied: {len(commands)} sacctmgr commands")
        pruned_argv = slurm_prune(policy, run_command, sacctmgr) if prune else []
        for argv in pruned_argv:
            typer.echo(" ".join(["sacctmgr", "-i", *argv]))
        if prune:
            typer.echo(f"pruned: {len(pruned_argv)} sacctmgr commands")
        left = engine_diff(policy, engine, preemptible_qos=(), sacctmgr=sacctmgr)
        gone = tuple(Pruned(("qos" if argv[1] == "qos" else "account", "", argv[3].partition("=")[2]))
                     for argv in pruned_argv)  # fmt: skip
        changes = EngineDiff(engine, changes.drift, changes.explained, (*changes.found, *gone))
        _record_apply(settings, policy, engine, actor, "os-user", changes, left)
        record_applied(policy, engine, state_dir)  # issue 38: the attribution baseline, once the engine has it
        for d in after:
            typer.echo(str(d), err=True)
        if after:
            raise typer.Exit(1)
        return
    stamp, objs = policy_stamp.render_objects(), policy_kueue.render_objects(policy)
    api = kube_api(kubeconfig)
    actor = kubernetes_user(api)  # asked first: an apply whose author cannot be told is not made
    refusal = prune_refusal(policy, actor) if prune else None
    if refusal:
        raise ConfigError(refusal)
    changes = engine_diff(policy, engine, preemptible_qos=(), kube=api, kueue_config=kueue_config)
    kueue_apply(api, stamp)
    typer.echo(f"applied: {len(stamp)} admission objects (the submitter stamp and its lock)")
    kueue_apply(api, objs)
    typer.echo(f"applied: {len(objs)} Kueue objects")
    if prune:  # the API server itself refuses this user's delete of anything the apply did not create
        kueue_apply(api, prune_guard_objects(actor))
    pruned = prune_plan(objs, kueue_managed(api)) if prune else []
    kueue_prune(api, pruned)
    for item in pruned:
        typer.echo(str(item))
    if prune:
        typer.echo(f"pruned: {len(pruned)} Kueue objects")
    if kueue_config is not None:
        changed = kueue_config_apply(policy, kueue_config, kueue_restart, run_command)
        for line in changed:
            typer.echo(line)
        if changed and not kueue_restart:
            typer.echo(f"wrote {kueue_config}: restart the Kueue controller to load it (--kueue-restart CMD)", err=True)
        typer.echo(f"applied: Kueue Configuration {kueue_config}" + (" (restarted)" if changed and kueue_restart
                                                                       else "" if changed else " unchanged"))
    if policy.fair_share.half_life is None:
        typer.echo("fair_share accumulate: Kueue's usage always fades, so admission fair sharing is left off "
                   "(Kueue admits by priority, then arrival)", err=True)  # fmt: skip
    left = engine_diff(policy, engine, preemptible_qos=(), kube=api, kueue_config=kueue_config)
    changes = EngineDiff(engine, changes.drift, changes.explained, (*changes.found, *pruned))
    _record_apply(settings, policy, engine, actor, "kubernetes", changes, left)
    record_applied(policy, engine, state_dir)


def _record_apply(settings: Settings, policy: Policy, engine: str, actor: str, source: str, before: EngineDiff,
                  left: EngineDiff) -> None:  # fmt: skip
    """Publish the apply's record (policy.applied.v1) with any earlier one that could not be; one line on stdout.
    The engine has the policy by now, so a broker that does not answer loses nothing: the record waits in the state
    directory (policy-applies-unsent/) and the next `policy apply` publishes it, which stderr says."""
    from schemas.governance_baseline import policy_sha256

    event = applied_event(cluster=settings.cluster, engine=engine, actor=actor, actor_source=source,
                          policy_hash=policy_sha256(policy), before=before.found, still_differs=left.drift,
                          now_ms=time.time_ns() // 1_000_000)  # fmt: skip
    unsent = settings.state_dir / "policy-applies-unsent"
    unsent.mkdir(parents=True, exist_ok=True)
    (unsent / f"{event['apply_id']}.json").write_text(json.dumps(event), encoding="utf-8")
    line = f"apply {event['apply_id'][:12]} by {actor} ({source}), {len(event['changes'])} change(s)"
    try:
        sent = _publish_unsent(settings, unsent)
    except ServiceError as exc:
        typer.echo(f"not recorded yet: {line}: {exc}; kept in {unsent}, published by the next `policy apply`",
                   err=True)  # fmt: skip
        return
    typer.echo(f"recorded: {line}" + (f" (and {sent - 1} kept from before)" if sent > 1 else ""))


def _publish_unsent(settings: Settings, unsent: Path) -> int:
    """Publish every kept record (oldest first), removing each once the broker has it; ServiceError when the broker
    does not answer within RECORD_TIMEOUT_S."""
    from base.kafka import new_admin
    from schemas.topics import POLICY_APPLIED
    from streams.publish import RecordPublisher

    try:  # a quick look first: without a broker, a publish would wait out its whole delivery timeout
        new_admin(settings.kafka).list_topics(timeout=RECORD_PROBE_S)
    except Exception as exc:  # KafkaException: the cluster did not answer
        raise ServiceError(f"Kafka at {settings.kafka.bootstrap_servers} does not answer ({exc})"[:300]) from exc
    files = sorted(unsent.glob("*.json"), key=lambda f: f.stat().st_mtime)
    publisher = RecordPublisher(settings.kafka)
    for f in files:
        event = json.loads(f.read_text(encoding="utf-8"))
        publisher.publish(POLICY_APPLIED, f"{event['cluster']}/{event['engine']}".encode(), event)
    publisher.flush(timeout_s=RECORD_TIMEOUT_S)
    for f in files:
        f.unlink()
    return len(files)


def policy_diff(
    engine: str = ENGINE_OPTION,
    policy_path: Path | None = POLICY_OPTION,
    kubeconfig: Path | None = KUBECONFIG_OPTION,
    sacctmgr: str = SACCTMGR_OPTION,
    reservations: bool = RESERVATIONS_OPTION,
    kueue_config: Path | None = KUEUE_CONFIG_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Print how the live scheduler differs from the policy; exit 1 when it does (a Kueue quota raised by active
    reservations, exactly, is printed as explained and is not drift)."""
    policy = policy_from(policy_path, state_dir)
    kueue = check_engine(engine) == "kueue"
    diff = engine_diff(policy, engine, preemptible_qos=settings_for(state_dir).scheduler.preemptible_qos,
                       sacctmgr=sacctmgr, kube=kube_api(kubeconfig) if kueue else None, kueue_config=kueue_config,
                       bumps=reservation_bumps(policy, state_dir) if kueue and reservations else ())  # fmt: skip
    for line in [*diff.drift, *diff.explained]:
        typer.echo(line)
    if diff.drift:
        raise typer.Exit(1)
    typer.echo("no drift")


def policy_watch(
    interval_s: float | None = typer.Option(None, "--interval-s", help="Seconds between passes (default: settings' "
                                            "policy_watch.interval_s)."),
    engine: list[str] | None = typer.Option(None, "--engine", help="slurm or kueue, repeatable (default: settings' "
                                            "policy_watch.engines)."),
    policy_path: Path | None = POLICY_OPTION,
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Diff every configured engine against the policy on an interval until SIGTERM; publish drift, with each
    differing line, as a POLICY_DRIFT alert and its end as POLICY_DRIFT_CLEARED (`gpuledger up` runs it when
    policy_watch.engines names an engine)."""
    from base.cli_common import start_service, stop_signal
    from producers.policy_engine import differ_for
    from producers.policy_watch import run
    from schemas.topics import ALERTS
    from streams.publish import RecordPublisher

    settings = start_service(state_dir)
    if engine:
        watch = settings.policy_watch.model_dump()
        settings.policy_watch = type(settings.policy_watch).model_validate(
            {**watch, "engines": [check_engine(e) for e in engine]})
    if not settings.policy_watch.engines:
        raise ConfigError("no engine to watch: pass --engine or set policy_watch.engines")
    policy = policy_from(policy_path, state_dir)
    publisher = RecordPublisher(settings.kafka)
    cluster = settings.cluster

    def publish(alert: dict[str, object]) -> None:
        publisher.publish(ALERTS, f"{cluster}/policy-{alert['engine']}".encode(), alert)

    stop = stop_signal("policy-watch")
    run(cluster, tuple(settings.policy_watch.engines), differ_for(policy, settings), publish, publisher.flush, stop,
        interval_s if interval_s is not None else settings.policy_watch.interval_s,
        lambda: time.time_ns() // 1_000_000)  # fmt: skip
    stop.leave()


def register(policy_app: typer.Typer) -> None:
    policy_app.command("watch")(policy_watch)
    policy_app.command("apply")(policy_apply)
    policy_app.command("diff")(policy_diff)
    policy_app.command("baseline")(policy_baseline)
