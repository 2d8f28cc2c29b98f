"""Where Kubernetes credentials come from (base/kube.py), with the official client's own loader."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from base.errors import ConfigError
from base.kube import load_credentials

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t0k3n}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_a_named_kubeconfig_is_what_the_client_uses(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    before = client.Configuration.get_default_copy()
    try:
        load_credentials(path)
        assert client.Configuration.get_default_copy().host == "https://127.0.0.1:6443"
    finally:
        client.Configuration.set_default(before)  # the client's default is process-wide


def test_no_credentials_anywhere_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"^no Kubernetes credentials: ") as err:
        load_credentials()
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^no Kubernetes credentials: "):
        load_credentials(tmp_path / "absent-too")
