"""Fixtures of the fault suite (marker `fault`; `make fault`): one broker and one ClickHouse server
for the module (the undisturbed run every fault is compared with is the `baseline` fixture of
test_fault_injection.py). See fault_harness.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fault_harness import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("fault-stack")).start()
    try:
        yield s
    finally:
        s.close()
