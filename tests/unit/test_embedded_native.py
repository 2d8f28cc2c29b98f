"""Native-format repairs of the embedded ClickHouse server, on hand-built blocks."""

from __future__ import annotations

import struct

import pytest

from stack.clickhouse import native


def _str(text: str) -> bytes:
    out = bytearray()
    native.write_varint(len(text.encode()), out)
    return bytes(out) + text.encode()


def _block(rows: int, columns: list[tuple[str, str, bytes]]) -> bytes:
    out = bytearray()
    native.write_varint(len(columns), out)
    native.write_varint(rows, out)
    for name, type_name, data in columns:
        out += _str(name) + _str(type_name) + data
    return bytes(out)


def test_header_block_has_names_types_and_no_rows() -> None:
    block = native.header_block([("id", "UInt32"), ("at", "DateTime('Asia/Tokyo')")])
    assert block == b"\x02\x00" + _str("id") + _str("UInt32") + _str("at") + _str("DateTime('Asia/Tokyo')")
    assert native.first_block_types(block) == [("id", "UInt32"), ("at", "DateTime('Asia/Tokyo')")]


def test_retype_walks_variable_width_columns() -> None:
    names = _str("ab") + _str("") + _str("x" * 200)  # a length over 127 takes a two-byte varint
    tags = struct.pack("<3Q", 1, 1, 3) + _str("t1") + _str("t2") + _str("t3")
    nullable = b"\x00\x01\x00" + struct.pack("<3i", 5, 0, 7)
    lowcard = (
        struct.pack("<Q", 1)  # prefix: serialization version
        + struct.pack("<Q", 0 | (1 << 9))  # UInt8 indexes, additional keys
        + struct.pack("<Q", 2)
        + _str("")
        + _str("k")
        + struct.pack("<Q", 3)
        + b"\x01\x01\x00"
    )
    times = struct.pack("<3I", 1, 2, 3)
    data = _block(
        3,
        [
            ("name", "String", names),
            ("tags", "Array(String)", tags),
            ("n", "Nullable(Int32)", nullable),
            ("lc", "LowCardinality(String)", lowcard),
            ("pair", "Tuple(a UInt8, b FixedString(2))", b"\x01\x02\x03" + b"aabbcc"),
            ("at", "DateTime", times),
        ],
    )
    types = [
        "String",
        "Array(String)",
        "Nullable(Int32)",
        "LowCardinality(String)",
        "Tuple(a UInt8, b FixedString(2))",
        "DateTime('Europe/Paris')",
    ]
    fixed = native.retype_blocks(data + data, types)  # two blocks
    assert native.first_block_types(fixed)[-1] == ("at", "DateTime('Europe/Paris')")
    one = len(fixed) // 2
    assert fixed[:one] == fixed[one:] and fixed.endswith(times)
    assert len(fixed) == 2 * (len(data) + len("('Europe/Paris')"))


def test_retype_gives_up_on_unknown_layouts() -> None:
    data = _block(1, [("j", "JSON", b"\x00" * 8), ("at", "DateTime", b"\x00" * 4)])
    with pytest.raises(native.NativeLayoutUnknown):
        native.retype_blocks(data, ["JSON", "DateTime('UTC')"])
    with pytest.raises(native.NativeLayoutUnknown):
        native.retype_blocks(_block(1, [("at", "DateTime", b"\x00")]), ["DateTime('UTC')"])


def test_zone_repair_detection() -> None:
    assert native.needs_zone_repair(_block(0, [("at", "DateTime", b"")]))
    assert not native.needs_zone_repair(_block(0, [("at", "DateTime64(3, 'UTC')", b"")]))
