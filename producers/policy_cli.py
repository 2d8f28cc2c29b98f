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

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer
import yaml

from base.cli_common import STATE_DIR_OPTION, settings_for
from base.errors import ConfigError, ServiceError
from base.kube import load_credentials
from producers import policy_kueue, policy_slurm, policy_stamp
from producers.baseline_cli import policy_baseline, record_applied
from producers.preemptible import pricing_drift
from schemas.policy import Policy, PolicyError, load_policy

ENGINES = ("slurm", "kueue")
SACCTMGR_TIMEOUT_S = 60.0
RESERVATIONS_TIMEOUT_S = 10.0  # reading reservations.v1 for `diff --engine kueue`
FIELD_MANAGER = "gpuledger-policy"

Runner = Callable[[Sequence[str]], str]  # argv -> stdout; raises ServiceError when the command fails


def run_command(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=SACCTMGR_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise ServiceError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[:500]}")
    return done.stdout


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


# -- Slurm ----------------------------------------------------------------------------------------


def slurm_drift(policy: Policy, run: Runner, sacctmgr: str = "sacctmgr") -> list[policy_slurm.Drift]:
    want = policy_slurm.desired_state(policy)
    accounts = {a.account for a in want.associations.values()}
    qos_argv, assoc_argv = policy_slurm.show_qos_argv(), policy_slurm.show_assoc_argv(accounts)
    live = policy_slurm.parse_live(run([sacctmgr, *qos_argv[1:]]), run([sacctmgr, *assoc_argv[1:]]))
    return policy_slurm.drift(want, live)


def slurm_apply(policy: Policy, run: Runner, sacctmgr: str = "sacctmgr") -> list[list[str]]:
    """Bring Slurm's accounting to the policy; the commands run, in order."""
    want = policy_slurm.desired_state(policy)
    commands = policy_slurm.fix_commands(want, slurm_drift(policy, run, sacctmgr))
    for argv in commands:
        run([sacctmgr, "-i", *argv])
    return commands


def slurm_conf_drift(policy: Policy, run: Runner) -> list[policy_slurm.ConfDrift]:
    """The fair-share settings slurmctld runs with against the policy's (a PriorityType written to slurm.conf since
    slurmctld started is drift: it needs a restart)."""
    config = run(["scontrol", "show", "config"])
    conf = policy_slurm.parse_show_config(config).get("slurm_conf")
    text = _read_conf(Path(conf)) if conf else None
    return policy_slurm.conf_drift(policy, config, text)


def _read_conf(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write_atomically(path: Path, text: str) -> None:
    """Replace the file in one step (slurmctld never reads half of it), keeping its mode."""
    import os
    import tempfile

    mode = path.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def slurm_conf_apply(policy: Policy, run: Runner, conf_path: Path | None, now_s: float
                     ) -> tuple[list[policy_slurm.ConfDrift], list[policy_slurm.ConfDrift]]:  # fmt: skip
    """Write the policy's fair-share block into slurm.conf and `scontrol reconfigure` when slurmctld runs other
    settings. Returns (what differed before, what still differs after: a PriorityType that needs a restart)."""
    config = run(["scontrol", "show", "config"])
    live = policy_slurm.parse_show_config(config)
    path = conf_path or (Path(live["slurm_conf"]) if live.get("slurm_conf") else None)
    if path is None:
        raise ConfigError("scontrol show config names no SLURM_CONF: pass --slurm-conf FILE")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    before = policy_slurm.conf_drift(policy, config, text)
    if not before:
        return [], []
    new = policy_slurm.write_conf(text, policy, now_s, live.get("prioritytype"))
    try:
        _write_atomically(path, new)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    run(["scontrol", "reconfigure"])
    after: list[policy_slurm.ConfDrift] = []
    for attempt in range(20):  # slurmctld answers again within a second or two of a reconfigure
        try:
            after = policy_slurm.conf_drift(policy, run(["scontrol", "show", "config"]), new)
            break
        except ServiceError:
            if attempt == 19:
                raise
            time.sleep(0.5)
    return before, after


# -- Kueue ----------------------------------------------------------------------------------------


def kube_api(kubeconfig: Path | None) -> Any:
    from kubernetes import client, config

    try:
        if kubeconfig is not None:
            return client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))
    except (config.ConfigException, OSError) as exc:
        raise ConfigError(f"no Kubernetes credentials: {exc}") from exc
    load_credentials()
    return client.CustomObjectsApi()


def kueue_objects(policy: Policy) -> list[dict[str, Any]]:
    """What `apply --engine kueue` writes and `diff` compares: the submitter stamp's admission policies (before
    anything is queued, so every Job is stamped), then the Kueue objects."""
    return [*policy_stamp.render_objects(), *policy_kueue.render_objects(policy)]


def _resource(kind: str) -> tuple[str, str, str, bool]:
    """(group, version, plural, namespaced) of a rendered kind."""
    if kind in policy_stamp.KINDS:
        return (policy_stamp.GROUP, policy_stamp.VERSION, *policy_stamp.KINDS[kind])
    return (policy_kueue.GROUP, policy_kueue.VERSION, *policy_kueue.KINDS[kind])


def kueue_live(api: Any, want: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The live objects of the kinds and names the policy renders (a missing one is simply absent)."""
    from kubernetes.client.exceptions import ApiException

    live: dict[tuple[str, str, str], dict[str, Any]] = {}
    for obj in want:
        kind, ns, name = policy_kueue.object_key(obj)
        g, v, plural, namespaced = _resource(kind)
        try:
            got = (api.get_namespaced_custom_object(g, v, ns, plural, name) if namespaced
                   else api.get_cluster_custom_object(g, v, plural, name))  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise ServiceError(f"reading {kind} {name}: {exc.status} {exc.reason}") from exc
        live[(kind, ns, name)] = dict(got)
    return live


def kueue_apply(api: Any, objs: Sequence[dict[str, Any]]) -> None:
    """Server-side apply of each object (force: the policy owns the fields it sets)."""
    from kubernetes.client.exceptions import ApiException

    for obj in objs:
        kind, ns, name = policy_kueue.object_key(obj)
        g, v, plural, namespaced = _resource(kind)
        kw: dict[str, Any] = {"field_manager": FIELD_MANAGER, "force": True,
                              "_content_type": "application/apply-patch+yaml"}  # fmt: skip
        try:
            if namespaced:
                api.patch_namespaced_custom_object(g, v, ns, plural, name, obj, **kw)
            else:
                api.patch_cluster_custom_object(g, v, plural, name, obj, **kw)
        except ApiException as exc:
            raise ServiceError(f"applying {kind} {name}: {exc.status} {exc.reason}: {str(exc.body)[:500]}") from exc


def kueue_config_apply(policy: Policy, path: Path, restart: str | None, run: Runner) -> list[str]:
    """Put the policy's admission fair sharing into the Kueue controller's Configuration file (everything else in it
    kept) when it differs; run `restart` (the controller reads the file only at start). Returns the lines that
    differed."""
    import shlex


    config = _kueue_config(path)
    found = policy_kueue.config_drift(policy, config)
    if not found:
        return []
    try:
        _write_atomically(path, yaml.safe_dump(policy_kueue.merged_config(config, policy), sort_keys=False))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from exc
    if restart:
        run(shlex.split(restart))
    return found


def _kueue_config(path: Path) -> dict[str, Any]:

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read Kueue's Configuration {path}: {exc}") from exc
    if len(text) > 1 << 20:
        raise ConfigError(f"{path}: larger than 1 MiB")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != "Configuration":
        raise ConfigError(f"{path}: not a Kueue Configuration (kind: Configuration)")
    return data


def reservation_bumps(policy: Policy, state_dir: Path | None) -> list[policy_kueue.Bump]:
    """The active reservations of this cluster as quota bumps (the topic read whole); none, with a warning,
    when the topic cannot be read: then every quota difference is drift."""
    import time

    from schemas.governance_reservations import fold
    from schemas.topics import RESERVATIONS
    from streams.eventlog import read_events

    settings = settings_for(state_dir)
    try:
        events, _ = read_events(settings.kafka, RESERVATIONS, timeout_s=RESERVATIONS_TIMEOUT_S)
    except ServiceError as exc:
        typer.echo(f"reservations not read ({exc}): a reservation's quota bump shows as drift", err=True)
        return []
    reservations = fold(events, policy)[0].values()
    return policy_kueue.bumps(policy, reservations, settings.cluster, time.time_ns() // 1_000_000)


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
    state_dir: Path | None = STATE_DIR_OPTION,
) -> None:
    """Apply the policy to the running scheduler (Slurm accounting, or Kueue objects)."""
    policy = policy_from(policy_path, state_dir)
    if check_engine(engine) == "slurm":
        before, after = slurm_conf_apply(policy, run_command, slurm_conf, time.time())
        for d in before:
            typer.echo(f"slurm.conf {d.setting}={d.want} (slurmctld ran {d.have or '(none)'})")
        typer.echo(f"applied: {len(before)} slurm.conf settings" + (" (scontrol reconfigure)" if before else ""))
        commands = slurm_apply(policy, run_command, sacctmgr)
        for argv in commands:
            typer.echo(" ".join(["sacctmgr", "-i", *argv]))
        typer.echo(f"applied: {len(commands)} sacctmgr commands")
        record_applied(policy, engine, state_dir)  # issue 38: the attribution baseline, once the engine has it
        for d in after:
            typer.echo(str(d), err=True)
        if after:
            raise typer.Exit(1)
        return
    stamp, objs = policy_stamp.render_objects(), policy_kueue.render_objects(policy)
    api = kube_api(kubeconfig)
    kueue_apply(api, stamp)
    typer.echo(f"applied: {len(stamp)} admission objects (the submitter stamp and its lock)")
    kueue_apply(api, objs)
    typer.echo(f"applied: {len(objs)} Kueue objects")
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
    record_applied(policy, engine, state_dir)


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
    found: Sequence[object]
    explained: Sequence[object] = ()
    if check_engine(engine) == "slurm":
        found = [*slurm_conf_drift(policy, run_command), *slurm_drift(policy, run_command, sacctmgr)]
    else:
        objs = kueue_objects(policy)
        live = kueue_live(kube_api(kubeconfig), objs)
        by = reservation_bumps(policy, state_dir) if reservations else []
        found, explained = policy_kueue.drift_with_reservations(policy, objs, live, by)
        if kueue_config is not None:
            found = [*found, *policy_kueue.config_drift(policy, _kueue_config(kueue_config))]
    # The pricing side: what the producers charge as preemptible against the tier the engine preempts.
    found = [*found, *pricing_drift(policy, settings_for(state_dir).scheduler.preemptible_qos, engine)]
    for item in [*found, *explained]:
        typer.echo(str(item))
    if found:
        raise typer.Exit(1)
    typer.echo("no drift")


def register(policy_app: typer.Typer) -> None:
    policy_app.command("apply")(policy_apply)
    policy_app.command("diff")(policy_diff)
    policy_app.command("baseline")(policy_baseline)
