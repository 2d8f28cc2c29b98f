"""The pure parts of stack/two_engines.py: who holds which GPU as each engine says, what each engine says ran, and
the simulated exporter's scrape read back by the real dcgm parser (no engine, no broker); of
stack/two_engines_scenarios.py, the expected ledger's sums and its side-by-side print; stack/cards.py's card."""

from __future__ import annotations

import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

from producers.dcgm import normalize_text
from producers.devicemap import iter_dcgm_labels
from sinks.ratecard import parse_card
from stack.cards import one_dollar_a_second
from stack.kube.cluster import LocalKube
from stack.kube.kubelet import FakeKubelet
from stack.two_engines import (
    KUBE_NODE,
    DeviceManager,
    Holder,
    Run,
    SimExporter,
    kube_devices,
    pod_run,
    sacct_runs,
    slurm_devices,
    slurm_holders,
)
from stack.two_engines_scenarios import Expected, dollars, side_by_side

SCONTROL = """\
JobId=7 JobName=gang UserId=root(0) JobState=RUNNING Nodes=gpu-node-1 CPU_IDs=0 Mem=0 GRES=gpu:h100:2(IDX:0-1)
JobId=8 JobName=idle-s UserId=alice(999) JobState=RUNNING Nodes=gpu-node-1 CPU_IDs=1 GRES=gpu:a100:1(IDX:3)
JobId=9 JobName=low UserId=root(0) JobState=PENDING Reason=BeginTime
"""  # fmt: skip


def test_slurm_holders_are_the_gpu_indices_scontrol_gives_running_jobs() -> None:
    assert slurm_holders(SCONTROL) == {0: Holder("7", "gang", 0), 1: Holder("7", "gang", 1),
                                       3: Holder("8", "idle-s", 0)}  # fmt: skip


def test_sacct_runs_count_every_run_of_a_requeued_job_and_skip_what_never_started() -> None:
    text = ("12|1700000000|1700000005|billing=1,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1|REQUEUED\n"
            "12|1700000008|1700000028|billing=1,cpu=1,gres/gpu:h100=2,gres/gpu=2,node=1|COMPLETED\n"
            "13|Unknown|1700000030|billing=1,cpu=1,gres/gpu=1,node=1|CANCELLED\n")  # fmt: skip
    runs = sacct_runs(text)
    assert runs == {"12": [Run(1700000000, 1700000005, 2), Run(1700000008, 1700000028, 2)]}
    assert sum(r.gpu_seconds for r in runs["12"]) == 50


def pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "p-1", **status.pop("meta", {})},
            "spec": {"nodeName": KUBE_NODE, "containers": [{"name": "main", "resources": {
                "limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": phase, **status}}  # fmt: skip


def test_a_pods_run_is_its_start_time_to_its_finish_or_its_deletion() -> None:
    done = pod("Succeeded", startTime="2026-12-07T10:00:01Z", containerStatuses=[
        {"state": {"terminated": {"finishedAt": "2026-12-07T10:00:21Z", "startedAt": "2026-12-07T10:00:21Z"}}}])
    assert pod_run(done) == Run(1796637601, 1796637621, 2)
    deleted = pod("Running", startTime="2026-12-07T10:00:01Z", meta={"deletionTimestamp": "2026-12-07T10:00:09Z"},
                  containerStatuses=[{"state": {"running": {"startedAt": "2026-12-07T10:00:01Z"}}}])  # fmt: skip
    assert pod_run(deleted).gpu_seconds == 16


def test_the_device_manager_gives_free_gpus_at_binding_and_takes_them_back_at_the_end(tmp_path: Path) -> None:
    devices = kube_devices("k")
    kubelet = FakeKubelet(tmp_path / "k.sock")
    dm = DeviceManager(cast(LocalKube, None), KUBE_NODE, devices, kubelet)
    first, second = pod("Pending"), pod("Pending", meta={"name": "p-2"})
    dm.on_pod("ADDED", first)
    dm.on_pod("ADDED", second)
    assert dm.assigned == {"ns/p-1": [0, 1], "ns/p-2": [2, 3]}
    assert kubelet.pods[("ns", "p-2")] == {"main": {"nvidia.com/gpu": [devices[2].uuid, devices[3].uuid]}}
    dm.on_pod("MODIFIED", pod("Succeeded"))
    third = pod("Pending", meta={"name": "p-3"})
    dm.on_pod("ADDED", third)
    assert dm.assigned == {"ns/p-2": [2, 3], "ns/p-3": [0, 1]}
    dm.on_pod("ADDED", pod("Pending", meta={"name": "p-4"}))
    assert dm.errors == [f"ns/p-4 wants 2 GPUs, 0 free on {KUBE_NODE}"]
    dm.on_pod("DELETED", second)
    assert set(kubelet.pods) == {("ns", "p-3")}
    assert dm.holders() == {0: Holder("ns/p-3", "p-3", 0), 1: Holder("ns/p-3", "p-3", 1)}


def test_the_simulated_exporter_is_read_by_the_dcgm_parser_with_the_holders_labels() -> None:
    devices = slurm_devices((("h100", 2), ("a100", 2)), "s")
    exporter = SimExporter(devices, lambda: slurm_holders(SCONTROL), kube=False, port=0)
    try:
        text = exporter.scrape(1_800_000_000)
    finally:
        exporter.stop()
    scrape = normalize_text(text)
    assert sorted(d["uuid"] for d in scrape.devices) == sorted(d.uuid for d in devices)
    jobs = {labels["UUID"]: labels.get("hpc_job") for labels in iter_dcgm_labels(text)}
    assert jobs == {devices[0].uuid: "7", devices[1].uuid: "7", devices[2].uuid: None, devices[3].uuid: "8"}
    util = {d["uuid"]: d["gpu_util_pct"] for d in scrape.devices}
    assert util[devices[2].uuid] == 0 and 55 <= util[devices[0].uuid] <= 95  # nobody's; a batch job computes
    kube = SimExporter(kube_devices("k"), lambda: {1: Holder("ns/p-1", "p-1", 0)}, kube=True, port=0)
    try:
        labels = [lab for lab in iter_dcgm_labels(kube.scrape(1_800_000_000)) if lab.get("pod")]
    finally:
        kube.stop()
    assert {(lab["namespace"], lab["pod"], lab["gpu"]) for lab in labels} == {("ns", "p-1", "1")}


def test_the_one_dollar_card_prices_a_gpu_second_at_exactly_one_dollar() -> None:
    """stack/cards.py's card as the rate card's own parser reads it: 3,600 $ a GPU-hour on each generation, the
    preemptible tier at the card's discount (the live pricing tests' card has none: the policy's applies)."""
    card = parse_card(tomllib.loads(one_dollar_a_second("t", ("hopper", "ampere"), discount="0.40")))
    prices = {(r.generation, r.preemptible): r.per_gpu_hour for r in card.rates()}
    assert prices == {("hopper", False): Decimal(3600), ("ampere", False): Decimal(3600),
                      ("hopper", True): Decimal(2160), ("ampere", True): Decimal(2160)}  # fmt: skip
    assert parse_card(tomllib.loads(one_dollar_a_second("t")), policy_discount=Decimal("0.5")).preemptible_discount == (
        Decimal("0.5")
    )


def test_the_expected_ledger_adds_up_per_team_cluster_and_project_and_prints_beside_the_ledger() -> None:
    want = Expected(
        seconds={("s", "1"): 19, ("s", "2"): 44, ("k", "ns/train-a"): 25, ("k", "ns/tune-b"): 12},
        who={("s", "1"): ("vision", "p-nlp"), ("s", "2"): ("ops", "p-ops"), ("k", "ns/train-a"): ("vision", "p-vision"),
             ("k", "ns/tune-b"): ("nlp", "p-nlp")},
        runs={}, users={}, pods={},
    )  # fmt: skip
    assert want.by_team() == {("vision", "s"): 19, ("vision", "k"): 25, ("vision", "ALL"): 44, ("ops", "s"): 44,
                              ("ops", "ALL"): 44, ("nlp", "k"): 12, ("nlp", "ALL"): 12}  # fmt: skip
    assert want.by_project() == {"p-nlp": 31, "p-ops": 44, "p-vision": 25}
    assert want.total() == 100 and dollars(100) == "100.00"
    lines = side_by_side(want, {("s", "1"): 19, ("s", "2"): 45, ("k", "ns/train-a"): 25})
    assert [line.split()[:2] for line in lines[1:]] == [["k", "ns/train-a"], ["k", "ns/tune-b"], ["s", "1"], ["s", "2"]]
    assert [line.split()[4:] for line in lines[1:]] == [["25", "25"], ["12", "-", "<-", "differs"], ["19", "19"],
                                                       ["44", "45", "<-", "differs"]]  # fmt: skip
