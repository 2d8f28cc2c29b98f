"""Batch writes into ClickHouse that are safe to repeat, and the split of failures into
"ClickHouse is unavailable" (retry the whole batch later) and "ClickHouse rejects these rows"
(send exactly those rows to the dead-letter topic).

Idempotency: every table is a ReplacingMergeTree on a deterministic key, so a repeated row
replaces itself. Tables that feed a daily rollup (device_minutes, coverage_minutes) additionally
get only keys that are not stored yet (looked up per batch, bounded by the batch's time range), so
the materialized view sees each key once and the rollups stay exact. One sink owns a partition at
a time and a record's key always maps to the same partition, so look-up-then-insert does not race.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from base.errors import ServiceError
from sinks.rows import Row, TableSpec

# ClickHouse error names that mean "this data is wrong", as opposed to "the server is not well".
ROW_ERRORS = frozenset({
    "VIOLATED_CONSTRAINT", "TYPE_MISMATCH", "ILLEGAL_TYPE_OF_ARGUMENT", "ARGUMENT_OUT_OF_BOUND",
    "CANNOT_CONVERT_TYPE", "INCORRECT_DATA", "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN", "TOO_LARGE_STRING_SIZE",
    "CANNOT_PARSE_TEXT", "CANNOT_PARSE_NUMBER", "CANNOT_PARSE_DATE", "CANNOT_PARSE_DATETIME",
    "CANNOT_PARSE_INPUT_ASSERTION_FAILED", "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE", "DECIMAL_OVERFLOW",
    "CANNOT_READ_ARRAY_FROM_TEXT", "INCORRECT_NUMBER_OF_COLUMNS",
})  # fmt: skip
_CLIENT_ROW_ERRORS = (TypeError, ValueError, OverflowError, struct.error, AttributeError)


class ClickHouseUnavailable(ServiceError):
    """ClickHouse did not take a batch for a reason that is not the data: retry it later."""


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a row came from, for the dead-letter record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    timestamp_ms: int | None = None


@dataclass(slots=True)
class Pending:
    spec: TableSpec
    row: Row
    origin: Origin


@dataclass(frozen=True, slots=True)
class Rejected:
    origin: Origin
    table: str
    error_class: str
    reason: str


@dataclass(slots=True)
class WriteResult:
    inserted: dict[str, int] = field(default_factory=dict)
    skipped_duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)


def error_name(exc: BaseException) -> str:
    match = re.search(r"\(([A-Z][A-Z0-9_]+)\)", str(exc))
    return match.group(1) if match else ""


def _classify(exc: Exception) -> str:
    """'row' when the rows are at fault, else 'unavailable'."""
    from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

    if isinstance(exc, (*_CLIENT_ROW_ERRORS, DataError)):
        return "row"
    if isinstance(exc, OperationalError):
        return "unavailable"
    if isinstance(exc, DatabaseError) and error_name(exc) in ROW_ERRORS:
        return "row"
    return "unavailable"


class LedgerWriter:
    """Writes batches of rows through a clickhouse-connect client."""

    def __init__(self, client: Any) -> None:
        self._client = client

    @property
    def client(self) -> Any:
        return self._client

    def write(self, pending: Sequence[Pending]) -> WriteResult:
        """Insert a batch. Raises `ClickHouseUnavailable` (nothing to commit: retry the same batch,
        which is safe); otherwise returns counts and the rows ClickHouse rejected."""
        result = WriteResult()
        by_table: dict[str, list[Pending]] = {}
        specs: dict[str, TableSpec] = {}
        for item in pending:
            by_table.setdefault(item.spec.table, []).append(item)
            specs[item.spec.table] = item.spec
        for table, items in by_table.items():
            spec = specs[table]
            if spec.dedupe_key:
                items, dropped = self._only_new(spec, items)
                result.skipped_duplicates += dropped
            if items:
                self._insert(spec, items, result)
        return result

    def _only_new(self, spec: TableSpec, items: list[Pending]) -> tuple[list[Pending], int]:
        idx = [spec.columns.index(c) for c in spec.dedupe_key]
        tix = spec.columns.index(spec.time_column)
        seen: set[tuple[Any, ...]] = set()
        try:
            lo = min(int(p.row[tix]) for p in items)
            hi = max(int(p.row[tix]) for p in items)
            clusters = sorted({str(p.row[0]) for p in items})
        except (TypeError, ValueError):
            return items, 0  # malformed time values: let the insert reject them row by row
        keys = ", ".join(spec.dedupe_key)  # identifiers from the code's own TableSpec, never input
        # Bounded by the batch's time range and its entities (nodes, or devices for device rows), so
        # what comes back is about the batch's size even when much more is stored.
        entity = spec.dedupe_key[2] if len(spec.dedupe_key) > 3 else spec.dedupe_key[1]
        eix = spec.columns.index(entity)
        entities = sorted({str(p.row[eix]) for p in items})
        try:
            stored = self._client.query(
                f"SELECT {keys} FROM {spec.table} WHERE {spec.time_column} >= {{lo:Int64}} "
                f"AND {spec.time_column} <= {{hi:Int64}} AND cluster IN {{clusters:Array(String)}} "
                f"AND {entity} IN {{entities:Array(String)}}",
                parameters={"lo": lo, "hi": hi, "clusters": clusters, "entities": entities},
            ).result_rows
        except Exception as exc:
            raise ClickHouseUnavailable(f"cannot read stored keys of {spec.table}: {exc}") from exc
        seen.update(tuple(r) for r in stored)
        fresh = []
        for p in items:
            key = tuple(p.row[i] for i in idx)
            if key in seen:
                continue
            seen.add(key)
            fresh.append(p)
        return fresh, len(items) - len(fresh)

    def _insert(self, spec: TableSpec, items: list[Pending], result: WriteResult) -> None:
        try:
            self._client.insert(spec.table, [p.row for p in items], column_names=list(spec.columns))
        except Exception as exc:
            if _classify(exc) == "unavailable":
                raise ClickHouseUnavailable(f"insert into {spec.table} failed: {exc}") from exc
            if len(items) == 1:
                result.rejected.append(
                    Rejected(items[0].origin, spec.table, error_name(exc) or type(exc).__name__, str(exc)[:2000])
                )
                return
            mid = len(items) // 2  # bisect to find exactly the rows ClickHouse refuses
            self._insert(spec, items[:mid], result)
            self._insert(spec, items[mid:], result)
            return
        result.inserted[spec.table] = result.inserted.get(spec.table, 0) + len(items)
