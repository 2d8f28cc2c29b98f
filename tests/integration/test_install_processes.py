"""Every component started as the Kubernetes manifests say (issue 42 item 4, in part): each workload's container
as a plain process (tests/manifests.kube_process: its args, its environment, the ConfigMap's gpuledger.toml
written to a folder and GPULEDGER_CONFIG pointing there, the Secret's keys with test values) against the real
broker and ClickHouse. Only what a site edits is changed: the addresses in gpuledger.toml (Kafka, ClickHouse,
no schema registry here) and the metrics port (any free one: other suites share this machine).

The setup Jobs run to completion and set the stack up (topics, tables, the rate card); the Deployments of the
ledger path and of the alerts stay up and answer /metrics. Not started here: the schemas Job (no registry in
this test), the producers (dcgm needs an exporter, kube watch and podresources a control plane), the
reservation service, policy watch and escalation service (Kueue: tests/integration/test_kube_manifests.py checks
their workloads' settings and rights), web. A Secret key a manifest forgets fails with the workload and
the setting named. The ledger the ledger path gives from the manifests' own commands is compared in the fault
suite (tests/fault/test_fault_compose.py: a simulated backlog, the simulator's per-job ledger).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx
import pytest
from fixtures_clickhouse import ClickHouseServer
from manifests import INSTALL, ManifestGap, Process, install_processes, kube_docs, kube_process, workloads

JOBS = ("gpuledger-topics", "gpuledger-db-migrate", "gpuledger-ratecard")
SERVING = ("gpuledger-processors", "gpuledger-sinks", "gpuledger-chat", "gpuledger-reclaim")
STAYING = ("gpuledger-agents", "gpuledger-appeals")  # no /metrics: up and still running


@pytest.fixture
def install(kafka_bootstrap: str, clickhouse_server: ClickHouseServer, tmp_path: Path) -> dict[str, Process]:
    """The install's workloads as processes; gpuledger.toml with this machine's addresses (no schema registry here:
    Avro single-object encoding; one test broker)."""
    database = f"install_{tmp_path.name[-8:]}".replace("-", "_")
    site = {"kafka.bootstrap_servers": kafka_bootstrap, "kafka.schema_registry_url": None,
            "kafka.replication_factor": 1, "clickhouse.url": clickhouse_server.url, "clickhouse.database": database,
            "metrics.base_port": 0}  # fmt: skip
    secrets = {"gpuledger-clickhouse": {"password": clickhouse_server.password,
                                        "analyst-password": clickhouse_server.analyst_password}}  # fmt: skip
    return install_processes(tmp_path, secrets=secrets, site=site)


def _popen(proc: Process, log: Path) -> subprocess.Popen[bytes]:
    assert "/var/lib/" not in (Path(proc.env["GPULEDGER_CONFIG"])).read_text(), proc.workload  # nothing outside tmp
    return proc.start(log)


def _run_job(proc: Process, log: Path, timeout_s: float = 120) -> None:
    popen = _popen(proc, log)
    rc = popen.wait(timeout_s)
    assert rc == 0, f"{proc.workload}: `gpuledger {' '.join(proc.args)}` exited {rc}: {log.read_text()[-3000:]}"


def _metrics_port(proc: Process) -> int | None:
    files = list((proc.state_dir / "metrics").glob("*.port"))
    return int(files[0].read_text().strip()) if files else None


def test_each_component_runs_as_its_manifest_says(install: dict[str, Process], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in JOBS:
        _run_job(install[name], logs / f"{name}.log")
    started = {name: _popen(install[name], logs / f"{name}.log") for name in (*SERVING, *STAYING)}
    try:
        deadline = time.monotonic() + 90
        waiting = set(SERVING)
        while waiting and time.monotonic() < deadline:
            for name in sorted(waiting):
                rc = started[name].poll()
                assert rc is None, f"{name} exited {rc}: {(logs / f'{name}.log').read_text()[-3000:]}"
                port = _metrics_port(install[name])
                if port and httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200:
                    waiting.discard(name)
            time.sleep(0.5)
        assert not waiting, {n: (logs / f"{n}.log").read_text()[-1500:] for n in waiting}
        for name in STAYING:
            rc = started[name].poll()
            assert rc is None, f"{name} exited {rc}: {(logs / f'{name}.log').read_text()[-3000:]}"
    finally:
        for popen in started.values():
            popen.terminate()
        for popen in started.values():
            try:
                popen.wait(30)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait()


def test_a_secret_key_the_install_lacks_names_the_workload_and_the_setting(tmp_path: Path) -> None:
    (migrate,) = [w for w in workloads(kube_docs(INSTALL)) if w["metadata"]["name"] == "gpuledger-db-migrate"]
    settings = {d["metadata"]["name"]: d["data"] for d in kube_docs(INSTALL) if d["kind"] == "ConfigMap"}
    with pytest.raises(ManifestGap, match=r"gpuledger-db-migrate: GPULEDGER_CLICKHOUSE__PASSWORD needs key 'password'"):
        kube_process(migrate, tmp_path, config_maps=settings, secrets={"gpuledger-clickhouse": {}}, fields={})
