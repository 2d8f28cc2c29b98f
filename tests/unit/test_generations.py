"""One generation classifier (schemas/generations.csv) for producers and processors alike."""

from __future__ import annotations

import pytest

from base.errors import ParseError
from processors import rollup
from schemas.generations import UNKNOWN, generation_of, parse_generation_table

# The four models the processors' old substring list and the producers' table disagreed on, with
# NVIDIA's architecture for each: the table was right every time (the substring list said unknown).
DISPUTED = [
    ("Tesla P100-PCIE-16GB", "pascal"),
    ("NVIDIA L20", "ada"),
    ("Quadro RTX 8000", "turing"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "blackwell"),
]

COMMON = [
    ("NVIDIA H100 80GB HBM3", "hopper"),
    ("h100", "hopper"),  # a Slurm gres type
    ("NVIDIA A100-SXM4-40GB", "ampere"),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "ampere"),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "hopper"),
    ("Tesla V100-SXM2-32GB", "volta"),
    ("Tesla T4", "turing"),
    ("NVIDIA L4", "ada"),
    ("NVIDIA L40S", "ada"),
    ("NVIDIA B200", "blackwell"),
    ("NVIDIA GH200 480GB", "hopper"),
    ("NVIDIA RTX 6000 Ada Generation", "ada"),
]


@pytest.mark.parametrize(("model", "generation"), DISPUTED + COMMON)
def test_generation_of_a_model_name(model: str, generation: str) -> None:
    assert generation_of(model) == generation


@pytest.mark.parametrize(("model", "generation"), DISPUTED + COMMON)
def test_processors_fall_back_to_the_same_table(model: str, generation: str) -> None:
    directory = rollup.DeviceDirectory()  # no inventory: the generation comes from the model name
    assert directory.generation("c1/n1", "GPU-a", 0, None, model) == generation


@pytest.mark.parametrize("model", [None, "", "Some Future Accelerator"])
def test_unknown_model(model: str | None) -> None:
    assert generation_of(model) == UNKNOWN


def test_a_bad_table_line_is_reported_with_its_line_number() -> None:
    text = "# comment\ntoken,generation\nH100,hopper\nA100\n"
    with pytest.raises(ParseError, match=r"generations.csv:4"):
        parse_generation_table(text)
