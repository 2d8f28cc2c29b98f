"""The fake kubelet PodResources server of the tests: stack/kube/kubelet.py (`gpuledger dev two-engines` serves
it too)."""

from __future__ import annotations

from stack.kube.kubelet import FakeKubelet, Pods

__all__ = ["FakeKubelet", "Pods"]
