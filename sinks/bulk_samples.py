"""Raw samples in bulk: a batch of node scrapes handed to ClickHouse as one Avro container (issue 21, item 4).

The row path decodes each scrape with fastavro, checks it against the contract's model, builds a typed record
and maps its devices to rows, about 35 us of Python a row (docs/benchmarks.md). ClickHouse reads Avro itself,
so this path only checks each record's header and copies its body into an Avro object container file: one block
per scrape, holding a record (head, scrape, tail) of `WRAPPER_NAME`, where head and tail are one random number
per insert.
`raw_scrapes_bulk` (a Null table, migration 030) takes the container and its materialized view writes
`raw_samples`, the same rows as the row path (a test compares them).

What makes it as strict as the row path, without Python reading a body:
- only a record whose header names the schema version the table was built for (`TABLE_FINGERPRINT`) comes here:
  a single-object header with that fingerprint, or a Confluent header whose registry id the codec resolves to it;
  any other framing goes record by record;
- a body is exactly one datum, or the insert fails: a short one ends its block early (the reader's error), a
  long one makes the tail read something other than the head (the view's `throwIf`), and the number is drawn per
  insert, so no record can carry it;
- the view refuses what `schemas.models` refuses (identifiers, ranges, UTF-8), and a test derives its cases from
  the model.

A failed insert of any kind returns the batch to the record-by-record path, which dead-letters exactly the bad
records with their reason and retries while ClickHouse is away. Pure: `wrapper_schema`, `container_header` and
`container`; the adapter, `RawSampleBulk`, holds the client.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from schemas import DEFAULT_STORE, SchemaStore
from schemas.codec import (
    CONFLUENT_HEADER_LEN,
    CONFLUENT_MAGIC,
    SINGLE_OBJECT_HEADER_LEN,
    SINGLE_OBJECT_MAGIC,
    AvroCodec,
    _strip_logical_types,
    avro_long,
)
from schemas.topics import DEVICE_SAMPLES
from streams.consume import SourceRecord

log = logging.getLogger(__name__)

TABLE = "raw_scrapes_bulk"
# The device-samples version raw_scrapes_bulk's tuple mirrors (migration 030), as its single-object header has it.
TABLE_FINGERPRINT = bytes.fromhex("1c99069b247bf201")
WRAPPER_NAME = "gpuledger.bulk.RawScrapeBlock"
OCF_MAGIC = b"Obj\x01"
SYNC_LEN = 16
REGISTRY_IDS_KEPT = 1024  # Confluent headers remembered (a registry holds a few versions of a subject)


def _avro_bytes(data: bytes) -> bytes:
    return avro_long(len(data)) + data


def wrapper_schema(store: SchemaStore = DEFAULT_STORE) -> dict[str, Any]:
    """The container's schema: a random head, the scrape as its latest schema has it (times as the longs they
    are on the wire, as the codec reads them), the same random tail."""
    scrape = _strip_logical_types(store.versions(DEVICE_SAMPLES.subject)[-1])
    return {
        "type": "record",
        "name": WRAPPER_NAME,
        "fields": [
            {"name": "head", "type": "long"},
            {"name": "scrape", "type": scrape},
            {"name": "tail", "type": "long"},
        ],
    }


def container_header(schema: dict[str, Any], sync: bytes) -> bytes:
    """An Avro object container file's header (the Avro specification's "Object Container Files")."""
    meta = {"avro.schema": json.dumps(schema, separators=(",", ":")).encode(), "avro.codec": b"null"}
    body = b"".join(_avro_bytes(k.encode()) + _avro_bytes(v) for k, v in meta.items())
    return OCF_MAGIC + avro_long(len(meta)) + body + avro_long(0) + sync


def container(header: bytes, sync: bytes, bodies: Sequence[bytes | memoryview], nonce: int) -> bytes:
    """`header` (from `container_header` with `sync`) and one block per body: (nonce, body, nonce)."""
    mark = avro_long(nonce)
    one = avro_long(1)
    parts: list[bytes | memoryview] = [header]
    for body in bodies:
        parts += (one, avro_long(len(body) + 2 * len(mark)), mark, body, mark, sync)
    return b"".join(parts)


@dataclass(slots=True)
class BulkStats:
    inserts: int = 0
    records: int = 0
    rows: int = 0
    fell_back: int = 0  # batches the bulk insert refused, sent record by record


class RawSampleBulk:
    """Lands the device-samples records of a batch it can take; returns the others (the caller's row path
    takes them, and the whole batch when the insert fails)."""

    def __init__(self, client: Any, codec: AvroCodec, topic: str, *, store: SchemaStore = DEFAULT_STORE) -> None:
        self._client = client
        self._codec = codec
        self._topic = topic  # the broker-side name
        self._header = SINGLE_OBJECT_MAGIC + TABLE_FINGERPRINT
        self._registry_ids: dict[bytes, bool] = {}  # Confluent header -> whether it names the table's version
        self.enabled = codec.fingerprint(DEVICE_SAMPLES.subject) == TABLE_FINGERPRINT
        if not self.enabled:
            log.warning("raw samples go record by record: %s's latest schema is not the one %s was built for",
                        DEVICE_SAMPLES.subject, TABLE)  # fmt: skip
        self._sync = secrets.token_bytes(SYNC_LEN)
        self._container_header = container_header(wrapper_schema(store), self._sync)
        self.stats = BulkStats()

    def _header_len(self, value: bytes) -> int:
        """How long the header of a record this path takes is; 0 for a record it leaves to the row path."""
        if value[:SINGLE_OBJECT_HEADER_LEN] == self._header:
            return SINGLE_OBJECT_HEADER_LEN
        if value[:1] != CONFLUENT_MAGIC or len(value) < CONFLUENT_HEADER_LEN:
            return 0
        head = value[:CONFLUENT_HEADER_LEN]
        ours = self._registry_ids.get(head)
        if ours is None:
            try:
                writer, _ = self._codec.framing(value)
            except Exception:  # an id the registry cannot say now: the row path decides (and dead-letters)
                return 0
            ours = writer.fingerprint == TABLE_FINGERPRINT
            if len(self._registry_ids) < REGISTRY_IDS_KEPT:
                self._registry_ids[head] = ours
        return CONFLUENT_HEADER_LEN if ours else 0

    def __call__(self, records: list[SourceRecord]) -> list[SourceRecord]:
        if not self.enabled:
            return records
        topic = self._topic
        mine: list[SourceRecord] = []
        bodies: list[memoryview] = []
        others: list[SourceRecord] = []
        for r in records:
            value = r.value
            start = self._header_len(value) if r.topic == topic and value is not None else 0
            if start:
                mine.append(r)
                bodies.append(memoryview(value)[start:])  # type: ignore[arg-type]  # start > 0: value is bytes
            else:
                others.append(r)
        if not mine:
            return records
        data = container(self._container_header, self._sync, bodies, secrets.randbits(63))
        try:
            summary = self._client.raw_insert(TABLE, insert_block=data, fmt="Avro")
        except Exception as exc:  # anything: the row path decides record by record (and retries an outage)
            self.stats.fell_back += 1
            log.info("bulk insert of %d scrapes refused, sending them record by record: %s", len(mine),
                     " ".join(str(exc).split())[:300])  # fmt: skip
            return records
        written = int((getattr(summary, "summary", None) or {}).get("written_rows", 0) or 0)
        self.stats.inserts += 1
        self.stats.records += len(mine)
        self.stats.rows += max(written - len(mine), 0)  # written_rows counts the Null table's rows too
        return others
