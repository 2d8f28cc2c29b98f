from __future__ import annotations

from processors.coverage import CoverageTracker
from processors.testing import T0, inventory
from processors.windows import DeviceWindow

S = 1000


def tracker() -> CoverageTracker:
    c = CoverageTracker(timeout_ms=30 * S)
    inv = inventory("n1", ["GPU-A", "GPU-B"])
    c.set_inventory("c1", "n1", T0, inv["devices"])
    return c


def test_gap_after_timeout_then_recovery() -> None:
    c = tracker()
    c.seen("c1", "n1", "GPU-A", 0, None, T0)
    c.seen("c1", "n1", "GPU-B", 1, None, T0)
    assert c.on_tick(T0 + 29 * S) == []
    c.seen("c1", "n1", "GPU-A", 0, None, T0 + 29 * S)
    (gap,) = c.on_tick(T0 + 30 * S)
    assert gap["kind"] == "COVERAGE_GAP" and gap["device_uuids"] == ["GPU-B"] and gap["ts_ms"] == T0 + 30 * S
    assert c.on_tick(T0 + 40 * S) == []  # raised once
    c.seen("c1", "n1", "GPU-B", 1, None, T0 + 50 * S)
    (rec,) = c.on_tick(T0 + 51 * S)
    assert rec["kind"] == "COVERAGE_RECOVERED" and rec["device_uuids"] == ["GPU-B"]


def test_never_reporting_device_counts_from_inventory_time() -> None:
    c = tracker()
    c.seen("c1", "n1", "GPU-A", 0, None, T0 + 31 * S)
    (gap,) = c.on_tick(T0 + 31 * S)
    assert gap["device_uuids"] == ["GPU-B"]


def test_unknown_device_flagged_once() -> None:
    c = tracker()
    for dev in ("GPU-A", "GPU-B", "GPU-X"):
        c.seen("c1", "n1", dev, 9 if dev == "GPU-X" else 0, None, T0)
    (unk,) = c.on_tick(T0 + S)
    assert unk["kind"] == "UNKNOWN_DEVICE" and unk["device_uuids"] == ["GPU-X"]
    assert c.on_tick(T0 + 2 * S) == []


def test_coverage_minute_counts_expected_device_seconds() -> None:
    c = tracker()
    wins = {
        ("GPU-A", None): DeviceWindow(0, None, {s: (0.5, 1.0, 1.0) for s in range(60)}),
        ("GPU-X", None): DeviceWindow(7, None, {0: (0.5, 1.0, 1.0)}),
    }
    row = c.minute("c1", "n1", T0, wins)
    assert row == {
        "cluster": "c1",
        "node": "n1",
        "minute_start_ms": T0,
        "expected_devices": 2,
        "reporting_devices": 1,
        "expected_device_s": 120,
        "reporting_device_s": 60,
        "unexpected_devices": 1,
    }


def test_ticks_every_second_raise_each_gap_at_its_first_due_tick_and_skip_quiet_nodes() -> None:
    """Nodes are rescanned only when a device could be due (last-seen only grows), yet each gap is
    raised at the first tick at or after last seen + timeout, and recoveries on the next tick."""
    c = tracker()
    scans = 0
    real = c._last_seen

    def counting(node: str, exp: object) -> int | None:
        nonlocal scans
        scans += 1
        return real(node, exp)  # type: ignore[arg-type]

    c._last_seen = counting  # type: ignore[method-assign]
    raised: dict[int, list[str]] = {}
    for t in range(0, 120):
        now = T0 + t * S
        c.seen("c1", "n1", "GPU-A", 0, None, now)
        if t < 10 or t >= 80:
            c.seen("c1", "n1", "GPU-B", 1, None, now)  # B is silent from 10 s to 80 s
        for alert in c.on_tick(now):
            raised.setdefault(t, []).append(alert["kind"])
    assert raised == {39: ["COVERAGE_GAP"], 80: ["COVERAGE_RECOVERED"]}
    # without the skip: 2 devices x 120 ticks; with it, every tick only while B's gap is open
    assert scans < 2 * 120 * 0.6, scans
