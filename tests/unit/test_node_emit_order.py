"""The node driver sends a partition's waiting rows (devices that did not compute) as soon as that partition's
minutes close, before the next partition is closed; busy rows follow every partition's, minute by minute."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from processors.drivers.node import NodeDriver, split_by_activity
from processors.stages import NodeOutputs
from processors.testing import T0

M = 60_000


def _row(job: str, minute: int, active_s: int = 0, starved_s: int = 0) -> dict[str, Any]:
    return {
        "cluster": "c1",
        "node": "n",
        "job_id": job,
        "minute_start_ms": T0 + minute * M,
        "active_s": active_s,
        "starved_s": starved_s,
    }


def test_rows_split_by_whether_the_device_computed_keeping_their_order() -> None:
    rows = [_row("a", 0, active_s=3), _row("b", 0), _row("c", 0, starved_s=1), _row("d", 1)]
    waiting, busy = split_by_activity(rows)
    assert [r["job_id"] for r in waiting] == ["b", "d"]
    assert [r["job_id"] for r in busy] == ["a", "c"]


def test_each_partitions_waiting_rows_go_before_the_next_partition_closes_and_busy_rows_last() -> None:
    sent: list[str] = []
    closes: list[int] = []

    class Part:
        def __init__(self, rows: list[dict[str, Any]]) -> None:
            self.rows = rows

        def advance(self, w: int) -> NodeOutputs:
            closes.append(len(sent))  # what was sent when this partition began to close
            return NodeOutputs(device_minutes=self.rows)

        def tick(self, now: int) -> list[dict[str, Any]]:
            return []

    parts = {
        0: Part([_row("p0-busy", 0, active_s=60), _row("p0-idle", 0), _row("p0-busy-m1", 1, active_s=1)]),
        1: Part([_row("p1-busy", 0, starved_s=60), _row("p1-idle", 0)]),
    }
    outputs = SimpleNamespace(send=lambda topic, subject, key, row: sent.append(row["job_id"]))
    driver = NodeDriver.__new__(NodeDriver)
    driver.parts = parts  # type: ignore[assignment]
    driver.watermarks = SimpleNamespace(  # type: ignore[assignment]
        compute=lambda drain_to: {0: (T0 + 2 * M, 0), 1: (T0 + 2 * M, 0)}, advanced=lambda p, w: None
    )
    driver.ctx = SimpleNamespace(  # type: ignore[assignment]
        outputs=outputs,
        topics=SimpleNamespace(dm="dm", cov="cov"),
        stats=SimpleNamespace(device_minutes=0, coverage_minutes=0),
        observer=None,
        emit_alert=lambda alert, key: None,
    )
    driver.advance()
    assert closes == [0, 1]  # partition 0's idle row was out before partition 1 closed
    assert sent == ["p0-idle", "p1-idle", "p0-busy", "p1-busy", "p0-busy-m1"]
    assert driver.ctx.stats.device_minutes == 5
