"""The local Kubernetes control plane (etcd, kube-apiserver, Kueue) for tests and developers.

`build.ensure_binaries` builds the binaries from pinned Go modules once per machine;
`cluster.LocalKube` runs them on loopback in a directory of its own; `cli` is `gpuledger dev kube`.
"""

from __future__ import annotations

from pathlib import Path

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
