"""Fair share as the policy says, on the real API server with Kueue (issue 41 item 2). `gpuledger policy apply
--engine kueue --kueue-config <the controller's Configuration>` applies the Kueue objects (every ClusterQueue with
usage-based admission fair sharing, LocalQueues weighted by shares, the interactive tier's shared ClusterQueue) and
writes `admissionFairSharing` (half-life, sampling interval) into the controller's Configuration; the controller
is restarted to load it (it reads the file at start only). Then Kueue itself shows the policy at work:

- decay: a team's LocalQueue usage (`status.fairSharing.admissionFairSharingStatus.consumedResources`, Kueue's
  moving average) falls once its job stopped; the idle team's job, created after the heavy team's, is admitted
  first when the shared interactive queue frees;
- accumulate: Kueue cannot accumulate (its usage always fades), so admission fair sharing is off and Kueue admits
  in arrival order: the heavy team's earlier job first.

Restarts the Kueue controller (twice, restoring its configuration at the end): it runs after the other tests."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fixtures_cli import run_gpuledger
from fixtures_kube import eventually, get, kueue_story, make_namespace, workload_of
from test_kube_live_identity import remove_stamp
from test_kube_live_kueue import gpu_job

from stack.kube.cluster import LocalKube

pytestmark = [pytest.mark.integration, pytest.mark.restarts_control_plane]
GPU = "nvidia.com/gpu"


def policy_text(s: str, a: str, b: str, mode: str) -> str:
    fair = "{mode: decay, half_life_days: 0.0007}" if mode == "decay" else "{mode: accumulate}"
    return f"""\
version: 1
generations:
  hopper: {{slurm_gres: h100, kueue_flavor: fs-{s}}}
tiers:
  - {{name: std-{s}, priority: 100}}
  - {{name: ia-{s}, priority: 50}}
interactive: {{tier: ia-{s}, max_gpus_per_user: 2, max_session_hours: 4}}
fair_share: {fair}
kueue: {{cohort: co-{s}, usage_sampling_seconds: 1}}
teams:
  - {{name: a-{s}, namespaces: [{a}], quota: {{hopper: 1}}}}
  - {{name: b-{s}, namespaces: [{b}], quota: {{hopper: 1}}}}
"""


def consumed(kube: LocalKube, ns: str, lq: str) -> float:
    """Kueue's moving average of the LocalQueue's GPU usage (0 before its first sample)."""
    status = get(kube, ns, "localqueues.kueue.x-k8s.io", lq).get("status", {})
    used = ((status.get("fairSharing") or {}).get("admissionFairSharingStatus") or {}).get("consumedResources") or {}
    text = str(used.get(GPU, "0"))
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def suspended(kube: LocalKube, ns: str, job: str) -> bool:
    return get(kube, ns, "job", job).get("spec", {}).get("suspend") is not False


def deactivate(kube: LocalKube, ns: str, job: str) -> None:
    wl = workload_of(kube, ns, job)["metadata"]["name"]
    kube.kubectl("-n", ns, "patch", "workloads.kueue.x-k8s.io", wl, "--type=merge", "-p", '{"spec":{"active":false}}')


def race(kube: LocalKube, heavy_ns: str, idle_ns: str, queue: str, tag: str) -> str:
    """The interactive queue full (a blocker of the heavy team), then the heavy team's job, then the idle team's;
    the blocker stopped: which job Kueue admits first ('heavy' or 'idle')."""
    kube.apply([gpu_job(f"block-{tag}", heavy_ns, 2, queue)])
    eventually(lambda: not suspended(kube, heavy_ns, f"block-{tag}"), f"blocker {tag} admitted",
               explain=lambda: kueue_story(kube, heavy_ns))  # fmt: skip
    kube.apply([gpu_job(f"heavy-{tag}", heavy_ns, 2, queue)])
    heavy = eventually(lambda: workload_of(kube, heavy_ns, f"heavy-{tag}"), "the heavy team's Workload")
    # Kueue orders equal priorities by creation time, kept in whole seconds: the idle team's job is created in a
    # later second, so only its team's lower usage can put it first.
    born = datetime.strptime(heavy["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    eventually(lambda: datetime.now(UTC) >= born + timedelta(seconds=1.05), "a later second")
    kube.apply([gpu_job(f"idle-{tag}", idle_ns, 2, queue)])
    eventually(lambda: workload_of(kube, idle_ns, f"idle-{tag}"), "the idle team's Workload")
    deactivate(kube, heavy_ns, f"block-{tag}")
    def admitted() -> str | None:
        if not suspended(kube, heavy_ns, f"heavy-{tag}"):
            return "heavy"
        return "idle" if not suspended(kube, idle_ns, f"idle-{tag}") else None

    first = eventually(admitted, f"a job admitted after the blocker {tag}", explain=lambda: kueue_story(kube, heavy_ns))
    for ns, job in ((heavy_ns, f"heavy-{tag}"), (idle_ns, f"idle-{tag}")):
        deactivate(kube, ns, job)
    return str(first)


def test_kueue_admits_by_decayed_usage_under_decay_and_in_order_under_accumulate(local_kube: LocalKube,
                                                                                 tmp_path: Any) -> None:  # fmt: skip
    s = uuid.uuid4().hex[:6]
    a, b = make_namespace(local_kube, "fsa"), make_namespace(local_kube, "fsb")
    queue = f"ia-{s}"
    original = local_kube.kueue_config.read_text()
    policy = tmp_path / "policy.yaml"
    kubeconfig = local_kube.cfg.kubeconfig("gpuledger-policy")
    args = ["--engine", "kueue", "--policy", str(policy), "--kubeconfig", str(kubeconfig), "--kueue-config",
            str(local_kube.kueue_config)]  # fmt: skip

    def apply_and_restart(mode: str) -> None:
        policy.write_text(policy_text(s, a, b, mode))
        done = run_gpuledger(["policy", "apply", *args], env=dict(os.environ), timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "restart the Kueue controller to load it" in done.stderr
        local_kube.restart_kueue()
        diff = run_gpuledger(["policy", "diff", "--no-reservations", *args], env=dict(os.environ), timeout=120)
        assert (diff.returncode, diff.stdout) == (0, "no drift\n"), diff.stdout + diff.stderr

    try:
        apply_and_restart("decay")
        config = local_kube.kueue_config.read_text()
        assert "usageHalfLifeTime: 60s" in config and "usageSamplingInterval: 1s" in config
        # The heavy team computes on the shared interactive queue (borrowing both teams' lent quota), then stops.
        local_kube.apply([gpu_job("use", a, 2, queue)])
        eventually(lambda: not suspended(local_kube, a, "use"), "the heavy team's job admitted",
                   explain=lambda: kueue_story(local_kube, a))  # fmt: skip
        eventually(lambda: consumed(local_kube, a, queue) > 0, "Kueue sampled the heavy team's usage")
        deactivate(local_kube, a, "use")
        peak = eventually(lambda: (c := consumed(local_kube, a, queue)) > 0 and c, "usage read")
        low = eventually(lambda: (c := consumed(local_kube, a, queue)) < peak and c, "usage decaying", timeout=60)
        assert consumed(local_kube, b, queue) == 0
        assert race(local_kube, a, b, queue, "decay") == "idle"  # the team that used nothing goes first

        apply_and_restart("accumulate")
        assert "admissionFairSharing" not in local_kube.kueue_config.read_text()
        cq = json.loads(local_kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", queue, "-o", "json").stdout)
        assert cq["spec"]["admissionScope"] == {"admissionMode": "NoAdmissionFairSharing"}
        assert race(local_kube, a, b, queue, "accumulate") == "heavy"  # arrival order: Kueue does not accumulate
        print(f"decay: the heavy team's usage {peak:g} -> {low:g} GPU once stopped; the idle team admitted first; "
              "accumulate: arrival order")  # fmt: skip
    finally:
        local_kube.kueue_config.write_text(original)
        local_kube.restart_kueue()
        remove_stamp(local_kube, a)  # policy apply installs the submitter stamp cluster-wide
