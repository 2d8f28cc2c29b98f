"""Typed records generated from the `.avsc` files: the schema is written once, the classes follow it.

`schemas/records.py` is this module's output, checked in so that readers and mypy see plain
classes: one frozen dataclass per Avro record (nested records too), a `Literal` alias per enum, and
per class `to_avro()` (the dict the codec encodes) and `from_avro(dict)` (from a decoded dict).

    python -m schemas.codegen            rewrite schemas/records.py from the schemas
    python -m schemas.codegen --check    exit status 1, naming each difference, when it is stale

`drift(store, module)` compares the classes of a module with the schemas field by field (name and
order, type, default, enum symbols); `tests/unit/test_records.py` runs it and the text comparison,
so a schema edited without regenerating fails the unit tests.

Type mapping: `null|X` is `X | None`; `int`/`long` are `int` (timestamps stay epoch milliseconds,
as the codec decodes them); `float`/`double` are `float`; arrays are tuples (the classes are
immutable; `to_avro` writes lists, as the decoder gives). Every field is keyword-only, so Avro's
order (required fields after defaulted ones) is kept as it is.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import textwrap
from dataclasses import MISSING, dataclass, fields, is_dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, get_args

from base.errors import ContractError
from schemas import DEFAULT_STORE, SCHEMA_DIR, SchemaStore

OUTPUT = SCHEMA_DIR / "records.py"
_WIDTH = 120  # the line length of the ruff settings in pyproject.toml

_PRIMITIVES = {
    "null": "None",
    "boolean": "bool",
    "int": "int",
    "long": "int",
    "float": "float",
    "double": "float",
    "bytes": "bytes",
    "string": "str",
}


@dataclass(frozen=True, slots=True)
class FieldSpec:
    name: str
    annotation: str  # as written in the generated class
    default: str | None  # Python source of the default, None when required
    to_avro: str  # expression of `self.<name>` that gives the Avro value
    from_avro: str  # expression of `d` that gives the attribute value
    doc: str


@dataclass(frozen=True, slots=True)
class RecordSpec:
    name: str
    subject: str | None  # set on a subject's top record
    doc: str
    fields: tuple[FieldSpec, ...]


@dataclass(frozen=True, slots=True)
class EnumSpec:
    name: str
    symbols: tuple[str, ...]
    doc: str


@dataclass(frozen=True, slots=True)
class _Type:
    annotation: str
    to_avro: str  # a format string over `{v}` (the Python value)
    from_avro: str  # a format string over `{v}` (the Avro value)


class _Collector:
    """Walks the schemas, collecting record and enum specs in definition order (dependencies first)."""

    def __init__(self) -> None:
        self.records: dict[str, RecordSpec] = {}
        self.enums: dict[str, EnumSpec] = {}

    def type_of(self, node: Any, where: str) -> _Type:
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _Type(_PRIMITIVES[node], "{v}", "{v}")
            name = node.rsplit(".", 1)[-1]
            if name in self.records:
                return _Type(name, "{v}.to_avro()", name + ".from_avro({v})")
            if name in self.enums:
                return _Type(name, "{v}", "{v}")
            raise ContractError(f"{where}: unknown type {node!r}")
        if isinstance(node, list):
            branches = [b for b in node if b != "null"]
            if len(branches) != 1 or len(branches) == len(node):
                raise ContractError(f"{where}: only `null | X` unions are supported, got {node!r}")
            inner = self.type_of(branches[0], where)
            if inner.to_avro == "{v}" and inner.from_avro == "{v}":
                return _Type(f"{inner.annotation} | None", "{v}", "{v}")
            return _Type(
                f"{inner.annotation} | None",
                "None if {v} is None else " + inner.to_avro,
                "None if (v := {v}) is None else "
                + inner.from_avro.format(v="v").replace("{", "{{").replace("}", "}}"),
            )
        kind = node["type"]
        if kind == "record":
            return self.record(node, None, where)
        if kind == "enum":
            name = node["name"]
            spec = EnumSpec(name, tuple(node["symbols"]), node.get("doc", ""))
            if self.enums.setdefault(name, spec) != spec:
                raise ContractError(f"{where}: enum {name} is defined twice, differently")
            return _Type(name, "{v}", "{v}")
        if kind == "array":
            inner = self.type_of(node["items"], where)
            item_to = inner.to_avro.format(v="x")
            item_from = inner.from_avro.format(v="x")
            return _Type(
                f"tuple[{inner.annotation}, ...]",
                "list({v})" if item_to == "x" else f"[{item_to} for x in {{v}}]",
                "tuple({v})" if item_from == "x" else f"tuple({item_from} for x in {{v}})",
            )
        if kind in _PRIMITIVES:  # {"type": "long", "logicalType": ...}
            return self.type_of(kind, where)
        raise ContractError(f"{where}: Avro type {kind!r} is not supported by the generator")

    def record(self, node: dict[str, Any], subject: str | None, where: str) -> _Type:
        name = node["name"]
        specs = []
        for f in node["fields"]:
            t = self.type_of(f["type"], f"{where}.{f['name']}")
            attr = f"self.{f['name']}"
            default = None
            source = f"d[{_q(f['name'])}]"
            if "default" in f:
                default = _default_source(f["default"], t)
                fallback = _avro_default_source(f["default"])
                key = _q(f["name"])
                source = f"d.get({key})" if fallback == "None" else f"d.get({key}, {fallback})"
            specs.append(
                FieldSpec(
                    f["name"],
                    t.annotation,
                    default,
                    t.to_avro.format(v=attr),
                    t.from_avro.format(v=source),
                    " ".join(str(f.get("doc", "")).split()),
                )
            )
        spec = RecordSpec(name, subject, " ".join(str(node.get("doc", "")).split()), tuple(specs))
        if self.records.setdefault(name, spec) != spec:
            raise ContractError(f"{where}: record {name} is defined twice, differently")
        return _Type(name, "{v}.to_avro()", name + ".from_avro({v})")


def _default_source(value: Any, t: _Type) -> str:
    if value is None:
        return "None"
    if isinstance(value, list):
        if value:
            raise ContractError("only empty array defaults are supported")
        return "()"
    if isinstance(value, str):
        return _q(value)
    if isinstance(value, bool | int | float):
        return repr(value)
    raise ContractError(f"default {value!r} of {t.annotation} is not supported by the generator")


def _avro_default_source(value: Any) -> str:
    if value == []:
        return "[]"
    return _q(value) if isinstance(value, str) else repr(value)


def specs(store: SchemaStore = DEFAULT_STORE) -> tuple[dict[str, EnumSpec], dict[str, RecordSpec]]:
    """Every enum and record of `store`'s latest schemas, by name, dependencies first."""
    collector = _Collector()
    for subject in store.subjects():
        collector.record(store.load(subject), subject, subject)
    return collector.enums, collector.records


def _q(text: str) -> str:
    """A double-quoted Python string literal (the quotes ruff format writes)."""
    return json.dumps(text)


def _doc(text: str, indent: str) -> list[str]:
    """A docstring at `indent`, wrapped to the line length."""
    lines = textwrap.wrap(text.replace('"""', "'''"), _WIDTH - len(indent) - 6) or [""]
    if len(lines) == 1:
        return [f'{indent}"""{lines[0]}"""']
    return [f'{indent}"""{lines[0]}', *(f"{indent}{line}" for line in lines[1:]), f'{indent}"""']


def _alias(name: str, items: list[str], origin: str) -> list[str]:
    """`name = origin[items]`, split one item a line when it is too long (as ruff format does)."""
    line = f"{name} = {origin}[{', '.join(items)}]"
    if len(line) <= _WIDTH:
        return [line]
    return [f"{name} = {origin}[", *(f"    {item}," for item in items), "]"]


def render(store: SchemaStore = DEFAULT_STORE) -> str:
    """The source of `schemas/records.py` for `store` (formatted as `ruff format` leaves it)."""
    enums, records = specs(store)
    out = [
        '"""Typed contract records: one frozen dataclass per Avro record, a `Literal` per enum.',
        "",
        "GENERATED from the `.avsc` files by `python -m schemas.codegen`; do not edit (the unit tests fail",
        "when this file and the schemas differ). `to_avro()` gives the dict `AvroCodec.encode` writes;",
        "`from_avro(d)` reads a decoded dict. `RECORDS` maps each subject to its top-level class.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from collections.abc import Mapping",
        "from dataclasses import dataclass",
        "from typing import Any, ClassVar, Literal",
    ]
    for enum in enums.values():
        out += ["", *_alias(enum.name, [_q(s) for s in enum.symbols], "Literal")]
        if enum.doc:
            out += _doc(enum.doc, "")
    for rec in records.values():
        out += ["", "", "@dataclass(frozen=True, slots=True, kw_only=True)", f"class {rec.name}:"]
        out += [*_doc(rec.doc or rec.name, "    "), ""]
        if rec.subject is not None:
            out += [f"    SUBJECT: ClassVar[str] = {_q(rec.subject)}", ""]
        for f in rec.fields:
            line = f"    {f.name}: {f.annotation}"
            if f.default is not None:
                line += f" = {f.default}"
            out.append(line)
        out += ["", "    def to_avro(self) -> dict[str, Any]:", "        return {"]
        out += [f"            {_q(f.name)}: {f.to_avro}," for f in rec.fields]
        out += ["        }", "", "    @classmethod", f"    def from_avro(cls, d: Mapping[str, Any]) -> {rec.name}:"]
        out.append("        return cls(")
        out += [f"            {f.name}={f.from_avro}," for f in rec.fields]
        out.append("        )")
    tops = [r for r in records.values() if r.subject is not None]
    union = [f"ContractRecord = {' | '.join(r.name for r in tops)}"]
    if len(union[0]) > _WIDTH:
        union = ["ContractRecord = (", *(f"    {'| ' if i else ''}{r.name}" for i, r in enumerate(tops)), ")"]
    out += ["", "", *union, '"""Any subject\'s top-level record (what `RecordPublisher.publish` takes)."""']
    out += ["", "RECORDS: dict[str, type[ContractRecord]] = {"]
    out += [f"    {_q(str(r.subject))}: {r.name}," for r in sorted(tops, key=lambda r: str(r.subject))]
    out += ["}", ""]
    return "\n".join(out)


def drift(module: ModuleType, store: SchemaStore = DEFAULT_STORE) -> list[str]:
    """Every way the classes of `module` differ from `store`'s schemas: missing or extra records,
    fields (name, order), types, defaults, enum symbols, subjects. Empty when they agree."""
    enums, records = specs(store)
    problems: list[str] = []
    for enum in enums.values():
        alias = getattr(module, enum.name, None)
        symbols = get_args(alias) if alias is not None else None
        if alias is None or getattr(alias, "__origin__", None) is not Literal:
            problems.append(f"enum {enum.name}: no Literal alias in {module.__name__}")
        elif symbols != enum.symbols:
            problems.append(f"enum {enum.name}: symbols {list(symbols or ())}, schema {list(enum.symbols)}")
    for rec in records.values():
        cls = getattr(module, rec.name, None)
        if cls is None or not is_dataclass(cls):
            problems.append(f"record {rec.name}: no dataclass in {module.__name__}")
            continue
        if rec.subject is not None and getattr(cls, "SUBJECT", None) != rec.subject:
            problems.append(f"record {rec.name}: SUBJECT {getattr(cls, 'SUBJECT', None)!r}, schema {rec.subject!r}")
        have = {f.name: f for f in fields(cls)}
        want = {f.name: f for f in rec.fields}
        problems += [f"record {rec.name}: field {n!r} in the schema, not in the class" for n in want if n not in have]
        problems += [f"record {rec.name}: field {n!r} in the class, not in the schema" for n in have if n not in want]
        if [n for n in have if n in want] != [n for n in want if n in have]:
            problems.append(f"record {rec.name}: fields in another order than the schema's")
        for name in want.keys() & have.keys():
            spec, actual = want[name], have[name]
            if actual.type != spec.annotation:
                problems.append(f"record {rec.name}.{name}: type {actual.type}, schema {spec.annotation}")
            default = None if actual.default is MISSING else actual.default
            if default != (None if spec.default is None else ast.literal_eval(spec.default)):
                problems.append(f"record {rec.name}.{name}: default {default}, schema {spec.default}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schemas.codegen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report a stale schemas/records.py, change nothing")
    parser.add_argument("--schema-dir", type=Path, default=SCHEMA_DIR)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    source = render(SchemaStore(args.schema_dir))
    current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
    if args.check:
        if current != source:
            print(f"{args.output} is stale: run `python -m schemas.codegen`", file=sys.stderr)
            return 1
        return 0
    if current != source:
        args.output.write_text(source, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["EnumSpec", "FieldSpec", "RecordSpec", "drift", "main", "render", "specs"]
