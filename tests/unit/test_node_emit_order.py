"""The node driver sends a partition's waiting rows (devices that did not compute) as soon as that partition's
minute closes, before the next partition is closed; busy rows follow every partition's, minute by minute. The job
stage takes a job's minutes in order: no row of a later minute may go ahead of a busy row of an earlier one."""

from __future__ import annotations

import io
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import fastavro

from processors.drivers.node import NodeDriver, split_by_activity
from processors.stages import NodeOutputs
from processors.testing import T0
from schemas import load_schema
from schemas.topics import JOB_DEVICE_MINUTES

M = 60_000


def _row(job: str, minute: int, active_s: int = 0, starved_s: int = 0, node: str = "n") -> dict[str, Any]:
    return {
        "cluster": "c1",
        "node": node,
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


class Codec:
    """Encodes a device-minute as "job|minute" (what these tests read back); no framing."""

    def encode(self, subject: str, row: dict[str, Any]) -> bytes:
        return f"{row['job_id']}|{(row['minute_start_ms'] - T0) // M}".encode()

    def header(self, subject: str) -> bytes:
        return b""


def _read(value: bytes) -> tuple[str, int]:
    job, minute = value.decode().split("|")
    return job, int(minute)


def _driver(
    parts: dict[int, Any], sent: list[str], minutes: list[tuple[str, int]] | None = None,
    bundled: list[tuple[str, int]] | None = None,
) -> NodeDriver:  # fmt: skip
    """A node driver over `parts`: each device-minute sent appends its job to `sent` (and (job, minute) to
    `minutes`); each row of the job stage's bundles appends (job, minute) to `bundled`, in the order sent."""
    schema = fastavro.parse_schema(load_schema(JOB_DEVICE_MINUTES.subject))

    def send_raw(topic: str, key: bytes, value: bytes) -> None:
        if topic == "dm":
            sent.append(_read(value)[0])
            if minutes is not None:
                minutes.append(_read(value))
        elif topic == "job_dm" and bundled is not None:
            bundle: Any = fastavro.schemaless_reader(io.BytesIO(value), schema)
            bundled.extend(_read(item) for item in bundle["rows"])

    driver = NodeDriver.__new__(NodeDriver)
    driver.parts = parts
    driver.watermarks = SimpleNamespace(  # type: ignore[assignment]
        compute=lambda drain_to: {p: (T0 + 3 * M, 0) for p in parts}, advanced=lambda p, w: None
    )
    driver.ctx = SimpleNamespace(  # type: ignore[assignment]
        outputs=SimpleNamespace(send_raw=send_raw, send=lambda *a: None),
        codec=Codec(),
        topics=SimpleNamespace(dm="dm", job_dm="job_dm", cov="cov"),
        stats=SimpleNamespace(device_minutes=0, job_device_minutes=0, coverage_minutes=0),
        observer=None,
        emit_alert=lambda alert, key: None,
    )
    return driver


class Part:
    """A partition whose close gives `rows` in two steps (`NodePartition.closing`): those of the nodes in
    `ahead` (rows name their node in "node"), then the rest."""

    def __init__(self, rows: list[dict[str, Any]], sent: list[str], closes: list[int]) -> None:
        self.rows, self.sent, self.closes = rows, sent, closes
        self.waiting_nodes: frozenset[str] = frozenset()

    def closing(self, w: int, ahead: frozenset[str]) -> Iterator[NodeOutputs]:
        self.closes.append(len(self.sent))  # what was sent when this partition began to close
        yield NodeOutputs(device_minutes=[r for r in self.rows if r["node"] in ahead])
        self.closes.append(len(self.sent))  # ... and when it closed the rest
        yield NodeOutputs(device_minutes=[r for r in self.rows if r["node"] not in ahead])

    def tick(self, now: int) -> list[dict[str, Any]]:
        return []


def test_each_partitions_waiting_rows_go_before_the_next_partition_closes_and_busy_rows_last() -> None:
    sent: list[str] = []
    closes: list[int] = []
    parts = {
        0: Part([_row("p0-busy", 0, active_s=60), _row("p0-idle", 0)], sent, closes),
        1: Part([_row("p1-busy", 0, starved_s=60), _row("p1-idle", 0)], sent, closes),
    }
    driver = _driver(parts, sent)
    driver.advance()
    # both first steps (empty), then partition 0's idle row went out before partition 1 closed the rest
    assert closes == [0, 0, 0, 1]
    assert sent == ["p0-idle", "p1-idle", "p0-busy", "p1-busy"]
    assert driver.ctx.stats.device_minutes == 4
    assert driver.ctx.stats.job_device_minutes == 4  # one job a row here: a bundle each


def test_a_partition_closing_several_minutes_sends_none_of_a_later_one_ahead_of_an_earlier_busy_row() -> None:
    sent: list[str] = []
    closes: list[int] = []
    # partition 0 catches up two minutes: job a busy in minute 0 and idle in minute 1 (the job stage would take
    # minute 1 for out first, and minute 0's busy row for a replay)
    parts = {
        0: Part([_row("a", 0, active_s=60), _row("c", 0), _row("a", 1), _row("c", 1)], sent, closes),
        1: Part([_row("b", 0), _row("b", 0, active_s=5)], sent, closes),
    }
    minutes: list[tuple[str, int]] = []
    bundled: list[tuple[str, int]] = []
    driver = _driver(parts, sent, minutes, bundled)
    driver.advance()
    # first the waiting rows of each partition's first minute, then minute by minute, busy rows last in each
    assert minutes == [("c", 0), ("b", 0), ("a", 0), ("b", 0), ("a", 1), ("c", 1)]
    assert bundled == minutes  # the job stage's bundles, in the same order


def test_the_nodes_that_waited_the_minute_before_go_out_of_every_partition_before_any_closes_the_rest() -> None:
    sent: list[str] = []
    closes: list[int] = []
    p0 = [_row("p0-idle", 0, node="a"), _row("p0-busy", 0, active_s=9, node="b"), _row("p0-new", 0, node="b")]
    parts = {
        0: Part(p0, sent, closes),
        1: Part([_row("p1-idle", 0, node="c"), _row("p1-busy", 0, starved_s=9, node="d")], sent, closes),
    }
    parts[0].waiting_nodes = frozenset({"a"})
    parts[1].waiting_nodes = frozenset({"c"})
    driver = _driver(parts, sent)
    driver.advance()
    # each partition's first step, then each one's rest
    assert closes == [0, 1, 2, 3]
    assert sent == ["p0-idle", "p1-idle", "p0-new", "p0-busy", "p1-busy"]


def test_a_first_step_holding_a_whole_minute_does_not_let_the_next_minutes_waiting_rows_ahead() -> None:
    sent: list[str] = []
    closes: list[int] = []
    # every node waited the minute before, so the first step holds all of minute 0; minute 1 closes too
    rows = [_row("a", 0, active_s=60), _row("c", 0), _row("a", 1, node="m"), _row("c", 1, node="m")]
    parts = {0: Part(rows, sent, closes)}
    parts[0].waiting_nodes = frozenset({"n"})
    minutes: list[tuple[str, int]] = []
    bundled: list[tuple[str, int]] = []
    driver = _driver(parts, sent, minutes, bundled)
    driver.advance()
    assert minutes == [("c", 0), ("a", 0), ("a", 1), ("c", 1)]
    assert bundled == minutes


def test_the_coverage_clocks_tick_before_the_rest_of_the_close() -> None:
    """A coverage deadline does not wait for a minute's close: every partition's clock ticks once the rows of
    the first steps are out, before any partition closes the rest."""
    sent: list[str] = []
    closes: list[int] = []
    ticked: list[int] = []
    parts = {
        0: Part([_row("p0-idle", 0, node="a"), _row("p0-busy", 0, active_s=9, node="b")], sent, closes),
        1: Part([_row("p1-idle", 0, node="c"), _row("p1-busy", 0, starved_s=9, node="d")], sent, closes),
    }
    for part in parts.values():
        part.waiting_nodes = frozenset({"a", "c"})
        part.tick = lambda now: ticked.append(len(sent)) or []  # type: ignore[method-assign]
    driver = _driver(parts, sent)
    driver.advance()
    assert ticked == [2, 2]  # after both first steps' rows, before the rest
    assert closes == [0, 1, 2, 2]
    assert sent == ["p0-idle", "p1-idle", "p0-busy", "p1-busy"]
