"""The kubelet's PodResources API, v1: `api.proto` copied unchanged from `k8s.io/kubelet` v0.37.2
(`pkg/apis/podresources/v1/api.proto`), and the Python modules generated from it with grpcio-tools 1.85.1:

    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. producers/kubelet/api.proto

then the two lines `# ruff: noqa` and `# mypy: ignore-errors` put on top of each generated file
(tests/unit/test_podresources.py regenerates them and compares). The client is `producers/podresources.py`.
"""
