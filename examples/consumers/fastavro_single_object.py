"""Read gpuledger topics written in Avro single-object encoding, with confluent-kafka and fastavro only.

Needs the schemas (`gpuledger schemas export DIR`) and nothing else of gpuledger:

    python fastavro_single_object.py --bootstrap 127.0.0.1:19092 --schemas DIR \\
        --topic usage.job-minutes.v1 --group my-team-chargeback [--from-beginning] [--until-end]

Prints one JSON line per record: topic, partition, offset, key, value (times are epoch milliseconds).
A record is `C3 01` + the CRC-64-AVRO fingerprint (little-endian) of its writer schema's Parsing
Canonical Form + the Avro body; the writer is looked up by fingerprint among every `.avsc` of DIR
(history included) and resolved to the latest version of the same record, so older writers read in
today's shape. A record that does not decode is reported on stderr and skipped (count it, alert on it).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from fastavro.schema import fingerprint, to_parsing_canonical_form

MAGIC = b"\xc3\x01"


def strip_logical_types(node: Any) -> Any:
    """Keep timestamps as epoch-millisecond ints (fastavro would make datetimes of them)."""
    if isinstance(node, dict):
        return {k: strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [strip_logical_types(v) for v in node]
    return node


def load_writers(schema_dir: Path) -> dict[bytes, tuple[Any, Any]]:
    """Fingerprint (the 8 header bytes) -> (writer schema, reader schema: the latest of that record)."""
    latest: dict[str, Any] = {}
    parsed: list[tuple[str, Any]] = []
    for path in sorted(schema_dir.rglob("*.avsc")):
        raw = json.loads(path.read_text(encoding="utf-8"))
        name = raw["name"] if "." in raw["name"] else f"{raw.get('namespace', '')}.{raw['name']}"
        schema = fastavro.parse_schema(strip_logical_types(raw))
        parsed.append((name, schema))
        if "history" not in path.relative_to(schema_dir).parts:
            latest[name] = schema
    writers: dict[bytes, tuple[Any, Any]] = {}
    for name, schema in parsed:
        # fastavro returns the fingerprint's bytes in header order (little-endian) as hex.
        fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))
        writers[fp] = (schema, latest[name])
    return writers


def decode(value: bytes, writers: dict[bytes, tuple[Any, Any]]) -> dict[str, Any]:
    if value[:2] != MAGIC or len(value) < 10:
        raise ValueError("not an Avro single-object record")
    found = writers.get(value[2:10])
    if found is None:
        raise ValueError(f"unknown schema fingerprint {int.from_bytes(value[2:10], 'little'):016x}")
    writer, reader = found
    record: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(value[10:]), writer, reader)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--schemas", required=True, type=Path, help="the directory `gpuledger schemas export` wrote")
    ap.add_argument("--topic", action="append", required=True)
    ap.add_argument("--group", default="gpuledger-example-fastavro")
    ap.add_argument("--from-beginning", action="store_true", help="read from the start (default: committed offsets)")
    ap.add_argument("--until-end", action="store_true", help="stop at the end offsets seen at start-up")
    args = ap.parse_args(argv)

    writers = load_writers(args.schemas)
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": not args.until_end,  # a long-running consumer commits as it goes
            "auto.offset.reset": "earliest",
        }
    )
    parts = [TopicPartition(t, p) for t in args.topic for p in consumer.list_topics(t, timeout=10).topics[t].partitions]
    remaining = {}
    for tp in parts:
        lo, hi = consumer.get_watermark_offsets(tp, timeout=10)
        if hi > lo:
            remaining[(tp.topic, tp.partition)] = hi
        if args.from_beginning:
            tp.offset = OFFSET_BEGINNING
    consumer.assign(parts)
    failed = 0
    try:
        while not (args.until_end and not remaining):
            for msg in consumer.consume(500, 1.0):
                if msg.error():
                    print(f"consumer error: {msg.error()}", file=sys.stderr)
                    continue
                where = (msg.topic(), msg.partition())
                if where in remaining and msg.offset() + 1 >= remaining[where]:
                    del remaining[where]
                try:
                    record = decode(msg.value() or b"", writers)
                except Exception as exc:  # undecodable: report and go on
                    failed += 1
                    print(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {exc}", file=sys.stderr)
                    continue
                key = (msg.key() or b"").decode("utf-8", "replace")
                print(json.dumps({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                                  "key": key, "value": record}, default=repr))  # fmt: skip
    finally:
        consumer.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
