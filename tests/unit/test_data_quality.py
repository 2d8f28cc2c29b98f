"""The data-quality figure (sinks/data_quality.py `figure`), worked by hand over a few jobs."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

from sinks.data_quality import DQ_COLUMNS, DataQuality, JobFacts, Tally, figure, frozen_figure

# allocated, dark, unpriced, unknown MIG, unidentified seconds; project source; claimed
JOBS = [
    JobFacts(7200, 720, 0, 0, 0, "EXPLICIT", False),  # 2 GPU-h, a tenth dark
    JobFacts(3600, 3600, 0, 0, 3600, "DEFAULT", False),  # 1 GPU-h on an unidentified device: all dark
    JobFacts(1800, 0, 1800, 1800, 0, "EXPLICIT", True),  # a MIG slice of unknown profile; named a foreign project
    JobFacts(5400, 0, 0, 0, 0, "MISSING", False),
]


def test_figure_by_hand() -> None:
    # allocated 18,000 s; dark 4,320 -> coverage 13,680 / 18,000 = 76.0%; default 3,600 / 18,000 = 20.0%;
    # claimed 1,800 / 18,000 = 10.0%; unidentified 1 GPU-h in one job; unpriced 0.5 GPU-h, all unknown MIG.
    assert figure("2026-11", JOBS) == DataQuality(
        scope="2026-11", jobs=4, coverage_pct=76.0, unidentified_gpu_h=Decimal("1.000"), unidentified_jobs=1,
        default_project_pct=20.0, claimed_project_pct=10.0, unpriced_gpu_h=Decimal("0.500"),
        unknown_mig_gpu_h=Decimal("0.500"),
    )  # fmt: skip


def test_no_jobs_is_no_coverage_and_no_shares() -> None:
    empty = figure("2026-12", [])
    assert (empty.jobs, empty.coverage_pct, empty.default_project_pct, empty.unpriced_gpu_h) == (0, 0.0, 0.0, 0)


def test_columns_and_text() -> None:
    dq = figure("2026-11", JOBS)
    assert tuple(dq.columns()) == DQ_COLUMNS
    assert dq.columns()["dq_coverage_pct"] == 76.0
    assert dq.text() == (
        "data quality (2026-11, 4 jobs): coverage 76.0%, unidentified devices 1.000 GPU-h (1 jobs), default project "
        "20.0%, claimed project 10.0% of allocated GPU-h, unpriced 0.500 GPU-h (0.500 on MIG slices of unknown "
        "profile)"
    )
    assert "MIG" not in figure("2026-11", JOBS[:2]).text()


def test_tallies_add_up_to_the_months_figure() -> None:
    # Each team's tally frozen on its statement; the month's figure is the figure of their sum, the same as the
    # figure over every job (percentages are not additive, the seconds are).
    vision, nlp = Tally.of(JOBS[:2]), Tally.of(JOBS[2:])
    assert (vision.jobs, vision.dark_s, vision.unidentified_s, vision.default_project_s) == (2, 4320, 3600, 3600)
    month = frozen_figure("2026-11", [vision, nlp])
    assert month == dataclasses.replace(figure("2026-11 as closed", JOBS), frozen=True)
    assert month is not None and month.frozen and month.columns()["dq_frozen"] is True
    assert "(2026-11 as closed, 4 jobs)" in month.text()


def test_no_frozen_figure_without_every_statements_tally() -> None:
    assert frozen_figure("2026-11", []) is None
    assert frozen_figure("2026-11", [Tally.of(JOBS), None]) is None  # closed before figures were frozen
    assert frozen_figure("2026-11", [Tally()]) == dataclasses.replace(figure("2026-11 as closed", []), frozen=True)
