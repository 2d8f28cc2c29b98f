"""Devices of unknown identity in the data-quality figure (issue 18), end to end without Kafka: the worked
ledger of tests/unit/test_attribution_unidentified.py through the processors, its device-minutes written by
the sinks' own writer into the embedded ClickHouse, read back by `report chargeback`'s data-quality query.
P1 4 x 120 s, P2 2 x 30 s, P3 2 x 60 s on unidentified devices: 660 device-seconds of 3 jobs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from unit.test_attribution_unidentified import records

from base.processor_settings import ProcessorSettings
from processors.attribution import UNIDENTIFIED
from processors.pipeline import run_in_memory
from schemas import topics
from sinks.chargeback import UNIDENTIFIED_PREFIX, Unidentified, unidentified
from sinks.rows import SINKS
from sinks.writer import LedgerWriter, Origin, Pending

pytestmark = pytest.mark.integration


@pytest.fixture
def client(ledger_client: Any) -> Any:
    return ledger_client


def test_unidentified_device_hours_are_reported(client: Any) -> None:
    assert UNIDENTIFIED_PREFIX == UNIDENTIFIED  # the sinks read what the processors write
    rows = run_in_memory(records(), ProcessorSettings()).device_minutes
    (sink,) = SINKS[topics.DEVICE_MINUTES.name]
    pending = [Pending(sink, row, Origin("m", 0, i)) for i, r in enumerate(rows) for row in sink.rows(r)]
    assert not LedgerWriter(client).write(pending).rejected
    assert unidentified(client, "2026-03") == Unidentified(Decimal(660 * 1000 // 3600) / 1000, 3)
    assert unidentified(client, "2026-04") == Unidentified(Decimal("0.000"), 0)
