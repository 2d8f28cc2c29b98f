"""deploy/kubernetes/gpuledger (issue 21): the processors, sinks, web and producers as Deployments and
DaemonSets, the setup steps as Jobs.

- The real kube-apiserver (`local_kube`) accepts every object: `kubectl apply --dry-run=server
  --validate=strict` runs admission and the OpenAPI schema, refusing unknown fields (a manifest with a
  misspelt field is refused by the same check, so the check can fail).
- Each container runs a registered `gpuledger` command with options that command has, and the pods run
  as the image's non-root user.
- Every process `gpuledger up` runs for a real cluster has its workload there with the same command
  (the simulator, the chat stand-in and the local broker/registry/ClickHouse are the laptop's); the reservation
  service, which `up` runs only with an engine and a policy, is configured by its workload to run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from manifests import kube_docs, pod_spec

from base.settings import Settings
from stack.components import COMPONENTS
from stack.kube.cluster import LocalKube

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes" / "gpuledger"
WORKLOADS = ("Deployment", "DaemonSet", "Job")
# The laptop's stand-ins: a production cluster has its own Kafka, registry and ClickHouse, real sources, chat.
LOCAL_ONLY = {"broker", "broker-2", "broker-3", "registry", "clickhouse", "simulator", "chat-receiver"}


def _docs() -> list[dict[str, Any]]:
    return kube_docs((MANIFESTS,))


_pod_spec = pod_spec


def _containers() -> list[tuple[str, dict[str, Any]]]:
    return [(d["metadata"]["name"], c) for d in _docs() if d["kind"] in WORKLOADS for c in _pod_spec(d)["containers"]]


def _cli_root() -> Any:
    from gpuledger import cli

    cli._register_all()
    return typer.main.get_command(cli.app)


def _split(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    words = []
    for i, arg in enumerate(args):
        if arg.startswith("-"):
            return tuple(words), args[i:]
        words.append(arg)
    return tuple(words), []


def test_every_container_runs_a_registered_command_with_its_options() -> None:
    root = _cli_root()
    assert _containers()
    for name, c in _containers():
        path, options = _split(c["args"])
        cmd = root
        for word in path:
            assert word in getattr(cmd, "commands", {}), f"{name}: `gpuledger {' '.join(path)}` is not a command"
            cmd = cmd.commands[word]
        known = {opt for p in cmd.params for opt in p.opts}
        for opt in (o for o in options if o.startswith("--")):
            assert opt.split("=", 1)[0] in known, f"{name}: {opt} is not an option of `gpuledger {' '.join(path)}`"


def test_pods_run_as_the_images_user_without_privileges() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    (uid,) = re.findall(r"--uid (\d+)", dockerfile)
    for doc in _docs():
        if doc["kind"] not in WORKLOADS:
            continue
        pod = _pod_spec(doc)
        assert pod["securityContext"]["runAsNonRoot"] is True and str(pod["securityContext"]["runAsUser"]) == uid
        for c in pod["containers"]:
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_every_production_process_of_up_has_its_workload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(state_dir=tmp_path, cluster="prod")
    commands: dict[tuple[str, ...], str] = {}
    for doc in _docs():
        if doc["kind"] in WORKLOADS:
            for c in _pod_spec(doc)["containers"]:
                commands[_split(c["args"])[0]] = doc["kind"]
    for comp in COMPONENTS:
        if comp.name in LOCAL_ONLY or not comp.enabled(settings):
            continue
        assert comp.command is not None, comp.name
        kind = commands.get(comp.command)
        assert kind is not None, f"{comp.name}: no workload runs `gpuledger {' '.join(comp.command)}`"
        assert (kind == "Job") == comp.oneshot, f"{comp.name}: a {kind}"
    # The producers: telemetry on every GPU node, scheduler events once.
    assert commands[("dcgm", "run")] == "DaemonSet" and commands[("kube", "watch")] == "Deployment"


def _container_settings(container: dict[str, Any], state_dir: Path) -> Settings:
    """The settings a container's environment gives (its plain values; the ConfigMap's file is not read)."""
    with pytest.MonkeyPatch.context() as env:
        for key in [k for k in os.environ if k.startswith("GPULEDGER_")]:
            env.delenv(key)
        for item in container["env"]:
            if "value" in item and item["name"] != "GPULEDGER_CONFIG":
                env.setenv(item["name"], item["value"])
        return Settings(state_dir=state_dir, cluster="prod")


def test_the_reservation_service_runs_as_its_workload_configures_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`up` runs `reserve run` only with an engine and the policy configured: the Deployment sets both (Kueue, the
    policy ConfigMap's file) and runs as its own ServiceAccount, bound to a role that gets and patches
    ClusterQueues and nothing more."""
    named = "gpuledger-reservations"
    (deployment,) = [d for d in _docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == named]
    pod = _pod_spec(deployment)
    (container,) = pod["containers"]
    monkeypatch.chdir(tmp_path)
    settings = _container_settings(container, tmp_path)
    assert settings.sinks.reservations.engines == ["kueue"] and settings.sinks.reservations.kubeconfig is None
    comp = next(c for c in COMPONENTS if c.name == "reservations")
    assert comp.enabled(settings) and not comp.enabled(settings.model_copy(update={"policy_path": None}))
    assert container["args"] == comp.argv(settings, lambda _: None)[3:]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}
    assert str(settings.policy_path) == f"{mounts['policy']}/policy.yaml" and volumes["policy"] == "gpuledger-policy"
    account = pod["serviceAccountName"]
    assert account == "gpuledger-reservations" and pod.get("automountServiceAccountToken", True)
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in _docs())
    rbac = [d for d in yaml.safe_load_all((MANIFESTS.parent / "rbac" / "reservations.yaml").read_text()) if d]
    role, binding = rbac
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpuledger"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"],
                              "verbs": ["get", "patch"]}]  # fmt: skip


def test_everything_that_judges_appeals_reads_the_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The appeals service (`up` runs `appeal run` only with a policy), the job stage's agents (which read
    appeals only with one) and the chat worker (which posts decisions and escalations only with one) each set
    `policy_path` to the policy ConfigMap's file, as the reservation service does. The appeals service has
    no API token: it talks to Kafka only."""
    monkeypatch.chdir(tmp_path)
    workloads = {d["metadata"]["name"]: d for d in _docs() if d["kind"] == "Deployment"}
    for named in ("gpuledger-appeals", "gpuledger-agents", "gpuledger-chat", "gpuledger-reservations"):
        pod = _pod_spec(workloads[named])
        (container,) = pod["containers"]
        settings = _container_settings(container, tmp_path)
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}
        assert settings.policy_path is not None, named
        assert str(settings.policy_path) == f"{mounts['policy']}/policy.yaml", named
        assert volumes["policy"] == "gpuledger-policy", named
    comp = next(c for c in COMPONENTS if c.name == "appeals")
    appeals = _pod_spec(workloads["gpuledger-appeals"])
    argv = comp.argv(Settings(state_dir=tmp_path, cluster="prod"), lambda _: None)
    assert appeals["containers"][0]["args"] == argv[3:]
    assert not comp.enabled(Settings(state_dir=tmp_path, cluster="prod", policy_path=None))
    assert comp.enabled(Settings(state_dir=tmp_path, cluster="prod", policy_path=tmp_path / "policy.yaml"))
    assert appeals["automountServiceAccountToken"] is False


def _dry_run(kube: LocalKube, docs: list[dict[str, Any]]) -> Any:
    return kube.kubectl("apply", "--dry-run=server", "--validate=strict", "-f", "-",
                        input=yaml.safe_dump_all(docs), check=False)  # fmt: skip


def test_the_api_server_accepts_every_manifest(local_kube: LocalKube) -> None:
    docs = _docs()
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    assert [n["metadata"]["name"] for n in namespaces] == ["gpuledger"]
    local_kube.apply(namespaces)  # for real: a namespaced dry run needs its namespace
    rest = [d for d in docs if d["kind"] != "Namespace"]
    result = _dry_run(local_kube, rest)
    assert result.returncode == 0, result.stderr
    accepted = re.findall(r"^(\S+) (?:created|configured|unchanged) \(server dry run\)$", result.stdout, re.M)
    assert len(accepted) == len(rest), result.stdout
    kinds = {d["kind"] for d in rest}
    assert {"Deployment", "DaemonSet", "Job", "ConfigMap", "ServiceAccount", "Service"} <= kinds
    # The same check refuses a field the schema does not have, and a wrong type.
    deployment = next(d for d in rest if d["kind"] == "Deployment")
    typo = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    refused = _dry_run(local_kube, [typo])
    assert refused.returncode != 0 and 'unknown field "spec.replica"' in refused.stderr, refused.stderr
    wrong = {**deployment, "spec": {**deployment["spec"], "replicas": "two"}}
    assert _dry_run(local_kube, [wrong]).returncode != 0


def test_the_policy_watch_runs_as_its_workload_configures_it_with_read_only_rights(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`up` runs `policy watch` only with an engine and the policy configured: the Deployment sets both and runs as
    its own ServiceAccount, bound to a role that only gets the kinds the policy renders (the live test diffs as a
    user bound to it, tests/integration/test_kube_live_policy.py)."""
    named = "gpuledger-policy-watch"
    (deployment,) = [d for d in _docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == named]
    pod = _pod_spec(deployment)
    (container,) = pod["containers"]
    monkeypatch.chdir(tmp_path)
    settings = _container_settings(container, tmp_path)
    assert settings.policy_watch.engines == ["kueue"] and settings.policy_watch.kubeconfig is None
    comp = next(c for c in COMPONENTS if c.name == "policy-watch")
    assert comp.enabled(settings) and not comp.enabled(settings.model_copy(update={"policy_path": None}))
    assert container["args"] == comp.argv(settings, lambda _: None)[3:]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert str(settings.policy_path) == f"{mounts['policy']}/policy.yaml"
    account = pod["serviceAccountName"]
    assert account == "gpuledger-policy-watch"
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in _docs())
    role, binding = [d for d in yaml.safe_load_all((MANIFESTS.parent / "rbac" / "policy-watch.yaml").read_text()) if d]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpuledger"}]
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} == {"get"}


def test_the_escalation_service_runs_as_its_workload_configures_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """`up` runs `escalate run` only with an engine and the policy configured: the Deployment sets both and runs as
    its own ServiceAccount, bound to the role the live Kueue escalation test raises a job with
    (tests/integration/test_kube_live_escalation.py): it patches batch Jobs' labels and writes nothing else."""
    named = "gpuledger-escalations"
    (deployment,) = [d for d in _docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == named]
    pod = _pod_spec(deployment)
    (container,) = pod["containers"]
    monkeypatch.chdir(tmp_path)
    settings = _container_settings(container, tmp_path)
    assert settings.sinks.escalations.engines == ["kueue"] and settings.sinks.escalations.kubeconfig is None
    comp = next(c for c in COMPONENTS if c.name == "escalations")
    assert comp.enabled(settings) and not comp.enabled(settings.model_copy(update={"policy_path": None}))
    assert not comp.enabled(Settings(state_dir=tmp_path, cluster="prod", policy_path=settings.policy_path))
    assert container["args"] == comp.argv(settings, lambda _: None)[3:]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}
    assert str(settings.policy_path) == f"{mounts['policy']}/policy.yaml" and volumes["policy"] == "gpuledger-policy"
    account = pod["serviceAccountName"]
    assert account == named and pod.get("automountServiceAccountToken", True)
    assert any(d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account for d in _docs())
    role, binding = [d for d in yaml.safe_load_all((MANIFESTS.parent / "rbac" / "escalations.yaml").read_text()) if d]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "gpuledger"}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    granted = {(g, res, verb) for rule in role["rules"] for g in rule["apiGroups"] for res in rule["resources"]
               for verb in rule["verbs"]}  # fmt: skip
    writes = {(g, res, verb) for g, res, verb in granted if verb not in ("get", "list", "watch")}
    assert writes == {("batch", "jobs", "patch")}
