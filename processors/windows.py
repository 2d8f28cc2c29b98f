"""Event-time minute windows per device: half-open [m, m + 60 s), explicit grace, named late destination.

A window of minute `m` closes when the watermark reaches `m + 60 s + grace`. Samples for a closed
minute are *late*: the caller routes them to the late topic (LATE_SAMPLES) and counts them. Windows
store one entry per second (two samples of one device in the same second count once, the first wins),
so attribution can be done per second at close, when every allocation event for the minute is in.

Hostile times: a `Horizon` bounds how far ahead of the processing clock an event may be (the caller
dead-letters one beyond it, so it never moves a watermark), and the closing loop skips minutes that have
nothing to close (`skip_to`), so no single record can make it step through minutes one by one without end.

A device's minute is a `DeviceWindow` (processors/_window.c): three arrays of 60 doubles (NaN = metric
absent) and a seen-mask inline, ~1.6 KB; `secs` gives the dict view, `put` records a second (the first
sample of a second wins), `count` the seconds sampled, `add_mapping` the mapping versions that fed it.

Replay after a crash: the caller restores `next_close_ms` and the input offsets at which recent
minutes closed (`close_offsets`); a replayed sample of an already-closed minute is then told apart as
*already counted* (it arrived before that minute closed) or *late* (it arrived after), exactly as the
first time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from processors._window import DeviceWindow, Scrape, absorb

MINUTE_MS = 60_000  # the one definition: attribution, idle, stages and the runtime import it
DevKey = tuple[str, str, int | None]  # (node, uuid, mig_instance_id)
Second = tuple[float | None, float | None, float | None]  # (activity, fb_used_mib, power_w)


class Admit(StrEnum):
    ACCEPTED = "accepted"
    LATE = "late"  # minute already closed: goes to the late topic
    REPLAYED = "replayed"  # already counted in an emitted minute before a restart: skip
    FUTURE = "future"  # further ahead of the processing clock than the horizon allows: dead-lettered


class Horizon:
    """The latest event time a stage admits: `max_future_ms` past its processing clock.

    An event beyond `limit_ms` is not admitted: the caller dead-letters it with the reason and it leaves
    every watermark untouched. The clock is given (`observe_clock`), never read here. In real time the
    clock is the wall clock. In event-time replay (`follow_events`) it is the later of the wall clock and
    the latest event time admitted (`follow`): history lies behind the wall clock, so a replay of it is
    never refused however long a quiet gap in it, and a replay under a pinned clock still moves on, at
    most `max_future_ms` per admitted event. With neither a clock nor an event yet, everything is admitted.
    The limit never goes back (a wall clock stepped back by NTP refuses nothing it admitted before).
    """

    __slots__ = ("follow_events", "limit_ms", "max_future_ms", "refused")

    def __init__(self, max_future_ms: int, follow_events: bool = False) -> None:
        if max_future_ms < 0:
            raise ValueError("max_future_ms must be >= 0")
        self.max_future_ms = max_future_ms
        self.follow_events = follow_events
        self.limit_ms: int | None = None
        self.refused = 0

    def observe_clock(self, now_ms: int) -> None:
        lim = now_ms + self.max_future_ms
        if self.limit_ms is None or lim > self.limit_ms:
            self.limit_ms = lim

    def follow(self, ts_ms: int) -> None:
        """An admitted event time (only needed when it is the latest one): event-time replay follows it."""
        if self.follow_events:
            self.observe_clock(ts_ms)

    def admits(self, ts_ms: int) -> bool:
        """True when `ts_ms` is within the horizon; counts a refusal otherwise (the caller dead-letters it)."""
        lim = self.limit_ms
        if lim is not None and ts_ms > lim:
            self.refused += 1
            return False
        self.follow(ts_ms)
        return True

    def reason(self, ts_ms: int) -> str:
        return (
            f"event time {ts_ms} ms is {ts_ms - (self.limit_ms or 0) + self.max_future_ms} ms ahead of the "
            f"processing clock (at most {self.max_future_ms} ms admitted, processor.max_future_ms): not admitted, "
            "so it cannot move the watermark"
        )


def minute_of(ts_ms: int) -> int:
    return ts_ms - ts_ms % MINUTE_MS


@dataclass(slots=True)
class ClosedMinute:
    minute_ms: int
    devices: dict[DevKey, DeviceWindow]


class MinuteWindows:
    """The open minutes of one input partition (all devices of the nodes it carries)."""

    def __init__(self, grace_ms: int) -> None:
        if grace_ms < 0:
            raise ValueError("grace_ms must be >= 0")
        self.grace_ms = grace_ms
        self.open: dict[int, dict[DevKey, DeviceWindow]] = {}
        self.first_offset: dict[int, int] = {}  # minute -> smallest input offset that fed it
        self.next_close_ms: int | None = None  # every minute before this one is closed
        self.close_offsets: dict[int, int] = {}  # minute -> input offset (exclusive) at which it closed
        self.late_count = 0

    def admit(self, ts_ms: int, offset: int) -> Admit:
        m = ts_ms - ts_ms % MINUTE_MS
        nc = self.next_close_ms
        if nc is not None and m < nc:
            closed_at = self.close_offsets.get(m)
            if closed_at is not None and offset < closed_at:
                return Admit.REPLAYED
            self.late_count += 1
            return Admit.LATE
        return Admit.ACCEPTED

    def add_scrape(self, node: str, scrape: Mapping[str, Any], activity: Any, offset: int) -> Admit:
        """Add every device sample of a node scrape decoded by the general codec (the scrapes read natively
        take `add_read_scrape`). `node` is the node's id in the window keys (the stages use "cluster/node");
        `activity(sample) -> float | None`."""
        ts = scrape["ts_ms"]
        verdict = self.admit(ts, offset)
        if verdict is not Admit.ACCEPTED:
            return verdict
        m = ts - ts % MINUTE_MS
        s = ts // 1000
        devices = self._minute(m, offset)
        mapping = scrape["mapping_version"]
        for dev in scrape["devices"]:
            key = (node, dev["uuid"], dev["mig_instance_id"])
            w = devices.get(key)
            if w is None:
                w = devices[key] = DeviceWindow(dev["index"], dev["model"], None, m // 1000, dev.get("mig_profile"))
            if w.put(s, activity(dev), dev["fb_used_mib"], dev["power_w"]) and w.mapping != mapping:
                w.add_mapping(mapping)
        return verdict

    def add_read_scrape(
        self,
        node: str,
        scrape: Scrape,
        offset: int,
        last_seen: dict[DevKey, int],
        index_of: dict[DevKey, int | None],
        unchecked: list[DevKey],
        keys: dict[str, tuple[DevKey, ...]],
    ) -> Admit:
        """`add_scrape` for a scrape read natively (`processors.fastdecode.scrape_reader`), with the coverage
        map's updates (`NodePartition.on_scrape`'s loop) in the same pass over its devices; `keys` keeps each
        node's device keys (`processors._window.absorb`)."""
        ts = scrape.ts_ms
        verdict = self.admit(ts, offset)
        devices = self._minute(ts - ts % MINUTE_MS, offset) if verdict is Admit.ACCEPTED else None
        absorb(scrape, node, devices, ts // 1000, last_seen, index_of, unchecked, keys)
        return verdict

    def _minute(self, m: int, offset: int) -> dict[DevKey, DeviceWindow]:
        """The open minute `m`'s windows, opened (fed first at `offset`) if it is not open yet."""
        devices = self.open.get(m)
        if devices is None:
            devices = self.open[m] = {}
            self.first_offset[m] = offset
        return devices

    def start_at(self, ts_ms: int) -> None:
        """Begin closing from the minute of `ts_ms` if nothing has been closed yet."""
        if self.next_close_ms is None:
            self.next_close_ms = minute_of(ts_ms)

    def closable(self, watermark_ms: int) -> bool:
        nc = self.next_close_ms
        return nc is not None and nc + MINUTE_MS + self.grace_ms <= watermark_ms

    def close_next(self, next_offset: int) -> ClosedMinute:
        """Close the oldest open minute (call while `closable`). `next_offset` is the input position now."""
        assert self.next_close_ms is not None
        m = self.next_close_ms
        self.next_close_ms = m + MINUTE_MS
        self.first_offset.pop(m, None)
        self.close_offsets[m] = next_offset
        return ClosedMinute(m, self.open.pop(m, {}))

    def skip_to(self, minute_ms: int) -> None:
        """Mark every minute before `minute_ms` closed without closing them one by one (the caller has
        found nothing in them to close: no sample, and no row it would emit). A sample for one of them
        later is late, as for any closed minute."""
        assert self.next_close_ms is not None and minute_ms >= self.next_close_ms
        assert all(m >= minute_ms for m in self.open), "skipping a minute that holds samples"
        self.next_close_ms = minute_ms

    def discard_before(self, minute_ms: int) -> int:
        """Drop the open minutes before `minute_ms` (before the first minute this partition closes) and
        count their scrapes as late: returns that count (node-seconds)."""
        dropped = 0
        for m in [m for m in self.open if m < minute_ms]:
            per_node: dict[str, int] = {}
            for (node, _, _), win in self.open.pop(m).items():
                per_node[node] = max(per_node.get(node, 0), win.count())
            self.first_offset.pop(m, None)
            dropped += sum(per_node.values())
        self.late_count += dropped
        return dropped

    def earliest_open(self) -> int | None:
        return min(self.open) if self.open else None

    def min_needed_offset(self) -> int | None:
        """Replaying from this offset rebuilds every open window."""
        return min(self.first_offset.values(), default=None)

    def forget_close_offsets(self, committed_offset: int) -> None:
        """A minute that closed at or before the committed offset can no longer be met in a replay
        except by late samples."""
        for m in [m for m, off in self.close_offsets.items() if off <= committed_offset]:
            del self.close_offsets[m]

    def tracked_devices(self) -> int:
        return len({k for devs in self.open.values() for k in devs})
