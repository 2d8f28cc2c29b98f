"""The rate card: finance inputs per accelerator generation computed into $/GPU-hour.

Pure code over plain data (no IO but `load_card`). Money is `Decimal`; a rate is rounded half-up
to the micro-dollar (millionth) per GPU-hour, and the warehouse stores that integer, so the CLI
and the SQL views charge with the same exact arithmetic:

    charge of a line = sum(allocated GPU-seconds x rate in micro-dollars) / 3.6e9, half-up to the cent.

Owned hardware (tier `on-prem`):
    capex/h  = purchase price x (1 + shared infra ratio) / (depreciation years x hours per year)
    power/h  = power draw (kW) x PUE x facility $/kWh
    rate     = (capex/h + power/h) / billable fraction
    preemptible rate = rate x (1 - preemptible discount)   (the policy's `preemptible.discount` when
                                                            settings name a policy.yaml)
Cloud burst: tier `cloud-on-demand` at the provider's on-demand price and `cloud-spot` at its spot
price, never blended with each other or with owned hardware; the preemptible discount does not
apply (spot is already the preemptible price).
"""

from __future__ import annotations

import datetime as dt
import tomllib
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from base.errors import ConfigError

ONPREM = "on-prem"
CLOUD_ON_DEMAND = "cloud-on-demand"
CLOUD_SPOT = "cloud-spot"
TIERS = (ONPREM, CLOUD_ON_DEMAND, CLOUD_SPOT)

MICRO = Decimal("0.000001")
CENT = Decimal("0.01")
SECONDS_PER_HOUR = 3600
DEFAULT_CARD = Path(__file__).with_name("ratecard.toml")


def to_micro(amount: Decimal) -> int:
    """Dollars to integer micro-dollars, half-up."""
    return int((amount / MICRO).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def charge_for_seconds(rate_seconds: list[tuple[int, int]]) -> Decimal:
    """Exact charge of (seconds, micro-dollars per GPU-hour) pairs, half-up to the cent."""
    numerator = sum(seconds * micro for seconds, micro in rate_seconds)
    return (Decimal(numerator) / Decimal(3_600_000_000)).quantize(CENT, rounding=ROUND_HALF_UP)


CENT_UNITS = 36_000_000  # one cent in (seconds x micro-dollars per hour)


def allocate_cents(numerators: dict[str, int]) -> dict[str, Decimal]:
    """Charges of report lines from their exact numerators (sum of seconds x micro-dollars/h), so
    they add up to the grand total rounded half-up: each line rounded down, the leftover cents one
    each to the largest remainders (ties by line name). The analyst view `v_chargeback` does the same."""
    total_cents = (sum(numerators.values()) + CENT_UNITS // 2) // CENT_UNITS
    floors = {line: num // CENT_UNITS for line, num in numerators.items()}
    leftover = total_cents - sum(floors.values())
    order = sorted(numerators, key=lambda line: (-(numerators[line] % CENT_UNITS), line))
    bonus = set(order[:leftover])
    return {line: (Decimal(floors[line] + (1 if line in bonus else 0)) / 100).quantize(CENT) for line in numerators}


def share_rate_micro(micro_per_gpu_hour: int, slices: int, of: int) -> int:
    """The rate of a MIG slice holding `slices` of the GPU's `of` compute slices: the GPU's rate x slices / of,
    half-up to the micro-dollar (as the preemptible rate is). `v_usage_priced` computes the same integer."""
    if of <= 0 or not 0 <= slices <= of:
        raise ValueError(f"a share is 0..{of} slices of {of}, got {slices}")
    return (micro_per_gpu_hour * slices * 2 + of) // (2 * of)


def gpu_hours(seconds: int) -> Decimal:
    return (Decimal(seconds) / SECONDS_PER_HOUR).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)


@dataclass(frozen=True, slots=True)
class Rate:
    """One priced row: a generation, tier and preemptibility from an effective date."""

    generation: str
    pricing_tier: str
    preemptible: bool
    effective_from: dt.date
    micro_per_gpu_hour: int
    steps: tuple[tuple[str, str], ...] = field(default=())  # (what, arithmetic) for `ratecard show`

    @property
    def per_gpu_hour(self) -> Decimal:
        return Decimal(self.micro_per_gpu_hour) * MICRO


@dataclass(frozen=True, slots=True)
class OnPremInputs:
    generation: str
    effective_from: dt.date
    purchase_price_usd: Decimal
    depreciation_years: Decimal
    power_draw_w: Decimal
    facility_usd_per_kwh: Decimal
    pue: Decimal
    shared_infra_ratio: Decimal
    billable_fraction: Decimal


@dataclass(frozen=True, slots=True)
class CloudInputs:
    generation: str
    effective_from: dt.date
    on_demand_usd_per_gpu_hour: Decimal
    spot_usd_per_gpu_hour: Decimal


@dataclass(frozen=True, slots=True)
class RateCard:
    version: str
    currency: str
    hours_per_year: int
    preemptible_discount: Decimal
    onprem: tuple[OnPremInputs, ...]
    cloud: tuple[CloudInputs, ...]

    def rates(self) -> list[Rate]:
        out: list[Rate] = []
        for item in self.onprem:
            out.extend(_onprem_rates(item, self.hours_per_year, self.preemptible_discount))
        for c in self.cloud:
            for tier, price in ((CLOUD_ON_DEMAND, c.on_demand_usd_per_gpu_hour), (CLOUD_SPOT, c.spot_usd_per_gpu_hour)):
                micro = to_micro(price)
                steps = ((f"{tier} price", f"provider list price {price} $/GPU-h (not blended)"),)
                for preemptible in (False, True):
                    out.append(Rate(c.generation, tier, preemptible, c.effective_from, micro, steps))
        out.sort(key=lambda r: (r.generation, r.pricing_tier, r.preemptible, r.effective_from))
        return out

    def rate_for(self, generation: str, pricing_tier: str, preemptible: bool, day: dt.date) -> Rate | None:
        """The rate in force on `day`: the latest effective date on or before it."""
        best: Rate | None = None
        for rate in self.rates():
            if (rate.generation, rate.pricing_tier, rate.preemptible) != (generation, pricing_tier, preemptible):
                continue
            if rate.effective_from <= day and (best is None or rate.effective_from > best.effective_from):
                best = rate
        return best


def _q(value: Decimal, places: str = "0.000001") -> str:
    return str(value.quantize(Decimal(places), rounding=ROUND_HALF_UP))


def _onprem_rates(item: OnPremInputs, hours_per_year: int, discount: Decimal) -> list[Rate]:
    hours = item.depreciation_years * hours_per_year
    capex = item.purchase_price_usd * (1 + item.shared_infra_ratio)
    capex_h = capex / hours
    kw = item.power_draw_w / 1000
    power_h = kw * item.pue * item.facility_usd_per_kwh
    cost_h = capex_h + power_h
    base = cost_h / item.billable_fraction
    base_micro = to_micro(base)
    steps = (
        (
            "capex/h",
            f"{item.purchase_price_usd} x (1 + {item.shared_infra_ratio}) / ({item.depreciation_years} y x "
            f"{hours_per_year} h) = {_q(capex_h)}",
        ),
        ("power/h", f"{kw} kW x PUE {item.pue} x {item.facility_usd_per_kwh} $/kWh = {_q(power_h)}"),
        ("cost/h", f"{_q(capex_h)} + {_q(power_h)} = {_q(cost_h)}"),
        ("rate", f"{_q(cost_h)} / billable {item.billable_fraction} = {_q(base)} -> {Decimal(base_micro) * MICRO}"),
    )
    pre = Decimal(base_micro) * MICRO * (1 - discount)
    pre_micro = to_micro(pre)
    pre_steps = (
        *steps,
        ("preemptible", f"{Decimal(base_micro) * MICRO} x (1 - {discount}) = {Decimal(pre_micro) * MICRO}"),
    )
    return [
        Rate(item.generation, ONPREM, False, item.effective_from, base_micro, steps),
        Rate(item.generation, ONPREM, True, item.effective_from, pre_micro, pre_steps),
    ]


def _dec(entry: dict[str, Any], key: str, where: str, *, positive: bool = True) -> Decimal:
    if key not in entry:
        raise ConfigError(f"rate card {where}: missing {key!r}")
    raw = entry[key]
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ConfigError(f"rate card {where}: {key} must be a number, got {raw!r}")
    try:
        value = Decimal(str(raw))
    except InvalidOperation as exc:
        raise ConfigError(f"rate card {where}: {key} is not a number: {raw!r}") from exc
    if positive and value <= 0:
        raise ConfigError(f"rate card {where}: {key} must be positive, got {raw!r}")
    return value


def _date(entry: dict[str, Any], where: str) -> dt.date:
    raw = entry.get("effective_from")
    if isinstance(raw, dt.datetime):
        return raw.date()
    if isinstance(raw, dt.date):
        return raw
    if isinstance(raw, str):
        try:
            return dt.date.fromisoformat(raw)
        except ValueError as exc:
            raise ConfigError(f"rate card {where}: effective_from is not a date: {raw!r}") from exc
    raise ConfigError(f"rate card {where}: missing effective_from")


def _entry_generation(section: str, i: int, entry: dict[str, Any]) -> tuple[str, str]:
    """Where an entry is (for messages) and its generation, which every entry must name."""
    where = f"{section}[{i}] ({entry.get('generation', '?')})"
    generation = str(entry.get("generation") or "")
    if not generation:
        raise ConfigError(f"rate card {where}: missing generation")
    return where, generation


def _discount(data: dict[str, Any], policy_discount: Decimal | None) -> Decimal:
    """The preemptible discount: the policy's (policy.yaml `preemptible.discount`) when there is a policy,
    the card's own otherwise. A card that states one too must state the same value."""
    if policy_discount is None:
        return _dec(data, "preemptible_discount", "top level", positive=False)
    if "preemptible_discount" in data:
        own = _dec(data, "preemptible_discount", "top level", positive=False)
        if own != policy_discount:
            raise ConfigError(f"rate card: preemptible_discount {own} differs from the policy's preemptible.discount "
                              f"{policy_discount}; state it once, in the policy")  # fmt: skip
    return policy_discount


def parse_card(data: dict[str, Any], policy_discount: Decimal | None = None) -> RateCard:
    """Validate the card's plain data (as read from TOML) into a `RateCard`; `policy_discount`, when given,
    is the organisation policy's preemptible discount, which the card then charges."""
    discount = _discount(data, policy_discount)
    if not Decimal(0) <= discount < 1:
        raise ConfigError(f"rate card: preemptible_discount must be in [0, 1), got {discount}")
    onprem = []
    seen: set[tuple[str, str, dt.date]] = set()
    for i, entry in enumerate(data.get("onprem", [])):
        where, generation = _entry_generation("onprem", i, entry)
        item = OnPremInputs(
            generation=generation,
            effective_from=_date(entry, where),
            purchase_price_usd=_dec(entry, "purchase_price_usd", where),
            depreciation_years=_dec(entry, "depreciation_years", where),
            power_draw_w=_dec(entry, "power_draw_w", where, positive=False),
            facility_usd_per_kwh=_dec(entry, "facility_usd_per_kwh", where, positive=False),
            pue=_dec(entry, "pue", where),
            shared_infra_ratio=_dec(entry, "shared_infra_ratio", where, positive=False),
            billable_fraction=_dec(entry, "billable_fraction", where),
        )
        if item.pue < 1 or item.billable_fraction > 1:
            raise ConfigError(f"rate card {where}: PUE must be >= 1 and billable_fraction <= 1")
        key = (ONPREM, generation, item.effective_from)
        if key in seen:
            raise ConfigError(f"rate card {where}: two on-prem entries from {item.effective_from}")
        seen.add(key)
        onprem.append(item)
    cloud = []
    for i, entry in enumerate(data.get("cloud", [])):
        where, generation = _entry_generation("cloud", i, entry)
        citem = CloudInputs(
            generation=generation,
            effective_from=_date(entry, where),
            on_demand_usd_per_gpu_hour=_dec(entry, "on_demand_usd_per_gpu_hour", where),
            spot_usd_per_gpu_hour=_dec(entry, "spot_usd_per_gpu_hour", where),
        )
        key = ("cloud", generation, citem.effective_from)
        if key in seen:
            raise ConfigError(f"rate card {where}: two cloud entries from {citem.effective_from}")
        seen.add(key)
        cloud.append(citem)
    hours = data.get("hours_per_year", 8760)
    if not isinstance(hours, int) or hours <= 0:
        raise ConfigError(f"rate card: hours_per_year must be a positive integer, got {hours!r}")
    return RateCard(
        version=str(data.get("card_version", "unversioned")),
        currency=str(data.get("currency", "USD")),
        hours_per_year=hours,
        preemptible_discount=discount,
        onprem=tuple(onprem),
        cloud=tuple(cloud),
    )


def load_card(path: Path | None = None, policy_path: Path | None = None) -> RateCard:
    """The card at `path` (default: the shipped one); with `policy_path`, its preemptible discount is the
    policy's (schemas/policy.py), so the rate card and the scheduler's preemptible tier read one value."""
    target = path or DEFAULT_CARD
    policy_discount = None
    if policy_path is not None:
        from schemas.policy import load_policy

        policy = load_policy(policy_path)
        policy_discount = policy.preemptible_discount if policy.preemptible is not None else None
    try:
        with target.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"rate card file not found: {target}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"rate card {target} is not valid TOML: {exc}") from exc
    return parse_card(data, policy_discount)


RATE_CARD_COLUMNS = [
    "generation",
    "pricing_tier",
    "preemptible",
    "effective_from",
    "rate_micro_per_gpu_hour",
    "basis",
    "card_version",
    "loaded_ms",
]


def rate_card_rows(card: RateCard, loaded_ms: int) -> list[list[Any]]:
    """Rows for the warehouse's `rate_card` table (one load replaces the previous card)."""
    return [
        [
            r.generation,
            r.pricing_tier,
            r.preemptible,
            r.effective_from,
            r.micro_per_gpu_hour,
            "; ".join(f"{what}: {how}" for what, how in r.steps),
            card.version,
            loaded_ms,
        ]
        for r in card.rates()
    ]
