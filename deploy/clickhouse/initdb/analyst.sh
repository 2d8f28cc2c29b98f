#!/bin/bash
# Run once by the clickhouse/clickhouse-server image at its first start (/docker-entrypoint-initdb.d), as
# the writer (CLICKHOUSE_USER, with access management). Makes the read-only analyst user that reports and
# analysts log in as, holding only the role `gpuledger_analyst`: the role's grants are the migrations'
# (sinks/migrations/004_analyst_role.sql: SELECT on the ledger database), applied later by `db migrate`.
# The password reaches the server as its SHA-256 hash (hex), so no quoting of the secret is needed.
set -euo pipefail

user="${GPULEDGER_ANALYST_USER:-analyst}"
password="${GPULEDGER_ANALYST_PASSWORD:?set GPULEDGER_ANALYST_PASSWORD (compose: CLICKHOUSE_ANALYST_PASSWORD)}"
if [[ ! "$user" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
    echo "analyst.sh: GPULEDGER_ANALYST_USER must be an identifier, got '$user'" >&2
    exit 1
fi
hash="$(printf '%s' "$password" | sha256sum | cut -d' ' -f1)"

clickhouse client --host 127.0.0.1 --user "$CLICKHOUSE_USER" --password "$CLICKHOUSE_PASSWORD" --multiquery <<SQL
CREATE ROLE IF NOT EXISTS gpuledger_analyst;
CREATE USER IF NOT EXISTS ${user} IDENTIFIED WITH sha256_hash BY '${hash}';
GRANT gpuledger_analyst TO ${user};
SET DEFAULT ROLE gpuledger_analyst TO ${user};
SQL
