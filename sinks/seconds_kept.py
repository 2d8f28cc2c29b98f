"""What the warehouse keeps of the per-second samples (`clickhouse.raw_samples_kept`, issue 44 item 3). Pure.

At 100,000 GPUs at 1 Hz, `raw_samples` would take 8.6 billion rows a day (docs/benchmarks.md, "What ClickHouse
keeps per second"). Three choices; the default is `sampled`, one second in 10:

- `every_second`: every device-sample, kept `clickhouse.raw_sample_ttl_days`;
- `sampled`: the node scrapes whose second is a multiple of `clickhouse.raw_sample_every_s` (the same seconds on
  every node, so a replay or a second sink keeps the same ones and the table stays idempotent);
- `minutes`: none; the device-minutes are the warehouse's finest grain, and a dispute reads the seconds from
  `telemetry.device-samples` while its retention holds them (`sinks/seconds.py`).

The choice is made per node scrape (a record), never per device: a scrape kept is kept whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from schemas.codec import (
    CONFLUENT_HEADER_LEN,
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_HEADER_LEN,
    SINGLE_OBJECT_MAGIC,
    read_avro_long,
)

if TYPE_CHECKING:
    from base.settings import ClickHouseSettings

Kept = Literal["every_second", "sampled", "minutes"]
KEPT: tuple[Kept, ...] = ("every_second", "sampled", "minutes")


@dataclass(frozen=True, slots=True)
class SecondsKept:
    """Which node scrapes `raw_samples` keeps."""

    mode: Kept = "every_second"
    every_s: int = 10  # `sampled`: one scrape in every `every_s` seconds of event time

    def __post_init__(self) -> None:
        if self.mode not in KEPT:
            raise ValueError(f"raw samples kept: {self.mode!r} is not one of {', '.join(KEPT)}")
        if not 2 <= self.every_s <= 3600:
            raise ValueError(f"raw samples kept: every_s must be 2-3600, got {self.every_s}")

    @classmethod
    def of(cls, ch: ClickHouseSettings) -> SecondsKept:
        return cls(ch.raw_samples_kept, ch.raw_sample_every_s)

    @property
    def writes(self) -> bool:
        """Whether the sink writes `raw_samples` at all."""
        return self.mode != "minutes"

    def keeps(self, ts_ms: int) -> bool:
        """Whether the node scrape at `ts_ms` goes into `raw_samples`."""
        if self.mode == "every_second":
            return True
        if self.mode == "minutes":
            return False
        return (ts_ms // 1000) % self.every_s == 0

    def describe(self) -> str:
        if self.mode == "sampled":
            return f"one second in {self.every_s}"
        return "every second" if self.mode == "every_second" else "no seconds (device-minutes only)"


def header_len(value: bytes | memoryview) -> int:
    """The length of a record's framing (single-object or Confluent); 0 when it has neither."""
    head = bytes(value[:2])
    if head == SINGLE_OBJECT_MAGIC and len(value) >= SINGLE_OBJECT_HEADER_LEN:
        return SINGLE_OBJECT_HEADER_LEN
    if head[:1] == CONFLUENT_MAGIC and len(value) >= CONFLUENT_HEADER_LEN:
        return CONFLUENT_HEADER_LEN
    return 0


def scrape_ts_ms(value: bytes | memoryview) -> int | None:
    """A device-samples record's `ts_ms`, read without decoding the rest: the schema begins with `cluster` and
    `node` (strings) and then `ts_ms` (a long); a test holds every version to that. None when the record is not
    framed or is short (the row path then decodes it, and dead-letters it if it is bad)."""
    start = header_len(value)
    if not start:
        return None
    try:
        at = start
        for _ in range(2):  # cluster, node
            size, at = read_avro_long(value, at)
            if size < 0:
                return None
            at += size
        ts, _ = read_avro_long(value, at)
    except (IndexError, ValueError):
        return None
    return ts
