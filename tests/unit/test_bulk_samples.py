"""The Avro container the raw-sample bulk path builds, read back by fastavro's reader (an implementation we did
not write): every block is one (head, scrape, tail) record with the insert's number at both ends, and the scrape
is the body it was given, whole."""

from __future__ import annotations

import io
from typing import Any

import fastavro
import pytest

from processors.testing import device, scrape
from schemas.codec import SINGLE_OBJECT_HEADER_LEN, AvroCodec, avro_long
from schemas.topics import DEVICE_SAMPLES
from sinks.bulk_samples import TABLE_FINGERPRINT, container, container_header, wrapper_schema

CODEC = AvroCodec()


def scrapes() -> list[dict[str, Any]]:
    return [
        scrape(f"n{i}", 1_796_000_000_000 + i, [device(f"GPU-{i}-{g}", g, sm=0.1 * g, mig=g or None) for g in range(i)])
        for i in range(5)
    ]


@pytest.mark.parametrize("nonce", [0, 1, -1, 2**62 + 12345, -(2**63)])
def test_fastavro_reads_each_block_as_the_scrape_between_the_inserts_number(nonce: int) -> None:
    sync = bytes(range(16))
    records = scrapes()
    bodies = [CODEC.encode(DEVICE_SAMPLES.subject, r)[SINGLE_OBJECT_HEADER_LEN:] for r in records]
    data = container(container_header(wrapper_schema(), sync), sync, [memoryview(b) for b in bodies], nonce)
    reader = fastavro.reader(io.BytesIO(data))
    assert reader.metadata["avro.codec"] == "null"
    read = list(reader)
    assert [r["head"] for r in read] == [nonce] * len(records)
    assert [r["tail"] for r in read] == [nonce] * len(records)
    assert [r["scrape"] for r in read] == [CODEC.decode(CODEC.encode(DEVICE_SAMPLES.subject, r)).record
                                           for r in records]  # fmt: skip
    blocks = fastavro.block_reader(io.BytesIO(data))
    assert [b.num_records for b in blocks] == [1] * len(records)  # one block per scrape


def test_avro_long_is_what_fastavro_writes_for_a_long() -> None:
    for value in (0, -1, 1, 63, -64, 64, 2**31, -(2**40), 2**63 - 1, -(2**63)):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema("long"), value)
        assert avro_long(value) == buf.getvalue()


def test_the_table_was_built_for_the_schemas_latest_version() -> None:
    # Fails when telemetry.device-samples gets a new version: raw_scrapes_bulk (migration 030) then needs a new
    # migration with the new tuple, and TABLE_FINGERPRINT the new fingerprint (until then the bulk path is off).
    assert CODEC.fingerprint(DEVICE_SAMPLES.subject) == TABLE_FINGERPRINT
