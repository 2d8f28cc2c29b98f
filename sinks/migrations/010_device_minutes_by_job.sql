-- device_minutes keyed by job as well. A device shared within one minute (a job ends and the next
-- starts, or part of the minute is unallocated) has one row per job_id; keyed by device and minute
-- only, ReplacingMergeTree kept one of them and the writer's "already stored?" check dropped the
-- other before the daily rollup saw it, so allocated seconds went missing from the ledger (found
-- by the fault suite, tests/fault). The table is rebuilt with job_id in its key; the rollup's
-- materialized view is dropped first and recreated on the new table. Rows already lost were never
-- stored: replaying usage.device-minutes.v1 under a fresh sink group adds them (existing rows are
-- skipped by key, so the rollup stays exact).

DROP VIEW IF EXISTS usage_daily_mv;

DROP TABLE IF EXISTS device_minutes_by_job;

CREATE TABLE device_minutes_by_job
(
    cluster String,
    node String,
    device_uuid String,
    mig_instance_id Int32 DEFAULT -1,
    minute_start_ms Int64,
    day Date MATERIALIZED toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')),
    model LowCardinality(String),
    generation LowCardinality(String),
    job_id String COMMENT 'empty for unallocated telemetry',
    user String,
    project String,
    team String,
    cost_centre String,
    preemptible Bool,
    pricing_tier LowCardinality(String),
    unallocated_s UInt32,
    allocated_s UInt32,
    active_s UInt32,
    starved_s UInt32,
    idle_s UInt32,
    dark_s UInt32,
    sm_weighted_s Float64,
    sample_count UInt32,
    activity_mean_ratio Nullable(Float64),
    activity_max_ratio Nullable(Float64),
    fb_used_mib_max Nullable(Float64),
    power_w_mean Nullable(Float64),
    mapping_version LowCardinality(String),
    classifier_version LowCardinality(String),
    CONSTRAINT classes_add_up CHECK allocated_s = active_s + starved_s + idle_s + dark_s,
    CONSTRAINT within_minute CHECK allocated_s + unallocated_s <= 60,
    CONSTRAINT minute_aligned CHECK minute_start_ms % 60000 = 0
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(day)
ORDER BY (cluster, node, device_uuid, mig_instance_id, minute_start_ms, job_id);

INSERT INTO device_minutes_by_job SELECT * FROM device_minutes;

RENAME TABLE device_minutes TO device_minutes_by_device, device_minutes_by_job TO device_minutes;

DROP TABLE device_minutes_by_device;

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
