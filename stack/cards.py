"""Rate cards that make a charge easy to check: `one_dollar_a_second` prices a GPU-second at exactly 1 $.

An on-prem entry of 31,536,000 $ over one year of 8,760 h, and nothing else (no power, no shared infrastructure,
every hour billable): 3,600.000000 $ a GPU-hour, so a charge is its GPU-seconds in dollars, to the cent. The live
pricing tests and the two-engine scenarios (stack/two_engines_scenarios.py, `gpuledger dev two-engines
--scenarios`) load it.
"""

from __future__ import annotations


def one_dollar_a_second(version: str, generations: tuple[str, ...] = ("hopper",), discount: str | None = None) -> str:
    """The card's TOML (sinks/ratecard.py reads it): 1 $ a GPU-second on each of `generations`; `discount` is the
    card's preemptible discount (None: none on the card, the policy's applies)."""
    head = f'card_version = "{version}"\ncurrency = "USD"\nhours_per_year = 8760\n'
    if discount is not None:
        head += f'preemptible_discount = "{discount}"\n'
    entry = """
[[onprem]]
generation = "{}"
effective_from = 2020-01-01
purchase_price_usd = "31536000"
depreciation_years = 1
power_draw_w = 0
facility_usd_per_kwh = "0"
pue = "1"
shared_infra_ratio = "0"
billable_fraction = "1"
"""
    return head + "".join(entry.format(g) for g in generations)
