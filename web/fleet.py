"""The fleet page's view model (operators and finance): pure functions from query rows to tables.

No web framework, no ClickHouse client. The teams side by side are the lines of `report chargeback --by
team` (the warehouse's statements); everything else sums the same rollups the report reads:

- *fleet device-seconds* of a day: the inventory's device-seconds (coverage_daily, what the node
  inventory says is installed) where the inventory reported, else the device-seconds seen at all
  (allocated + unallocated telemetry): the denominator of "share of the fleet allocated";
- *consumed / allocated*: active + starved over allocated GPU-seconds, the capital request's one number;
- *coverage gap*: inventory device-seconds with no telemetry (devices present but not reporting);
- *queue wait*: per job that started in the period, start minus submit (the job events' own times).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from web.model import Column, Day, gpu_h, money, pct, utc_minute


@dataclass(frozen=True, slots=True)
class FleetDay:
    day: dt.date
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    unallocated_s: int  # telemetry of devices no job held
    inventory_s: int  # device-seconds the node inventory expected (0: no inventory reported)
    reporting_s: int  # of those, device-seconds that reported telemetry

    @property
    def allocated_s(self) -> int:
        return self.active_s + self.starved_s + self.idle_s + self.dark_s

    @property
    def consumed_s(self) -> int:
        return self.active_s + self.starved_s

    @property
    def fleet_s(self) -> int:
        """The fleet's device-seconds that day: the inventory's, else every device seen."""
        return self.inventory_s or self.allocated_s + self.unallocated_s


@dataclass(frozen=True, slots=True)
class FleetUsage:
    """Priced usage of one (cluster, generation, tier, preemptible) in the period."""

    cluster: str
    generation: str
    pricing_tier: str
    preemptible: bool
    jobs: int
    allocated_s: int
    active_s: int
    starved_s: int
    idle_s: int
    dark_s: int
    charge_num: int
    idle_charge_num: int
    unpriced_s: int


@dataclass(frozen=True, slots=True)
class QueueWait:
    """Jobs of one generation and tier that started in the period, and their waits from submit to start."""

    generation: str
    pricing_tier: str
    jobs: int
    p50_ms: int
    p90_ms: int
    max_ms: int
    total_ms: int


def minutes(ms: int) -> Decimal:
    return (Decimal(int(ms)) / 60_000).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)


def days_filled(rows: Iterable[FleetDay], start: dt.date, days: int) -> list[FleetDay]:
    """Every day of the period, a day with no row as zeros."""
    by_day = {r.day: r for r in rows}
    return [by_day.get(d, FleetDay(d, 0, 0, 0, 0, 0, 0, 0))
            for d in (start + dt.timedelta(days=i) for i in range(days))]  # fmt: skip


def chart_days(days: Sequence[FleetDay]) -> list[Day]:
    return [Day(d.day, d.active_s, d.starved_s, d.idle_s, d.dark_s) for d in days]


TREND_COLUMNS = (
    Column("day", "day"), Column("fleet_gpu_h", "fleet GPU-h", "gpu_h"),
    Column("allocated_gpu_h", "allocated GPU-h", "gpu_h"), Column("allocated_share_pct", "share allocated %", "pct"),
    Column("consumed_gpu_h", "consumed GPU-h", "gpu_h"), Column("utilisation_pct", "consumed / allocated %", "pct"),
    Column("idle_gpu_h", "idle GPU-h", "gpu_h"), Column("dark_gpu_h", "dark GPU-h", "gpu_h"),
    Column("reporting_pct", "inventory reporting %", "pct"),
)  # fmt: skip


def trend(days: Iterable[FleetDay]) -> list[dict[str, Any]]:
    """Per day: the fleet's size, the share of it allocated, and how much of the allocation computed."""
    return [{
        "day": d.day, "fleet_gpu_h": gpu_h(d.fleet_s), "allocated_gpu_h": gpu_h(d.allocated_s),
        "allocated_share_pct": pct(d.allocated_s, d.fleet_s), "consumed_gpu_h": gpu_h(d.consumed_s),
        "utilisation_pct": pct(d.consumed_s, d.allocated_s), "idle_gpu_h": gpu_h(d.idle_s),
        "dark_gpu_h": gpu_h(d.dark_s), "reporting_pct": pct(d.reporting_s, d.inventory_s),
    } for d in days]  # fmt: skip


CAPACITY_COLUMNS = (
    Column("generation", "generation"), Column("jobs", "jobs", "int"),
    Column("allocated_gpu_h", "allocated GPU-h", "gpu_h"), Column("consumed_gpu_h", "consumed GPU-h", "gpu_h"),
    Column("utilisation_pct", "consumed / allocated %", "pct"), Column("idle_gpu_h", "idle GPU-h", "gpu_h"),
    Column("idle_cost", "idle cost", "money"), Column("charge", "charge", "money"),
    Column("unpriced_gpu_h", "unpriced GPU-h", "gpu_h"),
)  # fmt: skip


def by_generation(usage: Iterable[FleetUsage]) -> list[dict[str, Any]]:
    """Per generation: allocated vs consumed and what its idle time cost (every cluster and tier); charge
    and idle cost half-up to the cent per generation (informational: the statements are per team)."""
    sums: dict[str, dict[str, int]] = {}
    for u in usage:
        s = sums.setdefault(u.generation, dict.fromkeys(("jobs", "alloc", "cons", "idle", "num", "idle_num", "unp"), 0))
        s["jobs"] += u.jobs
        s["alloc"] += u.allocated_s
        s["cons"] += u.active_s + u.starved_s
        s["idle"] += u.idle_s
        s["num"] += u.charge_num
        s["idle_num"] += u.idle_charge_num
        s["unp"] += u.unpriced_s
    return [{
        "generation": g, "jobs": s["jobs"], "allocated_gpu_h": gpu_h(s["alloc"]), "consumed_gpu_h": gpu_h(s["cons"]),
        "utilisation_pct": pct(s["cons"], s["alloc"]), "idle_gpu_h": gpu_h(s["idle"]),
        "idle_cost": money(s["idle_num"]), "charge": money(s["num"]), "unpriced_gpu_h": gpu_h(s["unp"]),
    } for g, s in sorted(sums.items(), key=lambda kv: (-kv[1]["alloc"], kv[0]))]  # fmt: skip


UNPRICED_COLUMNS = (
    Column("cluster", "cluster"), Column("generation", "generation"), Column("pricing_tier", "tier"),
    Column("preemptible", "preemptible"), Column("jobs", "jobs", "int"),
    Column("unpriced_gpu_h", "unpriced GPU-h", "gpu_h"), Column("unpriced_pct", "share of its hours %", "pct"),
)  # fmt: skip


def unpriced(usage: Iterable[FleetUsage]) -> list[dict[str, Any]]:
    """Where allocated hours found no rate on the card (they are charged nothing until one is added)."""
    rows: list[dict[str, Any]] = [{
        "cluster": u.cluster, "generation": u.generation, "pricing_tier": u.pricing_tier,
        "preemptible": u.preemptible, "jobs": u.jobs, "unpriced_gpu_h": gpu_h(u.unpriced_s),
        "unpriced_pct": pct(u.unpriced_s, u.allocated_s), "_s": u.unpriced_s,
    } for u in usage if u.unpriced_s > 0]  # fmt: skip
    rows.sort(key=lambda r: (-r["_s"], r["cluster"], r["generation"], r["pricing_tier"]))
    return rows


COVERAGE_COLUMNS = (
    Column("cluster", "cluster"), Column("node", "node"), Column("expected_gpu_h", "inventory GPU-h", "gpu_h"),
    Column("reporting_gpu_h", "reporting GPU-h", "gpu_h"), Column("missing_gpu_h", "not reporting GPU-h", "gpu_h"),
    Column("coverage_pct", "reporting %", "pct"),
)  # fmt: skip


def coverage_gaps(gaps: Iterable[tuple[str, str, int, int]]) -> list[dict[str, Any]]:
    """Nodes with devices present in the inventory but not reporting, the largest gap first."""
    rows: list[dict[str, Any]] = [{
        "cluster": c, "node": n, "expected_gpu_h": gpu_h(e), "reporting_gpu_h": gpu_h(r),
        "missing_gpu_h": gpu_h(e - r), "coverage_pct": pct(r, e), "_missing": e - r,
    } for c, n, e, r in gaps if r < e]  # fmt: skip
    rows.sort(key=lambda row: (-row["_missing"], row["cluster"], row["node"]))
    return rows


QUEUE_COLUMNS = (
    Column("generation", "generation"), Column("pricing_tier", "tier"), Column("jobs", "jobs started", "int"),
    Column("wait_p50_min", "median wait min", "minutes"), Column("wait_p90_min", "p90 wait min", "minutes"),
    Column("wait_max_min", "longest wait min", "minutes"), Column("wait_mean_min", "mean wait min", "minutes"),
)  # fmt: skip


def queue(waits: Iterable[QueueWait]) -> list[dict[str, Any]]:
    return [{
        "generation": w.generation, "pricing_tier": w.pricing_tier, "jobs": w.jobs,
        "wait_p50_min": minutes(w.p50_ms), "wait_p90_min": minutes(w.p90_ms), "wait_max_min": minutes(w.max_ms),
        "wait_mean_min": minutes(w.total_ms // w.jobs) if w.jobs else None,
    } for w in sorted(waits, key=lambda w: (w.generation, w.pricing_tier))]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Headline:
    """The fleet's month in a few numbers."""

    fleet_gpu_h: Decimal
    allocated_gpu_h: Decimal
    allocated_share_pct: float | None  # allocated / fleet
    consumed_gpu_h: Decimal
    utilisation_pct: float | None  # consumed / allocated: the business case in a single number
    idle_gpu_h: Decimal
    reporting_pct: float | None  # inventory device-seconds that reported
    missing_gpu_h: Decimal  # inventory device-seconds that did not


def headline(days: Iterable[FleetDay]) -> Headline:
    listed = list(days)
    fleet = sum(d.fleet_s for d in listed)
    alloc = sum(d.allocated_s for d in listed)
    consumed = sum(d.consumed_s for d in listed)
    inventory = sum(d.inventory_s for d in listed)
    reporting = sum(d.reporting_s for d in listed)
    return Headline(
        fleet_gpu_h=gpu_h(fleet), allocated_gpu_h=gpu_h(alloc), allocated_share_pct=pct(alloc, fleet),
        consumed_gpu_h=gpu_h(consumed), utilisation_pct=pct(consumed, alloc),
        idle_gpu_h=gpu_h(sum(d.idle_s for d in listed)), reporting_pct=pct(reporting, inventory),
        missing_gpu_h=gpu_h(inventory - reporting),
    )  # fmt: skip


DRIFT_COLUMNS = (
    Column("cluster", "cluster"), Column("engine", "engine"), Column("since", "since (UTC)"),
    Column("differences", "differences (as policy diff prints them)"),
)  # fmt: skip


def policy_drift(latest: Iterable[tuple[str, str, str, int, list[str]]]) -> list[dict[str, Any]]:
    """The engines whose latest policy-watch alert is a drift, with each differing line; a cleared one is gone."""
    return [{"cluster": c, "engine": e, "since": utc_minute(t), "differences": "; ".join(lines)}
            for c, e, kind, t, lines in latest if kind == "POLICY_DRIFT"]  # fmt: skip


APPLY_COLUMNS = (
    Column("when", "when (UTC)"), Column("cluster", "cluster"), Column("engine", "engine"), Column("who", "who"),
    Column("changes", "changes: setting before -> after"), Column("still_differs", "still differs"),
)  # fmt: skip


def policy_applies(rows: Iterable[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Each `policy apply`, newest first: who (as the engine knows them) changed which settings, before -> after."""
    out = []
    for ts, cluster, engine, actor, source, objects, settings, before, after, still in rows:
        changes = [f"{o}{' ' + s if s else ''}: {'(none)' if b is None else b} -> {'(none)' if a is None else a}"
                   for o, s, b, a in zip(objects, settings, before, after, strict=True)]  # fmt: skip
        out.append({"when": utc_minute(int(ts)), "cluster": cluster, "engine": engine, "who": f"{actor} ({source})",
                    "changes": "; ".join(changes) or "nothing differed", "still_differs": "; ".join(still)})
    return out
