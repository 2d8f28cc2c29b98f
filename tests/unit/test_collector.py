"""`base.collector.collector_paused`: the cyclic collector off for the block, then as it was."""

from __future__ import annotations

import gc

import pytest

from base.collector import collector_paused


def test_the_collector_is_off_in_the_block_and_back_after_it_even_on_an_error() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_callers_own_disable_stands() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
