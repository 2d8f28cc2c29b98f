"""Helpers for the scheduler producers' tests (no fixtures).

ListSink  stands in for the publisher (`producers.jobevents.EventSink`): each record is encoded with its
          topic's contract first (a record the contract refuses fails the test, as it would the real
          publisher), then kept as (topic name, key, record) in `records`.
"""

from __future__ import annotations

from typing import Any

from schemas.codec import AvroCodec


class ListSink:
    def __init__(self) -> None:
        self.codec = AvroCodec()
        self.records: list[tuple[str, bytes, dict[str, Any]]] = []

    def publish(self, topic: Any, key: bytes, record: dict[str, Any]) -> None:
        self.codec.encode(topic.subject, record)
        self.records.append((topic.name, key, record))
