"""Plans for the lean Avro walk (`schemas/_leanavro.c`): the hot topics' bodies without fastavro's objects.

fastavro builds a Python object for every field of every record and walks its schema for each one;
the processors read ~100,000 device-samples a second and write a device-minute per device a minute.
A plan is a record schema's fields in order, each a kind and a name (None for a field decoding skips
without allocating). The native walk follows it:
- `Plan.decode(data, pos)` gives a dict of the named fields, exactly what fastavro gives for them, and
  raises the plan's error class (the codec's `MalformedRecord`), saying at which byte it went wrong,
  for bytes that are not such a record.
  Work and memory are bounded by the record's size: every length and count is checked before use.
- `Plan.encode(record)` gives a flat record's body, the bytes fastavro's `schemaless_writer` writes, or
  None when a value is not of the plain Python type of its field (a missing field, an int for a double,
  a bool for a long, a string that does not encode): the caller lets fastavro decide those.

Only these shapes have plans: string, int, long, double, boolean, [null, X] of those (null first), and
for decoding one array-of-records field whose items are the same (NodeScrape's devices). Anything else
raises `UnsupportedSchema` and goes through the general codec. Unit tests hold both directions against
fastavro (tests/unit/test_schemas_lean.py, tests/unit/test_processors_fastdecode.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from base.errors import ContractError
from schemas._leanavro import Plan

# field kinds, as the native walk numbers them (the optional ones are [null, X] unions)
STRING, LONG, DOUBLE, BOOLEAN, OPT_STRING, OPT_LONG, OPT_DOUBLE, RECORDS = range(8)

__all__ = ["Plan", "UnsupportedSchema", "decode_plan", "encode_plan"]


class UnsupportedSchema(ContractError):
    """The schema has a shape the lean walk does not handle: use the general codec."""


def field_kind(avro_type: Any) -> int:
    """The kind of a field's type (a logical type keeps its primitive's); UnsupportedSchema if none."""
    if isinstance(avro_type, dict) and avro_type.get("type") in ("long", "int", "string", "double"):
        avro_type = avro_type["type"]  # logical types (timestamp-millis) keep their primitive encoding
    if avro_type == "string":
        return STRING
    if avro_type in ("long", "int"):
        return LONG
    if avro_type == "double":
        return DOUBLE
    if avro_type == "boolean":
        return BOOLEAN
    if isinstance(avro_type, list) and len(avro_type) == 2 and avro_type[0] == "null":
        inner = field_kind(avro_type[1])
        if inner in (STRING, LONG, DOUBLE):
            return inner + OPT_STRING
    raise UnsupportedSchema(f"unsupported field type {avro_type!r}")


def _fields(schema: Mapping[str, Any], wanted: Collection[str] | None, what: str) -> tuple[tuple[str | None, int], ...]:
    plan = tuple(
        (f["name"] if wanted is None or f["name"] in wanted else None, field_kind(f["type"])) for f in schema["fields"]
    )
    missing = set(wanted or ()) - {name for name, _ in plan}
    if missing:
        raise UnsupportedSchema(f"{what} lacks {sorted(missing)}")
    return plan


def decode_plan(
    schema: Mapping[str, Any],
    error: type[Exception],
    label: str,
    wanted: Collection[str] | None = None,
    array: str | None = None,
    item_wanted: Collection[str] | None = None,
) -> Plan:
    """The plan decoding `schema`'s records to the `wanted` fields (every one when None); `array` names
    the one array-of-records field, decoded to its items' `item_wanted` fields. Bytes that do not decode
    raise `error`, with `label` naming the body."""
    top: list[tuple[str | None, int]] = []
    items: Plan | None = None
    for f in schema["fields"]:
        if array is not None and f["name"] == array:
            t = f["type"]
            if not (isinstance(t, dict) and t.get("type") == "array" and isinstance(t.get("items"), dict)):
                raise UnsupportedSchema(f"{array} is not an array of records")
            items = Plan(_fields(t["items"], item_wanted, array), error, label)
            top.append((array, RECORDS))
        else:
            name = f["name"] if wanted is None or f["name"] in wanted else None
            top.append((name, field_kind(f["type"])))
    missing = set(wanted or ()) - {name for name, _ in top}
    if array is not None and items is None:
        missing.add(array)
    if missing:
        raise UnsupportedSchema(f"schema lacks {sorted(missing)}")
    return Plan(tuple(top), error, label, items)


def encode_plan(schema: Mapping[str, Any]) -> Plan | None:
    """The plan encoding a flat record of `schema` (every field named), None for any other shape."""
    try:
        return Plan(_fields(schema, None, "record"), ContractError, "record")
    except UnsupportedSchema:
        return None
