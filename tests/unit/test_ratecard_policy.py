"""The rate card and the policy read one preemptible discount (policy.yaml `preemptible.discount`)."""

from __future__ import annotations

import datetime as dt
import re
import tomllib
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from base.errors import ConfigError
from sinks.ratecard import DEFAULT_CARD, ONPREM, load_card, parse_card

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = (ROOT / "deploy" / "policy.example.yaml").read_text()
DAY = dt.date(2026, 3, 1)


def test_the_policys_discount_is_the_cards(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE.replace('discount: "0.40"', 'discount: "0.25"'))
    card_text = DEFAULT_CARD.read_text().replace('preemptible_discount = "0.40"\n', "")
    card_path = tmp_path / "card.toml"
    card_path.write_text(card_text)
    card = load_card(card_path, policy)
    assert card.preemptible_discount == Decimal("0.25")
    full = card.rate_for("hopper", ONPREM, False, DAY)
    pre = card.rate_for("hopper", ONPREM, True, DAY)
    assert full is not None and pre is not None
    assert pre.per_gpu_hour == (full.per_gpu_hour * Decimal("0.75")).quantize(Decimal("0.000001"), ROUND_HALF_UP)
    assert pre.per_gpu_hour < full.per_gpu_hour
    with pytest.raises(ConfigError, match="missing 'preemptible_discount'"):
        load_card(card_path)  # without a policy the card must state it


def test_a_card_stating_another_discount_than_the_policy_is_refused(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(EXAMPLE.replace('discount: "0.40"', 'discount: "0.25"'))
    differs = re.escape("preemptible_discount 0.40 differs from the policy's preemptible.discount 0.25")
    with pytest.raises(ConfigError, match=differs):
        load_card(None, policy)
    policy.write_text(EXAMPLE)  # the shipped card and the shipped policy agree
    assert load_card(None, policy).preemptible_discount == Decimal("0.40")
    assert tomllib.loads(DEFAULT_CARD.read_text())["preemptible_discount"] == "0.40"


def test_parse_card_takes_the_policy_value_over_a_missing_one() -> None:
    data = tomllib.loads(DEFAULT_CARD.read_text())
    del data["preemptible_discount"]
    assert parse_card(data, Decimal("0.1")).preemptible_discount == Decimal("0.1")
    with pytest.raises(ConfigError, match="missing 'preemptible_discount'"):
        parse_card(data)
