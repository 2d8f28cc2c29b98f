"""The local Kubernetes control plane (etcd, kube-apiserver, Kueue) for tests and developers.

`build.ensure_binaries` builds the binaries from pinned Go modules once per machine;
`cluster.LocalKube` runs them on loopback in a directory of its own; `cli` is `gpuledger dev kube`. The objects
every user of a control plane applies are here once: a component's RBAC, a user's binding, a namespace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from base.errors import ConfigError
from stack.kube.build import KubeBinaries


def deploy_dir() -> Path:
    """`deploy/kubernetes` of this checkout: the CRDs the control plane installs, the components' RBAC."""
    here = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
    if not (here / "crds").is_dir():
        raise ConfigError(f"the Kubernetes manifests are not at {here}; run gpuledger from a checkout of the project")
    return here


def crd_files(bins: KubeBinaries) -> list[Path]:
    """Kueue's CRDs of the built version (from its module), then JobSet's and Volcano's
    (deploy/kubernetes/crds, copied from their release tags: see PROVENANCE.md there)."""
    return [*sorted(bins.kueue_crds.glob("*.yaml")), *sorted((deploy_dir() / "crds").glob("*.yaml"))]


def rbac_manifests(component: str) -> list[dict[str, Any]]:
    """deploy/kubernetes/rbac/<component>.yaml's objects (the component's ClusterRole)."""
    path = deploy_dir() / "rbac" / f"{component}.yaml"
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def user_binding(user: str, cluster_role: str, name: str) -> dict[str, Any]:
    """A ClusterRoleBinding `name` of `cluster_role` to the (token) user `user`."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }  # fmt: skip


def namespace(name: str) -> list[dict[str, Any]]:
    """A namespace and its `default` ServiceAccount (no controller-manager's service account controller makes it)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": name}},
    ]
