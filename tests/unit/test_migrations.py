"""Migration files: ordered, split into statements, placeholders filled safely."""

from __future__ import annotations

import pytest

from base.errors import ConfigError
from sinks.db import check_identifier, load_migrations


def test_migrations_are_ordered_and_named() -> None:
    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted({m.version for m in migrations})
    assert migrations[0].version == 1 and migrations[0].name == "ledger_tables"


def test_statements_fill_ttl_and_database() -> None:
    by_name = {m.name: m for m in load_migrations()}
    statements = by_name["ledger_tables"].statements(database="ledger", raw_sample_ttl_days=30)
    raw = next(s for s in statements if "raw_samples" in s.split("(")[0])
    assert "toIntervalDay(30)" in raw and "{" not in raw
    assert all(not s.lstrip().startswith("--") for s in statements)
    grants = by_name["analyst_role"]
    assert grants.needs_access_management
    assert "GRANT SELECT ON ledger.* TO gpuledger_analyst" in grants.statements(
        database="ledger", raw_sample_ttl_days=1
    )


def test_every_table_a_sink_writes_is_deduplicating() -> None:
    ddl = "\n".join(m.sql for m in load_migrations())
    for table in ("device_minutes", "job_minutes", "coverage_minutes", "raw_samples", "job_events", "alerts",
                  "actions", "attribution_corrections", "identity_snapshots", "appeal_events",
                  "reservation_events"):  # fmt: skip
        block = ddl.split(f"CREATE TABLE IF NOT EXISTS {table}\n", 1)[1].split(";", 1)[0]
        assert "ReplacingMergeTree" in block, table


def test_checksum_changes_with_the_text() -> None:
    m = load_migrations()[0]
    assert m.checksum == load_migrations()[0].checksum and len(m.checksum) == 16


@pytest.mark.parametrize("name", ["ledger; DROP TABLE x", "1abc", "a-b", ""])
def test_identifiers_are_checked(name: str) -> None:
    with pytest.raises(ConfigError):
        check_identifier(name)
