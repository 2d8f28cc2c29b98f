-- superseded-checksum: 9db7db9bc30bfe91 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- Closed statements (issue 19). `gpuledger period close YYYY-MM` freezes each team's statement of a month:
-- its lines (one per job and rate, plus the adjustment, credit and reservation lines routed to it), the
-- figures behind them and a content hash. Nothing here is ever updated: a correction, a credit, late data or
-- a rate-card reload that changes a closed month becomes an adjustment line in the next open month
-- (sinks/statements.py), traceable to its cause.
--
-- A close writes the lines, then the statements, then the period_closes row: a close that stopped half-way
-- has no period_closes row and its rows are ignored by every view. If two closes of one month ever race,
-- the first (smallest closed_ms, then close_id) wins in every view; a repeated identical close writes the
-- same keys and de-duplicates.

CREATE TABLE IF NOT EXISTS statement_lines
(
    statement_id String,
    line_id String COMMENT 'deterministic: the same content gives the same id',
    period String COMMENT 'the month of the statement (YYYY-MM)',
    team String,
    kind LowCardinality(String) COMMENT 'usage, adjustment, credit, reservation',
    source_period String COMMENT 'the month the amount belongs to (an adjustment: the closed month it corrects)',
    cluster String,
    job_id String,
    user String,
    project String,
    original_project String,
    correction_id String,
    cost_centre String,
    generation LowCardinality(String),
    pricing_tier LowCardinality(String),
    preemptible Bool,
    rate_micro_per_gpu_hour UInt64 COMMENT 'the rate of a usage line; 0 on other lines',
    allocated_s Int64,
    active_s Int64,
    starved_s Int64,
    idle_s Int64,
    dark_s Int64,
    unpriced_s Int64,
    charge_num Int128 COMMENT 'exact: seconds x micro-dollars per GPU-hour (3.6e9 per dollar)',
    charge Decimal(18, 2),
    cause_kind LowCardinality(String) COMMENT 'adjustments and credits: correction, late-data, rate-card, appeal, reservation',
    cause_ref String COMMENT 'the correction id, rate card version, appeal id or reservation id',
    note String
)
ENGINE = ReplacingMergeTree
ORDER BY (statement_id, line_id);

CREATE TABLE IF NOT EXISTS statements
(
    statement_id String,
    close_id String,
    period String,
    team String,
    closed_ms Int64,
    closed_by String,
    content_hash String COMMENT 'sha256 of the canonical statement; `gpuledger statement verify` recomputes it',
    card_version String,
    line_count UInt32,
    jobs UInt64,
    usage_charge Decimal(18, 2),
    adjustment_charge Decimal(18, 2),
    credit_charge Decimal(18, 2),
    reservation_charge Decimal(18, 2),
    total_charge Decimal(18, 2),
    allocated_s Int64,
    dark_s Int64,
    unpriced_s Int64,
    coverage_pct Float64 COMMENT 'data quality: (allocated - dark) / allocated of the usage lines'
)
ENGINE = ReplacingMergeTree
ORDER BY (period, team, statement_id);

CREATE TABLE IF NOT EXISTS period_closes
(
    period String,
    close_id String COMMENT 'sha256 of the period and its statements'' hashes',
    closed_ms Int64,
    closed_by String,
    statements UInt32,
    total_charge Decimal(18, 2)
)
ENGINE = ReplacingMergeTree
ORDER BY (period, close_id);
