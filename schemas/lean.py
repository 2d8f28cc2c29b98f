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

Only flat records have plans: string, int, long, double, boolean, [null, X] of those (null first).
Anything else raises `UnsupportedSchema` and goes through the general codec. The node stage reads its
scrapes (records with an array of device records) with a walk of its own over the same reading code
(`processors.fastdecode.scrape_reader`). Unit tests hold both directions against fastavro
(tests/unit/test_schemas_lean.py).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from base.errors import ContractError
from schemas._leanavro import Plan

# field kinds, as the native walks number them (the optional ones are [null, X] unions); RECORDS, an array of
# records, is read only by the node stage's scrape reader (processors/_window.c)
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
    schema: Mapping[str, Any], error: type[Exception], label: str, wanted: Collection[str] | None = None
) -> Plan:
    """The plan decoding `schema`'s flat records to the `wanted` fields (every one when None). Bytes that do
    not decode raise `error`, with `label` naming the body."""
    return Plan(_fields(schema, wanted, "schema"), error, label)


def encode_plan(schema: Mapping[str, Any]) -> Plan | None:
    """The plan encoding a flat record of `schema` (every field named), None for any other shape."""
    try:
        return Plan(_fields(schema, None, "record"), ContractError, "record")
    except UnsupportedSchema:
        return None
