"""Read gpuledger topics written in Confluent's wire format, with confluent-kafka's AvroDeserializer.

For a stack whose producers use a schema registry (`gpuledger up` runs one; `kafka.schema_registry_url`
points them at yours). Nothing of gpuledger is needed, only the registry:

    python confluent_registry.py --bootstrap 127.0.0.1:19092 --registry http://127.0.0.1:8081/apis/ccompat/v7 \\
        --topic alerts.v1 --group my-team-alerts [--from-beginning] [--until-end]

Prints one JSON line per record: topic, partition, offset, key, value. A record is `00` + the 4-byte
schema id + the Avro body; the deserializer fetches the writer schema by id (cached) and decodes.
Records written before the registry was turned on are in single-object framing (`C3 01`): this
consumer reports them on stderr and skips them (fastavro_single_object.py reads those).
"""

from __future__ import annotations

import argparse
import json
import sys

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--registry", required=True, help="the registry's Confluent-compatible URL")
    ap.add_argument("--topic", action="append", required=True)
    ap.add_argument("--group", default="gpuledger-example-confluent")
    ap.add_argument("--from-beginning", action="store_true", help="read from the start (default: committed offsets)")
    ap.add_argument("--until-end", action="store_true", help="stop at the end offsets seen at start-up")
    args = ap.parse_args(argv)

    # Timestamps (logicalType timestamp-millis) come back as UTC datetimes; printed as ISO text below.
    deserialize = AvroDeserializer(SchemaRegistryClient({"url": args.registry}))
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": not args.until_end,
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
                value = msg.value() or b""
                try:
                    if value[:1] != b"\x00":
                        raise ValueError("not Confluent-framed (single-object records predate the registry)")
                    record = deserialize(value, SerializationContext(msg.topic(), MessageField.VALUE))
                except Exception as exc:  # undecodable: report and go on
                    failed += 1
                    print(f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {exc}", file=sys.stderr)
                    continue
                key = (msg.key() or b"").decode("utf-8", "replace")
                print(json.dumps({"topic": msg.topic(), "partition": msg.partition(), "offset": msg.offset(),
                                  "key": key, "value": record}, default=str))  # fmt: skip
    finally:
        consumer.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
