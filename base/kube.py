"""Kubernetes credentials, found the one way every component looks for them."""

from __future__ import annotations

from pathlib import Path

from base.errors import ConfigError


def load_credentials(kubeconfig: str | Path | None = None) -> None:
    """Configure the kubernetes client: `kubeconfig` when given, else the pod's service account (running in a
    cluster), else the user's default kubeconfig. None found: one line saying so."""
    from kubernetes import config

    try:
        if kubeconfig:
            config.load_kube_config(config_file=str(kubeconfig))
            return
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    except (config.ConfigException, OSError) as exc:
        raise ConfigError(f"no Kubernetes credentials: {exc}") from exc
