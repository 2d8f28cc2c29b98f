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

CREATE VIEW IF NOT EXISTS v_period_closes AS
SELECT period, first.1 AS closed_ms, first.2 AS close_id, first.3 AS closed_by, first.4 AS statements,
       first.5 AS total_charge
FROM
(
    SELECT period, argMin(tuple(closed_ms, close_id, closed_by, statements, total_charge), tuple(closed_ms, close_id))
           AS first
    FROM period_closes FINAL
    GROUP BY period
);

CREATE VIEW IF NOT EXISTS v_statements AS
SELECT * FROM statements FINAL
WHERE close_id IN (SELECT close_id FROM v_period_closes);

CREATE VIEW IF NOT EXISTS v_statement_lines AS
SELECT * FROM statement_lines FINAL
WHERE statement_id IN (SELECT statement_id FROM v_statements);

-- A closed month's report: v_chargeback_month's columns and cent allocation over the frozen usage lines, so
-- `report chargeback --period` of a closed month shows what was closed, whatever changed since.
--   SELECT * FROM v_statement_month(period = '2026-11', by = 'team')
CREATE OR REPLACE VIEW v_statement_month AS
SELECT
    period, by, line, jobs,
    toDecimal128(intDiv(alloc_s * 10000 + 1800, 3600), 4) / 10000 AS allocated_gpu_h,
    toDecimal128(floor_cents + if(cent_rank <= leftover_cents, 1, 0), 2) / 100 AS charge,
    toDecimal128(intDiv((act_s + starv_s) * 10000 + 1800, 3600), 4) / 10000 AS consumed_gpu_h,
    if(alloc_s = 0, 0, round(100 * (act_s + starv_s) / alloc_s, 1)) AS utilisation_pct,
    toDecimal128(intDiv(act_s * 10000 + 1800, 3600), 4) / 10000 AS active_gpu_h,
    toDecimal128(intDiv(starv_s * 10000 + 1800, 3600), 4) / 10000 AS starved_gpu_h,
    toDecimal128(intDiv(idl_s * 10000 + 1800, 3600), 4) / 10000 AS idle_gpu_h,
    toDecimal128(intDiv(drk_s * 10000 + 1800, 3600), 4) / 10000 AS dark_gpu_h,
    toDecimal128(intDiv(idle_num + 18000000, 36000000), 2) / 100 AS idle_cost,
    if(alloc_s = 0, 0, round(100 * (alloc_s - drk_s) / alloc_s, 1)) AS coverage_pct,
    toDecimal128(intDiv(unpriced * 10000 + 1800, 3600), 4) / 10000 AS unpriced_gpu_h,
    alloc_s AS allocated_seconds,
    act_s AS active_seconds,
    starv_s AS starved_seconds,
    idl_s AS idle_seconds,
    drk_s AS dark_seconds,
    num AS charge_numerator,
    idle_num AS idle_charge_numerator
FROM
(
    SELECT *,
           intDiv(num, 36000000) AS floor_cents,
           row_number() OVER (ORDER BY num % 36000000 DESC, line) AS cent_rank,
           intDiv(sum(num) OVER () + 18000000, 36000000) - sum(intDiv(num, 36000000)) OVER () AS leftover_cents
    FROM
    (
        SELECT {period:String} AS period, {by:String} AS by,
               multiIf({by:String} = 'team', team, {by:String} = 'project', project,
                       {by:String} = 'user', user, cost_centre) AS line,
               uniqExact(cluster, job_id) AS jobs,
               toInt128(sum(allocated_s)) AS alloc_s,
               toInt128(sum(active_s)) AS act_s,
               toInt128(sum(starved_s)) AS starv_s,
               toInt128(sum(idle_s)) AS idl_s,
               toInt128(sum(dark_s)) AS drk_s,
               toInt128(sum(unpriced_s)) AS unpriced,
               sum(charge_num) AS num,
               sum(toInt128(idle_s) * rate_micro_per_gpu_hour) AS idle_num
        FROM v_statement_lines
        WHERE period = {period:String} AND kind = 'usage'
        GROUP BY line
    )
);
