"""A synthetic GPU cluster: job events, device telemetry and inventory that agree, plus the ledger they imply.

Library API (pure Python, no Kafka):

    from producers.simulator import SimConfig, simulate, expected_ledger

    cfg = SimConfig(seed=7, nodes=4, duration_s=1800)      # 4 nodes x 8 GPUs, 30 minutes
    for topic, key, record in simulate(cfg):                # event-time order
        ...  # topic: schemas.topics.Topic (INVENTORY, JOB_EVENTS, DEVICE_SAMPLES); key: bytes; record: dict
    ledger = expected_ledger(cfg)                           # {job_id: Ledger}
    ledger["1001"].allocated_s == (ledger["1001"].active_s + ledger["1001"].starved_s
                                   + ledger["1001"].idle_s + ledger["1001"].dark_s)

- `SimConfig(seed, nodes, gpus_per_node=8, duration_s, start_ms, cluster="sim", exporter_version,
  upgrade_to, upgrade_at_s, dead_exporter_nodes, dead_exporter_at_s, dead_exporter_for_s,
  silent_devices, training_gangs, hpc_job_label, mig_nodes)`: frozen; the same config gives the
  same records. `mig_nodes=k` turns the last k nodes into A100s in MIG mode: jobs hold single
  slices (allocations carry `mig_instance_id`/`mig_profile`), slices report profiling ratios and
  framebuffer under `GPU_I_ID`/`GPU_I_PROFILE`, the physical GPU reports board metrics only (no
  activity), and Ledger.devices keys are `node/uuid/GPU_I_ID`. Devices are keyed (node, slot)
  in the plan: the GPU index for whole GPUs, the slice's position on the node for MIG.
- `simulate(config, *, start_s=0, end_s=None) -> Iterator[tuple[Topic, bytes, dict]]`: inventory
  records first (one per node, `INVENTORY`, key `cluster/node`), then per second: ENDED events,
  STARTED events (`JOB_EVENTS`, key `cluster/job_id`), one `DEVICE_SAMPLES` record per node whose
  exporter is alive (key `cluster/node`). Event times are whole seconds from `start_ms`, 1 Hz.
  Records are plain dicts matching the `.avsc` contracts (encode with `schemas.codec.AvroCodec`).
- `expected_ledger(config, thresholds=None) -> dict[str, Ledger]`: per job allocated / active /
  starved / idle / dark seconds, `sm_weighted_s`, idle and dark job-minutes, per-device breakdown,
  computed from the ground truth per docs/classification.md (classifier c1), not by the processors.
- `expected_device_minutes(config, thresholds=None) -> list[DeviceMinute]`: the same, per job,
  device (node, uuid) and event-time minute (`minute_start_ms`), with `sample_count`: what the
  usage.device-minutes rows of allocated devices must say.
- `plan(config) -> SimPlan`: the cluster (nodes, devices, UUIDs), people, jobs, exporter outages
  and silent devices, for tests that need to know the ground truth.
- `write_ledger(config, path)` (JSON or CSV), `unallocated_seconds(config)`.
- `kube_nodes=k` (k >= 3; 0 in the dataclass, 3 in `gpuledger simulate run|ledger` and so under `up`) adds a
  Kubernetes cluster `<cluster>-k8s` beside the Slurm-like one (producers/simulator/kube.py): Kueue Jobs, a
  multi-pod Kueue gang, notebooks as plain pods, pods on MIG slices, 4-GPU pods started while the watcher
  runs. Its job events are `producers.kube.KubeTracker`'s over simulated Pods and Workloads (devices from the
  exporters' pod labels; one pod's only at the watcher's next label refresh: a count-only STARTED, then an
  UPDATED naming its GPUs, dark unidentified devices in between); `simulate` merges both clusters' records by
  event time, and `expected_ledger`, `expected_device_minutes` and `unallocated_seconds` cover both
  (Ledger.cluster says which; Kubernetes job ids are `namespace/pod`, so ids never collide). A config without
  it gives exactly the records it always gave.
- `run(config, publisher, realtime=False, clock=time.time, sleep=time.sleep)`: publishes through
  `streams.publish.RecordPublisher` (what `gpuledger simulate run` does).

The cluster: nodes of mixed generations (H100, A100, L40S, V100) in on-prem, cloud on-demand and
spot pricing tiers; five teams with projects and users. Job mix: multi-node training gangs,
single- and multi-GPU batch, interactive notebooks that go idle over lunch (12-13 UTC) and
overnight, data-starved jobs (bursty ~13% activity, >= 8 GiB loaded), a script poking an idle
device 2 s every 4 min, a node whose exporter dies while held (dark), a device that never reports,
and an exporter upgrade mid-run (3.4.0 -> 4.7.1: PCIe KB/s -> bytes, `Hostname` -> `hostname`,
profiling metrics appear) whose canonical values are unchanged. Device samples are made by
emitting what the exporter release would print and passing it through the real DCGM normalizer
and record builder (`producers.dcgm`).
"""

from producers.simulator.ledger import (
    DeviceMinute,
    Ledger,
    Thresholds,
    expected_device_minutes,
    expected_ledger,
    unallocated_seconds,
    write_ledger,
)
from producers.simulator.model import DEFAULT_START_MS, SimConfig, SimJob, SimPlan, plan
from producers.simulator.run import run
from producers.simulator.stream import simulate

__all__ = [
    "DEFAULT_START_MS",
    "DeviceMinute",
    "Ledger",
    "SimConfig",
    "SimJob",
    "SimPlan",
    "Thresholds",
    "expected_device_minutes",
    "expected_ledger",
    "plan",
    "run",
    "simulate",
    "unallocated_seconds",
    "write_ledger",
]
