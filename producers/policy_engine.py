"""The policy on the live engines: read what Slurm and Kueue run, diff it against the policy, and write the policy
onto them. One implementation for `gpuledger policy apply|diff` (producers/policy_cli.py) and the policy watch
(producers/policy_watch.py): the pure comparisons are producers/policy_slurm.py and policy_kueue.py; this module
runs sacctmgr/scontrol and talks to the Kubernetes API around them.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from base.errors import ConfigError, ServiceError
from base.kube import load_credentials
from base.settings import KafkaSettings, Settings
from producers import policy_kueue, policy_slurm, policy_stamp
from producers.preemptible import pricing_drift
from schemas.policy import Policy

ENGINES = ("slurm", "kueue")
SACCTMGR_TIMEOUT_S = 60.0
FIELD_MANAGER = "gpuledger-policy"
RESERVATIONS_TIMEOUT_S = 10.0  # reading reservations.v1 for a Kueue diff

Runner = Callable[[Sequence[str]], str]  # argv -> stdout; raises ServiceError when the command fails


def run_command(argv: Sequence[str]) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=SACCTMGR_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServiceError(f"{argv[0]}: {exc}") from exc
    if done.returncode != 0:
        raise ServiceError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[:500]}")
    return done.stdout


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


def prune_refusal(policy: Policy, actor: str) -> str | None:
    """None when `actor` (the engine's own answer: the OS user, the Kubernetes user) may `apply --prune`, else the
    one line that says who may (policy `governance.pruners`)."""
    allowed = policy.governance.pruners
    if actor in allowed:
        return None
    return (f"{actor!r} may not prune: policy governance.pruners names who may "
            f"({', '.join(allowed) if allowed else 'nobody named'})")  # fmt: skip


def slurm_prune(policy: Policy, run: Runner, sacctmgr: str = "sacctmgr") -> list[list[str]]:
    """Remove the QOS and accounts `policy apply` created (their Description is policy_slurm.MARK) that the policy
    no longer names; the commands run, in order. Slurm has no admission step to judge a delete, so the mark,
    written by the apply that created the object, is the only proof; an unmarked object is never removed."""
    marked = {what: policy_slurm.marked(run([sacctmgr, *policy_slurm.show_marked_argv(what)[1:]]), what)
              for what in ("qos", "account")}  # fmt: skip
    commands = policy_slurm.prune_commands(policy_slurm.desired_state(policy), marked["qos"], marked["account"])
    for argv in commands:
        run([sacctmgr, "-i", *argv])
    return commands


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


@dataclass(frozen=True, slots=True)
class Pruned:
    """An object gpuledger's policy apply created that the policy no longer names: removed by `apply --prune`."""

    key: tuple[str, str, str]

    def __str__(self) -> str:
        kind, ns, name = self.key
        return f"{kind} {ns + '/' if ns else ''}{name}: pruned (created by {FIELD_MANAGER}, no longer in the policy)"


def created_by_us(obj: dict[str, Any]) -> bool:
    """Whether `policy apply` made this object, by the engine's own record: our managed-by label AND a managedFields
    entry of our field manager (the API server writes managedFields; a label alone anyone may set)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    managers = {str(f.get("manager")) for f in (obj.get("metadata") or {}).get("managedFields") or ()}
    return all(labels.get(k) == v for k, v in policy_kueue.MANAGED_BY.items()) and FIELD_MANAGER in managers


def prune_plan(want: Sequence[dict[str, Any]], live: Sequence[dict[str, Any]]) -> list[Pruned]:
    """Live Kueue objects gpuledger created (`created_by_us`) that the rendered policy no longer names (pure); in
    reverse apply order (LocalQueues before their ClusterQueues, flavors last)."""
    named = {policy_kueue.object_key(o) for o in want}
    order = {kind: i for i, kind in enumerate(policy_kueue.APPLY_ORDER)}
    out = [Pruned(policy_kueue.object_key(o)) for o in live
           if created_by_us(o) and policy_kueue.object_key(o) not in named]  # fmt: skip
    return sorted(out, key=lambda p: (-order.get(p.key[0], 0), p.key))


PRUNE_GUARD = "gpuledger-policy-prune-guard"
PRUNE_GUARD_MESSAGE = ("gpuledger: policy apply --prune deletes only the Kueue objects it created (the label "
                       "app.kubernetes.io/managed-by=gpuledger-policy and a managedFields entry of its field manager)")


def prune_guard_objects(actor: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy (+ binding) by which the API server itself refuses `actor`'s DELETE of a Kueue
    object the policy apply did not create: the managed-by label and a managedFields entry of our field manager, both
    on the stored object (`oldObject`), or no delete. Applied by `apply --prune` before it deletes anything."""
    label_key, label_value = next(iter(policy_kueue.MANAGED_BY.items()))
    kinds = [plural for plural, _ in policy_kueue.KINDS.values()]
    ours = (f"has(oldObject.metadata.labels) && {json.dumps(label_key)} in oldObject.metadata.labels && "
            f"oldObject.metadata.labels[{json.dumps(label_key)}] == {json.dumps(label_value)} && "
            f"has(oldObject.metadata.managedFields) && "
            f"oldObject.metadata.managedFields.exists(f, has(f.manager) && f.manager == {json.dumps(FIELD_MANAGER)})")
    meta = {"name": PRUNE_GUARD, "labels": dict(policy_stamp.MANAGED_BY)}
    return [
        {"apiVersion": policy_stamp.API_VERSION, "kind": "ValidatingAdmissionPolicy", "metadata": meta,
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": [policy_kueue.GROUP], "apiVersions": ["*"],
                                                          "operations": ["DELETE"], "resources": kinds}]},
                  "matchConditions": [{"name": "the-policy-user",
                                       "expression": f"request.userInfo.username == {json.dumps(actor)}"}],
                  "validations": [{"expression": ours, "message": PRUNE_GUARD_MESSAGE, "reason": "Forbidden"}]}},
        {"apiVersion": policy_stamp.API_VERSION, "kind": "ValidatingAdmissionPolicyBinding", "metadata": meta,
         "spec": {"policyName": PRUNE_GUARD, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {}, "objectSelector": {}}}},
    ]  # fmt: skip


def kueue_managed(api: Any) -> list[dict[str, Any]]:
    """Every Kueue object of the kinds the policy renders that carries our managed-by label (all namespaces)."""
    from kubernetes.client.exceptions import ApiException

    selector = ",".join(f"{k}={v}" for k, v in policy_kueue.MANAGED_BY.items())
    out: list[dict[str, Any]] = []
    for kind, (plural, _) in policy_kueue.KINDS.items():
        try:
            listed = api.list_cluster_custom_object(policy_kueue.GROUP, policy_kueue.VERSION, plural,
                                                    label_selector=selector)  # fmt: skip
        except ApiException as exc:
            raise ServiceError(f"listing {plural}: {exc.status} {exc.reason}") from exc
        out += [{**item, "kind": kind} for item in listed.get("items", ())]
    return out


def kueue_prune(api: Any, plan: Sequence[Pruned]) -> None:
    from kubernetes.client.exceptions import ApiException

    for item in plan:
        kind, ns, name = item.key
        g, v, plural, namespaced = _resource(kind)
        try:
            if namespaced:
                api.delete_namespaced_custom_object(g, v, ns, plural, name)
            else:
                api.delete_cluster_custom_object(g, v, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise ServiceError(f"pruning {kind} {name}: {exc.status} {exc.reason}") from exc


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


def reservation_bumps_from(policy: Policy, kafka: KafkaSettings, cluster: str, now_ms: int,
                           timeout_s: float = RESERVATIONS_TIMEOUT_S) -> list[policy_kueue.Bump]:  # fmt: skip
    """The active reservations of `cluster` as Kueue quota bumps (reservations.v1 read whole). ServiceError when the
    topic cannot be read."""
    from schemas.governance_reservations import fold
    from schemas.topics import RESERVATIONS
    from streams.eventlog import read_events

    events, _ = read_events(kafka, RESERVATIONS, timeout_s=timeout_s)
    return policy_kueue.bumps(policy, fold(events, policy)[0].values(), cluster, now_ms)


# -- the diff, as `policy diff` prints it and the watch publishes it --------------------------------------


@dataclass(frozen=True, slots=True)
class EngineDiff:
    """What differs on one engine (`drift`: each line as `policy diff` prints it) and what differs but is explained
    (a Kueue quota raised exactly by an active reservation)."""

    engine: str
    drift: tuple[str, ...]
    explained: tuple[str, ...] = ()
    found: tuple[object, ...] = field(default=(), compare=False)  # the differences (producers/policy_audit.py)


def engine_diff(policy: Policy, engine: str, *, preemptible_qos: Sequence[str], run: Runner = run_command,
                sacctmgr: str = "sacctmgr", kube: Any = None, kueue_config: Path | None = None,
                bumps: Sequence[policy_kueue.Bump] = ()) -> EngineDiff:  # fmt: skip
    """Read the engine and compare it with the policy: Slurm's slurm.conf fair share and accounting; Kueue's objects
    (`kube`: a CustomObjectsApi), its Configuration when a file is named; both: the pricing side."""
    found: list[object]
    explained: Sequence[object] = ()
    if engine == "slurm":
        found = [*slurm_conf_drift(policy, run), *slurm_drift(policy, run, sacctmgr)]
    elif engine == "kueue":
        objs = kueue_objects(policy)
        live = kueue_live(kube, objs)
        drifted, explained = policy_kueue.drift_with_reservations(policy, objs, live, list(bumps))
        found = list(drifted)
        if kueue_config is not None:
            found += policy_kueue.config_drift(policy, _kueue_config(kueue_config))
    else:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    found += pricing_drift(policy, preemptible_qos, engine)
    return EngineDiff(engine, tuple(str(d) for d in found), tuple(str(e) for e in explained), tuple(found))


def differ_for(policy: Policy, settings: Settings) -> Callable[[str], EngineDiff]:
    """engine -> its diff now, reached as the settings' policy_watch says (the watch's side of `policy diff`; a
    Kueue quota raised by an active reservation is explained, as there, when reservations.v1 can be read)."""
    watch = settings.policy_watch
    api = kube_api(watch.kubeconfig) if "kueue" in watch.engines else None

    def differ(engine: str) -> EngineDiff:
        bumps: list[policy_kueue.Bump] = []
        if engine == "kueue":
            try:
                bumps = reservation_bumps_from(policy, settings.kafka, settings.cluster, time.time_ns() // 1_000_000)
            except ServiceError:  # as `policy diff`: without the topic a bump shows as drift
                bumps = []
        return engine_diff(policy, engine, preemptible_qos=settings.scheduler.preemptible_qos,
                           sacctmgr=watch.sacctmgr, kube=api, kueue_config=watch.kueue_config, bumps=bumps)  # fmt: skip

    return differ
