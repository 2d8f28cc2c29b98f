"""Evolution check: every version of a subject reads data written with every older version.

For each subject and each pair of versions (writer older than reader), records are generated from
the writer schema so that every enum symbol and every union branch is written at least once, then
read with the reader schema through fastavro schema resolution. Anything that fails (a field added
without a default, a removed enum symbol or union branch, a type changed incompatibly, a renamed
record) is reported.

    python -m schemas.evolution [--schema-dir DIR]     exit status 1 on any incompatibility
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro

from base.errors import ContractError
from schemas import DEFAULT_STORE, SchemaStore
from schemas.codec import _strip_logical_types, crc64_fingerprint

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


@dataclass(frozen=True, slots=True)
class Incompatibility:
    subject: str
    writer_version: int
    reader_version: int
    reason: str

    def __str__(self) -> str:
        return f"{self.subject}: v{self.reader_version} cannot read v{self.writer_version}: {self.reason}"


def _variants(node: Any, names: dict[str, Any]) -> int:
    """How many generated records it takes to write every enum symbol and union branch once."""
    if isinstance(node, list):
        return max([len(node), *(_variants(b, names) for b in node)])
    if not isinstance(node, dict):
        return 1
    kind = node.get("type")
    if kind == "enum":
        return len(node["symbols"])
    if kind == "record":
        return max([1, *(_variants(f["type"], names) for f in node["fields"])])
    if kind == "array":
        return _variants(node["items"], names)
    if kind == "map":
        return _variants(node["values"], names)
    if isinstance(kind, dict | list):
        return _variants(kind, names)
    return 1


def _value(node: Any, k: int, names: dict[str, Any], namespace: str | None) -> Any:
    """The k-th generated value of a schema node."""
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return {
                "null": None,
                "boolean": k % 2 == 1,
                "int": k + 1,
                "long": k + 1,
                "float": k + 0.5,
                "double": k + 0.5,
                "bytes": bytes([k % 256]),
                "string": f"s{k}",
            }[node]
        full = node if "." in node or namespace is None else f"{namespace}.{node}"
        return _value(names.get(full, names.get(node)), k, names, namespace)
    if isinstance(node, list):
        return _value(node[k % len(node)], k, names, namespace)
    kind = node["type"]
    if kind in ("record", "enum", "fixed"):
        ns = node.get("namespace", namespace)
        name = node["name"]
        full = name if "." in name or ns is None else f"{ns}.{name}"
        names[full] = node
        namespace = ns
    if kind == "record":
        return {f["name"]: _value(f["type"], k, names, namespace) for f in node["fields"]}
    if kind == "enum":
        return node["symbols"][k % len(node["symbols"])]
    if kind == "fixed":
        return bytes(node["size"])
    if kind == "array":
        return [_value(node["items"], k, names, namespace)]
    if kind == "map":
        return {"key": _value(node["values"], k, names, namespace)}
    return _value(kind, k, names, namespace)


def sample_records(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Records of `schema` that together write every enum symbol and union branch at least once."""
    plain = _strip_logical_types(schema)
    count = max(2, _variants(plain, {}))
    return [_value(plain, k, {}, None) for k in range(count)]


def _pairs(versions: list[dict[str, Any]]) -> Iterator[tuple[int, int]]:
    for reader in range(2, len(versions) + 1):
        for writer in range(1, reader):
            yield writer, reader


def check_subject(store: SchemaStore, subject: str) -> list[Incompatibility]:
    """Every incompatibility between versions of `subject` (empty: it evolved compatibly)."""
    versions = store.versions(subject)
    problems: list[Incompatibility] = []
    parsed = [fastavro.parse_schema(_strip_logical_types(v)) for v in versions]
    seen: dict[bytes, int] = {}
    for number, schema in enumerate(parsed, start=1):
        fp = crc64_fingerprint(schema)
        if fp in seen:
            problems.append(Incompatibility(subject, seen[fp], number, "identical to an older version"))
        seen.setdefault(fp, number)
    for writer, reader in _pairs(versions):
        for record in sample_records(versions[writer - 1]):
            buf = io.BytesIO()
            try:
                fastavro.schemaless_writer(buf, parsed[writer - 1], record)
                buf.seek(0)
                fastavro.schemaless_reader(buf, parsed[writer - 1], parsed[reader - 1])
            except Exception as exc:  # resolution errors come as several exception kinds
                problems.append(Incompatibility(subject, writer, reader, f"{type(exc).__name__}: {exc}"))
                break
    return problems


def check(store: SchemaStore = DEFAULT_STORE) -> list[Incompatibility]:
    """Every incompatibility in every subject of `store`."""
    problems: list[Incompatibility] = []
    for subject in store.subjects():
        try:
            problems.extend(check_subject(store, subject))
        except ContractError as exc:  # bad history layout or unreadable file
            problems.append(Incompatibility(subject, 0, 0, str(exc)))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m schemas.evolution", description=__doc__.split("\n\n")[0])
    parser.add_argument("--schema-dir", type=Path, default=DEFAULT_STORE.root)
    args = parser.parse_args(argv)
    store = SchemaStore(args.schema_dir)
    problems = check(store)
    for subject in store.subjects():
        mine = [p for p in problems if p.subject == subject]
        status = "INCOMPATIBLE" if mine else "ok"
        print(f"{subject:32} v1..v{store.latest_version(subject):<3} {status}")
        for problem in mine:
            print(f"    {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
