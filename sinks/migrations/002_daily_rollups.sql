-- Daily rollups kept for years, so month-scale reports read ~thousands of rows per day instead of
-- every device-minute. They are fed by materialized views on insert; the sinks insert only
-- device-minutes and coverage-minutes whose key is not yet stored (see sinks/writer.py), so a
-- redelivered or re-emitted window never reaches the rollup twice and the sums stay exact.
-- SummingMergeTree merges lazily: always read with GROUP BY (the views below do).

CREATE TABLE IF NOT EXISTS usage_daily
(
    day Date,
    cluster String,
    generation LowCardinality(String),
    pricing_tier LowCardinality(String),
    preemptible Bool,
    job_id String,
    user String,
    team String,
    project String,
    cost_centre String,
    mapping_version LowCardinality(String),
    classifier_version LowCardinality(String),
    device_minutes UInt64,
    unallocated_s UInt64,
    allocated_s UInt64,
    active_s UInt64,
    starved_s UInt64,
    idle_s UInt64,
    dark_s UInt64,
    sm_weighted_s Float64,
    sample_count UInt64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
          mapping_version, classifier_version);

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_daily_mv TO usage_daily AS
SELECT
    toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day,
    cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
    mapping_version, classifier_version,
    toUInt64(count()) AS device_minutes,
    toUInt64(sum(unallocated_s)) AS unallocated_s,
    toUInt64(sum(allocated_s)) AS allocated_s,
    toUInt64(sum(active_s)) AS active_s,
    toUInt64(sum(starved_s)) AS starved_s,
    toUInt64(sum(idle_s)) AS idle_s,
    toUInt64(sum(dark_s)) AS dark_s,
    sum(sm_weighted_s) AS sm_weighted_s,
    toUInt64(sum(sample_count)) AS sample_count
FROM device_minutes
GROUP BY day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
         mapping_version, classifier_version;

CREATE TABLE IF NOT EXISTS coverage_daily
(
    day Date,
    cluster String,
    node String,
    minutes UInt64,
    expected_device_s UInt64,
    reporting_device_s UInt64,
    unexpected_device_minutes UInt64
)
ENGINE = SummingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (day, cluster, node);

CREATE MATERIALIZED VIEW IF NOT EXISTS coverage_daily_mv TO coverage_daily AS
SELECT
    toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day,
    cluster, node,
    toUInt64(count()) AS minutes,
    toUInt64(sum(expected_device_s)) AS expected_device_s,
    toUInt64(sum(reporting_device_s)) AS reporting_device_s,
    toUInt64(sum(unexpected_devices)) AS unexpected_device_minutes
FROM coverage_minutes
GROUP BY day, cluster, node;
