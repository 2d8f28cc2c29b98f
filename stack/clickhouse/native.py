"""ClickHouse Native format: the two repairs chDB's Native output needs before it goes on the wire.

1. An empty result is zero bytes; a server sends one block with the columns and no rows, and a
   client needs it to learn the column names and types. `header_block` builds it.
2. Native output written for "protocol revision 0" drops the zone of a top-level `DateTime('tz')`
   column (ClickHouse does this for old clients). `retype_blocks` puts the real type names back. To
   reach the header of a later column it must step over the data of the earlier ones, so it knows
   the layout of the common types; for a type it does not know it gives up and leaves the bytes as
   they are (`NativeLayoutUnknown`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_FIXED_WIDTH = {
    "Nothing": 1,
    "UInt8": 1,
    "Int8": 1,
    "Bool": 1,
    "Enum8": 1,
    "UInt16": 2,
    "Int16": 2,
    "Enum16": 2,
    "Date": 2,
    "BFloat16": 2,
    "UInt32": 4,
    "Int32": 4,
    "Float32": 4,
    "Date32": 4,
    "DateTime": 4,
    "IPv4": 4,
    "Decimal32": 4,
    "Time": 4,
    "UInt64": 8,
    "Int64": 8,
    "Float64": 8,
    "DateTime64": 8,
    "Decimal64": 8,
    "Time64": 8,
    "UInt128": 16,
    "Int128": 16,
    "UUID": 16,
    "IPv6": 16,
    "Decimal128": 16,
    "UInt256": 32,
    "Int256": 32,
    "Decimal256": 32,
}
_INTERVAL = re.compile(r"^Interval[A-Za-z]+$")
_LC_HAS_ADDITIONAL_KEYS = 1 << 9
_LC_INDEX_WIDTH = {0: 1, 1: 2, 2: 4, 3: 8}


class NativeLayoutUnknown(Exception):
    """The bytes use a type (or shape) this module cannot step over."""


def write_varint(value: int, out: bytearray) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _write_str(text: str, out: bytearray) -> None:
    raw = text.encode()
    write_varint(len(raw), out)
    out += raw


def header_block(columns: Sequence[tuple[str, str]]) -> bytes:
    """A Native block with these (name, type) columns and no rows."""
    out = bytearray()
    write_varint(len(columns), out)
    write_varint(0, out)
    for name, type_name in columns:
        _write_str(name, out)
        _write_str(type_name, out)
        # No LowCardinality version prefix: with zero rows clickhouse-connect reads no column data.
    return bytes(out)


def split_type_args(args: str) -> list[str]:
    """Split `A, B(C, D), 'x,y'` at its top-level commas."""
    parts: list[str] = []
    depth = 0
    quote = ""
    start = 0
    i = 0
    while i < len(args):
        ch = args[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'`\"":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
        i += 1
    tail = args[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _parse_type(type_name: str) -> tuple[str, list[str]]:
    type_name = type_name.strip()
    if "(" not in type_name:
        return type_name, []
    base, rest = type_name.split("(", 1)
    return base.strip(), split_type_args(rest.rsplit(")", 1)[0])


def _strip_element_name(arg: str) -> str:
    """`name Type` inside a named Tuple is `Type`."""
    match = re.match(r"^(?:`[^`]*`|[A-Za-z_][A-Za-z0-9_]*)\s+(?=[A-Z])", arg)
    return arg[match.end() :] if match else arg


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int = 0) -> None:
        self.buf = buf
        self.pos = pos

    def varint(self) -> int:
        result = 0
        shift = 0
        buf = self.buf
        while True:
            try:
                byte = buf[self.pos]
            except IndexError as exc:
                raise NativeLayoutUnknown("truncated varint") from exc
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    def skip(self, n: int) -> None:
        self.pos += n
        if self.pos > len(self.buf):
            raise NativeLayoutUnknown("truncated data")

    def uint64(self) -> int:
        start = self.pos
        self.skip(8)
        return int.from_bytes(self.buf[start : self.pos], "little")

    def string(self) -> str:
        size = self.varint()
        start = self.pos
        self.skip(size)
        return bytes(self.buf[start : self.pos]).decode()


def _skip_prefix(type_name: str, reader: _Reader) -> None:
    """Per-column serialization state written before the data (LowCardinality's version)."""
    base, args = _parse_type(type_name)
    if base == "LowCardinality":
        reader.skip(8)
    elif base in ("Array", "Nullable"):
        _skip_prefix(args[0], reader)
    elif base == "Map":
        _skip_prefix(args[0], reader)
        _skip_prefix(args[1], reader)
    elif base == "Tuple":
        for arg in args:
            _skip_prefix(_strip_element_name(arg), reader)


def _skip_data(type_name: str, rows: int, reader: _Reader) -> None:
    base, args = _parse_type(type_name)
    width = _FIXED_WIDTH.get(base)
    if width is not None:
        reader.skip(width * rows)
        return
    if base == "Decimal":
        precision = int(args[0])
        reader.skip(rows * (4 if precision <= 9 else 8 if precision <= 18 else 16 if precision <= 38 else 32))
    elif base == "FixedString":
        reader.skip(rows * int(args[0]))
    elif base == "String":
        buf = reader.buf
        pos = reader.pos
        for _ in range(rows):
            size = buf[pos]
            pos += 1
            if size & 0x80:
                reader.pos = pos - 1
                size = reader.varint()
                pos = reader.pos
            pos += size
        if pos > len(buf):
            raise NativeLayoutUnknown("truncated String column")
        reader.pos = pos
    elif base == "Nullable":
        reader.skip(rows)
        _skip_data(args[0], rows, reader)
    elif base in ("Array", "Map"):
        if rows == 0:
            return
        reader.skip(8 * (rows - 1))
        total = reader.uint64()
        if base == "Array":
            _skip_data(args[0], total, reader)
        else:
            _skip_data(args[0], total, reader)
            _skip_data(args[1], total, reader)
    elif base == "Tuple":
        for arg in args:
            _skip_data(_strip_element_name(arg), rows, reader)
    elif base == "LowCardinality":
        if rows == 0:
            return
        flags = reader.uint64()
        if not flags & _LC_HAS_ADDITIONAL_KEYS:
            raise NativeLayoutUnknown("LowCardinality with a global dictionary")
        keys = reader.uint64()
        inner = args[0]
        inner_base, inner_args = _parse_type(inner)
        _skip_data(inner_args[0] if inner_base == "Nullable" else inner, keys, reader)
        indexes = reader.uint64()
        reader.skip(indexes * _LC_INDEX_WIDTH[flags & 0xFF])
    elif _INTERVAL.match(base):
        reader.skip(8 * rows)
    else:
        raise NativeLayoutUnknown(f"cannot step over a {type_name} column")


def retype_blocks(data: bytes | memoryview, types: Sequence[str]) -> bytes:
    """Native blocks with each column's type name replaced by `types[i]` (same layout, new names).

    Only the name changes, so only types whose binary layout equals the written one may be given
    (`DateTime` -> `DateTime('Europe/Paris')`). Raises NativeLayoutUnknown if a block cannot be walked.
    """
    reader = _Reader(data)
    out = bytearray()
    end = len(data)
    while reader.pos < end:
        block_start = reader.pos
        columns = reader.varint()
        rows = reader.varint()
        if columns != len(types):
            raise NativeLayoutUnknown("column count differs from the described result")
        out += data[block_start : reader.pos]
        for i in range(columns):
            name_start = reader.pos
            reader.string()
            out += data[name_start : reader.pos]
            written_type = reader.string()
            _write_str(types[i], out)
            data_start = reader.pos
            _skip_prefix(written_type, reader)
            _skip_data(written_type, rows, reader)
            out += data[data_start : reader.pos]
    return bytes(out)


def first_block_types(data: bytes | memoryview) -> list[tuple[str, str]]:
    """(name, type) of every column of the first block."""
    reader = _Reader(data)
    columns = reader.varint()
    rows = reader.varint()
    result = []
    for _ in range(columns):
        name = reader.string()
        type_name = reader.string()
        result.append((name, type_name))
        _skip_prefix(type_name, reader)
        _skip_data(type_name, rows, reader)
    return result


def needs_zone_repair(data: bytes) -> bool:
    """Cheap test: could a top-level `DateTime` column in these bytes have lost its zone?"""
    return b"\x08DateTime" in data
