"""Cost of one policy-watch pass against the live engines (issue 41 item 1): CPU and wall time of
`producers.policy_engine.differ_for(...)(engine)`, the exact diff the watch and `policy diff` run.

It starts the project's live Slurm (slurmctld, slurmd, slurmdbd, MariaDB, munge; as root) and the live Kubernetes
control plane with Kueue (binaries cached by `gpuledger dev kube up`), applies a policy of two teams and two tiers to
each, then times `--passes` diff passes per engine: CPU of this process (the Kubernetes client, the parsing) and of
its children (sacctmgr, scontrol), and wall time. Usage (as root):

    .venv/bin/python bench/policy_watch_cost.py [--passes 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from base.settings import BrokerSettings, KafkaSettings, Settings  # noqa: E402
from producers.policy_engine import (  # noqa: E402
    differ_for,
    engine_diff,
    kube_api,
    kueue_apply,
    kueue_objects,
    run_command,
    slurm_apply,
    slurm_conf_apply,
)
from schemas.policy import parse_policy  # noqa: E402

POLICY = """\
version: 1
generations:
  hopper: {slurm_gres: h100, kueue_flavor: h100, fleet_gpus: 2}
  ampere: {slurm_gres: a100, kueue_flavor: a100, fleet_gpus: 2}
tiers:
  - {name: prod, priority: 1000, preempts: [sweep]}
  - {name: sweep, priority: 10}
preemptible: {tier: sweep, discount: "0.40"}
kueue: {cohort: org}
teams:
  - {name: serve, members: [root], namespaces: [bench-serve], tiers: [prod], quota: {hopper: 1}}
  - {name: sweeps, members: [root], namespaces: [bench-sweeps], tiers: [sweep], borrowing_limit: {hopper: 2}}
"""


def cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def measure(name: str, one: Callable[[], object], passes: int) -> None:
    one()  # warm: first connection, imports
    own, kids, wall = [], [], []
    for _ in range(passes):
        (a0, b0), w0 = cpu(), time.perf_counter()
        drift = one()
        (a1, b1), w1 = cpu(), time.perf_counter()
        own.append(a1 - a0)
        kids.append(b1 - b0)
        wall.append(w1 - w0)
    print(f"{name}: {passes} passes, drift lines {len(getattr(drift, 'drift', ()))}; per pass median "
          f"CPU self {1000 * statistics.median(own):.0f} ms + children {1000 * statistics.median(kids):.0f} ms, "
          f"wall {1000 * statistics.median(wall):.0f} ms (max {1000 * max(wall):.0f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", type=int, default=20)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")  # the local control plane's own CA
    policy = parse_policy(POLICY)
    from stack.kube.build import ensure_binaries
    from stack.kube.cluster import ClusterConfig, LocalKube
    from stack.slurm import deploy_dir
    from stack.slurm.cluster import LocalSlurm, SlurmConfig, ensure_installed

    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        ensure_installed()
        scfg = SlurmConfig.on_free_ports(Path(tmp) / "slurm", hooks_dir=deploy_dir())
        kcfg = ClusterConfig.on_free_ports(Path(tmp) / "kube")
        with LocalSlurm(scfg) as slurm, LocalKube(kcfg, ensure_binaries()) as kube:
            os.environ.update(slurm.client.cfg.env)  # sacctmgr/scontrol reach this cluster
            slurm_conf_apply(policy, run_command, None, time.time())  # the fair-share block: a clean diff
            slurm_apply(policy, run_command)
            kube.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
                        for n in ("bench-serve", "bench-sweeps")])  # fmt: skip
            kubeconfig = kube.cfg.kubeconfig()
            kueue_apply(kube_api(kubeconfig), kueue_objects(policy))
            settings = Settings(state_dir=Path(tmp), broker=BrokerSettings(enabled=False),
                                kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"),
                                policy_watch={"engines": ["slurm"]})  # fmt: skip
            differ = differ_for(policy, settings)
            measure("slurm (sacctmgr show qos, assoc; scontrol show config)", lambda: differ("slurm"), args.passes)
            # Kueue: the objects' diff as the watch runs it, without the reservations.v1 read (no broker here; the
            # watch reads that topic whole once per Kueue pass: a few records).
            api = kube_api(kubeconfig)
            measure("kueue (GET of each rendered object)", lambda: engine_diff(
                policy, "kueue", preemptible_qos=(), kube=api), args.passes)  # fmt: skip


if __name__ == "__main__":
    main()
