"""Rollups: DeviceMinute rows from a closed minute, JobMinute rows from a job's device-minutes.

Outputs are deterministic (rows sorted, sums taken in second order), so a minute re-emitted after a
crash is byte-identical and an idempotent sink keeps one copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from operator import itemgetter
from typing import Any, cast

from base.processor_settings import Thresholds
from processors._window import span_stats
from processors.attribution import AllocationTable, DeviceRef, Interval, JobInfo, owners_by_second, seconds_span
from processors.classify import MinuteClass, classify_minute
from processors.windows import DeviceWindow, Second
from schemas.generations import generation_of
from schemas.mig import UnknownMigProfile, mig_share

FACTS_KEPT = 1024  # a node's device facts kept (`DeviceDirectory.facts`): bounded whatever its samples say
WHOLE_GPU = (1, 1)
UNKNOWN_SHARE = (0, 1)  # a MIG instance whose share cannot be derived: its seconds are left unpriced


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    uuid: str
    model: str | None
    generation: str
    mig_profile: str | None = None


@lru_cache(maxsize=4096)
def gpu_share(mig: int | None, profile: str | None, model: str | None) -> tuple[int, int]:
    """(slices, of): the share of its GPU a device's seconds are priced at. A whole GPU is 1 of 1; a MIG
    instance is its profile's compute slices of the GPU's (`schemas.mig.mig_share`), or 0 of 1 (unpriced,
    and so listed in every report's unpriced hours) when no source named its profile or the profile is
    unknown: a wrong guess would bill a slice as a whole GPU, or a whole GPU as a slice."""
    if mig is None:
        return WHOLE_GPU
    if not profile:
        return UNKNOWN_SHARE
    try:
        share = mig_share(profile, model)
    except UnknownMigProfile:
        return UNKNOWN_SHARE
    return share.slices, share.of


class DeviceDirectory:
    """What is known of a node's devices beyond the samples: the inventory (uuid, model, generation)."""

    def __init__(self) -> None:
        self._by_node: dict[str, list[Mapping[str, Any]]] = {}
        # the first device of a node's inventory with each (uuid, MIG instance) and (index, MIG instance)
        self._by_uuid: dict[str, dict[tuple[Any, Any], Mapping[str, Any]]] = {}
        self._by_index: dict[str, dict[tuple[Any, Any], Mapping[str, Any]]] = {}
        self._facts: dict[str, dict[tuple[Any, ...], DeviceFacts]] = {}  # `facts`, per node until its inventory changes

    def set_node(self, node: str, devices: list[Mapping[str, Any]] | None) -> None:
        self._facts.pop(node, None)
        if devices is None:
            self._by_node.pop(node, None)
            self._by_uuid.pop(node, None)
            self._by_index.pop(node, None)
            return
        self._by_node[node] = list(devices)
        by_uuid: dict[tuple[Any, Any], Mapping[str, Any]] = {}
        by_index: dict[tuple[Any, Any], Mapping[str, Any]] = {}
        for dev in devices:
            if dev.get("uuid") is not None:
                by_uuid.setdefault((dev.get("uuid"), dev.get("mig_instance_id")), dev)
            if dev.get("index") is not None:
                by_index.setdefault((dev.get("index"), dev.get("mig_instance_id")), dev)
        self._by_uuid[node] = by_uuid
        self._by_index[node] = by_index

    def lookup(self, node: str, uuid: str | None, index: int | None, mig: int | None) -> Mapping[str, Any] | None:
        """The node's inventory entry of the device with this MIG instance and `uuid` (by `index` when the
        UUID is None), the first one listed; None when it lists none."""
        if uuid is not None:
            return self._by_uuid.get(node, {}).get((uuid, mig))
        if index is not None:
            return self._by_index.get(node, {}).get((index, mig))
        return None

    def facts_for_ref(self, node: str, ref: DeviceRef) -> DeviceFacts:
        dev = self.lookup(node, ref.uuid, ref.index, ref.mig_instance_id)
        if dev is None and ref.unidentified and ref.mig_instance_id is None:
            dev = self._sole_kind(node)
        uuid = ref.uuid or (dev.get("uuid") if dev else None) or ref.label
        model = dev.get("model") if dev else None
        gen = (dev.get("generation") if dev else None) or generation_of(model)
        return DeviceFacts(uuid, model, gen, dev.get("mig_profile") if dev else None)

    def _sole_kind(self, node: str) -> Mapping[str, Any] | None:
        """The model and generation of a node whose whole GPUs are all of one kind: an unidentified GPU there
        is one of them, so it is priced as one (on a node of mixed kinds it stays unknown: unpriced)."""
        kinds = {
            (d.get("model"), d.get("generation"))
            for d in self._by_node.get(node, ())
            if d.get("mig_instance_id") is None
        }
        if len(kinds) != 1:
            return None
        model, generation = next(iter(kinds))
        return {"model": model, "generation": generation} if model or generation else None

    def mig_profile(self, node: str, uuid: str, index: int | None, mig: int | None) -> str | None:
        """The inventory's MIG profile of a device (None for a whole GPU or one it does not describe)."""
        if mig is None:
            return None
        dev = self.lookup(node, uuid, None, mig) or self.lookup(node, None, index, mig)
        return dev.get("mig_profile") if dev is not None else None

    def facts(
        self, node: str, uuid: str, index: int | None, mig: int | None, model: str | None, profile: str | None
    ) -> DeviceFacts:
        """A sampled device's facts: its samples' model, its generation and MIG profile (the samples' profile,
        else the inventory's). Kept per node until its inventory changes (at most FACTS_KEPT a node)."""
        kept = self._facts.get(node)
        if kept is None:
            kept = self._facts[node] = {}
        key = (uuid, index, mig, model, profile)
        facts = kept.get(key)
        if facts is None:
            if len(kept) >= FACTS_KEPT:
                kept.clear()
            facts = kept[key] = DeviceFacts(
                uuid,
                model,
                self.generation(node, uuid, index, mig, model),
                profile or self.mig_profile(node, uuid, index, mig),
            )
        return facts

    def generation(self, node: str, uuid: str, index: int | None, mig: int | None, model: str | None) -> str:
        dev = self.lookup(node, uuid, None, mig) or self.lookup(node, None, index, mig)
        if dev is not None and dev.get("generation"):
            return str(dev["generation"])
        return generation_of(model)


def plain_sum(values: Iterable[float]) -> float:
    """Left to right, one addition a second: what span_stats does (Python's own `sum` of floats compensates
    from 3.12 on, which would make the two paths differ in the last bits)."""
    total = 0.0
    for v in values:
        total += v
    return total


def _stats(cells: list[Second]) -> dict[str, Any]:
    acts = [c[0] for c in cells if c[0] is not None]
    fbs = [c[1] for c in cells if c[1] is not None]
    pws = [c[2] for c in cells if c[2] is not None]
    return {
        "activity_mean_ratio": (plain_sum(acts) / len(acts)) if acts else None,
        "activity_max_ratio": max(acts) if acts else None,
        "fb_used_mib_max": max(fbs) if fbs else None,
        "power_w_mean": (plain_sum(pws) / len(pws)) if pws else None,
    }


def _row(
    cluster: str,
    node: str,
    facts: DeviceFacts,
    mig: int | None,
    minute_ms: int,
    job: JobInfo | None,
    mapping_version: str,
    thresholds: Thresholds,
) -> dict[str, Any]:
    """A row's fields but its seconds and stats; `mapping_version`: the mapping versions that fed it,
    sorted and comma-joined (a window's `mapping`)."""
    slices, of = gpu_share(mig, facts.mig_profile, facts.model)
    return {
        "cluster": cluster,
        "node": node,
        "device_uuid": facts.uuid,
        "mig_instance_id": mig,
        "mig_profile": facts.mig_profile if mig is not None else None,
        "gpu_share_slices": slices,
        "gpu_share_of": of,
        "minute_start_ms": minute_ms,
        "model": facts.model,
        "generation": facts.generation,
        "job_id": job.job_id if job else None,
        "user": job.user if job else None,
        "project": job.project if job else None,
        "team": job.team if job else None,
        "cost_centre": job.cost_centre if job else None,
        "preemptible": job.preemptible if job else False,
        "pricing_tier": job.pricing_tier if job else "on-prem",
        "job_node_rows": None,  # set once the node-minute's rows are all made (`node_minute_rows`)
        "unallocated_s": 0,
        "allocated_s": 0,
        "active_s": 0,
        "starved_s": 0,
        "idle_s": 0,
        "dark_s": 0,
        "sm_weighted_s": 0.0,
        "sample_count": 0,
        "activity_mean_ratio": None,
        "activity_max_ratio": None,
        "fb_used_mib_max": None,
        "power_w_mean": None,
        "mapping_version": mapping_version,
        "classifier_version": thresholds.version,
    }


_CLASS_FIELD = {MinuteClass.ACTIVE: "active_s", MinuteClass.STARVED: "starved_s", MinuteClass.IDLE: "idle_s"}


def allocated_row(
    base: dict[str, Any], seconds: set[int], secs: Mapping[int, Second], thresholds: Thresholds
) -> dict[str, Any]:
    """Fill a job's row from its allocated seconds of the minute and the device's per-second samples."""
    cells = [secs[s] for s in sorted(seconds) if s in secs]
    with_act = [c for c in cells if c[0] is not None]
    row = dict(base)
    row["allocated_s"] = len(seconds)
    row["sample_count"] = len(cells)
    row["dark_s"] = len(seconds) - len(with_act)
    if with_act:
        total = plain_sum(cast(float, c[0]) for c in with_act)
        fb = [c[1] for c in with_act if c[1] is not None]
        cls = classify_minute(total / len(with_act), max(fb) if fb else None, thresholds)
        row[_CLASS_FIELD[cls]] = len(with_act)
        row["sm_weighted_s"] = total
    row.update(_stats(cells))
    return row


def likely_waiting(
    per_node: Mapping[str, Mapping[Any, DeviceWindow]], allocated: Iterable[str], thresholds: Thresholds
) -> set[str]:
    """Of the `allocated` nodes (holding a job in the minute), those with a device that looks as if it did not
    compute, its whole minute taken as one span (one native pass a device): idle, no sample, or no window
    at all. A guess, for ordering only: the rows say what each device did."""
    out = set()
    for nk in allocated:
        wins = per_node.get(nk)
        if not wins:
            out.add(nk)
            continue
        for win in wins.values():
            _, n_act, total, _, max_fb_act, _, _, _ = span_stats(win, 0, 60)
            if not n_act or classify_minute(total / n_act, max_fb_act, thresholds) is MinuteClass.IDLE:
                out.add(nk)
                break
    return out


def span_row(row: dict[str, Any], win: DeviceWindow, i0: int, i1: int, thresholds: Thresholds) -> dict[str, Any]:
    """`allocated_row` for one job holding seconds [i0, i1) of the window's minute, read straight from
    the window's arrays in one native pass (`processors/_window.c`; NaN = absent). Same sums in the same
    second order, so the same bytes. Fills `row` (a `_row` made for it) and returns it."""
    n_seen, n_act, total, max_act, max_fb_act, max_fb, pw_total, n_pw = span_stats(win, i0, i1)
    row["allocated_s"] = i1 - i0
    row["sample_count"] = n_seen
    row["dark_s"] = i1 - i0 - n_act
    if n_act:
        cls = classify_minute(total / n_act, max_fb_act, thresholds)
        row[_CLASS_FIELD[cls]] = n_act
        row["sm_weighted_s"] = total
    row["activity_mean_ratio"] = total / n_act if n_act else None
    row["activity_max_ratio"] = max_act
    row["fb_used_mib_max"] = max_fb
    row["power_w_mean"] = pw_total / n_pw if n_pw else None
    return row


def _unallocated_row(
    cluster: str,
    node: str,
    facts: DeviceFacts,
    mig: int | None,
    minute_ms: int,
    mapping_version: str,
    cells: list[Second],
    thresholds: Thresholds,
) -> dict[str, Any]:
    """The row of a device's sampled seconds (`cells`) that no job held."""
    row = _row(cluster, node, facts, mig, minute_ms, None, mapping_version, thresholds)
    row["unallocated_s"] = len(cells)
    row["sample_count"] = len(cells)
    row.update(_stats(cells))
    return row


def node_minute_rows(
    cluster: str,
    node: str,
    node_id: str,
    minute_ms: int,
    windows: Mapping[tuple[str, int | None], DeviceWindow],
    intervals: list[Interval],
    table: AllocationTable,
    directory: DeviceDirectory,
    thresholds: Thresholds,
) -> list[dict[str, Any]]:
    """DeviceMinute rows of one node for one closed minute.

    One row per (device, job) for every allocation interval overlapping the minute (all-dark when the
    device sent nothing), and one unallocated row per device with telemetry outside any allocation. A GPU
    whose MIG instances report in the minute is not a device of its own: no job can hold it whole.
    """
    rows: list[dict[str, Any]] = []
    lo_s = minute_ms // 1000
    matched: set[int] = set()  # places in `intervals` of those a window matched (by their device)
    in_mig_mode = {uuid for uuid, mig in windows if mig is not None}
    # The intervals by the device UUID they name (the rest, by index or by neither, are matched one by one),
    # each with its place in `intervals` so a device's intervals keep their order.
    by_uuid: dict[tuple[str, int | None], list[tuple[int, Interval]]] = {}
    by_index: list[tuple[int, Interval]] = []
    for n, iv in enumerate(intervals):
        if iv.ref.uuid is not None:
            by_uuid.setdefault((iv.ref.uuid, iv.ref.mig_instance_id), []).append((n, iv))
        else:
            by_index.append((n, iv))
    for (uuid, mig), win in windows.items():
        placed = by_uuid.get((uuid, mig), [])
        if by_index:
            also = [p for p in by_index if p[1].ref.matches(uuid, win.index, mig)]
            if also:
                placed = sorted(placed + also, key=itemgetter(0))
        if not placed and mig is None and uuid in in_mig_mode:
            continue  # a MIG-mode GPU's own series (board metrics): its instances are the devices, not it
        ivs = []
        for n, iv in placed:
            matched.add(n)
            ivs.append(iv)
        facts = directory.facts(node_id, uuid, win.index, mig, win.model, win.mig_profile)
        if len(ivs) == 1:  # the common case: one job, the whole minute or a span of it
            iv = ivs[0]
            a, b = seconds_span(iv, lo_s, lo_s + 60)
            i0, i1 = a - lo_s, b - lo_s
            base = _row(cluster, node, facts, mig, minute_ms, table.job(iv.job_id), win.mapping, thresholds)
            rows.append(span_row(base, win, i0, i1, thresholds))
            if i0 > 0 or i1 < 60:
                secs = win.secs
                cells = [secs[s] for s in sorted(secs) if not a <= s < b and lo_s <= s < lo_s + 60]
                if cells:
                    rows.append(_unallocated_row(cluster, node, facts, mig, minute_ms, win.mapping, cells, thresholds))
            continue
        secs = win.secs
        owners = owners_by_second(ivs, minute_ms)
        for job_id in sorted({iv.job_id for iv in ivs}):
            base = _row(cluster, node, facts, mig, minute_ms, table.job(job_id), win.mapping, thresholds)
            rows.append(allocated_row(base, owners.get(job_id, set()), secs, thresholds))
        owned = set().union(*owners.values()) if owners else set()
        cells = [secs[s] for s in sorted(secs) if s not in owned and lo_s <= s < lo_s + 60]
        if cells:
            rows.append(_unallocated_row(cluster, node, facts, mig, minute_ms, win.mapping, cells, thresholds))
    # Intervals no sample matched: all-dark rows. Unidentified devices of two jobs are two devices (slot K of
    # one pod is not slot K of another), so they never compete for a second.
    by_ref: dict[tuple[DeviceRef, str], list[Interval]] = {}
    for n, iv in enumerate(intervals):
        if n not in matched:
            by_ref.setdefault((iv.ref, iv.job_id if iv.ref.unidentified else ""), []).append(iv)
    for ref, holder in sorted(by_ref, key=lambda k: (k[0].sort_key, k[1])):
        ivs = by_ref[(ref, holder)]
        facts = directory.facts_for_ref(node_id, ref)
        owners = owners_by_second(ivs, minute_ms)
        for job_id in sorted({iv.job_id for iv in ivs}):
            base = _row(cluster, node, facts, ref.mig_instance_id, minute_ms, table.job(job_id), "", thresholds)
            rows.append(allocated_row(base, owners.get(job_id, set()), {}, thresholds))
    # Each job's row count here travels with its rows: the job stage holds the job's minute until it has them
    # all, even when its own allocation table is behind (an UPDATED naming more devices not read yet there).
    # (`device_row_key` but the node, the same for every row here)
    keys_of_job: dict[str, set[tuple[str, int | None]]] = {}
    for r in rows:
        if r["job_id"] is not None:
            keys_of_job.setdefault(r["job_id"], set()).add((r["device_uuid"], r["mig_instance_id"]))
    for r in rows:
        if r["job_id"] is not None:
            r["job_node_rows"] = len(keys_of_job[r["job_id"]])
    rows.sort(
        key=lambda r: (
            r["device_uuid"],
            -1 if r["mig_instance_id"] is None else r["mig_instance_id"],
            r["job_id"] or "",
        )
    )
    return rows


# ---------------------------------------------------------------------------------------------------
# Job-minutes: the job stage collects a job's device-minutes (from every node) and emits the sum once
# every device the allocation says was held in that minute has reported its row.

SUM_FIELDS = ("allocated_s", "active_s", "starved_s", "idle_s", "dark_s", "sample_count")


def device_row_key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    mig = row.get("mig_instance_id")
    return (row["node"], row["device_uuid"], -1 if mig is None else mig)


def job_minute(info: JobInfo, minute_ms: int, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Sum a job's device-minutes (all devices, all nodes) into one JobMinute."""
    ordered = sorted(rows, key=device_row_key)
    out: dict[str, Any] = {
        "cluster": info.cluster,
        "job_id": info.job_id,
        "minute_start_ms": minute_ms,
        "device_count": len(ordered),
        "generation": min((r["generation"] for r in ordered), default="unknown"),
        "user": info.user,
        "project": info.project,
        "team": info.team,
        "cost_centre": info.cost_centre,
        "preemptible": info.preemptible,
        "pricing_tier": info.pricing_tier,
    }
    for f in SUM_FIELDS:
        out[f] = sum(int(r[f]) for r in ordered)
    sm = 0.0
    for r in ordered:
        sm += float(r["sm_weighted_s"])
    out["sm_weighted_s"] = sm
    measured = out["active_s"] + out["starved_s"] + out["idle_s"]
    out["activity_mean_ratio"] = sm / measured if measured else None
    maxes = [r["activity_max_ratio"] for r in ordered if r["activity_max_ratio"] is not None]
    out["activity_max_ratio"] = max(maxes) if maxes else None
    fbs = [r["fb_used_mib_max"] for r in ordered if r["fb_used_mib_max"] is not None]
    out["fb_used_mib_max"] = max(fbs) if fbs else None
    pw = [
        (r["power_w_mean"], r["sample_count"]) for r in ordered if r["power_w_mean"] is not None and r["sample_count"]
    ]
    weight = sum(n for _, n in pw)
    out["power_w_mean"] = (sum(p * n for p, n in pw) / weight) if weight else None
    out["mapping_version"] = ",".join(sorted({v for r in ordered for v in r["mapping_version"].split(",") if v}))
    out["classifier_version"] = ",".join(sorted({r["classifier_version"] for r in ordered})) or "c1"
    return out
