-- The attribution baseline (issue 38): every event of attribution.baseline.v1 as the sink stores it, one row per
-- event (`gpuledger policy apply` writes one when the baseline its policy implies is not the one in force). Which
-- baseline is in force (the latest event by ts_ms, ties by event_id; CLEARED: none) is not decided here but by the
-- same pure function `policy apply` uses (schemas/governance_baseline.py `in_force`); the reports (report
-- chargeback, the statements, the team page) mark the months, or the part of a month, before it.

CREATE TABLE IF NOT EXISTS attribution_baseline_events
(
    event_id String,
    event_type LowCardinality(String) COMMENT 'SET, CLEARED',
    ts_ms Int64 COMMENT 'when the policy was applied',
    actor String COMMENT 'who applied it',
    baseline_start_ms Nullable(Int64) COMMENT 'UTC midnight of the baseline day; null when CLEARED',
    source LowCardinality(String) COMMENT 'POLICY_DATE, STRICT_MODE, GRACE_MODE',
    attribution_mode LowCardinality(String) COMMENT 'GRACE, STRICT: the mode in force at the apply',
    engine Nullable(String),
    cluster String,
    policy_sha256 String
)
ENGINE = ReplacingMergeTree
ORDER BY event_id;
