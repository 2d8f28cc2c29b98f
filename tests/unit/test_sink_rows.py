"""The sinks' row mappings read typed records: every sample record of every stored subject maps to
rows of the table's width, the same from the decoded dict as from the typed record."""

from __future__ import annotations

import pytest

from schemas import load_schema
from schemas.evolution import sample_records
from sinks.rows import SINKS, TOPICS_BY_NAME


@pytest.mark.parametrize("topic", sorted(SINKS))
def test_every_sample_record_maps_to_rows_of_the_tables_width(topic: str) -> None:
    subject = TOPICS_BY_NAME[topic].subject
    for record in sample_records(load_schema(subject)):
        for spec in SINKS[topic]:
            assert subject == spec.record_type.SUBJECT
            typed = spec.record_type.from_avro(record)
            rows = spec.to_rows(typed)
            assert rows == spec.rows(record)
            assert all(len(row) == len(spec.columns) for row in rows)
            for row in rows:  # a column named after a top-level field carries it (nulls as '' or -1 aside)
                for column, value in zip(spec.columns, row, strict=True):
                    if column in record and not isinstance(record[column], list) and record[column] is not None:
                        assert value == record[column], (spec.table, column)
