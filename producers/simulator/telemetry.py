"""Ground truth of every simulated device-second, and the exporter output that reports it.

The truth is a pure function of (plan, device, second): the expected ledger and the scrapes are
both computed from it, so they agree by construction. Activity is whole percent (0-100), the
resolution `DCGM_FI_DEV_GPU_UTIL` has, so every exporter release maps it to the same canonical value.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple

from producers.dcgm import RawSample
from producers.mapping import load_mappings, parse_version
from producers.simulator.model import SimDevice, SimJob, SimPlan

_MASK = (1 << 64) - 1
DRIVER_VERSION = "550.54.15"
LUNCH = (12 * 3600, 13 * 3600)  # UTC seconds of day
WORKDAY = (8 * 3600, 18 * 3600)


def _mix(*values: int) -> int:
    """splitmix64 over the values: a cheap, stateless, reproducible hash."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (v & _MASK)) & _MASK
        x = (x + 0x9E3779B97F4A7C15) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        x ^= x >> 31
    return x


def _pick(lo: int, hi: int, *key: int) -> int:
    """An integer in [lo, hi], from the hash of key."""
    return lo + _mix(*key) % (hi - lo + 1)


class Truth(NamedTuple):
    activity_pct: int
    fb_used_mib: int
    fb_total_mib: int
    power_w: float
    temperature_c: int
    pcie_tx_kb: int
    pcie_rx_kb: int
    mem_copy_pct: int
    tensor_pct: int
    dram_pct: int


def notebook_user_present(abs_s: int, job: SimJob) -> bool:
    """Notebook owners work in bursts during the working day, and leave for lunch and overnight."""
    day_s = abs_s % 86400
    weekday = (abs_s // 86400 + 3) % 7  # 1970-01-01 was a Thursday; 0 = Monday
    if weekday >= 5 or not (WORKDAY[0] <= day_s < WORKDAY[1]) or LUNCH[0] <= day_s < LUNCH[1]:
        return False
    cycle = (abs_s - job.noise % 1800) % 1800  # 30-minute cycles: 10 minutes of work, then reading
    return cycle < 600


def activity_pct(job: SimJob, pos: int, t: int, start_s_abs: int) -> int:
    """Activity of the job's `pos`-th device at run second t, percent (docs/classification.md table)."""
    kind = job.kind
    n = job.noise
    if kind == "training":
        rel = t - job.start_s
        if rel % 1200 < 30:  # checkpoint pause every 20 minutes
            return _pick(1, 3, n, pos, t)
        return _pick(55, 95, n, pos, t)
    if kind == "batch":
        return _pick(55, 95, n, pos, t)
    if kind == "starved":
        # Bursty: 2 busy seconds in every 10, the rest nearly still (minute mean ~0.13).
        if (t + n) % 10 < 2:
            return _pick(45, 60, n, pos, t)
        return _pick(2, 5, n, pos, t)
    if kind == "poker":
        # A script touches the device for 2 s every 4 minutes.
        return 100 if (t - job.start_s) % 240 < 2 else 0
    if kind == "notebook":
        if notebook_user_present(start_s_abs + t, job):
            return _pick(30, 80, n, pos, t)
        return 0
    raise ValueError(f"unknown job kind {kind}")


def fb_used_mib(job: SimJob | None, dev: SimDevice, pos: int) -> int:
    if job is None:
        return 0
    kind = job.kind
    if kind == "training":
        return int(dev.memory_mib * 0.85)
    if kind == "batch":
        return int(dev.memory_mib * 0.5) + _pick(0, 512, job.noise, pos)
    if kind == "starved":
        return max(8192, int(dev.memory_mib * 0.3))
    if kind == "notebook":
        return min(dev.memory_mib - 1024, 12288 + _pick(0, 2048, job.noise, pos))
    return 2048  # poker


def truth(dev: SimDevice, job: SimJob | None, pos: int, t: int, start_s_abs: int) -> Truth:
    pct = activity_pct(job, pos, t, start_s_abs) if job is not None else 0
    used = fb_used_mib(job, dev, pos)
    h = _mix(dev.index, t, len(dev.uuid))
    power = round(0.12 * dev.power_max_w + pct / 100 * 0.8 * dev.power_max_w + (h % 1000) / 100, 3)
    busy = pct >= 20
    return Truth(
        activity_pct=pct,
        fb_used_mib=used,
        fb_total_mib=dev.memory_mib,
        power_w=power,
        temperature_c=30 + pct * 45 // 100 + int(h % 3),
        pcie_tx_kb=(pct * 9000 + int(h % 5000)) if busy else int(h % 64),
        pcie_rx_kb=(pct * 21000 + int(h % 9000)) if busy else int(h % 64),
        mem_copy_pct=pct * 6 // 10,
        tensor_pct=pct * 7 // 10 if job is not None and job.kind in ("training", "batch") else pct // 10,
        dram_pct=pct // 2,
    )


@dataclass(frozen=True, slots=True)
class ExporterProfile:
    """What one dcgm-exporter release prints by default (its default-counters.csv), in its units."""

    version: str
    mapping_version: str
    hostname_label: str
    pcie_renamed: bool  # DCGM_FI_PROF_PCIE_*_BYTES (bytes) instead of DCGM_FI_DEV_PCIE_*_THROUGHPUT (KB)
    prof_default: bool  # DCGM_FI_PROF_GR_ENGINE_ACTIVE & co enabled by default (4.0+)


def exporter_profile(version: str) -> ExporterProfile:
    mapping = load_mappings().for_exporter(version)
    v = parse_version(version)
    return ExporterProfile(
        version=version,
        mapping_version=mapping.version,
        hostname_label="hostname" if mapping.version == "dcgm-v4" else "Hostname",
        pcie_renamed="DCGM_FI_DEV_PCIE_TX_THROUGHPUT" not in mapping.rules,
        prof_default=v >= (4, 0, 0),
    )


def device_labels(dev: SimDevice, profile: ExporterProfile, job_id: str | None, kube: bool = False) -> dict[str, str]:
    """A device's series labels. The job holding it is `hpc_job` on a Slurm node; on a Kubernetes node
    (`kube`, job ids `namespace/pod`) the exporter names the pod (`namespace`, `pod`, `container`)."""
    labels = {
        "gpu": str(dev.index),
        "UUID": dev.uuid,
        "pci_bus_id": dev.pci_bus_id,
        "device": f"nvidia{dev.index}",
        "modelName": dev.model,
        profile.hostname_label: dev.node,
        "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION,
    }
    if dev.mig_instance_id is not None:
        labels["GPU_I_PROFILE"] = dev.mig_profile or ""
        labels["GPU_I_ID"] = str(dev.mig_instance_id)
    if job_id is not None and kube:
        namespace, pod = job_id.split("/", 1)
        labels.update(namespace=namespace, pod=pod, container="main")
    elif job_id is not None:
        labels["hpc_job"] = job_id
    return labels


def mig_instance_samples(labels: dict[str, str], tr: Truth) -> list[RawSample]:
    """What a MIG slice reports: profiling ratios and its framebuffer (GPU_UTIL is not supported in MIG
    mode, so MIG nodes run the DCP counter set whatever the release)."""
    return [
        RawSample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, tr.activity_pct / 100),
        RawSample("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels, tr.tensor_pct / 100),
        RawSample("DCGM_FI_PROF_DRAM_ACTIVE", labels, tr.dram_pct / 100),
        RawSample("DCGM_FI_DEV_FB_USED", labels, float(tr.fb_used_mib)),
        RawSample("DCGM_FI_DEV_FB_FREE", labels, float(tr.fb_total_mib - tr.fb_used_mib)),
    ]


def mig_parent_samples(labels: dict[str, str], tr: Truth) -> list[RawSample]:
    """What the physical GPU of a MIG node reports on its own series: board metrics, no activity."""
    return [
        RawSample("DCGM_FI_DEV_GPU_TEMP", labels, float(tr.temperature_c)),
        RawSample("DCGM_FI_DEV_POWER_USAGE", labels, tr.power_w),
        RawSample("DCGM_FI_DEV_XID_ERRORS", labels, 0.0),
    ]


def exporter_samples(profile: ExporterProfile, labels: dict[str, str], tr: Truth) -> list[RawSample]:
    """The samples one device contributes to a scrape, named and scaled as `profile`'s release does."""
    fb_free = tr.fb_total_mib - tr.fb_used_mib
    out = [
        RawSample("DCGM_FI_DEV_SM_CLOCK", labels, 1980.0 if tr.activity_pct else 345.0),
        RawSample("DCGM_FI_DEV_GPU_TEMP", labels, float(tr.temperature_c)),
        RawSample("DCGM_FI_DEV_POWER_USAGE", labels, tr.power_w),
        RawSample("DCGM_FI_DEV_GPU_UTIL", labels, float(tr.activity_pct)),
        RawSample("DCGM_FI_DEV_MEM_COPY_UTIL", labels, float(tr.mem_copy_pct)),
        RawSample("DCGM_FI_DEV_XID_ERRORS", labels, 0.0),
        RawSample("DCGM_FI_DEV_FB_FREE", labels, float(fb_free)),
        RawSample("DCGM_FI_DEV_FB_USED", labels, float(tr.fb_used_mib)),
    ]
    if profile.pcie_renamed:
        out.append(RawSample("DCGM_FI_PROF_PCIE_TX_BYTES", labels, float(tr.pcie_tx_kb * 1024)))
        out.append(RawSample("DCGM_FI_PROF_PCIE_RX_BYTES", labels, float(tr.pcie_rx_kb * 1024)))
    else:
        out.append(RawSample("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", labels, float(tr.pcie_tx_kb)))
        out.append(RawSample("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", labels, float(tr.pcie_rx_kb)))
    if profile.prof_default:
        out.append(RawSample("DCGM_FI_DEV_FB_RESERVED", labels, 512.0))
        out.append(RawSample("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, tr.activity_pct / 100))
        out.append(RawSample("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", labels, tr.tensor_pct / 100))
        out.append(RawSample("DCGM_FI_PROF_DRAM_ACTIVE", labels, tr.dram_pct / 100))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_exposition(samples: list[RawSample], help_text: bool = True) -> str:
    """Prometheus text format, as dcgm-exporter prints it (families grouped, HELP/TYPE headers)."""
    by_name: dict[str, list[RawSample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    lines: list[str] = []
    label_text: dict[int, str] = {}
    for name, group in by_name.items():
        if help_text:
            lines.append(f"# HELP {name} {name}.")
            lines.append(f"# TYPE {name} gauge")
        for s in group:
            text = label_text.get(id(s.labels))
            if text is None:
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
                label_text[id(s.labels)] = text
            value = s.value
            lines.append(f"{name}{{{text}}} {int(value) if value.is_integer() else repr(value)}")
    return "\n".join(lines) + "\n"


class DeviceSchedule:
    """The jobs of one device in time order, for look-ups at increasing seconds."""

    def __init__(self, entries: list[tuple[int, int, SimJob, int]]) -> None:
        self._entries = sorted(entries, key=lambda e: e[0])
        self._starts = [e[0] for e in self._entries]

    def at(self, t: int) -> tuple[SimJob, int] | None:
        i = bisect.bisect_right(self._starts, t) - 1
        if i >= 0:
            start, end, job, pos = self._entries[i]
            if start <= t < end:
                return job, pos
        return None


def device_schedules(plan: SimPlan) -> dict[tuple[str, int], DeviceSchedule]:
    entries: dict[tuple[str, int], list[tuple[int, int, SimJob, int]]] = {k: [] for k in plan.devices}
    for job in plan.jobs:
        for pos, dev in enumerate(job.devices):
            entries[dev].append((job.start_s, job.end_s, job, pos))
    return {k: DeviceSchedule(v) for k, v in entries.items()}
