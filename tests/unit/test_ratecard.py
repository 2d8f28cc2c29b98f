"""Rate card: finance inputs to $/GPU-hour, exact; effective dates; preemptible; cloud never blended."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from base.errors import ConfigError
from sinks.ratecard import (
    CENT_UNITS,
    CLOUD_ON_DEMAND,
    CLOUD_SPOT,
    ONPREM,
    allocate_cents,
    charge_for_seconds,
    gpu_hours,
    load_card,
    parse_card,
    rate_card_rows,
    to_micro,
)

BASE: dict[str, Any] = {
    "card_version": "t",
    "preemptible_discount": "0.5",
    "onprem": [
        {
            "generation": "hopper", "effective_from": dt.date(2026, 1, 1), "purchase_price_usd": "35040",
            "depreciation_years": 4, "power_draw_w": 1000, "facility_usd_per_kwh": "0.10", "pue": "1.5",
            "shared_infra_ratio": "0.25", "billable_fraction": "1",
        },
        {
            "generation": "hopper", "effective_from": "2026-06-01", "purchase_price_usd": "35040",
            "depreciation_years": 4, "power_draw_w": 1000, "facility_usd_per_kwh": "0.20", "pue": "1.5",
            "shared_infra_ratio": "0.25", "billable_fraction": "0.5",
        },
    ],
    "cloud": [
        {"generation": "hopper", "effective_from": "2026-01-01", "on_demand_usd_per_gpu_hour": "7.00",
         "spot_usd_per_gpu_hour": "2.10"},
    ],
}  # fmt: skip


def test_onprem_rate_arithmetic_is_exact() -> None:
    card = parse_card(BASE)
    rate = card.rate_for("hopper", ONPREM, False, dt.date(2026, 3, 1))
    assert rate is not None
    # capex/h = 35040 x 1.25 / (4 x 8760) = 1.25; power/h = 1 kW x 1.5 x 0.10 = 0.15; / 1 -> 1.40
    assert rate.per_gpu_hour == Decimal("1.400000")
    assert [what for what, _ in rate.steps] == ["capex/h", "power/h", "cost/h", "rate"]
    assert "35040 x (1 + 0.25)" in rate.steps[0][1]


def test_effective_dates_pick_the_latest_on_or_before_the_day() -> None:
    card = parse_card(BASE)
    assert card.rate_for("hopper", ONPREM, False, dt.date(2025, 12, 31)) is None
    assert card.rate_for("hopper", ONPREM, False, dt.date(2026, 5, 31)).per_gpu_hour == Decimal("1.4")  # type: ignore[union-attr]
    later = card.rate_for("hopper", ONPREM, False, dt.date(2026, 6, 1))
    assert later is not None and later.per_gpu_hour == Decimal("3.100000")  # (1.25 + 0.30) / 0.5


def test_preemptible_discount_applies_to_owned_hardware_only() -> None:
    card = parse_card(BASE)
    day = dt.date(2026, 3, 1)
    assert card.rate_for("hopper", ONPREM, True, day).per_gpu_hour == Decimal("0.700000")  # type: ignore[union-attr]
    for pre in (False, True):
        assert card.rate_for("hopper", CLOUD_ON_DEMAND, pre, day).per_gpu_hour == Decimal("7")  # type: ignore[union-attr]
        assert card.rate_for("hopper", CLOUD_SPOT, pre, day).per_gpu_hour == Decimal("2.1")  # type: ignore[union-attr]


def test_charges_round_half_up_once_per_line() -> None:
    # 1 s at $18/h is $0.005 exactly: half-up to a cent.
    assert charge_for_seconds([(1, to_micro(Decimal(18)))]) == Decimal("0.01")
    assert charge_for_seconds([(1, to_micro(Decimal("17.99")))]) == Decimal("0.00")
    # Two segments at different rates are summed before rounding.
    assert charge_for_seconds([(1800, 978_611), (1800, 1_000_661)]) == Decimal("0.99")
    assert gpu_hours(2670) == Decimal("0.7417")
    assert to_micro(Decimal("0.7528784246")) == 752_878


def test_shipped_card_loads_and_rows_carry_the_basis() -> None:
    card = load_card()
    rows = rate_card_rows(card, 123)
    assert rows and all(r[4] > 0 and r[5] and r[7] == 123 for r in rows)
    hopper = card.rate_for("hopper", ONPREM, False, dt.date(2026, 11, 10))
    assert hopper is not None and hopper.micro_per_gpu_hour == 1_631_018


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"preemptible_discount": "1.5"}, "preemptible_discount"),
        ({"onprem": [{**BASE["onprem"][0], "pue": "0.9"}]}, "PUE"),
        ({"onprem": [{**BASE["onprem"][0], "purchase_price_usd": "abc"}]}, "not a number"),
        ({"onprem": [{**BASE["onprem"][0], "effective_from": "soon"}]}, "not a date"),
        ({"onprem": [BASE["onprem"][0], BASE["onprem"][0]]}, "two on-prem entries"),
        ({"cloud": [{"generation": "hopper", "effective_from": "2026-01-01"}]}, "missing 'on_demand"),
    ],
)
def test_bad_cards_are_refused_with_the_place(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_card({**BASE, **change})


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_card(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("card_version = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_card(bad)


def test_cent_allocation_adds_up_to_the_rounded_total() -> None:
    # Three lines of exactly 1/3 cent... x 100: each exact 33.333 cents, total 100 cents.
    third = CENT_UNITS * 100 // 3
    got = allocate_cents({"a": third, "b": third, "c": third + 1})
    assert sum(got.values()) == Decimal("1.00") and got["c"] == Decimal("0.34")
    # Half-up per line would give 0.01 + 0.01 + 0.01 = 0.03 for a total of exactly 0.015 -> 0.02.
    half = CENT_UNITS // 2
    got = allocate_cents({"x": half, "y": half // 2, "z": half // 2})
    assert sum(got.values()) == Decimal("0.01") and got["x"] == Decimal("0.01")
    assert allocate_cents({}) == {}
