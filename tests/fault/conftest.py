"""Fixtures of the fault suite (marker `fault`; `make fault`): one broker and one ClickHouse server for the
session, and the undisturbed run every fault's run is compared with (`baseline`, once for the session: the
replicated broker's runs must equal it too). See fault_harness.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_harness import Baseline, Stack, run_baseline


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("fault-stack")).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def baseline(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Baseline:
    """The undisturbed run, once for the session."""
    return run_baseline(stack, tmp_path_factory.mktemp("base"))
