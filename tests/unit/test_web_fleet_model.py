"""The fleet page's view model (web/fleet.py): a worked fleet asserted exactly, no services."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from web import fleet
from web.fleet import FleetDay, FleetUsage, QueueWait

H = 3600
D1, D2 = dt.date(2026, 3, 1), dt.date(2026, 3, 2)


def test_share_allocated_uses_the_inventory_else_every_device_seen() -> None:
    # Day 1: 10 GPUs in the inventory (240 GPU-h), 9 reported; jobs held 120 GPU-h, 90 of them computed.
    one = FleetDay(D1, active_s=80 * H, starved_s=10 * H, idle_s=24 * H, dark_s=6 * H, unallocated_s=96 * H,
                   inventory_s=240 * H, reporting_s=216 * H)  # fmt: skip
    # Day 2: no inventory reported: the fleet is what was seen (allocated 10 + unallocated 30 GPU-h).
    two = FleetDay(D2, active_s=5 * H, starved_s=0, idle_s=5 * H, dark_s=0, unallocated_s=30 * H, inventory_s=0,
                   reporting_s=0)  # fmt: skip
    rows = fleet.trend([one, two])
    assert rows[0] == {
        "day": D1, "fleet_gpu_h": Decimal("240.0000"), "allocated_gpu_h": Decimal("120.0000"),
        "allocated_share_pct": 50.0, "consumed_gpu_h": Decimal("90.0000"), "utilisation_pct": 75.0,
        "idle_gpu_h": Decimal("24.0000"), "dark_gpu_h": Decimal("6.0000"), "reporting_pct": 90.0,
    }  # fmt: skip
    assert rows[1]["fleet_gpu_h"] == Decimal("40.0000") and rows[1]["allocated_share_pct"] == 25.0
    assert rows[1]["reporting_pct"] is None  # no inventory: coverage unknown, not 0 and not 100
    head = fleet.headline([one, two])
    assert head.fleet_gpu_h == Decimal("280.0000") and head.allocated_gpu_h == Decimal("130.0000")
    assert head.allocated_share_pct == round(100 * 130 / 280, 1) and head.utilisation_pct == round(100 * 95 / 130, 1)
    assert head.reporting_pct == 90.0 and head.missing_gpu_h == Decimal("24.0000")


def test_every_day_of_the_period_is_listed() -> None:
    days = fleet.days_filled([FleetDay(D2, H, 0, 0, 0, 0, 0, 0)], D1, 3)
    assert [d.day for d in days] == [D1, D2, D2 + dt.timedelta(days=1)]
    assert days[0].allocated_s == 0 and days[1].allocated_s == H
    assert [d.allocated_s for d in fleet.chart_days(days)] == [0, H, 0]


def test_generations_add_clusters_and_tiers_and_price_idle_time() -> None:
    rate = 2_000_000  # $2 per GPU-hour, in micro-dollars
    usage = [
        FleetUsage("a", "hopper", "on-prem", False, 3, 10 * H, 6 * H, 1 * H, 3 * H, 0, 10 * H * rate, 3 * H * rate, 0),
        FleetUsage("b", "hopper", "cloud-spot", True, 1, 2 * H, 1 * H, 0, 1 * H, 0, 2 * H * rate // 2,
                   1 * H * rate // 2, 0),
        FleetUsage("a", "volta", "on-prem", False, 2, 4 * H, 1 * H, 0, 3 * H, 0, 0, 0, 4 * H),
    ]  # fmt: skip
    hopper, volta = fleet.by_generation(usage)
    assert hopper == {
        "generation": "hopper", "jobs": 4, "allocated_gpu_h": Decimal("12.0000"), "consumed_gpu_h": Decimal("8.0000"),
        "utilisation_pct": round(100 * 8 / 12, 1), "idle_gpu_h": Decimal("4.0000"), "idle_cost": Decimal("7.00"),
        "charge": Decimal("22.00"), "unpriced_gpu_h": Decimal("0.0000"),
    }  # fmt: skip
    assert volta["charge"] == Decimal("0.00") and volta["unpriced_gpu_h"] == Decimal("4.0000")
    (only,) = fleet.unpriced(usage)
    assert (only["cluster"], only["generation"], only["unpriced_gpu_h"], only["unpriced_pct"]) == (
        "a", "volta", Decimal("4.0000"), 100.0)


def test_coverage_gaps_largest_first_and_complete_nodes_left_out() -> None:
    rows = fleet.coverage_gaps([("c", "n1", 8 * H, 7 * H), ("c", "n2", 8 * H, 8 * H), ("c", "n3", 8 * H, 2 * H)])
    assert [(r["node"], r["missing_gpu_h"], r["coverage_pct"]) for r in rows] == [
        ("n3", Decimal("6.0000"), 25.0), ("n1", Decimal("1.0000"), 87.5)]


def test_queue_waits_in_minutes() -> None:
    (row,) = fleet.queue([QueueWait("hopper", "on-prem", 4, 90_000, 600_000, 3_600_000, 4_200_000)])
    assert row == {"generation": "hopper", "pricing_tier": "on-prem", "jobs": 4, "wait_p50_min": Decimal("1.5"),
                   "wait_p90_min": Decimal("10.0"), "wait_max_min": Decimal("60.0"),
                   "wait_mean_min": Decimal("17.5")}  # fmt: skip
