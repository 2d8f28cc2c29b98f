"""The install's manifests read once for every test that checks them (deploy/kubernetes, docker-compose.yml).

`kube_docs` is every object of `deploy/kubernetes/gpuledger/` (or of the paths given), `workloads` its
Deployments, DaemonSets, StatefulSets, Jobs and CronJobs, `pod_spec` the pod a workload runs. `rbac_table` reads
the table of rights in docs/deployment.md ("What each service account may do"). `COMPOSE`/`SERVICES` are
docker-compose.yml, `compose_env` a service's environment as compose gives it. `install_processes` is every
workload of the install as a plain process (`kube_process`), its gpuledger.toml with a site's values
(`site_settings`); `Process.start` runs one.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stack.components import SIM_POLICY

ROOT = Path(__file__).resolve().parents[1]
CLI = "from gpuledger.cli import main; main()"
KUBE = ROOT / "deploy" / "kubernetes"
MANIFESTS = KUBE / "gpuledger"
# Everything an install applies: the workloads and settings, the ClusterRoles, the podresources DaemonSet.
INSTALL = (MANIFESTS, KUBE / "rbac", KUBE / "podresources-daemonset.yaml")
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
RIGHTS_HEADING = "## What each service account may do"
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def compose_value(value: Any) -> str:
    """`${VAR:-default}` as compose substitutes it when VAR is unset."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))


def compose_env(svc: dict[str, Any]) -> dict[str, str]:
    """A service's environment (a mapping or a list of NAME=value), substituted as compose does."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: compose_value(v) for k, v in env.items()}


def _files(paths: tuple[Path, ...]) -> list[Path]:
    return [f for p in paths for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p])]


def kube_docs(paths: tuple[Path, ...] = (MANIFESTS,)) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in _files(paths):
        docs += [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod template's spec; a CronJob's is one level further down (its jobTemplate)."""
    spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


def workloads(docs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [d for d in (kube_docs() if docs is None else docs) if d["kind"] in WORKLOADS]


def containers(docs: list[dict[str, Any]] | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [(w["metadata"]["name"], c) for w in workloads(docs) for c in pod_spec(w)["containers"]]


@dataclass(frozen=True)
class Right:
    """One row of the rights table: `account` may `verb` the `resource` (`plural.group`), by `name` if set."""

    component: str
    account: str
    verb: str
    resource: str
    name: str = ""

    @property
    def group(self) -> str:
        return self.resource.partition(".")[2]

    @property
    def plural(self) -> str:
        return self.resource.partition(".")[0]


def _cell_list(cell: str) -> list[str]:
    return [item.strip().strip("`") for item in cell.split(",") if item.strip() and item.strip() != "-"]


def rbac_table(doc: Path = ROOT / "docs" / "deployment.md") -> tuple[dict[str, str], list[Right]]:
    """The table of docs/deployment.md: (workload name -> its account, every right expanded to one verb on one
    resource by one name). A row with an empty component continues the one above; `-` is no right at all."""
    lines = doc.read_text(encoding="utf-8").split(RIGHTS_HEADING, 1)[1].splitlines()
    rows = [line for line in lines if line.startswith("| ")][1:]  # below the header (its rule is `|---|`)
    accounts: dict[str, str] = {}
    rights: list[Right] = []
    component = ""
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names_of, account, verbs, resources, names = cells
        account = account.strip("`")
        if names_of:
            component = names_of
            for workload in (w for w in _cell_list(names_of) if w.startswith("gpuledger-")):
                accounts[workload] = account
        for verb in _cell_list(verbs):
            for resource in _cell_list(resources):
                rights += [Right(component, account, verb, resource, n) for n in (_cell_list(names) or [""])]
    return accounts, rights


class ManifestGap(Exception):
    """A workload refers to something its install does not give it (a Secret key, a ConfigMap, a field)."""


@dataclass(frozen=True)
class Process:
    """A container of a workload as a plain process: `gpuledger <args>` with this environment."""

    workload: str
    kind: str
    args: list[str]
    env: dict[str, str]
    state_dir: Path

    def start(self, log: Path, args: list[str] | None = None) -> subprocess.Popen[bytes]:
        """`gpuledger ARGS` (default: the container's own) with the container's environment, output to `log`."""
        env = {"PATH": "/usr/bin:/bin", "HOME": str(self.state_dir), **self.env}
        argv = [sys.executable, "-c", CLI, *(self.args if args is None else args)]
        with log.open("ab") as out:
            return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)  # fmt: skip


def _expand_vars(value: str, env: dict[str, str]) -> str:
    """`$(VAR)` as the kubelet expands it from the variables defined before; `$$` is a literal `$`."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), value)  # fmt: skip


def kube_process(workload: dict[str, Any], root: Path, *, config_maps: dict[str, dict[str, str]],
                 secrets: dict[str, dict[str, str]], fields: dict[str, str],
                 edit_file: Callable[[str, str, str], str] | None = None) -> Process:  # fmt: skip
    """The workload's (single) container as a plain process under `root`: each ConfigMap or Secret volume written
    to a folder of its own (`edit_file(configmap, key, text)` may change a file, as a site edits its addresses),
    every mount path in the environment pointing there, env values from `value`, `secretKeyRef`,
    `configMapKeyRef` and `fieldRef` (`fields`: fieldPath -> value). Whatever is missing raises ManifestGap
    naming the workload and the setting."""
    name = workload["metadata"]["name"]
    pod = pod_spec(workload)
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts: dict[str, Path] = {}
    state_dir = root / name / "state"
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ManifestGap(f"{name}: mount {mount['name']!r} has no volume")
        folder = root / name / mount["name"]
        folder.mkdir(parents=True, exist_ok=True)
        if "configMap" in volume or "secret" in volume:
            source, data = ("configMap", config_maps) if "configMap" in volume else ("secret", secrets)
            ref = volume[source].get("name") or volume[source]["secretName"]
            if ref not in data:
                raise ManifestGap(f"{name}: volume {mount['name']!r} needs the {source} {ref!r}")
            for key, text in data[ref].items():
                (folder / key).write_text(edit_file(ref, key, text) if edit_file else text, encoding="utf-8")
        mounts[mount["mountPath"]] = folder
    if "/var/lib/gpuledger" in mounts:
        state_dir = mounts["/var/lib/gpuledger"]

    def local(value: str) -> str:
        for path, folder in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if value == path or value.startswith(path + "/"):
                return str(folder) + value[len(path) :]
        return value

    # A path in a mounted file (gpuledger.toml's state_dir) names a mount too: point it at the local folder.
    for folder in {mounts[m["mountPath"]] for m in container.get("volumeMounts", [])}:
        for file in (f for f in folder.iterdir() if f.is_file()):
            text = file.read_text(encoding="utf-8")
            file.write_text(re.sub(r'"(/[^"]*)"', lambda m: f'"{local(m.group(1))}"', text), encoding="utf-8")

    env: dict[str, str] = {}
    for item in container.get("env", []):
        var = item["name"]
        if "value" in item:
            env[var] = local(_expand_vars(str(item["value"]), env))
            continue
        ref = item.get("valueFrom", {})
        if "secretKeyRef" in ref or "configMapKeyRef" in ref:
            kind, data = ("secretKeyRef", secrets) if "secretKeyRef" in ref else ("configMapKeyRef", config_maps)
            obj, key = ref[kind]["name"], ref[kind]["key"]
            if key not in data.get(obj, {}):
                raise ManifestGap(f"{name}: {var} needs key {key!r} of {obj!r}, which the install does not have")
            env[var] = data[obj][key]
        elif "fieldRef" in ref:
            env[var] = fields[ref["fieldRef"]["fieldPath"]]
        else:
            raise ManifestGap(f"{name}: {var} comes from {sorted(ref)}, which this harness does not read")
    args = [_expand_vars(a, env) for a in [*container.get("command", [])[1:], *container.get("args", [])]]
    return Process(name, workload["kind"], args, env, state_dir)


def _toml_value(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def site_settings(text: str, site: dict[str, Any]) -> str:
    """gpuledger.toml with a site's values (`site`: "section.key" -> value; None removes the key), as a site
    edits the ConfigMap: nothing else changes."""
    doc = tomllib.loads(text)
    for dotted, value in site.items():
        section, key = dotted.split(".", 1)
        if value is None:
            doc[section].pop(key, None)
        else:
            doc.setdefault(section, {})[key] = value
    lines = [f"{k} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for section, values in ((k, v) for k, v in doc.items() if isinstance(v, dict)):
        lines += [f"[{section}]", *(f"{k} = {_toml_value(v)}" for k, v in values.items())]
    return "\n".join(lines) + "\n"


def install_processes(root: Path, *, secrets: dict[str, dict[str, str]], site: dict[str, Any]) -> dict[str, Process]:
    """Every workload of the install (`INSTALL`) as a plain process under `root`: the ConfigMaps as the manifests
    give them (gpuledger.toml with `site`'s values), the operator's policy ConfigMap (the simulator's policy) and
    the Secrets given; the downward API's node name and host IP those of this machine's one node."""
    docs = kube_docs(INSTALL)
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    config_maps["gpuledger-policy"] = {"policy.yaml": SIM_POLICY.read_text(encoding="utf-8")}  # the operator's

    def edit(config_map: str, key: str, text: str) -> str:
        return site_settings(text, site) if (config_map, key) == ("gpuledger-settings", "gpuledger.toml") else text

    fields = {"spec.nodeName": "gpu-node-1", "status.hostIP": "127.0.0.1"}
    return {w["metadata"]["name"]: kube_process(w, root, config_maps=config_maps, secrets=secrets, fields=fields,
                                                edit_file=edit) for w in workloads(docs)}  # fmt: skip
