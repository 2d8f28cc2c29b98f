"""`processors.whatif.run_classes` is the classifier's own answer for every job-minute: it reads signs only."""

from __future__ import annotations

import random

from processors.classify import JobMinuteClass, classify_job_minute
from processors.whatif import RUN_CODES, run_classes


def test_run_classes_agree_with_the_classifier_on_any_seconds() -> None:
    table = run_classes()
    rng = random.Random(43)
    for _ in range(20_000):
        active, starved, idle = (rng.choice((0, 0, rng.randint(1, 60 * 64))) for _ in range(3))
        bits = (active > 0) * 4 + (starved > 0) * 2 + (idle > 0)
        cls = classify_job_minute(active, starved, idle)
        assert table[bits] == RUN_CODES.get(cls, -1), (active, starved, idle)
    assert set(table) == {-1, RUN_CODES[JobMinuteClass.BUSY], RUN_CODES[JobMinuteClass.DARK]}
