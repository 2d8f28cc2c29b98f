"""The install's manifests read once for every test that checks them (deploy/kubernetes, docker-compose.yml).

`kube_docs` is every object of `deploy/kubernetes/gpuledger/` (or of the paths given), `workloads` its
Deployments, DaemonSets, StatefulSets, Jobs and CronJobs, `pod_spec` the pod a workload runs. `rbac_table` reads
the table of rights in docs/deployment.md ("What each service account may do").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
MANIFESTS = KUBE / "gpuledger"
# Everything an install applies: the workloads and settings, the ClusterRoles, the podresources DaemonSet.
INSTALL = (MANIFESTS, KUBE / "rbac", KUBE / "podresources-daemonset.yaml")
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
RIGHTS_HEADING = "## What each service account may do"


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
