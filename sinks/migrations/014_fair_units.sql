-- superseded-checksum: cbfb25c4105a1c41 (this file before its views moved to sinks/views/, one file per view,
-- applied after the migrations on every `gpuledger db migrate`)

-- Fair units (issue 19, item 5).
--
-- A MIG instance is priced by its share of the GPU: its compute slices over the GPU's (a 1g.10gb on an H100 is
-- 1 of 7; schemas/mig.py derives it from the profile, processors/rollup.py stamps it on every device-minute).
-- The slice's rate is the generation's rate x slices / of, half-up to the micro-dollar (sinks/ratecard.py
-- `share_rate_micro`), so every charge stays seconds x an integer rate and every grouping adds up. A whole GPU
-- is 1 of 1 (the default: rows stored before this migration are whole GPUs, as they were charged); a MIG
-- instance whose share is unknown is 0 of 1, so it is unpriced and shows in every report's unpriced hours.
-- The share is part of usage_daily's key, so slices of different sizes never sum into one row.
--
-- Reports split by pricing tier: `by = 'tier'` (on-prem, cloud-on-demand, cloud-spot), and every line carries
-- onprem_gpu_h / cloud_gpu_h and onprem_charge / cloud_charge, which add up to the line's `charge`: a line of one
-- kind has all of its charge in that column; a mixed line has its cloud part half-up from its exact numerator
-- and the rest (the line's cent allocation included) on-prem.

ALTER TABLE device_minutes
    ADD COLUMN IF NOT EXISTS mig_profile LowCardinality(String) DEFAULT '' AFTER mig_instance_id,
    ADD COLUMN IF NOT EXISTS gpu_share_slices UInt8 DEFAULT 1 AFTER mig_profile,
    ADD COLUMN IF NOT EXISTS gpu_share_of UInt8 DEFAULT 1 AFTER gpu_share_slices;

-- usage_daily gets the share in its key. A column added to a sorting key may not have a default, and rows
-- stored before this migration must read as whole GPUs (1 of 1), so the table is rebuilt (as 010 rebuilt
-- device_minutes): the materialized view is dropped first and recreated on the new table.
DROP VIEW IF EXISTS usage_daily_mv;

DROP TABLE IF EXISTS usage_daily_shared;

CREATE TABLE usage_daily_shared
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
    gpu_share_slices UInt8 DEFAULT 1 COMMENT 'compute slices of the GPU held: 1 of 1 for a whole GPU, 0 of 1 unknown',
    gpu_share_of UInt8 DEFAULT 1 COMMENT 'compute slices of the whole GPU (7 or 4 for a MIG instance)',
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
          mapping_version, classifier_version, gpu_share_slices, gpu_share_of);

INSERT INTO usage_daily_shared (day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre, mapping_version,
    classifier_version, device_minutes, unallocated_s, allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s,
    sample_count)
SELECT day, cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre, mapping_version,
    classifier_version, device_minutes, unallocated_s, allocated_s, active_s, starved_s, idle_s, dark_s, sm_weighted_s,
    sample_count FROM usage_daily;

RENAME TABLE usage_daily TO usage_daily_unshared, usage_daily_shared TO usage_daily;

DROP TABLE usage_daily_unshared;

CREATE MATERIALIZED VIEW IF NOT EXISTS usage_daily_mv TO usage_daily AS
SELECT
    toDate(fromUnixTimestamp64Milli(minute_start_ms, 'UTC')) AS day,
    cluster, generation, pricing_tier, preemptible, job_id, user, team, project, cost_centre,
    mapping_version, classifier_version, gpu_share_slices, gpu_share_of,
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
         mapping_version, classifier_version, gpu_share_slices, gpu_share_of;
