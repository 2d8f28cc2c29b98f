"""A MIG slice's share of its GPU (schemas/mig.py) and the slice rate it is priced at (sinks/ratecard.py),
worked by hand from NVIDIA's MIG profile tables: 7 compute slices on A100/H100/H200, 4 on A30."""

from __future__ import annotations

from fractions import Fraction

import pytest

from base.errors import ParseError
from schemas.mig import MigShare, UnknownMigProfile, gpu_slices, mig_share, parse_slice_table
from sinks.ratecard import share_rate_micro

SHARES = [
    ("1g.10gb", "NVIDIA H100 80GB HBM3", 1, 7),
    ("1g.20gb", "NVIDIA H100 80GB HBM3", 1, 7),  # twice the memory, still one compute slice
    ("3g.40gb", "NVIDIA H100 80GB HBM3", 3, 7),
    ("7g.80gb", "NVIDIA H100 80GB HBM3", 7, 7),
    ("1g.5gb", "NVIDIA A100-SXM4-40GB", 1, 7),
    ("4g.20gb", "NVIDIA A100-SXM4-40GB", 4, 7),
    ("MIG 2g.35gb", "NVIDIA H200", 2, 7),
    ("1g.6gb", "NVIDIA A30", 1, 4),
    ("2g.12gb+me", "NVIDIA A30", 2, 4),
    ("4g.24gb", "NVIDIA A30", 4, 4),
    ("mig-1g.10gb", "a100", 1, 7),  # Kubernetes resource name, Slurm gres type
]


@pytest.mark.parametrize(("profile", "model", "slices", "of"), SHARES)
def test_share_is_compute_slices_over_the_gpus(profile: str, model: str, slices: int, of: int) -> None:
    share = mig_share(profile, model)
    assert share == MigShare(slices, of)
    assert share.fraction == Fraction(slices, of)


def test_a_slice_of_a_dcgm_mig_model_name_is_found() -> None:
    assert gpu_slices("NVIDIA A100-SXM4-40GB MIG 1g.5gb") == 7
    assert gpu_slices("NVIDIA A30") == 4
    assert gpu_slices("Tesla V100-SXM2-32GB") is None
    assert gpu_slices(None) is None


@pytest.mark.parametrize(
    ("profile", "model", "why"),
    [
        ("1g.10gb", "Tesla V100-SXM2-32GB", "no known MIG slice count"),  # no MIG on Volta
        ("1g.10gb", None, "no known MIG slice count"),
        ("5g.50gb", "NVIDIA H100 80GB HBM3", "offers 1g, 2g, 3g, 4g, 7g instances, not 5g"),
        ("3g.18gb", "NVIDIA A30", "offers 1g, 2g, 4g instances, not 3g"),
        ("1c.3g.20gb", "NVIDIA A100-SXM4-40GB", "not of the form"),  # a compute instance shares its GPU instance
        ("", "NVIDIA H100 80GB HBM3", "not of the form"),
        ("big", "NVIDIA H100 80GB HBM3", "not of the form"),
    ],
)
def test_an_unknown_profile_is_a_clear_error(profile: str, model: str | None, why: str) -> None:
    with pytest.raises(UnknownMigProfile, match=why):
        mig_share(profile, model)


def test_slice_table_reports_the_bad_line() -> None:
    with pytest.raises(ParseError, match=r"t.csv:3: .*slices one of \[4, 7\]"):
        parse_slice_table("token,compute_slices\nA100,7\nX9,5\n", "t.csv")
    with pytest.raises(ParseError, match="header"):
        parse_slice_table("model,slices\n", "t.csv")


# Rates in micro-dollars per GPU-hour (the shipped card, 2026-11-01): hopper on-prem 1,631,018; ampere on-prem
# 752,878; hopper cloud on-demand 6,980,000. A slice's rate = rate x slices / of, half-up to the micro-dollar.
@pytest.mark.parametrize(
    ("rate", "slices", "of", "slice_rate"),
    [
        (1_631_018, 1, 7, 233_003),  # 233,002.571... -> up
        (1_631_018, 3, 7, 699_008),  # 699,007.714...
        (1_631_018, 7, 7, 1_631_018),  # the whole GPU as 7 slices is the whole rate
        (752_878, 1, 4, 188_220),  # 188,219.5: a tie rounds half-up
        (752_878, 2, 4, 376_439),
        (6_980_000, 1, 7, 997_143),  # 997,142.857...: cloud slices at the provider's price, never on-prem's
        (1_631_018, 0, 1, 0),  # a slice whose share is unknown: unpriced
    ],
)
def test_slice_rate_by_hand(rate: int, slices: int, of: int, slice_rate: int) -> None:
    assert share_rate_micro(rate, slices, of) == slice_rate


def test_slice_rate_rejects_an_impossible_share() -> None:
    with pytest.raises(ValueError, match="slices of 7"):
        share_rate_micro(1_000_000, 8, 7)


def test_the_rollup_prices_a_device_at_its_share() -> None:
    from processors.rollup import UNKNOWN_SHARE, WHOLE_GPU, gpu_share

    h100 = "NVIDIA H100 80GB HBM3"
    assert gpu_share(None, None, h100) == WHOLE_GPU == (1, 1)  # a whole GPU, whatever its model
    assert gpu_share(None, "1g.10gb", h100) == (1, 1)  # no MIG instance: a stray profile label changes nothing
    assert gpu_share(1, "1g.10gb", h100) == (1, 7)
    assert gpu_share(2, "3g.40gb", h100) == (3, 7)
    assert gpu_share(1, "2g.12gb", "NVIDIA A30") == (2, 4)
    # A slice whose share cannot be derived is 0 of 1: unpriced, never billed as a whole GPU.
    assert gpu_share(3, "9g.99gb", h100) == UNKNOWN_SHARE == (0, 1)
    assert gpu_share(3, None, h100) == (0, 1)  # no source named its profile
    assert gpu_share(3, "1g.10gb", "Tesla V100-SXM2-32GB") == (0, 1)
