"""Fixtures of the fault suite at scale (marker `fault_scale`; `make fault-scale`): a three-node broker and one
ClickHouse server for the session, the recorded fleet, and the undisturbed run at scale every scenario's run is
compared with (`scale_baseline`). See scale_harness.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_harness import Baseline, ReplicatedStack, finish_and_read, log
from scale_harness import Recording, ScaleRun, record


@pytest.fixture(scope="session")
def scale_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedStack]:
    s = ReplicatedStack(tmp_path_factory.mktemp("fault-scale-stack")).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def recording() -> Recording:
    rec = record()
    made = f"made in {rec.simulator_cpu_s:.0f} CPU s" if rec.simulator_cpu_s else "from the cache"
    log(f"recording: {rec.records:,} records ({rec.scrapes:,} node scrapes) over {len(rec.seconds)} s, {made}")
    return rec


@pytest.fixture(scope="session")
def scale_baseline(scale_stack: ReplicatedStack, recording: Recording, tmp_path_factory: pytest.TempPathFactory
                   ) -> Baseline:  # fmt: skip
    """The undisturbed run at scale, once for the session."""
    with ScaleRun(scale_stack, "scale-base", tmp_path_factory.mktemp("scale-base"), recording) as run:
        run.start_pipeline()
        led = finish_and_read(run)
        return Baseline(led, recording.expected, recording.expected, run.dlq_counts(), run.late_count())
